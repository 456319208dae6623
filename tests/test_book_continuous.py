"""The numbers, verdicts and figures behind 7.2 continuous batching (batching/book/continuous.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import numpy as np
import pytest
from helpers import H100_8B, UNIT, reqs, small_trace

from batching.book import (
    checks,
    common,
    continuous,
)
from batching.book.common import Claim
from batching.costs import get_cost_model
from batching.costs.profile import GPU_PROFILE_DIR
from batching.engine import run
from batching.metrics import iterations, run_metrics, useful_flops
from batching.plan import StepWork
from batching.schedulers import ContinuousScheduler
from batching.simulate import offered_rate, simulate
from batching.workloads import Workload


# ------------------------------------------------------------------------------ 7.2
def test_rate_sweep_continuous_utilization_grows_with_load_and_computes_nothing_twice():
    w = small_trace(150, rate=2.0)
    cfg = {
        "static": {"scheduler": "static", "slots": 16, "max_wait": 1.0},
        "continuous": {"scheduler": "continuous", "slots": 16},
    }
    sw = continuous.rate_sweep(w, H100_8B, cfg, [0.25, 1.0, 4.0, 16.0])
    c, s = sw["continuous"], sw["static"]
    np.testing.assert_allclose(c["offered_rate"], offered_rate(w) * np.array([0.25, 1.0, 4.0, 16.0]))
    assert c["stable"].dtype == bool and c["stable"][0]
    assert np.all(np.diff(c["slot_util"]) > -0.01) and c["slot_util"][-1] > 3 * c["slot_util"][0]
    # Continuous batching (mixed prefill, no preemption) performs exactly the useful FLOPs.
    np.testing.assert_allclose(c["useful_compute"], c["hw_compute"], rtol=1e-9)
    # Static batching pads and computes dead rows: strictly more FLOPs than useful.
    assert np.all(s["useful_compute"] < s["hw_compute"])
    assert c["slot_util"][-1] > s["slot_util"][-1] and c["throughput_req"][-1] > s["throughput_req"][-1]


def test_iterations_equal_output_length_from_admission():
    w, probes = continuous.with_probes(small_trace(100, rate=3.0), every=5, output=20)
    assert len(probes) == 20 and all(w.output_lens[i] == 20 for i in range(0, 100, 5))
    for sched, opts in (("continuous", {}), ("static", {"max_wait": 0.5})):
        res = simulate(w, H100_8B, sched, slots=16, **opts)
        it = iterations(res)
        np.testing.assert_array_equal(it["from_admission"], it["output_len"])
        assert np.all(it["from_arrival"] >= it["from_admission"])
    # Chunked prefill spends ceil(prompt / chunk) steps on the prompt, the last emitting token 1.
    res = simulate(w, H100_8B, "chunked", slots=16, token_budget=64 + 16, chunk_size=64)
    it = iterations(res)
    assert np.all(it["from_admission"] >= it["output_len"])


def test_iterations_from_arrival_by_hand():
    # Unit steps. A (arrives 0) runs alone; B arrives at 0.5 during step 1 and gets the free
    # slot at t=1: it lives through steps 2..3 plus the one in progress when it arrived.
    res = run(reqs((0, 4, 3), (0.5, 4, 2)), ContinuousScheduler(2, 64), UNIT)
    it = iterations(res)
    assert it["from_admission"].tolist() == [3, 2]
    assert it["from_arrival"].tolist() == [3, 3]  # step 1 was running when B arrived
    assert it["service"].tolist() == [3.0, 2.0]


def test_first_finisher_queue_static_makes_the_queue_wait_for_the_long_request():
    ffq = continuous.first_finisher_queue(extra=8, gap=0.05)
    assert len(ffq) == 40 and ffq.output_lens[0] == 2000
    extra = list(range(32, 40))
    st = continuous.subset_latency(simulate(ffq, H100_8B, "static", slots=32, max_wait=1.0), extra)
    co = continuous.subset_latency(simulate(ffq, H100_8B, "continuous", slots=32), extra)
    step = H100_8B.decode_step(1, 128)  # the cheapest decode step
    assert st["e2e_mean"] > 1900 * step  # waited for the 2,000-token request
    # ...while continuous batching admits each one within the step in progress (at worst the
    # first batch's 4,096-token prefill step, about 65 ms on this roofline).
    assert co["e2e_mean"] < 40 * step


# -------------------------------------------------------------------- verdicts and KV
def test_kv_rows_by_hand():
    # llama-8b on one H100: (0.9 x 80 GB - 16.06 GB of weights) / 128 KiB per token = 426,784
    # tokens: 52 slabs of 8,192; at 1,000 tokens each 426 requests, capped at 256.
    assert H100_8B.kv_capacity() == 426784
    assert continuous.kv_rows(H100_8B, 1000.0) == {"slabs": 52, "exact": 256}
    assert continuous.kv_rows(H100_8B, 4000.0)["exact"] == 106
    # llama-70b on 2 x H200: 343,910 tokens, 41 slabs (the seed section's limit for slabs).
    big = get_cost_model("llama-70b", "h200", tp=2)
    assert big.kv_capacity() == 343910
    assert continuous.kv_rows(big, 1370.0) == {"slabs": 41, "exact": 251}
    with pytest.raises(ValueError):
        continuous.kv_rows(H100_8B, 0.0)


def test_utilization_claim_truth_table():
    C = common.Claim
    assert continuous.utilization_claim(0.82, 0.39, 0.68) is C.NEEDS_WIDE_BATCH
    assert continuous.utilization_claim(0.82, 0.39, 0.45) is C.SLOT_LEVEL_ONLY
    assert continuous.utilization_claim(0.82, 0.61, 0.70) is C.HOLDS
    assert continuous.utilization_claim(0.50, 0.61, 0.70) is C.DOES_NOT_HOLD
    assert continuous.utilization_claim(0.60, 0.60, 0.0) is C.HOLDS  # the bound is inclusive
    # No rate met the SLO (NaN): nothing reached 60%, not even the slots.
    nan = float("nan")
    assert continuous.utilization_claim(nan, nan, nan) is C.DOES_NOT_HOLD
    assert continuous.utilization_claim(0.82, nan, nan) is C.SLOT_LEVEL_ONLY


def test_decode_compute_counts_the_decode_rows_flops_alone_by_hand():
    # One request, a 4-token prompt and 3 output tokens, under continuous batching: one prefill
    # step (4 tokens, 4 x 5 / 2 = 10 attention pairs) then 2 decode steps at 5 and 6 tokens of
    # context (11 in all). decode_compute is the decode part's FLOPs over busy time at peak.
    res = simulate(reqs((0.0, 4, 3)), H100_8B, "continuous", slots=1)
    m = run_metrics(res)
    model, per_s = H100_8B.model, m["busy_s"] * H100_8B.peak_flops
    assert m["decode_compute"] * per_s == pytest.approx(model.flops_arrays(0.0, 0.0, 2.0, 11.0), rel=1e-12)
    assert m["hw_compute"] * per_s == pytest.approx(model.flops_arrays(4.0, 10.0, 2.0, 11.0), rel=1e-12)
    # Static batching's dead row is decode work too: a 1-token request beside the same one
    # sits dead for both decode steps (its context, 4 + 1 tokens, read each time).
    st = run_metrics(simulate(reqs((0.0, 4, 3), (0.0, 4, 1)), H100_8B, "static", slots=2, max_wait=0.0))
    per_s = st["busy_s"] * H100_8B.peak_flops
    assert st["decode_compute"] * per_s == pytest.approx(
        model.flops_arrays(0.0, 0.0, 4.0, 11.0 + 2 * 5.0), rel=1e-12
    )


def test_token_ratio_and_capacity_gain_by_hand():
    w = Workload.from_arrays([0.0, 1.0], [100, 320], [10, 20])
    assert continuous.token_ratio(w) == pytest.approx(420 / 30)
    C = common.Claim
    gain = lambda c, d: continuous.capacity_gain(
        {"c": {"relaxed": c}, "d": {"relaxed": d}}, "c", "d", "relaxed"
    )
    assert gain(9.0, 3.0) == {"gain": pytest.approx(3.0), "claim": C.HOLDS}  # several times: >= 3
    assert gain(2.9, 1.0)["claim"] is C.PARTLY and gain(1.0, 1.0)["claim"] is C.DOES_NOT_HOLD
    assert gain(0.5, 1.0)["claim"] is C.DOES_NOT_HOLD
    assert gain(2.0, 0.0) == {"gain": float("inf"), "claim": C.HOLDS}  # dense met no rate


def test_utilization_marks_are_the_three_numbers_the_verdict_reads():
    case = {
        "narrow": {"rate": 4.0, "slot_util": 0.82, "hw_compute": 0.39},
        "wide": {"rate": 7.2, "slot_util": 0.32, "hw_compute": 0.68},
    }
    marks = continuous.utilization_marks(case, "n", "w")
    assert marks == [
        ("n", "slot_util", 4.0, 0.82),
        ("n", "hw_compute", 4.0, 0.39),
        ("w", "hw_compute", 7.2, 0.68),
    ]
    none = {**case, "wide": {"rate": 0.0, "slot_util": float("nan"), "hw_compute": float("nan")}}
    assert [m[0] for m in continuous.utilization_marks(none, "n", "w")] == ["n", "n"]


def test_the_utilization_figure_stars_each_mark_with_its_value():
    import matplotlib.pyplot as plt

    from batching.book import figures

    sweep = {
        "continuous, 32 slots": {
            "offered_rate": np.array([1.0, 2.0, 8.0]),
            "stable": np.array([True, True, False]),
            "slot_util": np.array([0.2, 0.5, 0.9]),
            "hw_compute": np.array([0.1, 0.3, 0.4]),
        }
    }
    marks = [
        ("continuous, 32 slots", "slot_util", 3.0, 0.82),
        ("continuous, 32 slots", "hw_compute", 16.0, 0.39),
    ]
    fig = figures.continuous.utilization_load_figure(sweep, trace_rate=2.0, marks=marks)
    for ax, (_, _, x, y) in zip(fig.axes, marks):
        stars = [ln for ln in ax.get_lines() if ln.get_marker() == "*"]
        assert [tuple(s.get_xydata()[0]) for s in stars] == [(x, y)]
        assert [t.get_text() for t in ax.texts] == [f"{y:.0%}"]
        assert ax.get_xlim()[1] >= x  # a mark beyond the sweep stays on the axes
    plt.close(fig)


def test_iterations_and_p99_claims_by_hand():
    C = common.Claim
    ok = {"exact_fraction": 1.0, "arrival_p50": 21.0}
    assert continuous.iterations_claim(ok, 20) is C.HOLDS
    assert continuous.iterations_claim({**ok, "arrival_p50": 23.0}, 20) is C.DOES_NOT_HOLD
    assert continuous.iterations_claim({**ok, "exact_fraction": 0.9}, 20) is C.DOES_NOT_HOLD
    nan = float("nan")
    p = {
        "dense": {"stable": True, "e2e_p99": 30.0},
        "cont": {"stable": True, "e2e_p99": 10.0},
    }
    assert continuous.p99_claim(p, "dense", "cont") is C.HOLDS  # 10 x 2 <= 30
    p["cont"]["e2e_p99"] = 16.0
    assert continuous.p99_claim(p, "dense", "cont") is C.DOES_NOT_HOLD  # 32 > 30
    p["dense"] = {"stable": False, "e2e_p99": nan}
    assert continuous.p99_claim(p, "dense", "cont") is C.HOLDS  # the dense queue grows
    p["cont"] = {"stable": False, "e2e_p99": nan}
    assert continuous.p99_claim(p, "dense", "cont") is C.DOES_NOT_HOLD


def test_p99_at_never_quotes_an_unstable_runs_percentiles():
    # 200 requests at 50 req/s of 300-token outputs: a static batcher with a 2 s timeout on a
    # 70B model falls behind (its queue grows); continuous batching keeps up.
    w = small_trace(200, rate=50.0)
    big = get_cost_model("llama-70b", "h200", tp=2)
    cfg = {
        "static": {"scheduler": "static", "slots": 32, "max_wait": 2.0},
        "continuous": {"scheduler": "continuous", "slots": 256, "kv_policy": "exact"},
    }
    p = continuous.p99_at(w, big, cfg, 1.0)
    assert (
        not p["static"]["stable"] and np.isnan(p["static"]["e2e_p99"]) and p["static"]["throughput_req"] > 0
    )
    assert p["continuous"]["stable"] and np.isfinite(p["continuous"]["e2e_p99"])
    assert p["static"]["offered_rate"] == pytest.approx(offered_rate(w))


def test_utilization_at_capacity_wider_batches_use_more_of_the_device():
    w = small_trace(150, rate=4.0)
    cfg = {
        "continuous, 8 slots": {"scheduler": "continuous", "slots": 8, "kv_policy": "exact"},
        "continuous, 64 slots": {"scheduler": "continuous", "slots": 64, "kv_policy": "exact"},
    }
    u = continuous.utilization_at_capacity(w, H100_8B, cfg, 250.0, iters=3)
    narrow, wide = u["continuous, 8 slots"], u["continuous, 64 slots"]
    assert wide["hw_compute"] > narrow["hw_compute"] > 0 and 0 < narrow["slot_util"] <= 1
    assert wide["rate"] > narrow["rate"] > 0
    # Mixed prefill computes each request's useful FLOPs once whatever the slots: the same
    # prefill share in both runs, and it is the trace's (prompts once, outputs once).
    assert wide["prefill_share"] == pytest.approx(narrow["prefill_share"], rel=1e-9)
    model = H100_8B.model
    p, n = w.prompt_lens.astype(float), w.output_lens.astype(float)
    decode = model.flops_arrays(0.0, 0.0, (n - 1).sum(), ((n - 1) * p + n * (n - 1) / 2).sum())
    total = useful_flops(w.fresh(), model)
    assert narrow["prefill_share"] == pytest.approx(1 - decode / total, rel=1e-9)
    assert narrow["decode_compute"] == pytest.approx((1 - narrow["prefill_share"]) * narrow["hw_compute"])


def test_a_70b_on_two_h100s_holds_too_few_requests_for_the_claim():
    """Vidur's measured TP-2 profile of Llama-2-70B: two 80 GB H100s keep 18,453 KV tokens
    beside the weights, 13 requests of 1,400 tokens. With fewer than 32 fitting, 32 and 256
    slots run the same steps, and no more than 13 of 32 slots can be busy: under 60%."""

    tp2 = get_cost_model(
        "llama-2-70b", "h100", tp=2, profile=str(GPU_PROFILE_DIR / "h100-llama-2-70b-tp2.json")
    )
    w = Workload.from_arrays(np.arange(40) * 0.5, [1000] * 40, [400] * 40)
    cfg = {"scheduler": "continuous", "prefill_mode": "mixed", "kv_policy": "exact"}
    case = continuous.utilization_case(w, tp2, {**cfg, "slots": 32}, {**cfg, "slots": 256}, iters=2)
    assert case["kv_exact"] == 18453 // 1400 == 13 and case["kv_limited"]
    assert case["relaxed_ms"] == pytest.approx(25 * tp2.step_time(StepWork.fresh(decodes=32, ctx=4096)) * 1e3)
    n, wd = case["narrow"], case["wide"]
    # The same steps: the same rate and FLOPs; only slot utilization's denominator differs.
    assert {k: v for k, v in n.items() if k != "slot_util"} == {
        k: v for k, v in wd.items() if k != "slot_util"
    }
    assert wd["slot_util"] == pytest.approx(n["slot_util"] * 32 / 256)
    assert 0 < case["narrow"]["slot_util"] <= 13 / 32 and case["claim"] is Claim.DOES_NOT_HOLD


# ----------------------------------------------------------------- glue and workloads
def test_trace_slices_need_no_dense_capping():
    # Request 1 fits the context alone (8000 + 100) but not padded to 8000 beside a
    # 1,000-token output: the static scheduler runs it in a batch of its own, uncapped.
    w = Workload.from_arrays([0, 0], [50, 8000], [1000, 100])
    capped, n = w.cap_to_context(8192, mode="cap")  # what common.trace_workload does
    assert n == 0 and capped.info["capped"]["n_capped"] == 0
    res = simulate(capped, H100_8B, "static", slots=2, kv_tokens=None)
    assert all(r.done for r in res.requests)
    assert res.requests[1].admit_time > res.requests[0].admit_time


# ------------------------------------------------------------------------ real engine
@pytest.mark.model
def test_real_engine_crosscheck_agrees_with_the_simulator_on_steps_and_iterations():
    pytest.importorskip("torch")
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    cc = checks.real_crosscheck(w, model="tiny", slots=2, threads=1)
    assert cc["available"], cc.get("reason")
    for name, p in cc["per"].items():
        assert p["steps_real"] == p["steps_sim"], name
        assert p["iters_real"] == p["iters_sim"] == [5.0] * 5, name
    assert cc["per"]["continuous"]["steps_real"] < cc["per"]["static"]["steps_real"]
    assert checks.crosscheck_agrees(cc)
    rows, header = checks.crosscheck_rows(cc)
    assert len(rows) == 2 and len(header) == len(rows[0])


def test_probe_summary_by_hand():
    its = {"from_admission": np.array([20, 20, 21]), "from_arrival": np.array([20, 25, 22])}
    assert continuous.probe_summary(its, 20) == {"exact_fraction": pytest.approx(2 / 3), "arrival_p50": 22.0}


def test_real_tail_by_hand() -> None:
    T = continuous.Tail
    static = {"e2e_p99": 8.0, "slot_util": 0.5, "stable": 1.0}
    t = continuous.real_tail(static, {"e2e_p99": 2.0, "slot_util": 0.4, "stable": 1.0})
    assert (t["tail"], t["claim"], t["p99_ratio"], t["slot_lower"]) == (T.LOWER, Claim.HOLDS, 4.0, True)
    t = continuous.real_tail(static, {"e2e_p99": 10.0, "slot_util": 0.5})  # no "stable": stable
    assert (t["tail"], t["claim"], t["p99_ratio"], t["slot_lower"]) == (
        T.NOT_LOWER,
        Claim.DOES_NOT_HOLD,
        1.25,
        False,
    )
    # Static batching's queue grew: its p99 measures the replay's length, so no ratio is taken.
    t = continuous.real_tail({**static, "stable": 0.0}, {"e2e_p99": 2.0, "slot_util": 0.4, "stable": 1.0})
    assert (t["tail"], t["claim"]) == (T.STATIC_UNSTABLE, Claim.HOLDS) and np.isnan(t["p99_ratio"])
    # Continuous batching's queue grew where static batching kept up: it does not hold.
    t = continuous.real_tail(static, {"e2e_p99": 2.0, "slot_util": 0.4, "stable": 0.0})
    assert (t["tail"], t["claim"]) == (T.CONT_UNSTABLE, Claim.DOES_NOT_HOLD) and np.isnan(t["p99_ratio"])
    # Both queues grew: no p99 counts, and the check says nothing of the claim.
    t = continuous.real_tail({**static, "stable": 0.0}, {"e2e_p99": 2.0, "slot_util": 0.4, "stable": 0.0})
    assert (t["tail"], t["claim"]) == (T.BOTH_UNSTABLE, None) and np.isnan(t["p99_ratio"])


def test_real_tail_offered_against_served_tokens() -> None:
    # 4 requests of 10 output tokens over 2 s of arrivals: 20 tokens/s asked for.
    w = Workload.from_arrays([0.0, 0.5, 1.0, 2.0], [8] * 4, [10] * 4)
    s = {"e2e_p99": 8.0, "slot_util": 0.5, "stable": 0.0, "throughput_tok": 5.0}
    c = {"e2e_p99": 2.0, "slot_util": 0.4, "stable": 1.0, "throughput_tok": 19.0}
    t = continuous.real_tail(s, c, w)
    assert t["offered_tok"] == pytest.approx(20.0) and (t["static_tok"], t["cont_tok"]) == (5.0, 19.0)


def test_a_static_run_that_falls_behind_is_marked_unstable_and_not_compared():
    """The same stability rule as the capacity search (capacity.queue_growth), applied to the
    runs the live check compares: a static batcher offered four times what it serves falls
    behind for the whole replay; continuous batching keeps up; no p99 ratio is taken."""
    from batching.capacity import queue_growth

    w = small_trace(200, rate=50.0)
    big = get_cost_model("llama-70b", "h200", tp=2)
    st = simulate(w, big, "static", slots=32, max_wait=2.0)
    co = simulate(w, big, "continuous", slots=256, kv_policy="exact")
    ms, mc = ({**run_metrics(r), "stable": 1.0 - queue_growth(r)["growing"]} for r in (st, co))
    assert ms["stable"] == 0.0 and mc["stable"] == 1.0
    t = continuous.real_tail(ms, mc, w)
    assert t["tail"] is continuous.Tail.STATIC_UNSTABLE and t["claim"] is Claim.HOLDS
    assert np.isnan(t["p99_ratio"]) and t["static_tok"] < t["offered_tok"]


def test_queue_wait_bound_counts_from_arrival():
    # Three queued requests at 1, 2 and 4 s behind a batch that blocks until 3 s: from t = 0
    # each waits at least 3 s; from arrival 2, 1 and 0 s, 1 s on average.
    w = Workload.from_arrays([0.0, 1.0, 2.0, 4.0], [8] * 4, [5] * 4)
    b = continuous.queue_wait_bound(w, w.rids[1:], 3.0)
    assert b == {"from_start": 3.0, "mean_arrival": pytest.approx(7 / 3), "from_arrival": pytest.approx(1.0)}
    with pytest.raises(ValueError):
        continuous.queue_wait_bound(w, [99], 3.0)


def test_the_first_finisher_queue_waits_at_least_the_bound_from_arrival():
    """7.2's admonition: the queued requests' mean latency from arrival under static batching
    is at least the bound counted from the same origin, and below the bound from t = 0."""
    ffq = continuous.first_finisher_queue(extra=16, gap=0.05)
    extra = list(range(32, 48))
    st = continuous.subset_latency(simulate(ffq, H100_8B, "static", slots=32, max_wait=2.0), extra)
    b = continuous.queue_wait_bound(ffq, extra, 2000 * H100_8B.decode_step(1, 1128))
    assert b["from_arrival"] <= st["e2e_mean"]
    assert b["from_arrival"] == pytest.approx(b["from_start"] - b["mean_arrival"])


def test_step_gap_explains_the_first_finishers_small_saving():
    """Continuous batching ends 7.1's first-finisher batch only a few percent sooner: both
    runs take 2,000 steps that stream all the weights; the static batch's 31 dead rows add
    only their short caches' reads. The gap is the mean steps' ratio."""
    from batching.workloads import preset

    ff = preset("first-finisher")
    st = simulate(ff, H100_8B, "static", slots=32, max_wait=2.0)
    co = simulate(ff, H100_8B, "continuous", slots=32)
    g = continuous.step_gap(st, co)
    assert 0 < g["gap"] < 0.10 and g["cont_step_ms"] < g["static_step_ms"]
    assert g["gap"] == pytest.approx(1 - g["cont_step_ms"] / g["static_step_ms"], rel=1e-6)
    # A one-row step at the long request's mean context is about the continuous run's mean step.
    assert g["cont_step_ms"] == pytest.approx(1e3 * H100_8B.decode_step(1, 1128), rel=0.02)


def test_the_real_figure_draws_an_unstable_runs_p99_hollow_and_marks_it() -> None:
    from matplotlib.colors import to_rgba

    from batching.book import figures

    run = {"slot_util": 0.5, "e2e_p99": 2.0, "throughput_tok": 90.0}
    rs = {"real": {"static": {**run, "stable": 0.0}, "continuous": {**run, "stable": 1.0}}}
    fig = figures.continuous.real_schedulers_figure(rs)
    p99 = fig.axes[1]
    faces = [to_rgba(b.get_facecolor()) for b in p99.patches]
    assert faces[0] == to_rgba("white") and faces[1] != to_rgba("white")
    assert [t.get_text() for t in p99.texts] == ["queue grew"]
    assert not fig.axes[0].texts and not fig.axes[2].texts  # only the percentile is in doubt
