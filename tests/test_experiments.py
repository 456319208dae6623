"""The experiment functions behind chapter 7's notebooks (batching/experiments.py) and
their figures (batching/plots.py): hand-computed cases, and sweeps that must move the way
theory says they do."""
from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np  # noqa: E402
import pytest  # noqa: E402

from batching import experiments as E  # noqa: E402
from batching import plots  # noqa: E402
from batching.costs import get_cost_model  # noqa: E402
from batching.engine import SimExecutor, run  # noqa: E402
from batching.schedulers import ContinuousScheduler, StaticScheduler  # noqa: E402
from batching.workload import LogNormal, Workload, preset, synthetic  # noqa: E402
from helpers import LinearCost, reqs  # noqa: E402

UNIT = SimExecutor(LinearCost(1.0))
H100_8B = get_cost_model("llama-8b", "h100")
Seg = E.Segment


def small_trace(n: int = 120, rate: float = 8.0, seed: int = 3) -> Workload:
    """A long-tailed synthetic workload, small enough for unit tests."""
    return synthetic(n, rate, LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
                     LogNormal(median=60, sigma=1.0, lo=2, hi=800), seed=seed)


# ------------------------------------------------------------------------- timelines
def test_timeline_of_a_hand_made_static_run_has_exactly_the_expected_cells():
    # A wants 3 tokens from a 2-token prompt, B 1 token from a 4-token prompt; every step
    # costs 1 s. Step 1 prefills both (A padded by 2) and finishes B; steps 2-3 decode A
    # while B's row is dead. The fast path logs steps 2-3 as one row.
    res = run(reqs((0, 2, 3), (0, 4, 1)), StaticScheduler(2, 64), UNIT, record_slots=True)
    assert E.timeline(res) == [
        Seg(0, 0, "prefill", 0.0, 0.5, 1), Seg(0, 0, "padding", 0.5, 1.0, 1), Seg(0, 0, "decode", 1.0, 3.0, 2),
        Seg(1, 1, "prefill", 0.0, 1.0, 1), Seg(1, 1, "dead", 1.0, 3.0, 2),
    ]
    assert E.slot_steps(res) == {"prefill": 2, "decode": 2, "dead": 2, "idle": 0, "total": 6, "padded_rows": 1}


def test_timeline_shows_idle_rows_and_idle_gaps_under_continuous_batching():
    # One slot free from t=2 until B arrives at t=4: slot 1 idle after A, both idle in the gap.
    res = run(reqs((0, 4, 2), (0, 4, 1), (4, 4, 1)), ContinuousScheduler(2, 64), UNIT, record_slots=True)
    tl = E.timeline(res)
    assert Seg(1, 1, "prefill", 0.0, 1.0, 1) in tl
    assert Seg(0, 0, "decode", 1.0, 2.0, 1) in tl and Seg(1, None, "idle", 1.0, 5.0, 2) in tl
    assert Seg(0, None, "idle", 2.0, 4.0, 0) in tl        # the engine waited for an arrival
    assert Seg(0, 2, "prefill", 4.0, 5.0, 1) in tl
    assert not [s for s in tl if s.kind == "dead"]
    # Segments of one slot tile time without gaps or overlaps.
    for slot in (0, 1):
        segs = [s for s in tl if s.slot == slot]
        assert all(math.isclose(a.t1, b.t0) for a, b in zip(segs, segs[1:]))


def test_first_finisher_static_wastes_31_rows_for_1980_steps():
    res = E.simulate(preset("first-finisher"), H100_8B, "static", slots=32, kv_tokens=None, record_slots=True)
    s = E.first_finisher_summary(res)
    assert s["dead"] == 31 * 1980 and s["total"] == 32 * 2000
    assert s["prefill"] + s["decode"] == 32 + (1999 + 31 * 19)
    assert s["after_first_fraction"] > 0.98
    dead = [seg for seg in E.timeline(res) if seg.kind == "dead"]
    assert len(dead) == 31 and all(seg.steps == 1980 for seg in dead)
    # Under continuous batching the same rows are idle, not dead.
    cont = E.first_finisher_summary(E.simulate(preset("first-finisher"), H100_8B, "continuous", slots=32,
                                               record_slots=True))
    assert cont["dead"] == 0 and cont["idle"] == 31 * 1980


def test_timeline_needs_a_recorded_run():
    res = run(reqs((0, 2, 2)), StaticScheduler(1, 64), UNIT)
    with pytest.raises(ValueError, match="record_slots=True"):
        E.timeline(res)


