"""The numbers, verdicts and figures behind 7.1 static batching (batching/book/static.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
from helpers import H100_8B, UNIT, _texts, reqs, small_trace

from batching.book import common, figures, plots, static
from batching.engine import run
from batching.schedulers import ContinuousScheduler, StaticScheduler
from batching.simulate import simulate
from batching.steplog import Segment
from batching.workloads import Workload, preset

Seg = Segment


# ------------------------------------------------------------------------- timelines
def test_timeline_of_a_hand_made_static_run_has_exactly_the_expected_cells():
    # A wants 3 tokens from a 2-token prompt, B 1 token from a 4-token prompt; every step
    # costs 1 s. Step 1 prefills both (A padded by 2) and finishes B; steps 2-3 decode A
    # while B's row is dead. The fast path logs steps 2-3 as one row.
    res = run(reqs((0, 2, 3), (0, 4, 1)), StaticScheduler(2, 64), UNIT, record_slots=True)
    assert res.log.timeline() == [
        Seg(0, 0, "prefill", 0.0, 0.5, 1),
        Seg(0, 0, "padding", 0.5, 1.0, 1),
        Seg(0, 0, "decode", 1.0, 3.0, 2),
        Seg(1, 1, "prefill", 0.0, 1.0, 1),
        Seg(1, 1, "dead", 1.0, 3.0, 2),
    ]


def test_timeline_shows_idle_rows_and_idle_gaps_under_continuous_batching():
    # One slot free from t=2 until B arrives at t=4: slot 1 idle after A, both idle in the gap.
    res = run(reqs((0, 4, 2), (0, 4, 1), (4, 4, 1)), ContinuousScheduler(2, 64), UNIT, record_slots=True)
    tl = res.log.timeline()
    assert Seg(1, 1, "prefill", 0.0, 1.0, 1) in tl
    assert Seg(0, 0, "decode", 1.0, 2.0, 1) in tl and Seg(1, None, "idle", 1.0, 5.0, 2) in tl
    assert Seg(0, None, "idle", 2.0, 4.0, 0) in tl  # the engine waited for an arrival
    assert Seg(0, 2, "prefill", 4.0, 5.0, 1) in tl
    assert not [s for s in tl if s.kind == "dead"]
    # Segments of one slot tile time without gaps or overlaps.
    for slot in (0, 1):
        segs = [s for s in tl if s.slot == slot]
        assert all(math.isclose(a.t1, b.t0) for a, b in zip(segs, segs[1:]))


def test_first_finisher_static_wastes_31_rows_for_1980_steps():
    res = simulate(preset("first-finisher"), H100_8B, "static", slots=32, kv_tokens=None, record_slots=True)
    s = static.first_finisher_summary(res)
    assert s["after_first_fraction"] > 0.98
    dead = [seg for seg in res.log.timeline() if seg.kind == "dead"]
    assert len(dead) == 31 and all(seg.steps == 1980 for seg in dead)
    assert all(seg.t0 == pytest.approx(s["first_finish_s"]) for seg in dead)  # the short ones end together
    # Under continuous batching the same rows are idle, not dead.
    cont = simulate(
        preset("first-finisher"), H100_8B, "continuous", slots=32, record_slots=True
    ).log.timeline()
    assert not [seg for seg in cont if seg.kind == "dead"]
    assert sum(seg.steps for seg in cont if seg.kind == "idle") == 31 * 1980


def test_timeline_needs_a_recorded_run():
    res = run(reqs((0, 2, 2)), StaticScheduler(1, 64), UNIT)
    with pytest.raises(ValueError, match="record_slots=True"):
        res.log.timeline()


# ------------------------------------------------------------------------------ 7.1
def test_padding_cost_of_the_padding_pair():
    pc = static.padding_cost(H100_8B)
    # A 50-token prefill is memory-bound on an H100, so padding costs far less time than FLOPs.
    assert (pc["bound_short"], pc["bound_padded"]) == ("memory", "compute")
    assert 5 < pc["time_ratio_short"] < pc["long"] / pc["short"] == 80
    assert 1.8 < pc["t_batch_padded"] / pc["t_batch_unpadded"] < 2.0
    with pytest.raises(ValueError):
        static.padding_cost(H100_8B, short=100, long=50)


def test_static_batch_sweep_matches_the_analytic_formula_and_falls_with_batch_size():
    w = small_trace(128)
    sweep = static.static_batch_sweep(w, H100_8B, [1, 2, 4, 8, 16, 32])
    np.testing.assert_allclose(sweep["slot_util"], sweep["analytic"], rtol=1e-12)
    assert sweep["slot_util"][0] == 1.0
    # Doubling B merges pairs of batches: each merged maximum is at least both old ones, so
    # utilization cannot rise and padding cannot fall.
    assert np.all(np.diff(sweep["analytic"]) <= 1e-12) and sweep["analytic"][-1] < 0.5
    assert np.all(np.diff(sweep["padding_fraction"]) >= -1e-12)


def test_analytic_static_utilization_by_hand():
    assert static.analytic_static_utilization([20, 2000], 2) == pytest.approx(2020 / 4000)
    # Batches [1, 3] and [2, 2] (last one full), then a partial batch [4] still taking 2 slots.
    assert static.analytic_static_utilization([1, 3, 2, 2, 4], 2) == pytest.approx(12 / (2 * (3 + 2 + 4)))
    with pytest.raises(ValueError):
        static.analytic_static_utilization([], 4)


def test_wait_sweep_trades_queueing_for_fuller_batches():
    w = small_trace(160, rate=4.0)
    waits = [0.0, 0.5, 2.0, 8.0]
    sw = static.wait_sweep(w, H100_8B, waits, slots=8)
    for name in ("static", "dynamic"):
        d = sw[name]
        assert np.all(d["mean_batch"] <= 8) and np.all(d["mean_batch"] >= 1), name
    st, dy = sw["static"], sw["dynamic"]
    # Timeout 0: every request is sealed alone, one kept token per step in 8 slots.
    assert st["mean_batch"][0] == 1 and st["slot_util"][0] == pytest.approx(1 / 8)
    assert st["slot_util"][-1] > 2 * st["slot_util"][0]
    assert np.all(np.diff(st["mean_batch"]) >= 0)  # longer timeout, fuller batches
    assert dy["mean_batch"][0] > st["mean_batch"][0]  # dynamic fills batches from the queue
    assert dy["queue_mean"][-1] >= dy["queue_mean"][0]  # waiting longer on purpose costs delay
    # One request per batch cannot keep up with 4 requests/s: that queue grows over the replay
    # (its delay is no value); dynamic batching's does not.
    assert st["stable"][0] == 0 and np.all(st["stable"][1:] == 1) and np.all(dy["stable"] == 1)


def test_timeline_panels_share_the_time_axis_on_request():
    short = [Seg(0, 0, "decode", 0.0, 2.0, 2)]
    long = [Seg(0, 0, "decode", 0.0, 5.0, 5)]
    fig = figures.static.timeline_figure([("a", short), ("b", long)])
    assert [ax.get_xlim()[1] for ax in fig.axes] == [2.0, 5.0]
    fig = figures.static.timeline_figure([("a", short), ("b", long)], sharex=True)
    assert [ax.get_xlim()[1] for ax in fig.axes] == [5.0, 5.0]
    matplotlib.pyplot.close("all")


@pytest.mark.model
def test_real_padding_runs_the_padding_and_reports_its_measured_cost():
    pytest.importorskip("torch")
    rp = static.real_padding(model="tiny", device="cpu", short=8, long=40, reps=2, threads=1)
    # The static run's one step prefilled 8 + 40 prompt tokens and 32 padding positions.
    assert rp["pad_tokens"] == 32 and rp["padding_fraction"] == pytest.approx(32 / 80)
    assert rp["token_ratio"] == 5 and rp["positions_ratio"] == pytest.approx(80 / 48)
    assert rp["reps"] == 2 and rp["model"] == "tiny"
    for k in ("padded_ms", "packed_ms", "short_ms", "long_ms"):
        assert math.isfinite(rp[k]) and rp[k] > 0, k
    assert rp["time_ratio_short"] == pytest.approx(rp["long_ms"] / rp["short_ms"])
    assert rp["time_ratio_batch"] == pytest.approx(rp["padded_ms"] / rp["packed_ms"])
    per = static.per_position_ms(rp)
    assert per["padded"] == pytest.approx(rp["padded_ms"] / 80)
    assert per["packed"] == pytest.approx(rp["packed_ms"] / 48)
    assert rp["executor"]["model"] == "tiny" and rp["executor"]["device"] == "cpu"
    assert rp["cpus"] >= 1 and isinstance(rp["busy"], bool)
    assert rp["busy"] == (rp["load"] > rp["cpus"])  # nan (no load average) is never busy
    for bad, field in (
        (dict(short=0), "short=0"),
        (dict(short=40, long=40), "long=40"),
        (dict(reps=0), "reps=0"),
    ):
        with pytest.raises(ValueError, match=field):
            static.real_padding(model="tiny", device="cpu", **{"short": 8, "long": 40, **bad})


# ------------------------------------------- review fixes: why.ipynb and static.ipynb
def test_static_batch_sizes_close_a_batch_early_at_the_context_by_hand():
    # B = 3, context 100: request 2 (prompt 60) cannot join [10/50, 10/5] (60 + 50 > 100),
    # so that batch closes at 2; [60/5, 10/5, 10/5] is full; the last request is alone.
    prompts, outputs = [10, 10, 60, 10, 10, 10], [50, 5, 5, 5, 5, 5]
    assert static.static_batch_sizes(prompts, outputs, 3, 100) == [2, 3, 1]
    assert static.static_batch_sizes(prompts, outputs, 3, 10_000) == [3, 3]
    # Over the batches formed: maxima 50, 5, 5; full batches [50, 5, 5], [5, 5, 5]: 50, 5.
    assert static.analytic_static_utilization(outputs, 3, [2, 3, 1]) == pytest.approx(75 / (3 * 60))
    assert static.analytic_static_utilization(outputs, 3) == pytest.approx(75 / (3 * 55))
    with pytest.raises(ValueError):
        static.analytic_static_utilization(outputs, 3, [3, 2])  # does not cover the requests
    with pytest.raises(ValueError):
        static.static_batch_sizes([1, 2], [1], 2, 100)


def _long_prompt_trace() -> Workload:
    """small_trace with a few prompts so long that no other long output fits beside them
    in llama-8b's 8,192-token context: the static scheduler closes batches early there."""
    w = small_trace(128)
    p, o = np.array(w.prompt_lens), np.array(w.output_lens)
    p[[10, 50, 90]], o[[10, 50, 90]] = 7800, 10  # each fits alone ...
    o[[11, 51, 91]] = 500  # ... but not beside the next request
    return Workload.from_arrays(np.zeros(len(w)), p, o, name="long prompts")


