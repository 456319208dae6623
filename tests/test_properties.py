"""Property tests: random small workloads through every scheduler (1,000 per scheduler).

Checked on every step (by a wrapping executor) and after every run: each request gets
exactly its output length; nothing is admitted before it arrives; prefill completes before
the first decode; token budget, slot limit and KV capacity are never exceeded, and KV
reserved is exactly what the policy says; FCFS admission order; no leak; the fast path
gives the same timestamps bit for bit as stepping; the same inputs give the same results.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import LinearCost
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from batching.engine import SimExecutor, run
from batching.metrics import summarize
from batching.plan import StepPlan
from batching.request import Request
from batching.schedulers import (
    ChunkedPrefillScheduler,
    ContinuousScheduler,
    DynamicScheduler,
    StaticScheduler,
)

MAX_CTX = 96  # below 64 + 64, so that dense batches meet the context limit
EXAMPLES = 1000
SETTINGS = settings(
    max_examples=EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


@st.composite
def workloads(draw) -> list[tuple[float, int, int]]:
    n = draw(st.integers(1, 12))
    gaps = draw(st.lists(st.one_of(st.just(0.0), st.floats(0, 4, allow_nan=False)), min_size=n, max_size=n))
    prompts = draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    outputs = [draw(st.integers(1, min(64, MAX_CTX - p))) for p in prompts]
    arrivals = np.cumsum([0.0] + gaps[1:])
    return [(float(a), p, o) for a, p, o in zip(arrivals, prompts, outputs)]


def kv_options(draw, slots: int, spec) -> dict:
    if draw(st.booleans()):
        return {
            "kv_policy": "slab",
            "kv_capacity": draw(st.sampled_from([math.inf, MAX_CTX * draw(st.integers(1, slots))])),
        }
    need = max(p + o for _, p, o in spec)
    return {"kv_policy": "exact", "kv_capacity": draw(st.integers(need, need + 3 * MAX_CTX))}


@st.composite
def static_like(draw, cls):
    spec = draw(workloads())
    b = draw(st.integers(1, 6))
    wait = draw(st.floats(0, 5, allow_nan=False))
    kv = {
        "kv_policy": draw(st.sampled_from(["slab", "exact"])),
        "kv_capacity": draw(st.sampled_from([math.inf, b * MAX_CTX])),
    }
    return spec, lambda: cls(b, MAX_CTX, max_wait=wait, **kv)


@st.composite
def continuous(draw):
    spec = draw(workloads())
    slots = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(["mixed", "separate"]))
    kv = kv_options(draw, slots, spec)
    return spec, lambda: ContinuousScheduler(slots, MAX_CTX, prefill_mode=mode, **kv)


@st.composite
def chunked(draw):
    spec = draw(workloads())
    slots = draw(st.integers(1, 6))
    budget = draw(st.integers(slots, slots + 64))
    chunk = draw(st.integers(1, 64))
    kv = kv_options(draw, slots, spec)
    return spec, lambda: ChunkedPrefillScheduler(slots, MAX_CTX, token_budget=budget, chunk_size=chunk, **kv)


costs = st.builds(LinearCost, st.floats(0.05, 2.0), st.floats(0.0, 0.05))


class CheckingExecutor(SimExecutor):
    """Checks every plan against the scheduler's limits before 'running' it."""

    def __init__(self, cost, sched) -> None:
        super().__init__(cost)
        self.s = sched

    def check(self, plan: StepPlan) -> None:
        s = self.s
        rows = [c.req for c in plan.prefills] + plan.decodes + plan.dead
        slots = [r.slot for r in rows]
        assert None not in slots and len(set(slots)) == len(slots) and len({r.rid for r in rows}) == len(rows)
        assert all(0 <= x < s.max_slots for x in slots) and len(rows) <= s.max_slots
        assert all(not r.in_prefill for r in plan.decodes), "decode before prefill completed"
        assert all(c.n >= 1 for c in plan.prefills)
        if isinstance(s, ChunkedPrefillScheduler):
            assert plan.num_tokens <= s.token_budget
            assert all(c.n <= s.chunk_size for c in plan.prefills)
        kv, state = s.kv, s.snapshot(plan)
        assert state.kv_reserved <= kv.capacity and state.running == len(s.running)
        if kv.policy == "exact":  # reserved = held + what this step writes
            assert state.kv_reserved == state.kv_used
        else:
            assert state.kv_reserved == kv.num_holders * kv.max_context

    def execute(self, plan):
        self.check(plan)
        return super().execute(plan)

    def decode_run(self, plan, k):
        self.check(plan)
        return super().decode_run(plan, k)


def fresh(spec) -> list[Request]:
    return [Request(i, a, p, o) for i, (a, p, o) in enumerate(spec)]


def check_run(case, cost) -> None:
    spec, make = case
    sched = make()
    R = fresh(spec)
    res = run(R, sched, CheckingExecutor(cost, sched))
    sched.check_idle()
    for r in R:
        assert r.generated == r.output_len == len(r.token_times)
        assert r.admit_time >= r.arrival and r.token_times[0] > r.arrival
        assert all(b > a for a, b in zip(r.token_times, r.token_times[1:]))
    firsts = [r.admit_time for r in R]
    assert firsts == sorted(firsts), "FCFS violated"
    s = summarize(res)
    assert 0 < s["slot_utilization"] <= 1 and 0 <= s["padding_fraction"] < 1


def check_fast_and_deterministic(case, cost) -> None:
    """The fast path gives the same timestamps, bit for bit, as stepping one at a time;
    the same inputs give the same results (the results file itself: test_results.py)."""
    spec, make = case
    R, slow, again = fresh(spec), fresh(spec), fresh(spec)
    res = run(R, make(), SimExecutor(cost))
    run(slow, make(), SimExecutor(cost), fast=False)
    assert [r.token_times for r in slow] == [r.token_times for r in R]
    res2 = run(again, make(), SimExecutor(cost))
    assert res2.log.cols == res.log.cols and [r.token_times for r in again] == [r.token_times for r in R]


CASES = {
    "static": static_like(StaticScheduler),
    "dynamic": static_like(DynamicScheduler),
    "continuous": continuous(),
    "chunked": chunked(),
}


@pytest.mark.parametrize("name", CASES)
def test_invariants(name):
    @SETTINGS
    @given(CASES[name], costs)
    def prop(case, cost):
        check_run(case, cost)

    prop()


@pytest.mark.parametrize("name", CASES)
def test_fast_path_and_determinism(name):
    @settings(SETTINGS, max_examples=EXAMPLES // 5)
    @given(CASES[name], costs)
    def prop(case, cost):
        check_fast_and_deterministic(case, cost)

    prop()