# ------------------------------------------------------------------------------ 7.1
def test_padding_cost_of_the_padding_pair():
    pc = E.padding_cost(H100_8B)
    assert pc["pad_tokens"] == 3950 and pc["prefill_computed"] == 8000 and pc["prefill_needed"] == 4050
    assert pc["padding_fraction"] == pytest.approx(3950 / 8000)
    assert pc["token_ratio"] == 80 and pc["flop_ratio"] > 80          # attention is quadratic
    assert pc["t_batch_sim"] == pc["t_batch_padded"]                    # the scheduler pads as counted
    # A 50-token prefill is memory-bound on an H100, so padding costs far less time than FLOPs.
    assert (pc["bound_short"], pc["bound_padded"]) == ("memory", "compute")
    assert 5 < pc["time_ratio_short"] < pc["token_ratio"]
    assert 1.8 < pc["time_ratio_batch"] < 2.0
    with pytest.raises(ValueError):
        E.padding_cost(H100_8B, short=100, long=50)


def test_static_batch_sweep_matches_the_analytic_formula_and_falls_with_batch_size():
    w = small_trace(128)
    sweep = E.static_batch_sweep(w, H100_8B, [1, 2, 4, 8, 16, 32])
    np.testing.assert_allclose(sweep["slot_util"], sweep["analytic"], rtol=1e-12)
    assert sweep["slot_util"][0] == 1.0
    # Doubling B merges pairs of batches: each merged maximum is at least both old ones, so
    # utilization cannot rise and padding cannot fall.
    assert np.all(np.diff(sweep["analytic"]) <= 1e-12) and sweep["analytic"][-1] < 0.5
    assert np.all(np.diff(sweep["padding_fraction"]) >= -1e-12)
    assert np.all(sweep["useful_compute"] <= sweep["hw_compute"] + 1e-12)


def test_analytic_static_utilization_by_hand():
    assert E.analytic_static_utilization([20, 2000], 2) == pytest.approx(2020 / 4000)
    # Batches [1, 3] and [2, 2] (last one full), then a partial batch [4] still taking 2 slots.
    assert E.analytic_static_utilization([1, 3, 2, 2, 4], 2) == pytest.approx(12 / (2 * (3 + 2 + 4)))
    with pytest.raises(ValueError):
        E.analytic_static_utilization([], 4)


def test_wait_sweep_trades_queueing_for_fuller_batches():
    w = small_trace(160, rate=4.0)
    waits = [0.0, 0.5, 2.0, 8.0]
    sw = E.wait_sweep(w, H100_8B, waits, slots=8)
    for name in ("static", "dynamic"):
        d = sw[name]
        assert np.all(d["mean_batch"] <= 8) and np.all(d["mean_batch"] >= 1), name
    st, dy = sw["static"], sw["dynamic"]
    # Timeout 0: every request is sealed alone, one kept token per step in 8 slots.
    assert st["mean_batch"][0] == 1 and st["slot_util"][0] == pytest.approx(1 / 8)
    assert st["slot_util"][-1] > 2 * st["slot_util"][0]
    assert np.all(np.diff(st["mean_batch"]) >= 0)        # longer timeout, fuller batches
    assert dy["mean_batch"][0] > st["mean_batch"][0]     # dynamic fills batches from the queue
    assert dy["queue_mean"][-1] >= dy["queue_mean"][0]   # waiting longer on purpose costs delay


# ------------------------------------------------------------------------------ 7.2
def test_rate_sweep_continuous_utilization_grows_with_load_and_computes_nothing_twice():
    w = small_trace(150, rate=2.0)
    cfg = {"static": {"scheduler": "static", "slots": 16, "timeout": 1.0},
           "continuous": {"scheduler": "continuous", "slots": 16}}
    sw = E.rate_sweep(w, H100_8B, cfg, [0.25, 1.0, 4.0, 16.0])
    c, s = sw["continuous"], sw["static"]
    np.testing.assert_allclose(c["offered_rate"], E.offered_rate(w) * np.array([0.25, 1.0, 4.0, 16.0]))
    assert np.all(np.diff(c["slot_util"]) > -0.01) and c["slot_util"][-1] > 3 * c["slot_util"][0]
    # Continuous batching (mixed prefill, no preemption) performs exactly the useful FLOPs.
    np.testing.assert_allclose(c["useful_compute"], c["hw_compute"], rtol=1e-9)
    # Static batching pads and computes dead rows: strictly more FLOPs than useful.
    assert np.all(s["useful_compute"] < s["hw_compute"])
    assert c["slot_util"][-1] > s["slot_util"][-1] and c["e2e_p99"][-1] < s["e2e_p99"][-1]
    sat = E.saturation(sw)
    assert sat["continuous"]["throughput_req"] == c["throughput_req"].max()