def test_static_sweep_equals_the_formula_over_the_batches_the_scheduler_forms():
    sweep = static.static_batch_sweep(_long_prompt_trace(), H100_8B, [1, 4, 16, 32])
    np.testing.assert_allclose(sweep["slot_util"], sweep["analytic_formed"], rtol=1e-12)
    assert np.any(np.abs(sweep["slot_util"] - sweep["analytic"]) > 1e-6)
    ag = static.sweep_agreement(sweep)
    assert not ag["equal"] and ag["formed_equal"] and ag["max_gap"] > 1e-6
    assert ag["max_gap"] == pytest.approx(np.abs(sweep["slot_util"] - sweep["analytic"]).max())
    plain = static.static_batch_sweep(small_trace(128), H100_8B, [1, 4, 16])
    ag = static.sweep_agreement(plain)
    assert ag["equal"] and ag["formed_equal"]


def test_sweep_agreement_by_hand():
    sweep = {
        "batch": np.array([1.0, 2.0, 4.0]),
        "slot_util": np.array([1.0, 0.50, 0.30]),
        "analytic": np.array([1.0, 0.52, 0.30]),
        "analytic_formed": np.array([1.0, 0.50, 0.30]),
    }
    ag = static.sweep_agreement(sweep)
    assert ag == {
        "equal": False,
        "max_gap": pytest.approx(0.02),
        "formed_equal": True,
    }


