"""The numbers, verdicts and figures behind 7.2 continuous batching (batching/book/continuous.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from helpers import LinearCost, reqs

from batching.book import (
    checks,
    common,
    continuous,
    plots,
    static,
)
from batching.costs import get_cost_model
from batching.engine import SimExecutor, run
from batching.schedulers import ContinuousScheduler, StaticScheduler
from batching.workload import LogNormal, Workload, synthetic

UNIT = SimExecutor(LinearCost(1.0))
H100_8B = get_cost_model("llama-8b", "h100")
Seg = static.Segment


def small_trace(n: int = 120, rate: float = 8.0, seed: int = 3) -> Workload:
    """A long-tailed synthetic workload, small enough for unit tests."""
    return synthetic(
        n,
        rate,
        LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=800),
        seed=seed,
    )


# ------------------------------------------------------------------------------ 7.2
def test_rate_sweep_continuous_utilization_grows_with_load_and_computes_nothing_twice():
    w = small_trace(150, rate=2.0)
    cfg = {
        "static": {"scheduler": "static", "slots": 16, "timeout": 1.0},
        "continuous": {"scheduler": "continuous", "slots": 16},
    }
    sw = continuous.rate_sweep(w, H100_8B, cfg, [0.25, 1.0, 4.0, 16.0])
    c, s = sw["continuous"], sw["static"]
    np.testing.assert_allclose(c["offered_rate"], common.offered_rate(w) * np.array([0.25, 1.0, 4.0, 16.0]))
    assert np.all(np.diff(c["slot_util"]) > -0.01) and c["slot_util"][-1] > 3 * c["slot_util"][0]
    # Continuous batching (mixed prefill, no preemption) performs exactly the useful FLOPs.
    np.testing.assert_allclose(c["useful_compute"], c["hw_compute"], rtol=1e-9)
    # Static batching pads and computes dead rows: strictly more FLOPs than useful.
    assert np.all(s["useful_compute"] < s["hw_compute"])
    assert c["slot_util"][-1] > s["slot_util"][-1] and c["e2e_p99"][-1] < s["e2e_p99"][-1]
    sat = continuous.saturation(sw)
    assert sat["continuous"]["throughput_req"] == c["throughput_req"].max()


def test_iterations_equal_output_length_from_admission():
    w, probes = continuous.with_probes(small_trace(100, rate=3.0), every=5, output=20)
    assert len(probes) == 20 and all(w.output_lens[i] == 20 for i in range(0, 100, 5))
    for sched, opts in (("continuous", {}), ("static", {"timeout": 0.5})):
        res = common.simulate(w, H100_8B, sched, slots=16, **opts)
        it = continuous.iterations(res)
        np.testing.assert_array_equal(it["from_admission"], it["output_len"])
        assert np.all(it["from_arrival"] >= it["from_admission"])
    # Chunked prefill spends ceil(prompt / chunk) steps on the prompt, the last emitting token 1.
    res = common.simulate(w, H100_8B, "chunked", slots=16, token_budget=64 + 16, chunk_size=64)
    it = continuous.iterations(res)
    assert np.all(it["from_admission"] >= it["output_len"])


def test_iterations_from_arrival_by_hand():
    # Unit steps. A (arrives 0) runs alone; B arrives at 0.5 during step 1 and gets the free
    # slot at t=1: it lives through steps 2..3 plus the one in progress when it arrived.
    res = run(reqs((0, 4, 3), (0.5, 4, 2)), ContinuousScheduler(2, 64), UNIT)
    it = continuous.iterations(res)
    assert it["from_admission"].tolist() == [3, 2]
    assert it["from_arrival"].tolist() == [3, 3]  # step 1 was running when B arrived
    assert it["service"].tolist() == [3.0, 2.0]


def test_first_finisher_queue_static_makes_the_queue_wait_for_the_long_request():
    ffq = continuous.first_finisher_queue(extra=8, gap=0.05)
    assert len(ffq) == 40 and ffq.output_lens[0] == 2000
    extra = list(range(32, 40))
    st = continuous.subset_latency(common.simulate(ffq, H100_8B, "static", slots=32, timeout=1.0), extra)
    co = continuous.subset_latency(common.simulate(ffq, H100_8B, "continuous", slots=32), extra)
    step = continuous.decode_step_ms(H100_8B, 1, 128) / 1e3  # the cheapest decode step
    assert st["queue_mean"] > 1900 * step  # waited for the 2,000-token request
    # ...while continuous batching admits each one within the step in progress (at worst the
    # first batch's 4,096-token prefill step, about 65 ms on this roofline).
    assert co["e2e_mean"] < 40 * step and co["queue_mean"] < 0.1


# ------------------------------------------------------------------------------ 7.3
def test_dense_batches_counts_members_per_batch_by_hand():
    # B = 3, timeout 1 s, every step 1 s, one output token each. Three arrivals by t = 0.4
    # fill a batch; the one at t = 5 is sealed alone by its timeout at t = 6; the two at
    # t = 10 and 10.5 are sealed together at t = 11. Batches of 3, 1 and 2.
    res = run(
        reqs((0, 4, 1), (0.2, 4, 1), (0.4, 4, 1), (5, 4, 1), (10, 4, 1), (10.5, 4, 1)),
        StaticScheduler(3, 64, timeout=1.0),
        UNIT,
    )
    assert continuous.dense_batches(res) == {
        "n": 3.0,
        "mean": 2.0,
        "p50": 2.0,
        "full_share": pytest.approx(1 / 3),
    }
    with pytest.raises(ValueError):
        continuous.dense_batches(run(reqs((0, 4, 1)), ContinuousScheduler(2, 64), UNIT))


def test_batch_fill_seals_static_batches_at_the_timeout_and_skips_continuous():
    # 40 requests, one every 0.25 s (4 req/s): a 1 s timeout seals about 1 + 4 x 1 = 5
    # members (the opener plus the next four arrivals), far below the 32 slots; dynamic
    # batching (no wait) takes whatever has arrived whenever the device is free.
    w = Workload.from_arrays(0.25 * np.arange(40), [64] * 40, [4] * 40)
    fill = continuous.batch_fill(
        w,
        H100_8B,
        {
            "static": dict(scheduler="static", slots=32, timeout=1.0),
            "dynamic": dict(scheduler="dynamic", slots=32, timeout=0.0),
            "continuous": dict(scheduler="continuous", slots=32),
        },
    )
    assert set(fill) == {"static", "dynamic"}
    assert fill["static"]["timeout_expect"] == pytest.approx(1 + 40 / 9.75)
    assert fill["static"]["n"] == 8 and fill["static"]["mean"] == 5 and fill["static"]["full_share"] == 0
    assert "timeout_expect" not in fill["dynamic"] and fill["dynamic"]["mean"] < 5


def test_metric_range_names_the_lowest_and_highest_configuration():
    sweep = {
        "a": {"time_scale": np.array([1.0, 2.0]), "bw": np.array([0.7, 0.5])},
        "b": {"time_scale": np.array([1.0, 2.0]), "bw": np.array([0.6, 0.9])},
    }
    assert continuous.metric_range(sweep, "bw", 2.0) == {"lo": 0.5, "hi": 0.9, "lo_name": "a", "hi_name": "b"}
    assert continuous.metric_range(sweep, "bw", 1.0)["lo_name"] == "b"


def test_slab_text_says_whether_memory_or_the_slots_bind():
    # llama-8b on one H100: (0.9 x 80 GB - 16.06 GB of weights) / 128 KiB per token =
    # 426,784 tokens, 52 slabs of 8,192; a stub with room for 2 slabs binds before 4 slots do.
    t = continuous.slab_text(H100_8B, 32)
    assert "(8,192 tokens)" in t and "426,784 KV tokens" in t and "52 slabs, more than the 32 slots" in t
    assert 'kv_policy="slab"' in t

    class Stub:
        model = type("M", (), {"max_context": 8192})()

        def kv_capacity(self) -> float:
            return 20000.0

    t = continuous.slab_text(Stub(), 4)
    assert "only 2 slabs for 4 slots, so memory, not the slots, limits" in t


def test_capped_text_never_writes_request_s():
    assert common.capped_text(0) == "no request here"
    assert common.capped_text(1) == "1 request here"
    assert common.capped_text(1234) == "1,234 requests here"
    with pytest.raises(ValueError):
        common.capped_text(-1)


def test_hw_compute_text_names_the_scheduler_it_compares_and_where_static_sits():
    # The build's heavy load: dynamic 46%, continuous 34%, static 20% in batches of 8.2.
    hw = {"static": 0.20, "dynamic": 0.46, "continuous": 0.34}
    text = continuous.hw_compute_text(hw, 8.2, 32, 2.0)
    assert text.startswith(
        "Counting every FLOP, dynamic batching keeps the device busier than continuous "
        "batching (46% against 34%), because padding and dead rows are real FLOPs."
    )
    assert (
        "Static batching's 20% is lower because its batches are small: its 2 s timeout seals them at "
        "8.2 requests on average, of 32 slots"
    ) in text
    assert "dense batching" not in text
    assert "about as busy as continuous batching (36% against 34%)" in continuous.hw_compute_text(
        {**hw, "dynamic": 0.36}, 8.2, 32, 2.0
    )
    low = continuous.hw_compute_text({**hw, "dynamic": 0.25}, 8.2, 32, 2.0)
    assert "less busy than continuous batching (25% against 34%), even with" in low
    assert continuous.hw_compute_text({**hw, "static": 0.33}, 8.2, 32, 2.0).endswith(
        "Static batching keeps it at 33%."
    )


def test_bend_text_finds_where_a_static_curve_bends_back():
    sweep = {
        "static": {"time_scale": np.array([0.5, 1.0, 2.0]), "e2e_p99": np.array([10.0, 900.0, 400.0])},
        "continuous": {"time_scale": np.array([0.5, 1.0, 2.0]), "e2e_p99": np.array([1.0, 2.0, 30.0])},
    }
    assert continuous.bend_text(sweep, "static", 2.0) == (
        "The static curve bends back: past 1x its latency falls as the load rises (900 s to 400 s at p99 "
        "by 2x), because faster arrivals fill more of each batch before its 2 s timeout seals it."
    )
    assert (
        continuous.bend_text(sweep, "continuous", 2.0)
        == "The continuous curve rises with the load over the whole sweep."
    )


# ----------------------------------------------------------------- glue and workloads
def test_trace_slices_need_no_dense_capping():
    # Request 1 fits the context alone (8000 + 100) but not padded to 8000 beside a
    # 1,000-token output: the static scheduler runs it in a batch of its own, uncapped.
    w = Workload.from_arrays([0, 0], [50, 8000], [1000, 100])
    capped, n = common.fit_context(w, 8192)
    assert n == 0 and capped.info["capped"]["n_capped"] == 0
    res = common.simulate(capped, H100_8B, "static", slots=2, kv_tokens=None)
    assert all(r.done for r in res.requests)
    assert res.requests[1].admit_time > res.requests[0].admit_time


def test_latency_figure_plots_requests_per_second_and_labels_replay_speeds_without_overlap():
    plots.style()
    a = {
        "time_scale": np.array([0.5, 1.0, 2.0]),
        "throughput_req": np.array([0.5, 1.0, 1.2]),
        "e2e_p50": np.array([1.0, 2.0, 50.0]),
        "e2e_p99": np.array([2.0, 4.0, 90.0]),
    }
    b = {
        **a,
        "throughput_req": a["throughput_req"] + 1e-3,
        "e2e_p50": a["e2e_p50"] * 1.01,
        "e2e_p99": a["e2e_p99"] * 1.01,
    }  # b sits on a: its labels would cover a's
    fig = plots.latency_throughput_figure({"static": a, "dynamic": b}, label_scales=[0.5, 2.0])
    ax0 = fig.axes[0]
    assert ax0.get_xlabel() == "achieved throughput (requests/s)"
    assert np.allclose(ax0.lines[0].get_xdata(), [0.5, 1.0, 1.2])
    texts = [t.get_text() for t in ax0.texts]
    assert "1x" not in texts and texts.count("0.5x") == 1 and texts.count("2x") == 1  # b's copies dropped
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for ax in fig.axes for t in ax.texts]
    assert not any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1 :])
    matplotlib.pyplot.close(fig)


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
        assert p["tokens_real"] == 30 + 25
    assert cc["per"]["continuous"]["steps_real"] < cc["per"]["static"]["steps_real"]
    assert "agree exactly" in checks.crosscheck_text(cc)
    header, rows = checks.crosscheck_rows(cc)
    assert len(rows) == 2 and len(header) == len(rows[0])