def test_iterations_equal_output_length_from_admission():
    w, probes = E.with_probes(small_trace(100, rate=3.0), every=5, output=20)
    assert len(probes) == 20 and all(w.output_lens[i] == 20 for i in range(0, 100, 5))
    for sched, opts in (("continuous", {}), ("static", {"timeout": 0.5})):
        res = E.simulate(w, H100_8B, sched, slots=16, **opts)
        it = E.iterations(res)
        np.testing.assert_array_equal(it["from_admission"], it["output_len"])
        assert np.all(it["from_arrival"] >= it["from_admission"])
    # Chunked prefill spends ceil(prompt / chunk) steps on the prompt, the last emitting token 1.
    res = E.simulate(w, H100_8B, "chunked", slots=16, token_budget=64 + 16, chunk_size=64)
    it = E.iterations(res)
    assert np.all(it["from_admission"] >= it["output_len"])


def test_iterations_from_arrival_by_hand():
    # Unit steps. A (arrives 0) runs alone; B arrives at 0.5 during step 1 and gets the free
    # slot at t=1: it lives through steps 2..3 plus the one in progress when it arrived.
    res = run(reqs((0, 4, 3), (0.5, 4, 2)), ContinuousScheduler(2, 64), UNIT)
    it = E.iterations(res)
    assert it["from_admission"].tolist() == [3, 2]
    assert it["from_arrival"].tolist() == [3, 3]          # step 1 was running when B arrived
    assert it["service"].tolist() == [3.0, 2.0]


def test_first_finisher_queue_static_makes_the_queue_wait_for_the_long_request():
    ffq = E.first_finisher_queue(extra=8, gap=0.05)
    assert len(ffq) == 40 and ffq.output_lens[0] == 2000
    extra = list(range(32, 40))
    st = E.subset_latency(E.simulate(ffq, H100_8B, "static", slots=32, timeout=1.0), extra)
    co = E.subset_latency(E.simulate(ffq, H100_8B, "continuous", slots=32), extra)
    step = E.decode_step_ms(H100_8B, 1, 128) / 1e3          # the cheapest decode step
    assert st["queue_mean"] > 1900 * step                   # waited for the 2,000-token request
    # ...while continuous batching admits each one within the step in progress (at worst the
    # first batch's 4,096-token prefill step, about 65 ms on this roofline).
    assert co["e2e_mean"] < 40 * step and co["queue_mean"] < 0.1


# ------------------------------------------------------------------------------ 7.3
def test_itl_spike_without_chunks_and_none_with_them():
    w = E.long_prompt_among_decodes(running=30, prompt=4000, at=0.5)
    cfg = {"mix": ("mixed", "continuous", {}),
           "chk": ("chunked", "chunked", {"token_budget": 512 + 32, "chunk_size": 512})}
    st = E.stall_runs(w, H100_8B, cfg, running=range(30), newcomer=30, slots=32)
    n = st["numbers"]
    rf = E.stall_numbers(H100_8B, 512, 4000, decodes=30)
    assert n["mix_steps_over_2x"] == 1 and n["mix_stall"] > 8
    assert n["mix_itl_max_ms"] == pytest.approx(rf["long_ms"], rel=0.02)
    assert n["chk_steps_over_2x"] == 0 and n["chk_itl_max_ms"] <= rf["chunk_ms"] * 1.15
    # The newcomer's prompt costs about the same compute either way: TTFT within 10%.
    assert n["chk_ttft_ms"] == pytest.approx(n["mix_ttft_ms"], rel=0.1)
    assert rf["chunks"] == 8


def test_chunk_roofline_is_flat_below_bstar_and_linear_above():
    d = E.chunk_step_times(H100_8B, [16, 32, 64, 1024, 2048, 4096], decodes=30, ctx=300)
    small, big = d["step_s"][:3], d["step_s"][3:]
    assert np.ptp(small) / small[0] < 0.01                 # memory-bound: chunk rides for free
    assert big[2] / big[1] == pytest.approx(2.0, rel=0.1)  # compute-bound: time follows tokens
    assert np.all(np.diff(d["prefill_tps"][:3]) > 0)
    assert E.stall_numbers(H100_8B, 512, 4000, reference=[256, 1024, 4096])["chunk_share"] <= 1.0


