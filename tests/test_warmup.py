"""The real executor's warm-up (7.1-7.3): one prefill as large as the scheduler's largest step
(capped), once per runner and size, so that no timed step pays for fresh activation memory."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from batching.costs.models import get_model
from batching.engine import run
from batching.real.executor import RealExecutor, run_real
from batching.real.runner import WARMUP_TOKENS_MAX, ModelRunner
from batching.schedulers import ChunkedPrefillScheduler, ContinuousScheduler, StaticScheduler
from batching.workloads import Workload


def warmed_size(scheduler, max_len: int) -> int:
    """The prefill run_real's warm-up runs for ``scheduler`` on slabs of ``max_len``."""
    r = ModelRunner.from_shape(get_model("tiny"), scheduler.max_slots, device="cpu", max_len=max_len)
    r.warmup(tokens=scheduler.max_step_prompt_tokens)
    return r._warm_tokens


def test_largest_step_is_the_token_budget_or_a_full_prompt_per_slot():
    assert warmed_size(ChunkedPrefillScheduler(4, 64, token_budget=24, chunk_size=8), 64) == 24
    assert warmed_size(ContinuousScheduler(4, 64), 64) == 4 * 64
    assert warmed_size(StaticScheduler(3, 64), 50) == 3 * 50
    # The bound is the scheduler's own; the slabs only cap it.
    assert ChunkedPrefillScheduler(4, 64, token_budget=24, chunk_size=8).max_step_prompt_tokens == 24
    assert StaticScheduler(3, 64).max_step_prompt_tokens == 3 * 64


def test_warmup_prefills_once_per_size_within_the_slabs_and_the_cap():
    r = ModelRunner.from_shape(get_model("tiny"), 2, device="cpu", max_len=64)
    calls = []
    real = r._forward_packed
    r._forward_packed = lambda *a: calls.append(len(a[0])) or real(*a)  # tokens per forward pass
    r.warmup(tokens=100)
    assert calls == [5, 100]  # the small mixed step, then 100 positions (64 + 36)
    r.warmup(tokens=100)
    r.warmup(tokens=50)
    assert calls == [5, 100, 5, 5]  # nothing larger to warm: small steps only
    r.warmup(tokens=10_000)
    assert calls[-1] == 2 * 64 == r._warm_tokens  # capped by what 2 slabs of 64 hold
    assert WARMUP_TOKENS_MAX >= 2 * 64


def test_a_warmed_run_gives_the_tokens_of_an_unwarmed_one():
    # The warm-up's prefill writes slabs (with token 1 at every position) that every
    # request's own prefill overwrites before reading: the tokens cannot change.
    w = Workload.from_arrays([0.0, 0.0, 0.0], [20, 7, 13], [5, 9, 3], name="three")
    sched = lambda: ContinuousScheduler(2, 64)
    warmed = run_real(w, sched(), "tiny", device="cpu", max_len=64)
    runner = ModelRunner.from_shape(get_model("tiny"), 2, device="cpu", max_len=64)
    cold = run(w.fresh(), sched(), RealExecutor(runner, warmup=False))
    assert runner._warm_tokens == 0 and warmed.executor["warmup_s"] > 0
    assert {r.rid: r.token_ids for r in warmed.requests} == {r.rid: r.token_ids for r in cold.requests}
    assert all(len(r.token_ids) == r.output_len for r in warmed.requests)
