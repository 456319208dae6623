"""Hand-computed cases for the four schedulers (every step costs 1 s unless said otherwise)."""

from __future__ import annotations

import math

import pytest
from helpers import UNIT, reqs

from batching.engine import run
from batching.metrics import summarize
from batching.plan import StepWork
from batching.request import RequestError
from batching.schedulers import (
    ChunkedPrefillScheduler,
    ContinuousScheduler,
    DynamicScheduler,
    StaticScheduler,
)
from batching.validate import ConfigError


def go(requests, sched, **kw):
    res = run(requests, sched, kw.pop("executor", UNIT), **kw)
    sched.check_idle()
    return res


# ---------------------------------------------------------------- 7.1 static / dynamic
def test_static_first_finisher_utilization_is_hand_computed():
    a, b = R = reqs((0, 10, 20), (0, 10, 2000))
    res = go(R, StaticScheduler(2, 4096))
    s = summarize(res)
    assert s["slot_utilization"] == pytest.approx((20 + 2000) / (2 * 2000))
    assert s["steps"] == 2000  # 1 prefill + 1,999 decode steps
    assert a.token_times[-1] == 20.0  # the 20-token request is done after 20 steps...
    assert b.token_times[-1] == 2000.0
    dead = sum(n * d for n, d in zip(res.log.cols["n"], res.log.cols["dead"]))
    assert dead == 2000 - 20  # ...and its row is computed, uselessly, 1,980 more times


def test_static_padding_pair_pays_80x_prefill():
    R = reqs((0, 50, 20), (0, 4000, 20))
    res = go(R, StaticScheduler(2, 8192), record_slots=True)
    s = summarize(res)
    assert res.log.cols["prefill"][0] == 4050 and res.log.cols["pad"][0] == 3950
    assert s["padding_fraction"] == pytest.approx(3950 / 8000)
    (_, _, kind, n, pad), _ = res.log.occupancy[0]
    assert kind == "P" and (n + pad) / n == 80  # the 50-token prompt costs 4,000 positions


@pytest.mark.parametrize("sched", [StaticScheduler(2, 64), DynamicScheduler(2, 64)])
def test_the_log_counts_a_dense_batchers_queue(sched):
    """Five requests at t = 0, batches of two, one prefill and one decode step each: while the
    first batch runs three wait (static batching holds them in one sealed batch and the forming
    one, dynamic in its queue), while the second runs one, then none."""
    res = go(reqs(*[(0, 10, 2)] * 5), sched)
    assert res.log.cols["waiting"] == [3, 3, 1, 1, 0, 0]
    assert res.log.cols["running"] == [2, 2, 2, 2, 1, 1]
    assert sched.snapshot() == (0, 0, 0, 0)  # after the run: nothing waits, runs or is held


def test_static_timeout_seals_the_batch_and_late_arrivals_wait():
    R = reqs((0.0, 4, 2), (0.5, 4, 2), (2.0, 4, 2))
    go(R, StaticScheduler(4, 64, max_wait=1.0))
    assert [r.admit_time for r in R] == [1.0, 1.0, 3.0]  # sealed at 1.0; the third times out at 3.0


def test_dynamic_lets_late_arrivals_join_but_static_does_not():
    spec = ((0.0, 4, 3), (0.5, 4, 2), (0.7, 4, 2))
    R = reqs(*spec)
    go(R, DynamicScheduler(4, 64, max_wait=0.0))
    assert [r.admit_time for r in R] == [0.0, 3.0, 3.0]  # both joined the batch after the first
    R = reqs(*spec)
    go(R, StaticScheduler(4, 64, max_wait=0.0))
    assert [r.admit_time for r in R] == [0.0, 3.0, 5.0]  # each sealed alone at its own timeout


def test_dense_batch_refuses_a_kv_budget_it_cannot_hold():
    with pytest.raises(ConfigError, match="batch_size=4 x max_context=100"):
        StaticScheduler(4, 100, kv_capacity=300)


# ---------------------------------------------------------------- 7.2 continuous
def test_continuous_admits_in_the_step_after_a_slot_frees():
    a, b = R = reqs((0, 10, 3), (0, 10, 2))
    go(R, ContinuousScheduler(1, 64))
    assert a.finish_time == 3.0 and b.admit_time == 3.0
    assert b.token_times == [4.0, 5.0]


def test_continuous_short_request_leaves_after_its_own_steps():
    R = reqs((0, 8, 2000), *[(0, 8, 20)] * 7)
    go(R, ContinuousScheduler(8, 4096))
    assert all(r.token_times[-1] == 20.0 for r in R[1:])  # 20 iterations, whoever else runs
    assert R[0].token_times[-1] == 2000.0