def test_chunk_sweep_itl_grows_with_chunk_size_and_no_chunking_is_worst():
    w = synthetic(80, 4.0, LogNormal(median=2000, sigma=0.6, lo=64, hi=7000),
                  LogNormal(median=20, sigma=0.8, lo=2, hi=200), seed=5)
    cs = E.chunk_sweep(w, H100_8B, [128, 512, 2048], slots=16, time_scales=(1.0,))[1.0]
    assert np.all(np.diff(cs["itl_p99"]) > 0)
    assert cs["continuous_itl_p99"][0] > cs["itl_p99"][-1]
    nums = E.tradeoff_numbers({1.0: cs}, {"c": 512}, {"l1": 1.0})
    assert nums["l1c_itl_p99_ms"] == pytest.approx(cs["itl_p99"][1] * 1e3)
    assert nums["loads_text"] == "1"


def test_itl_series_by_hand():
    res = run(reqs((0, 4, 3), (0, 4, 2)), ContinuousScheduler(2, 64), SimExecutor(LinearCost(1.0, 0.5)))
    s = E.itl_series(res, [0, 1])
    # Step 1 computes 8 prompt tokens (5 s), step 2 two decodes (2 s), step 3 one decode (1.5 s).
    assert s["t"].tolist() == [7.0, 7.0, 8.5] and s["itl"].tolist() == [2.0, 2.0, 1.5]


# ------------------------------------------------------------------------------ KV
def test_kv_over_time_slab_reserves_whole_slabs_and_exact_reserves_what_is_held():
    w = small_trace(80, rate=10.0)
    kv = E.kv_runs(w, H100_8B, slots=64)
    slab, exact = kv["series"]["slab"], kv["series"]["exact"]
    np.testing.assert_array_equal(slab["reserved"], slab["running"] * H100_8B.model.max_context)
    np.testing.assert_array_equal(exact["reserved"], exact["used"])
    assert np.all(slab["used"] <= slab["reserved"])
    assert kv["numbers"]["slab_unused"] > 0.8 and kv["numbers"]["exact_unused"] == 0