def _wait_sweep_by_hand() -> dict:
    waits = np.array([0.0, 1.0, 8.0, 16.0])
    return {
        "static": {
            "wait": waits,
            "queue_mean": np.array([800.0, 200.0, 4.3, 6.3]),
            "slot_util": np.array([0.03, 0.07, 0.30, 0.45]),
        },
        "dynamic": {
            "wait": waits,
            "queue_mean": np.array([1.6, 1.6, 4.2, 6.3]),
            "slot_util": np.array([0.12, 0.13, 0.31, 0.45]),
        },
    }


def test_wait_summary_says_where_dynamic_batching_helps_by_hand():
    ws = _wait_sweep_by_hand()
    s = static.wait_summary(ws, rate=2.35, batch=32, ceiling=0.46)
    assert s["fill_s"] == pytest.approx(32 / 2.35) and s["converge_wait"] == 8.0
    # At T = 0 dynamic queues 1.6 s against 800 s and fills 12% of its slots against 3%.
    assert s["ahead"] is True and s["below_ceiling"] is True
    assert "below_ceiling" not in static.wait_summary(ws, rate=2.35, batch=32)
    # The best point of either sweep is 0.45: at the ceiling counts as below it, 0.40 does not.
    assert static.wait_summary(ws, rate=2.35, batch=32, ceiling=0.45)["below_ceiling"] is True
    assert static.wait_summary(ws, rate=2.35, batch=32, ceiling=0.40)["below_ceiling"] is False
    # Static ahead at the shortest timeout: dynamic is not "ahead".
    behind = {**ws, "dynamic": {**ws["dynamic"], "queue_mean": np.array([900.0, 1.6, 4.2, 6.3])}}
    assert static.wait_summary(behind, rate=2.35, batch=32)["ahead"] is False
    # A later point that disagrees again: no convergence "from T on".
    ws["dynamic"]["queue_mean"][-1] = 3.0
    s2 = static.wait_summary(ws, rate=2.35, batch=32)
    assert s2["converge_wait"] == -1.0
    with pytest.raises(ValueError):
        static.wait_summary(ws, rate=0.0, batch=32)