def test_separate_prefill_pauses_the_decodes():
    a, b = R = reqs((0, 10, 4), (1.5, 10, 2))
    go(R, ContinuousScheduler(2, 64, prefill_mode="separate"))
    assert a.token_times == [1.0, 2.0, 4.0, 5.0]  # step 3 (ending at 3.0) is B's prefill alone
    assert b.token_times == [3.0, 4.0]
    R = reqs((0, 10, 4), (1.5, 10, 2))
    go(R, ContinuousScheduler(2, 64, prefill_mode="mixed"))
    assert R[0].token_times == [1.0, 2.0, 3.0, 4.0]


def test_exact_kv_preempts_the_newest_and_recomputes_it():
    a, b = R = reqs((0, 10, 10), (0, 10, 10))
    res = go(R, ContinuousScheduler(2, 64, kv_capacity=30, kv_policy="exact"))
    assert res.preemptions == 1 and b.preemptions == 1 and a.preemptions == 0
    # B made 6 tokens, lost its cache at step 7, waited for A (done at step 10), then
    # recomputed 10 + 6 tokens in step 11, which emitted its 7th token.
    assert b.token_times == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 11.0, 12.0, 13.0, 14.0]
    s = summarize(res)
    assert s["kv_reserved_peak"] == 30 and s["kv_used_peak"] == 30


def test_fcfs_head_of_line_is_not_overtaken():
    # The head (prompt 50) cannot fit beside the running request; the small one behind it
    # would, but must wait: no skipping ahead, so nothing starves.
    R = reqs((0, 40, 5), (0.5, 50, 1), (0.6, 2, 1))
    go(R, ContinuousScheduler(4, 64, kv_capacity=64, kv_policy="exact"))
    assert R[2].admit_time >= R[1].admit_time


# ---------------------------------------------------------------- 7.3 chunked prefill
def test_chunked_prefill_splits_1200_into_512_512_176():
    (r,) = R = reqs((0, 1200, 3))
    res = go(R, ChunkedPrefillScheduler(4, 4096, token_budget=2048, chunk_size=512))
    assert res.log.cols["prefill"][:3] == [512, 512, 176]
    assert r.token_times[0] == 3.0  # the chunk that completes the prompt emits the first token


def test_chunked_takes_decodes_first_then_fills_the_budget():
    a, b = R = reqs((0, 4, 10), (1.0, 20, 2))
    res = go(R, ChunkedPrefillScheduler(4, 64, token_budget=8, chunk_size=8))
    # From t=1: A's decode takes 1 token of the budget, B's chunks take the other 7: 7, 7, 6.
    assert res.log.cols["prefill"][:4] == [4, 7, 7, 6]
    assert res.log.cols["decode"][1:4] == [1, 1, 1]
    assert a.token_times[:5] == [1.0, 2.0, 3.0, 4.0, 5.0]  # A never stalls
    assert b.token_times[0] == 4.0


def test_chunked_exact_kv_never_deadlocks_on_partial_prefills():
    R = reqs((0, 60, 2), (0, 60, 2))
    res = go(
        R,
        ChunkedPrefillScheduler(4, 128, token_budget=100, chunk_size=50, kv_capacity=100, kv_policy="exact"),
    )
    assert all(r.done for r in R) and res.preemptions >= 1


@pytest.mark.parametrize(
    "sched",
    [
        StaticScheduler(2, 64),
        ContinuousScheduler(2, 64, kv_capacity=40, kv_policy="exact"),
        ChunkedPrefillScheduler(2, 64, token_budget=8, chunk_size=8),
    ],
    ids=lambda s: s.name,
)
def test_a_plans_work_is_the_same_after_its_step_is_committed(sched):
    """Committing a step moves its requests' counters (computed tokens, KV held); the plan's
    cost inputs are taken when it is made, so ``work()``, first called after the commit,
    gives what the requests said before it."""
    for r in reqs((0, 20, 4), (0, 11, 3)):
        sched.on_arrival(r)
    t, prefill_attn, decode_ctx = 0.0, 0, 0
    while (plan := sched.schedule(t)) is not None:
        before = StepWork.of(plan)  # from the requests as they are now, not the plan's copy
        t += 1.0
        sched.commit(plan, t)
        assert plan.work() == before
        prefill_attn += before.prefill_attn
        decode_ctx += before.decode_ctx
    sched.check_idle()
    assert prefill_attn > 0 and decode_ctx > 0  # prefills and decodes both checked


