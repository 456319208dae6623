"""The CPU kernel plan: chosen from timings (injected here, never the wall clock), cached per
machine, and every path giving the reference model's numbers."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")

from batching.costs.models import get_model
from batching.plan import PrefillChunk, StepPlan
from batching.real import kernels as K
from batching.real.kernels import Bucket, LinearPlan, choose, choose_paths
from batching.real.model import Llama, ModelConfig
from batching.real.runner import ModelRunner, prompt_ids
from batching.request import Request

pytestmark = pytest.mark.model
TINY = ModelConfig.from_shape(get_model("tiny"))


def flat(**per_path: dict[int, float]) -> dict[str, dict[int, float]]:
    return dict(per_path)


def test_each_row_count_takes_its_fastest_path_ties_to_the_plainest() -> None:
    ms = flat(aten={1: 5.0, 2: 6.0, 4: 9.0}, wx={1: 5.0, 2: 5.0, 4: 9.5}, split={1: 4.0})
    buckets, cost = choose_paths(ms, "fp32")
    assert buckets == (Bucket(1, "split", 1), Bucket(2, "wx", 2), Bucket(4, "aten", 4))
    assert cost == {1: 4.0, 2: 5.0, 4: 9.0}
    # A tie between aten and wx goes to aten (PATHS order), whichever dict comes first.
    tie = choose_paths(flat(wx={8: 3.0}, aten={8: 3.0}), "fp32")[0]
    assert tie == (Bucket(8, "aten", 8),)


def test_a_bucket_pads_up_only_when_a_larger_step_is_clearly_cheaper() -> None:
    """Batch 1 slower than batch 2 (oneDNN's bf16 one-row kernel here): one row runs as two;
    a larger step within the probe's noise (PAD_MARGIN) does not pull a bucket up."""
    ms = flat(aten={1: 7.2, 2: 4.0, 4: 4.1, 8: 4.0, 16: 5.0})
    buckets, cost = choose_paths(ms, "bf16")
    assert [K.LinearPlan("bf16", buckets).lookup(t) for t in (1, 2, 3, 5, 9)] == [
        ("aten", 2),
        ("aten", 2),
        ("aten", 4),  # 4.1 against 4.0 at 8 rows: within the margin, no padding to 8
        ("aten", 8),
        ("aten", 16),
    ]
    assert cost[1] == 4.0 and cost[4] == 4.1
    # A step many times larger that times faster is a disturbed probe: no padding past 2x.
    odd = choose_paths(flat(aten={1: 10.0, 2: 9.9, 4: 9.8, 64: 1.0}), "fp32")[0]
    assert [LinearPlan("fp32", odd).lookup(t) for t in (1, 3)] == [("aten", 1), ("aten", 4)]
    # Above PAD_MAX a bucket runs its steps unpadded unless padding up is faster.
    big = choose_paths(flat(aten={256: 10.0, 512: 20.0}), "fp32")[0]
    assert LinearPlan("fp32", big).lookup(300) == ("aten", 300)
    assert LinearPlan("fp32", big).lookup(700) == ("aten", 700)  # beyond the last: its path


def test_the_dtype_is_the_faster_by_geometric_mean_and_the_choice_is_deterministic() -> None:
    ms = {
        "fp32": flat(aten={1: 5.0, 2: 6.0, 512: 100.0}),
        "bf16": flat(aten={1: 6.0, 2: 5.0, 512: 30.0}, dnnl={1: 4.5, 512: 40.0}),
    }
    plan = choose(ms)
    assert plan.dtype == "bf16" and plan.source == "probe"
    assert plan.buckets == (Bucket(1, "dnnl", 1), Bucket(2, "aten", 2), Bucket(512, "aten", 0))
    assert "fp32" in plan.dtype_reason and plan == choose(json.loads(json.dumps(ms), object_hook=_intkeys))
    assert choose(ms, "fp32").dtype == "fp32" and choose(ms, "fp32").dtype_reason == "asked for"
    # An AVX2 machine: bf16 several times slower at every size keeps fp32.
    slow = {"fp32": flat(aten={1: 5.0, 64: 20.0}), "bf16": flat(aten={1: 30.0, 64: 120.0})}
    assert choose(slow).dtype == "fp32"
    with pytest.raises(ValueError, match="dtype='bf16': not probed"):
        choose({"fp32": ms["fp32"]}, "bf16")


def _intkeys(d: dict) -> dict:
    return {int(k) if k.isdigit() else k: v for k, v in d.items()}


def test_plan_records_and_describes_its_buckets() -> None:
    plan = LinearPlan(
        "bf16", (Bucket(1, "dnnl", 2), Bucket(2, "dnnl", 2), Bucket(8, "wx", 8), Bucket(512, "dnnl", 0))
    )
    assert plan.describe() == "bf16; rows 1 as 2: dnnl, 2: dnnl, 3-8: wx, 9-512: dnnl"
    assert plan.paths == ("wx", "dnnl")
    assert plan.token_buckets() == [2, 8]
    rec = plan.to_dict()
    assert rec["buckets"][0] == [1, "dnnl", 2] and rec["dtype"] == "bf16"
    with pytest.raises(ValueError, match="path='nope'"):
        LinearPlan.fixed("nope")


def test_timings_are_probed_once_then_read_from_the_machines_cache(tmp_path, monkeypatch) -> None:
    """The probe runs only when no cached probe of this machine, torch and shapes exists; a
    file written for another key (another CPU, say) is not used."""
    calls: list[list[str]] = []

    def fake_probe(shape, dtypes, *a, **k):
        calls.append([K.dtype_name(d) for d in dtypes])
        return {K.dtype_name(d): {"aten": {1: 1.0 + i, 2: 2.0}} for i, d in enumerate(dtypes)}

    monkeypatch.setenv("BATCHING_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(K, "probe", fake_probe)
    monkeypatch.setattr(K, "_MEMO", {})
    shape = get_model("tiny")
    ms, src = K.timings(shape, [torch.float32, torch.bfloat16])
    assert src == "probe" and calls == [["fp32", "bf16"]] and ms["bf16"]["aten"][1] == 2.0
    monkeypatch.setattr(K, "_MEMO", {})  # a new process: the file answers
    ms2, src2 = K.timings(shape, [torch.bfloat16])
    assert src2 == "cache" and calls == [["fp32", "bf16"]] and ms2 == {"bf16": ms["bf16"]}
    (f,) = tmp_path.glob("*.json")
    doc = json.loads(f.read_text())
    doc["key"]["cpu"] = "another CPU"
    f.write_text(json.dumps(doc))
    monkeypatch.setattr(K, "_MEMO", {})
    assert K.timings(shape, [torch.float32])[1] == "probe" and len(calls) == 2


def test_a_probe_disturbed_by_other_processes_is_used_but_not_cached(tmp_path, monkeypatch) -> None:
    """Other processes kept cores busy during the probe (faked through /proc/stat's reading):
    the timings serve this process, the plan says why, and nothing is written."""
    import itertools

    ticks = itertools.count(0.0, 5.0)  # the machine's busy seconds: 5 s per reading
    clock = itertools.count(100.0, 2.0)  # 2 s of wall time per reading

    monkeypatch.setenv("BATCHING_KERNEL_CACHE", str(tmp_path))
    monkeypatch.setattr(K, "_MEMO", {})
    monkeypatch.setattr(K, "probe", lambda shape, dtypes, *a, **k: {"fp32": {"aten": {1: 1.0}}})
    monkeypatch.setattr(K, "busy_cpu_s", lambda: next(ticks))
    monkeypatch.setattr(K, "own_cpu_s", lambda: 0.0)
    monkeypatch.setattr(K.time, "perf_counter", lambda: next(clock))
    ms, source = K.timings(get_model("tiny"), [torch.float32])
    assert ms == {"fp32": {"aten": {1: 1.0}}} and source.startswith(
        "probe, disturbed: other processes kept 2.5"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_real_probe_of_tiny_times_every_candidate_path() -> None:
    ms = K.probe(get_model("tiny"), [torch.float32], rows=(1, 2, 8), rounds=1)
    assert set(ms) == {"fp32"} and set(ms["fp32"]) == set(K.paths_for(torch.float32))
    assert set(ms["fp32"]["split"]) == {1} and set(ms["fp32"]["aten"]) == {1, 2, 8}
    assert all(v > 0 for per in ms["fp32"].values() for v in per.values())


def _greedy_run(model: Llama, prompts: dict[int, int], steps: int) -> dict[int, list[int]]:
    """Prefill each prompt (one chunk each, one step), then ``steps`` decode steps of all."""
    runner = ModelRunner(model, slots=len(prompts), max_len=64)
    reqs = []
    for slot, (rid, n) in enumerate(prompts.items()):
        r = Request(rid, 0.0, n, steps + 1)
        r.on_admit(slot, 0.0)
        reqs.append(r)
    plan = StepPlan(prefills=[PrefillChunk(r, r.prompt_len) for r in reqs])
    out = runner.forward(plan)
    for c in plan.prefills:
        c.req.on_prefill(c.n, c.pad)
        c.req.on_token(1.0, out.token_ids[c.req.rid])
    for t in range(steps):
        plan = StepPlan(decodes=reqs)
        out = runner.forward(plan)
        for r in reqs:
            r.on_decode()
            r.on_token(2.0 + t, out.token_ids[r.rid])
    return {r.rid: r.token_ids for r in reqs}


@pytest.mark.parametrize("path", ["aten", "wx", "split"])
def test_every_float64_path_gives_the_reference_tokens(path: str) -> None:
    """Each path (and padding: one row as two, three as four) in float64 gives the tokens of
    the cache-free reference, one sequence at a time."""
    plan = LinearPlan.fixed(path, "fp64")
    if path != "split":
        plan = LinearPlan("fp64", (Bucket(1, path, 2), Bucket(4, path, 4), Bucket(64, path, 0)))
    m = Llama(TINY, "cpu", torch.float64, seed=0, kernels=plan)
    prompts = {0: 5, 1: 9, 2: 3}
    got = _greedy_run(m, prompts, 6)
    for rid, n in prompts.items():
        assert got[rid] == m.generate_full(prompt_ids(0, rid, n, TINY.vocab), 7), rid


@pytest.mark.skipif(not K.dnnl_available(torch.float32), reason="no oneDNN on this torch")
def test_dnnl_path_matches_aten_in_fp32() -> None:
    """oneDNN's prepacked product: the same logits as F.linear to fp32 rounding."""
    a = Llama(TINY, "cpu", torch.float32, seed=0, kernels=LinearPlan.fixed("aten"))
    d = Llama(TINY, "cpu", torch.float32, seed=0, kernels=LinearPlan.fixed("dnnl"))
    ids = torch.tensor(prompt_ids(0, 1, 24, TINY.vocab))
    torch.testing.assert_close(d.forward_full(ids), a.forward_full(ids), rtol=1e-4, atol=1e-5)


#: bf16 against fp32, the same weights rounded to bf16: RMS logit difference at most this share
#: of the logits' standard deviation (tiny measures ~2%; cpu-s ~7.5%, its deeper residual stream
#: rounding more), and the greedy token the same at 90% of positions or more.
BF16_RMS_TOL = 0.05


def test_bf16_logits_are_within_the_stated_tolerance_of_fp32() -> None:
    path = "dnnl" if K.dnnl_available(torch.bfloat16) else "aten"
    ref = Llama(TINY, "cpu", torch.float32, seed=0, kernels=LinearPlan.fixed("aten"))
    m16 = Llama(TINY, "cpu", torch.bfloat16, seed=0, kernels=LinearPlan.fixed(path, "bf16"))
    ids = torch.tensor(prompt_ids(0, 2, 48, TINY.vocab))
    a, b = ref.forward_full(ids), m16.forward_full(ids).float()
    assert ((a - b).pow(2).mean().sqrt() / a.std()).item() <= BF16_RMS_TOL
    assert (a.argmax(-1) == b.argmax(-1)).float().mean().item() >= 0.9


def test_default_plan_is_probed_lazily_and_float64_is_never_probed(monkeypatch) -> None:
    """A model built only to be saved as a checkpoint probes nothing; float64 runs F.linear."""
    calls: list[str] = []
    monkeypatch.setattr(K, "timings", lambda shape, dtypes: (calls.append("probe"), ({}, "probe"))[1])
    m = Llama(TINY, "cpu", torch.float32, seed=0)
    assert calls == []
    assert Llama(TINY, "cpu", torch.float64).kernels == LinearPlan.fixed("aten", "fp64") and calls == []
    with pytest.raises(ValueError):  # the fake timings are empty: the first use asks for them
        _ = m.kernels
    assert calls == ["probe"]


def test_kernels_command_prints_the_plan_and_its_timings(capsys) -> None:
    from batching.cli import main

    assert main(["kernels", "--model", "tiny", "--dtype", "fp32"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("tiny on this CPU (") and "fp32; rows 1" in out and "dtype fp32: asked for" in out
    assert "    aten" in out and "    split" in out
    assert main(["kernels", "--model", "tiny", "--dtype", "fp16"]) == 2
    assert "dtype='fp16'" in capsys.readouterr().err