def test_scaling_verdict_on_padding_by_hand():
    S = common.Versus
    # The H100 roofline: 80x the positions in 12.8x the time (a 50-token prefill is memory-bound).
    assert static.scaling(12.75, 80.0) is S.LESS
    # The committed CPU run: 35.2x the time for 40x the positions (88% per position), and the
    # padded pair 2.07x the packed one for 1.95x the positions: both in proportion.
    assert static.scaling(35.2, 40.0) is S.SAME
    assert static.scaling(2.074, 4000 / 2050) is S.SAME
    # The thresholds, on time per position: within 25% is proportional.
    assert static.scaling(0.76, 1.0) is S.SAME and static.scaling(0.74, 1.0) is S.LESS
    assert static.scaling(1.24, 1.0) is S.SAME and static.scaling(1.26, 1.0) is S.MORE
    assert static.scaling(1.05, 1.0, tol=0.03) is S.MORE
    assert S.LESS.value == "less"  # the label a notebook may glue
    for bad in ((0.0, 1.0), (1.0, -2.0), (1.0, 1.0, 1.0)):
        with pytest.raises(ValueError):
            static.scaling(*bad)


def test_per_position_ms_by_hand():
    rp = dict(short=50.0, long=2000.0, short_ms=35.0, long_ms=1200.0, packed_ms=1230.0, padded_ms=2400.0)
    assert static.per_position_ms(rp) == pytest.approx(
        {"short": 0.7, "long": 0.6, "packed": 0.6, "padded": 0.6}
    )


