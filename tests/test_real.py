"""The real executor under every scheduler: batching never changes a request's tokens."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from batching.costs.models import get_model
from batching.engine import RunResult, run
from batching.metrics import summarize
from batching.real.executor import RealExecutor, run_real
from batching.real.model import Llama, ModelConfig
from batching.real.runner import ModelRunner, prompt_ids
from batching.request import Request, RequestError
from batching.schedulers import (
    ChunkedPrefillScheduler,
    ContinuousScheduler,
    DynamicScheduler,
    Scheduler,
    StaticScheduler,
)

pytestmark = pytest.mark.model
TINY = ModelConfig.from_shape(get_model("tiny"))
MAX_LEN = 40  # slab per slot: prompts <= 24 + outputs <= 12 fit
SEEDS = (0, 1, 2)

# Every way the schedulers pack a step. All requests arrive at t=0, so the plans depend
# only on the schedulers, not on measured (noisy) step durations: failures reproduce.
SCHEDULES: dict[str, object] = {
    "static": lambda: StaticScheduler(4, MAX_LEN),  # padding + dead rows
    "dynamic": lambda: DynamicScheduler(3, MAX_LEN),
    "continuous-mixed": lambda: ContinuousScheduler(3, MAX_LEN, prefill_mode="mixed"),
    "continuous-separate": lambda: ContinuousScheduler(3, MAX_LEN, prefill_mode="separate"),
    "chunked": lambda: ChunkedPrefillScheduler(4, MAX_LEN, token_budget=8, chunk_size=5),
    # exact KV with too little room: requests are preempted and recomputed.
    "continuous-exact": lambda: ContinuousScheduler(4, MAX_LEN, kv_capacity=48, kv_policy="exact"),
    "chunked-exact": lambda: ChunkedPrefillScheduler(
        4, MAX_LEN, token_budget=8, chunk_size=5, kv_capacity=48, kv_policy="exact"
    ),
}


def workload(seed: int, n: int = 6) -> list[tuple[int, int, int]]:
    """(rid, prompt_len, output_len): prompts 1..24, outputs 1..12."""
    rng = np.random.default_rng(seed)
    return [(10 * seed + i, int(rng.integers(1, 25)), int(rng.integers(1, 13))) for i in range(n)]


def fresh(spec: list[tuple[int, int, int]]) -> list[Request]:
    return [Request(rid, 0.0, p, o) for rid, p, o in spec]


def serve(model: Llama, spec: list[tuple[int, int, int]], sched: Scheduler) -> RunResult:
    runner = ModelRunner(model, sched.max_slots, max_len=MAX_LEN)
    res = run(fresh(spec), sched, RealExecutor(runner, warmup=False))
    sched.check_idle()
    return res


def alone(model: Llama, spec: list[tuple[int, int, int]]) -> dict[int, list[int]]:
    """Each request served by itself: one slot, nothing else in any step."""
    out = {}
    for row in spec:
        res = serve(model, [row], ContinuousScheduler(1, MAX_LEN))
        out[row[0]] = res.requests[0].token_ids
    return out


@pytest.fixture(scope="module")
def model32() -> Llama:
    return Llama(TINY, "cpu", torch.float32, seed=0)


@pytest.fixture(scope="module")
def alone64(model64: Llama) -> dict[int, dict[int, list[int]]]:
    return {s: alone(model64, workload(s)) for s in SEEDS}


def test_alone_equals_the_cache_free_reference(model64: Llama, alone64: dict) -> None:
    for rid, p, o in workload(0):
        assert alone64[0][rid] == model64.generate_full(prompt_ids(0, rid, p, TINY.vocab), o), rid


@pytest.mark.parametrize("name", list(SCHEDULES))
def test_batched_tokens_equal_alone_tokens_float64(model64: Llama, alone64: dict, name: str) -> None:
    """7.1-7.3: static padding and dead rows, dynamic, continuous (mixed, separate),
    chunked prefill and recompute after preemption give every request the tokens it
    gets alone (float64, where no argmax near-tie can flip)."""
    preemptions = 0
    for s in SEEDS:
        res = serve(model64, workload(s), SCHEDULES[name]())
        preemptions += res.preemptions
        assert {r.rid: r.token_ids for r in res.requests} == alone64[s]
        assert all(len(r.token_ids) == r.output_len for r in res.requests)
    if name.endswith("exact"):
        assert preemptions > 0  # the recompute path really ran


def test_static_row_at_the_slab_end_and_dead_rows(model64: Llama) -> None:
    """7.1: a dense batch whose longest request fills its slab exactly (prompt + output =
    max_len) and whose short member becomes a dead row after 2 tokens."""
    spec = [(0, 3, 2), (1, 28, 12)]
    res = serve(model64, spec, StaticScheduler(2, MAX_LEN))
    assert sum(n * d for n, d in zip(res.log.cols["n"], res.log.cols["dead"])) == 10
    assert res.log.cols["pad"][0] == 25
    assert {r.rid: r.token_ids for r in res.requests} == alone(model64, spec)


def fp32_agreement(model32: Llama, seeds: tuple[int, ...] = SEEDS) -> float:
    """Fraction of requests whose fp32 batched tokens equal their fp32 alone tokens, over
    every schedule of SCHEDULES and ``seeds`` (conventions: batch invariance is tested in
    float64; fp32 argmax near-ties can flip, so fp32 is reported as a figure)."""
    same = total = 0
    for s in seeds:
        ref = alone(model32, workload(s))
        for make in SCHEDULES.values():
            res = serve(model32, workload(s), make())
            same += sum(r.token_ids == ref[r.rid] for r in res.requests)
            total += len(res.requests)
    return same / total


def test_fp32_agreement_is_reported(model32: Llama) -> None:
    frac = fp32_agreement(model32)
    print(f"\nfp32 batched == alone: {frac:.3f} of requests")
    assert frac >= 0.9


def test_real_run_durations_and_summary() -> None:
    """A real run (fp32, the CPU's hardware accounting) through run_real and summarize."""
    reqs = [Request(i, 0.001 * i, 4 + 3 * i, 2 + i) for i in range(5)]
    res = run_real(reqs, ContinuousScheduler(3, 512), "tiny", device="cpu", seed=1, max_len=64)
    dur = np.asarray(res.log.cols["dur"])
    assert len(dur) == res.num_steps and (dur > 0).all() and np.isfinite(dur).all()
    assert res.utilization_basis is not None and res.utilization_basis.device.name == "cpu-here"
    s = summarize(res)
    assert s["output_tokens"] == sum(2 + i for i in range(5)) and s["busy_s"] > 0
    assert 0 < s["hw_bandwidth_utilization"] < 1 and 0 < s["hw_compute_utilization"] < 1
    assert s["ttft"]["p50"] > 0 and math.isfinite(s["tpot"]["mean"])
    d = res.executor
    assert d["executor"] == "real" and d["model"] == "tiny" and d["dtype"] == "float32"
    # The kernel plan this machine's probe chose for tiny in fp32, recorded whole.
    assert d["linear"].startswith("fp32; rows 1") and d["threads"] >= 1
    assert d["kernels"]["dtype"] == "fp32" and d["kernels"]["source"] in ("probe", "cache")
    assert d["form_copy_bytes"] >= 0
    json.dumps(d)  # goes into the results file as is
    assert RealExecutor.decode_run(None, None, 3) is None  # type: ignore[arg-type]


def test_run_real_refuses_requests_longer_than_the_slab() -> None:
    with pytest.raises(RequestError, match="max_len=16"):
        run_real([Request(0, 0.0, 10, 7)], ContinuousScheduler(1, 512), "tiny", device="cpu", max_len=16)


def test_run_real_on_a_given_runner_serves_the_same_tokens_twice() -> None:
    """bench_fidelity serves several runs on one model: each run starts from a clean
    history and gives the tokens a freshly built model gives."""
    reqs = lambda: [Request(i, 0.0, 4 + 3 * i, 3 + i) for i in range(4)]
    fresh = run_real(reqs(), ContinuousScheduler(2, 512), "tiny", device="cpu", seed=1, max_len=32)
    runner = ModelRunner.from_shape(get_model("tiny"), 3, seed=1, max_len=32)
    again = [run_real(reqs(), ContinuousScheduler(2, 512), None, runner=runner) for _ in range(2)]
    want = [r.token_ids for r in fresh.requests]
    assert want and all([r.token_ids for r in x.requests] == want for x in again)
    with pytest.raises(ValueError, match="max_slots=4"):
        run_real(reqs(), ContinuousScheduler(4, 512), "tiny", runner=runner)
    with pytest.raises(ValueError, match="'cpu-s' but the runner holds 'tiny'"):
        run_real(reqs(), ContinuousScheduler(2, 512), "cpu-s", runner=runner)
    with pytest.raises(ValueError, match="max_len"):
        run_real(reqs(), ContinuousScheduler(2, 512), None, runner=runner, max_len=16)
    with pytest.raises(RequestError, match="max_len=32"):
        run_real([Request(0, 0.0, 30, 5)], ContinuousScheduler(2, 512), None, runner=runner)
