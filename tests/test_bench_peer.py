"""The peer benchmark's workers and bookkeeping (benchmarks/bench_peer.py), on the tiny model."""

from __future__ import annotations

import argparse

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("safetensors")

from helpers import load_benchmark

from batching.costs.models import get_model
from batching.real.checkpoint import save_hf_checkpoint
from batching.real.model import Llama, ModelConfig

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("bench_peer")


def test_first_difference(bench) -> None:
    a = {"0": [1, 2, 3], "1": [4, 5, 6], "2": [7, 8]}
    assert bench.first_difference(a, a) == {"requests": 3, "equal": 3, "first_mismatch": None}
    b = {"0": [1, 2, 3], "1": [4, 9, 6], "2": [7, 0]}
    d = bench.first_difference(a, b)
    assert d["equal"] == 1 and d["mismatching_rids"] == [1, 2]
    assert d["first_mismatch"] == {"rid": 1, "index": 1, "of": 3, "ours": 5, "theirs": 9}


def test_workload_is_seeded_and_within_bounds(bench) -> None:
    a = argparse.Namespace(
        seed=3,
        requests=50,
        prompt_median=64,
        prompt_sigma=1.0,
        prompt_lo=16,
        prompt_hi=512,
        output_median=40,
        output_sigma=0.9,
        output_lo=8,
        output_hi=256,
    )
    w = bench.build_workload(a)
    assert w == bench.build_workload(a) and [r for r, _, _ in w] == list(range(50))
    assert all(16 <= p <= 512 and 8 <= o <= 256 for _, p, o in w)


def _tiny_spec(folder) -> dict:
    """A worker spec on the seeded tiny checkpoint, saved in ``folder`` (requests to add)."""
    save_hf_checkpoint(Llama(ModelConfig.from_shape(get_model("tiny")), "cpu", torch.float32, seed=1), folder)
    return {
        "checkpoint": str(folder),
        "seed": 4,
        "vocab": 256,
        "threads": torch.get_num_threads(),
        "slots": 4,
        "token_budget": 8,
    }


def test_workers_agree_token_for_token(bench, tmp_path) -> None:
    """Our chunked mode and both transformers modes on the same tiny checkpoint: same prompt
    ids, every request its own length, the same greedy tokens."""
    spec = {
        **_tiny_spec(tmp_path),
        "requests": [[0, 9, 5], [1, 3, 12], [2, 20, 7]],
        "static_batch": 2,
        "hf_cb_config": {
            "page_size": 16,
            "num_blocks": 16,
            "max_batch_tokens": 32,
            "max_requests_per_batch": 4,
        },
    }
    ours = bench.worker_ours("ours-chunked", spec)
    assert [len(ours["tokens"][r]) for r in range(3)] == [5, 12, 7]
    pytest.importorskip("transformers")
    for doc in (bench.worker_hf_static(spec), bench.worker_hf_continuous(spec)):
        assert doc["prompt_digest"] == ours["prompt_digest"]
        assert {r: list(t) for r, t in doc["tokens"].items()} == ours["tokens"]
    assert torch.get_num_threads() == spec["threads"]


def test_bf16_workers_run_in_bf16(bench, tmp_path) -> None:
    """--dtype bf16: the fp32 checkpoint is cast on load, in this engine and in transformers;
    every request still gets its own length (tokens may differ from fp32's in the last bit)."""
    spec = {**_tiny_spec(tmp_path), "requests": [[0, 9, 5], [1, 3, 12]], "dtype": "bf16"}
    assert bench.torch_dtype(spec) is torch.bfloat16 and bench.torch_dtype({}) is torch.float32
    ours = bench.worker_ours("ours-chunked", spec)
    assert [len(ours["tokens"][r]) for r in range(2)] == [5, 12]
    assert "bf16" in str(ours["executor"].get("dtype")) or "bfloat16" in str(ours["executor"].get("dtype"))
    pytest.importorskip("transformers")
    _, _, model, _ = bench._hf_model(spec)
    assert next(model.parameters()).dtype is torch.bfloat16


def test_auto_worker_runs_the_probes_choice_and_records_it(bench, tmp_path) -> None:
    """``auto`` (this engine only): the dtype and kernels of this machine's probe, recorded in
    the worker's executor record."""
    from batching.real.checkpoint import read_config
    from batching.real.executor import kernel_plan

    spec = {**_tiny_spec(tmp_path), "requests": [[0, 9, 5], [1, 3, 12]], "dtype": "auto"}
    ours = bench.worker_ours("ours-chunked", spec)
    plan = kernel_plan(read_config(tmp_path), torch.device("cpu"), "auto")
    assert ours["executor"]["kernels"]["buckets"] == plan.to_dict()["buckets"]
    assert ours["executor"]["kernels"]["dtype"] == plan.dtype
    assert [len(ours["tokens"][r]) for r in range(2)] == [5, 12]


def test_variants_and_each_engines_best_dtype(bench) -> None:
    runs = bench.variants(["ours-chunked", "vllm"], ["fp32", "bf16", "auto"])
    assert runs == ["ours-chunked@fp32", "vllm@fp32", "ours-chunked@bf16", "vllm@bf16", "ours-chunked@auto"]
    per = {v: {"tok_s_median": t} for v, t in zip(runs, [400.0, 420.0, 700.0, 1000.0, 710.0])}
    assert bench.best_variants(per) == {"ours-chunked": "ours-chunked@auto", "vllm": "vllm@bf16"}