def test_real_padding_figure_draws_the_four_measured_steps():
    plots.style()
    rp = dict(short=50.0, long=2000.0, short_ms=35.2, long_ms=1238.0, packed_ms=1169.4, padded_ms=2425.4)
    fig = figures.static.real_padding_figure(rp)
    ax = fig.axes[0]
    assert [round(p.get_width(), 1) for p in ax.patches] == [35.2, 1238.0, 1169.4, 2425.4]
    assert set(_texts(ax)) == {" 35.2 ms", " 1,238 ms", " 1,169 ms", " 2,425 ms"}
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels[0].endswith("50 positions") and labels[3].endswith("4,000 positions")
    matplotlib.pyplot.close(fig)


def test_wait_figure_labels_every_point_even_where_they_bunch():
    plots.style()
    ws = _wait_sweep_by_hand()
    ws["dynamic"]["queue_mean"] = np.array([1.59, 1.60, 4.2, 6.3])  # 0 and 1 s on one spot
    fig = figures.static.wait_figure(ws, ceiling=0.46)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = _texts(ax)
    assert "0, 1" in texts  # one label for the bunch
    for t in ax.texts:  # none cut off by the axes
        assert ax.get_window_extent().contains(*t.get_window_extent(r).p0), t.get_text()
        assert ax.get_window_extent().contains(*t.get_window_extent(r).p1), t.get_text()
    # The dynamic T = 16 point sits at 45%, just under the 46% ceiling: its label (above its
    # point by default) must not sit on the dashed line, nor may any other.
    y_line = ax.transData.transform((1.0, 0.46))[1]
    for t in ax.texts:
        if t.get_text().startswith("full batches"):  # the line's own label, on it
            continue
        box = t.get_window_extent(r)
        clear = figures.static.WAIT_LABEL_CLEAR_PX
        assert not box.y0 - clear <= y_line <= box.y1 + clear, t.get_text()
    sixteen = [
        t for t in ax.texts if t.get_text() == "16" and t.get_color() == plots.SCHEDULER_COLORS["dynamic"]
    ]
    assert len(sixteen) == 1 and sixteen[0].get_window_extent(r).y0 > y_line
    matplotlib.pyplot.close(fig)


# ------------------------------------------------------------ slot waste, the tail, the CPU context
def _sweep(util: dict[int, float]) -> dict[str, np.ndarray]:
    return {"batch": np.array(list(util), dtype=float), "slot_util": np.array(list(util.values()))}


def test_slot_waste_by_hand():
    # The Azure conversation trace's shape: B = 16 wastes just under half, B = 128 most.
    trace = {1: 1.0, 8: 0.551, 16: 0.504, 32: 0.454, 128: 0.359}
    sw = static.slot_waste(_sweep(trace))
    assert sw["waste_small"] == pytest.approx(0.496) and sw["waste_large"] == pytest.approx(0.641)
    assert sw["from_batch"] == 32 and sw["verdict"] is common.Claim.PARTLY
    # Over half wasted at both sizes, more at the larger: the claim holds, from B = 16 on.
    sw = static.slot_waste(_sweep({**trace, 16: 0.45}))
    assert sw["verdict"] is common.Claim.HOLDS and sw["from_batch"] == 16
    # Half or less wasted at the largest size: it does not hold, and no B wastes most from there on.
    sw = static.slot_waste(_sweep({**trace, 128: 0.5}))
    assert sw["verdict"] is common.Claim.DOES_NOT_HOLD and sw["from_batch"] == -1
    # Most wasted at both, but less at the larger: only in part ("more as B grows" fails).
    assert static.slot_waste(_sweep({**trace, 16: 0.3, 128: 0.4}))["verdict"] is common.Claim.PARTLY
    # A gap in the run of "most": from_batch is where the run to the largest B starts.
    assert static.slot_waste(_sweep({1: 1.0, 4: 0.4, 8: 0.6, 16: 0.45, 128: 0.3}))["from_batch"] == 16
    with pytest.raises(ValueError, match="in the sweep"):
        static.slot_waste(_sweep(trace), small=64)
    with pytest.raises(ValueError):
        static.slot_waste(_sweep(trace), most=1.0)