def test_kv_fit_for_llama_8b_on_h100():
    w = small_trace(200)
    fit = E.kv_fit(H100_8B, w)
    assert fit["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2
    assert fit["slab"] == H100_8B.kv_capacity() // 8192 == 52
    assert fit["exact_avg"] > fit["exact_final"] > fit["slab"]


def test_kv_budget_sweep_exact_beats_slab_when_memory_binds():
    w = small_trace(120, rate=50.0)
    sw = E.kv_budget_sweep(w, H100_8B, [16384, 65536], slots=128)
    slab, exact = sw["slab"], sw["exact"]
    assert np.all(slab["preemptions"] == 0)
    assert list(slab["running_peak"]) == [2, 8]
    assert np.all(exact["running_peak"] > slab["running_peak"])
    assert np.all(exact["throughput_tok"] > slab["throughput_tok"])
    assert np.all(np.diff(slab["throughput_tok"]) > 0)
    assert E.budget_numbers(sw, 16384)["gain"] > 1


# ----------------------------------------------------------------- glue and workloads
def test_fit_context_dense_keeps_padded_batches_inside_the_context():
    # Capped to context alone, request 1 fits (8000 + 100) but padded to 8000 beside a
    # 1,000-token output request it would not; dense capping leaves room for the padding.
    w = Workload.from_arrays([0, 0], [50, 8000], [1000, 100])
    dense, n = E.fit_context(w, 8192, dense=True)
    assert n == 1 and int((dense.prompt_lens.max() + dense.output_lens).max()) <= 8192
    res = E.simulate(dense, H100_8B, "static", slots=2, kv_tokens=None)
    assert all(r.done for r in res.requests)
    assert E.fit_context(w, 8192)[1] == 0


def test_glue_helpers():
    sweep = {"x": np.array([1.0, 2.0]), "y": np.array([10.0, 20.0])}
    assert E.at(sweep, "x", 2.0) == {"x": 2.0, "y": 20.0}
    with pytest.raises(KeyError):
        E.at(sweep, "x", 3.0)
    assert E.flat("p", {"a": np.float64(1.5), "b": "s"}) == {"p_a": 1.5, "p_b": "s"}
    assert E.choose(True, 100, 10) == 10 and E.choose(False, 100, 10) == 100
    assert E.describe_cost(get_cost_model("llama-70b", "h200", tp=2)) == (
        "llama-70b (bf16 weights, bf16 KV cache) on 2 x H200-SXM, tensor parallel")
    assert plots.plain(np.float64(2.5)) == 2.5 and type(plots.plain(np.int64(3))) is int


# ---------------------------------------------------------------------------- plots
def test_every_figure_draws_and_saves(tmp_path):
    plots.style()
    w = small_trace(60, rate=4.0)
    ff = E.simulate(preset("first-finisher"), H100_8B, "static", slots=32, kv_tokens=None, record_slots=True)
    cfg = {"static": {"scheduler": "static", "slots": 8, "timeout": 1.0},
           "continuous": {"scheduler": "continuous", "slots": 8}}
    sw = E.rate_sweep(w, H100_8B, cfg, [0.5, 2.0])
    wl, probes = E.with_probes(w, every=5)
    lp = E.long_prompt_among_decodes(running=6, prompt=1000)
    st = E.stall_runs(lp, H100_8B, {"mix": ("continuous, mixed", "continuous", {})}, range(6), 6, slots=8)
    kv = E.kv_runs(w, H100_8B, slots=16)
    rt = E.chunk_step_times(H100_8B, [64, 512])
    figs = {
        "padding": plots.padding_figure(E.padding_cost(H100_8B)),
        "timeline": plots.timeline_figure([("static", E.timeline(ff))], marks=[[(0.1, "mark")]]),
        "batch": plots.batch_sweep_figure(E.static_batch_sweep(w, H100_8B, [1, 4])),
        "wait": plots.wait_figure(E.wait_sweep(w, H100_8B, [0, 1], slots=4), ceiling=0.4),
        "rate": plots.rate_util_figure(sw, trace_rate=E.offered_rate(w)),
        "latency": plots.latency_throughput_figure(sw),
        "iters": plots.iterations_figure(E.probe_runs(wl, H100_8B, cfg, probes), 20),
        "itl": plots.itl_figure(st["series"], 0.5, st["first_token"]),
        "roofline": plots.chunk_roofline_figure(rt["chunk"], rt["step_s"], rt["decode_s"], rt["bstar"]),
        "tradeoff": plots.chunk_tradeoff_figure({"1x": E.chunk_sweep(w, H100_8B, [256, 512], slots=8)[1.0]}),
        "kv_time": plots.kv_time_figure(kv["series"], H100_8B.kv_capacity()),
        "kv_fit": plots.kv_fit_figure(w.prompt_lens + w.output_lens, E.kv_fit(H100_8B, w), {"slab": 10}),
        "kv_budget": plots.kv_budget_figure(E.kv_budget_sweep(w, H100_8B, [16384, 32768], slots=32)),
    }
    for name, fig in figs.items():
        assert fig.axes, name
        png, svg = plots.save(fig, name, tmp_path)
        assert png.stat().st_size > 5000 and svg.read_text().startswith("<?xml"), name
        matplotlib.pyplot.close(fig)
    assert "x" in plots.table([[1, "ab"]], ["x", "y"])


def test_phase_colours_are_distinct_and_cover_every_kind():
    assert set(plots.PHASE_COLORS) == set(E.KINDS)
    assert len(set(plots.PHASE_COLORS.values())) == len(E.KINDS)


# ------------------------------------------------------------------------ real engine
@pytest.mark.model
def test_real_engine_crosscheck_agrees_with_the_simulator_on_steps_and_iterations():
    pytest.importorskip("torch")
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    cc = E.real_crosscheck(w, model="tiny", slots=2, threads=1)
    assert cc["available"], cc.get("reason")
    for name, p in cc["per"].items():
        assert p["steps_real"] == p["steps_sim"], name
        assert p["iters_real"] == p["iters_sim"] == [5.0] * 5, name
        assert p["tokens_real"] == 30 + 25
    assert cc["per"]["continuous"]["steps_real"] < cc["per"]["static"]["steps_real"]
    assert "agree exactly" in E.crosscheck_text(cc)
    header, rows = E.crosscheck_rows(cc)
    assert len(rows) == 2 and len(header) == len(rows[0])