# ---------------------------------------------------------------- configuration errors
@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: ChunkedPrefillScheduler(8, 64, token_budget=4), "token_budget=4 < max_slots=8"),
        (lambda: ChunkedPrefillScheduler(8, 64, token_budget=64, chunk_size=0), "chunk_size=0"),
        (lambda: StaticScheduler(0, 64), "batch_size=0"),
        (lambda: DynamicScheduler(-1, 64), "batch_size=-1"),
        (lambda: ContinuousScheduler(0, 64), "max_slots=0"),
        (lambda: ContinuousScheduler(4, 64, prefill_mode="eager"), "prefill_mode='eager'"),
        (lambda: ContinuousScheduler(4, 64, kv_capacity=32), "cannot hold one slab of max_context=64"),
        (lambda: ContinuousScheduler(4, 64, kv_capacity=0, kv_policy="exact"), "kv capacity=0"),
        (lambda: ContinuousScheduler(4, 64, kv_policy="paged"), "kv policy='paged'"),
        (lambda: StaticScheduler(4, 64, max_wait=math.nan), "max_wait=nan"),
        (lambda: DynamicScheduler(4, 64, max_wait=-1), "max_wait=-1"),
    ],
)
def test_bad_configuration_is_refused_at_construction(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


def test_prompt_longer_than_context_or_kv_is_refused_up_front():
    with pytest.raises(RequestError, match=r"request 1: prompt_len=100 \+ output_len=5 = 105 exceeds"):
        run(reqs((0, 4, 4), (1, 100, 5)), ContinuousScheduler(4, 64), UNIT)
    with pytest.raises(RequestError, match="needs 50 KV tokens, more than the kv capacity=40"):
        run(reqs((0, 40, 10)), ChunkedPrefillScheduler(4, 64, kv_capacity=40, kv_policy="exact"), UNIT)


@pytest.mark.parametrize(
    "spec, match",
    [
        ((0, 0, 5), "prompt_len=0"),
        ((0, 5, -3), "output_len=-3"),
        ((math.nan, 5, 5), "arrival=nan"),
        ((math.inf, 5, 5), "arrival=inf"),
        ((-1.0, 5, 5), "arrival=-1.0"),
        ((0, 2.5, 5), "prompt_len=2.5"),
    ],
)
def test_bad_request_fields_name_the_field_and_value(spec, match):
    with pytest.raises(RequestError, match=match):
        reqs(spec)


def test_unsorted_or_empty_workloads_are_refused():
    with pytest.raises(ValueError, match="arrivals must be sorted: request 1 arrival=1.0"):
        run(reqs((2, 4, 4), (1, 4, 4)), ContinuousScheduler(4, 64), UNIT)
    with pytest.raises(ValueError, match="empty workload"):
        run([], ContinuousScheduler(4, 64), UNIT)


def test_dense_batch_never_pads_past_the_context():
    # Prompt 90 + output 10 fit a 100-token context alone, but beside a 20-token prompt
    # with 50 output tokens the batch would need 90 + 50: it is split instead.
    R = reqs((0, 20, 50), (0, 90, 10))
    go(R, StaticScheduler(4, 100, max_wait=1.0))
    assert R[1].admit_time > R[0].admit_time
    R = reqs((0, 20, 50), (0, 90, 10), (0, 10, 5))
    go(R, DynamicScheduler(4, 100, max_wait=0.0))
    assert R[1].admit_time > R[0].admit_time and R[2].admit_time >= R[1].admit_time  # FCFS


def test_reserve_each_takes_the_whole_batch_or_nothing():
    """The scheduler's one-check reservation of every running decode: all rows at once when
    they fit, as one reserve() each would; nothing at all when they do not (the scheduler
    then goes row by row and preempts)."""
    from batching.kv import KVCache
    from batching.request import Request

    a, b = Request(0, 0.0, 4, 8), Request(1, 0.0, 6, 8)
    exact = KVCache(20, "exact", 16)
    exact.reserve(a, 4)
    exact.reserve(b, 6)
    assert exact.reserve_each([a, b], 1) and exact.reserved == 12 and exact.free == 8
    assert exact.reserve_each([a, b], 4) and exact.reserved == 20
    assert not exact.reserve_each([a, b], 1) and exact.reserved == 20  # 2 more do not fit: nothing taken
    exact.free_request(a)
    exact.free_request(b)
    exact.check_empty()
    # Slabs: a held slab needs nothing more; a new holder takes a whole one.
    slab = KVCache(32, "slab", 16)
    slab.reserve(a, 4)
    assert slab.reserve_each([a], 1) and slab.reserved == 16
    assert slab.reserve_each([a, b], 1) and slab.reserved == 32 and slab.num_holders == 2
    c = Request(2, 0.0, 4, 8)
    assert not slab.reserve_each([a, b, c], 1) and slab.reserved == 32 and slab.num_holders == 2