def test_batch_durations_by_hand():
    # One slot, every step 1 s: A's batch runs 3 steps (0-3 s), B's 1 step (3-4 s); C arrives
    # at 10 s, after an idle gap that belongs to no batch.
    res = run(reqs((0, 2, 3), (0, 4, 1), (10, 2, 2)), StaticScheduler(1, 64), UNIT)
    np.testing.assert_allclose(static.batch_durations(res), [3.0, 1.0, 2.0])
    # Both in one batch of two: the batch lasts as long as its longest member.
    res = run(reqs((0, 2, 3), (0, 4, 1)), StaticScheduler(2, 64), UNIT)
    np.testing.assert_allclose(static.batch_durations(res), [3.0])


def test_tail_verdict_by_hand():
    n = {"dy_throughput_tok": 622.0, "cm_throughput_tok": 623.0, "dy_ttft_p99": 6.2, "cm_ttft_p99": 0.067}
    n = {**n, "dy_stable": 1.0, "cm_stable": 1.0}
    assert static.tail_verdict(n) is common.Claim.HOLDS
    # The tails far apart, but the means too (6% apart): in part.
    assert static.tail_verdict({**n, "dy_throughput_tok": 585.0}) is common.Claim.PARTLY
    assert static.tail_verdict({**n, "dy_throughput_tok": 585.0}, tol=0.07) is common.Claim.HOLDS
    # Tails within 3x of each other: the claim does not hold.
    assert static.tail_verdict({**n, "dy_ttft_p99": 0.2}) is common.Claim.DOES_NOT_HOLD
    assert static.tail_verdict({**n, "dy_ttft_p99": 0.2}, factor=2.5) is common.Claim.HOLDS
    # A queue that grew over the replay has no tail to judge.
    assert static.tail_verdict({**n, "dy_stable": 0.0}) is None
    with pytest.raises(ValueError):
        static.tail_verdict(n, factor=1.0)


def test_dynamic_batching_keeps_up_while_its_tail_waits_for_the_longest_member():
    n = static.tail_numbers(small_trace(160, rate=2.0), H100_8B, slots=8)
    assert n["dy_stable"] == n["cm_stable"] == 1.0
    # Both keep up with the offered load, so they serve the same tokens per second...
    assert n["dy_throughput_tok"] == pytest.approx(n["cm_throughput_tok"], rel=0.02)
    # ...while a newcomer under dynamic batching waits for the running batch: its p99 TTFT is
    # of the order of the longest batches, far above continuous batching's.
    assert n["dy_ttft_p99"] > 20 * n["cm_ttft_p99"]
    assert n["batch_p50_s"] < n["batch_p99_s"] <= n["batch_max_s"]
    assert 0.5 * n["batch_p99_s"] < n["dy_ttft_p99"] < 2 * n["batch_max_s"]
    assert static.tail_verdict(n) is common.Claim.HOLDS


def test_real_context_is_the_registry_models_context():
    # cpu-s's 2,048 tokens are why the CPU pads to 2,000 rather than the page's 4,000.
    assert static.real_context({"model": "cpu-s"}) == 2048
    assert static.REAL_PADDING_LONG["cpu"] < static.real_context({"model": "cpu-s"})
    assert static.REAL_PADDING_LONG["cuda"] == 4000 <= static.real_context({"model": "llama-1b"})


def test_tail_rows_by_hand():
    n = {"dy_throughput_tok": 622.1, "dy_ttft_p50": 1.786, "dy_ttft_p99": 6.202}
    n = {**n, "cm_throughput_tok": 1622.8, "cm_ttft_p50": 0.01753, "cm_ttft_p99": 0.06745}
    assert static.tail_rows(n) == [
        ["dynamic, max_wait 0 s", "622", "6.2"],
        ["continuous", "1,623", "0.0674"],
    ]
    assert len(static.TAIL_HEADER) == 3
