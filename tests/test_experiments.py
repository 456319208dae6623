"""The experiment functions behind chapter 7's notebooks (batching/experiments/) and
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
def test_trace_slices_need_no_dense_capping():
    # Request 1 fits the context alone (8000 + 100) but not padded to 8000 beside a
    # 1,000-token output: the static scheduler runs it in a batch of its own, uncapped.
    w = Workload.from_arrays([0, 0], [50, 8000], [1000, 100])
    capped, n = E.fit_context(w, 8192)
    assert n == 0 and capped.info["capped"]["n_capped"] == 0
    res = E.simulate(capped, H100_8B, "static", slots=2, kv_tokens=None)
    assert all(r.done for r in res.requests)
    assert res.requests[1].admit_time > res.requests[0].admit_time


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


@pytest.mark.model
def test_real_padding_runs_the_padding_and_reports_its_measured_cost():
    pytest.importorskip("torch")
    rp = E.real_padding(model="tiny", device="cpu", short=8, long=40, reps=2, threads=1)
    # The static run's one step prefilled 8 + 40 prompt tokens and 32 padding positions.
    assert rp["pad_tokens"] == 32 and rp["padding_fraction"] == pytest.approx(32 / 80)
    assert rp["token_ratio"] == 5 and rp["positions_ratio"] == pytest.approx(80 / 48)
    assert rp["reps"] == 2 and rp["model"] == "tiny"
    for k in ("padded_ms", "packed_ms", "short_ms", "long_ms"):
        assert math.isfinite(rp[k]) and rp[k] > 0, k
    assert rp["time_ratio_short"] == pytest.approx(rp["long_ms"] / rp["short_ms"])
    assert rp["time_ratio_batch"] == pytest.approx(rp["padded_ms"] / rp["packed_ms"])
    header, rows = E.real_padding_rows(rp)
    assert [r[1] for r in rows] == ["8", "40", "48", "80"] and len(header) == 3
    assert E.executor_text(rp["executor"]).startswith("tiny, 0.1M parameters, float32")
    for bad, field in ((dict(short=0), "short=0"), (dict(short=40, long=40), "long=40"),
                       (dict(reps=0), "reps=0")):
        with pytest.raises(ValueError, match=field):
            E.real_padding(model="tiny", device="cpu", **{"short": 8, "long": 40, **bad})


@pytest.mark.model
def test_real_stall_serves_the_long_prompt_whole_or_in_chunks_on_the_model():
    pytest.importorskip("torch")
    # tail_steps=20: the running requests keep decoding through the newcomer's chunks even
    # if the calibration overstated the step 4x (a noisy neighbour on a shared machine).
    st = E.real_stall(model="tiny", device="cpu", running=3, prompt=100, chunk=16, tail_steps=20,
                      running_prompt=40, threads=1)
    assert st["budget"] == 16 + 4 and st["at_s"] > 0 and st["decode_ms"] > 0
    output = 2 * 10 + math.ceil(100 / 16) + 20
    for tag, res in st["results"].items():
        done = {r.rid: len(r.token_ids) for r in res.requests}
        assert done == {0: output, 1: output, 2: output, 3: 8}, tag       # every token, nobody dropped
        L = res.log.cols
        prefills = [int(p) for p in L["prefill"] if p]
        if tag == "chk":
            # Budget 20 with the 3 running decodes: the newcomer's 100 tokens go in chunks
            # of 16 (chunk_size), the last 4 left over, in steps that carry all 3 decodes.
            assert [int(p) for p, d in zip(L["prefill"], L["decode"]) if p and d == 3] == [16] * 6 + [4]
            assert max(prefills) <= 20
        else:   # the running prompts together, then the whole long prompt in one step
            assert prefills == [3 * 40, 100], tag
    n = st["numbers"]
    assert set(n) == {f"{t}_{k}" for t in ("mix", "sep", "chk")
                      for k in ("itl_max_ms", "itl_p50_ms", "stall", "steps_over_2x", "ttft_ms")}
    assert set(st["series"]) == set(st["labels"].values()) and st["model"] == "tiny"
    with pytest.raises(ValueError, match="chunk=0"):
        E.real_stall(model="tiny", device="cpu", running=3, prompt=100, chunk=0)


def _stall_doc(device: str, device_name: str, model: str, mix_ms: float, chk_ms: float) -> dict:
    """A bench_stall.py result with hand-picked numbers."""
    return {"device": device, "device_name": device_name, "model": model, "dtype": "bf16",
            "date": "2026-12-01T00:00:00+00:00", "command": "python benchmarks/bench_stall.py",
            "padding": {"short": 50.0, "long": 4000.0, "short_ms": 2.0, "long_ms": 30.0, "token_ratio": 80.0,
                        "time_ratio_short": 15.0, "time_ratio_batch": 1.9},
            "stall": {"running": 30, "prompt": 4000, "chunk": 512, "decode_ms": 4.0,
                      "numbers": {"mix_itl_max_ms": mix_ms, "mix_stall": mix_ms / 4.0, "chk_itl_max_ms": chk_ms,
                                  "mix_ttft_ms": mix_ms, "chk_ttft_ms": 41.0}}}


def test_committed_real_runs_are_read_cpu_first_and_described(tmp_path):
    import json
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    assert E.committed_real_runs(str(tmp_path)) == []
    assert "No other device's measurement" in E.committed_stall_text([])
    assert "No other device's measurement" in E.committed_padding_text([])
    (res / "stall-h200-llama-1b.json").write_text(json.dumps(_stall_doc("H200-SXM", "NVIDIA H200", "llama-1b",
                                                                         36.0, 6.0)))
    (res / "stall-cpu-here-cpu-s.json").write_text(json.dumps(_stall_doc("cpu-here", "AMD EPYC", "cpu-s",
                                                                         900.0, 110.0)))
    docs = E.committed_real_runs(str(tmp_path))
    assert [d["device"] for d in docs] == ["cpu-here", "H200-SXM"]
    assert docs[1]["path"] == "benchmarks/results/stall-h200-llama-1b.json"
    text = E.committed_stall_text(docs)
    assert ("llama-1b bf16 on NVIDIA H200, measured 2026-12-01 (`benchmarks/results/stall-h200-llama-1b.json`): "
            "with 30 requests decoding at 4.0 ms a step, a 4,000-token prompt prefilled whole held their next "
            "token for 36 ms (9x their median), in 512-token chunks for at most 6 ms") in text
    assert "No GPU measurement" not in text
    assert "No GPU measurement is among them yet" in E.committed_stall_text(docs[:1])
    pad = E.committed_padding_text(docs)
    assert "the 50-token prompt's prefill took 15x its own time (2.0 vs 30.0 ms) for 80x the positions" in pad
    bad = _stall_doc("cpu-here", "AMD EPYC", "cpu-s", 1.0, 1.0)
    del bad["stall"]
    (res / "stall-cpu-here-bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"stall-cpu-here-bad.json: no 'stall'"):
        E.committed_real_runs(str(tmp_path))


@pytest.mark.model
def test_real_schedulers_measure_the_first_finisher_and_meet_a_profile_of_this_machine(tmp_path):
    import json
    pytest.importorskip("torch")
    import torch
    from batching.real import device_name
    # r0 wants 30 tokens, r1..r5 five each, all at t = 0, two slots. Static: batches
    # (r0, r1) for 30 steps, then (r2, r3) and (r4, r5) for 5 each: 40 steps, 55 tokens
    # in 80 slot-steps. Continuous: r1..r5 follow each other through the second slot while
    # r0 runs: 30 steps, 55 of 60 slot-steps.
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    configs = {"static": dict(scheduler="static", slots=2), "continuous": dict(scheduler="continuous", slots=2)}
    rs = E.real_schedulers(w, configs, model="tiny", device="cpu", threads=1, profile=None)
    assert "sim" not in rs and rs["model"] == "tiny" and rs["requests"] == 6
    assert (rs["real"]["static"]["steps"], rs["real"]["continuous"]["steps"]) == (40, 30)
    assert rs["real"]["static"]["slot_util"] == pytest.approx(55 / 80)
    assert rs["real"]["continuous"]["slot_util"] == pytest.approx(55 / 60)
    assert "No profile measured on this machine" in E.real_schedulers_text(rs)
    header, rows = E.real_schedulers_rows(rs)
    assert header == ["measured", "static", "continuous"] and rows[0] == ["slot utilization", "69%", "92%"]
    # A profile of this machine: every step 10 ms, whatever it holds.
    here = device_name(torch.device("cpu"))
    prof = {"schema": 1, "meta": {"device": "cpu-here", "device_name": here, "model": "tiny", "dtype": "fp32",
                                  "date": "2026-11-30"},
            "decode": {"batch": [1, 2], "ctx": [8, 64], "ms": [[10.0, 10.0], [10.0, 10.0]]},
            "prefill": {"tokens": [1, 64], "ms": [10.0, 10.0]}}
    (tmp_path / "cpu-here-tiny.json").write_text(json.dumps(prof))
    assert E.profile_measured_here("tiny", here, str(tmp_path)) == str(tmp_path / "cpu-here-tiny.json")
    assert E.profile_measured_here("tiny", "another CPU", str(tmp_path)) is None
    assert E.profile_measured_here("cpu-s", here, str(tmp_path)) is None
    rs = E.real_schedulers(w, configs, model="tiny", device="cpu", threads=1,
                           profile=str(tmp_path / "cpu-here-tiny.json"))
    assert {n: m["steps"] for n, m in rs["sim"].items()} == {"static": 40, "continuous": 30}
    assert rs["sim"]["static"]["busy_s"] == pytest.approx(0.400)
    assert set(rs["steps_pred_over_real"]["static"]) == {"prefill", "decode"}
    text = E.real_schedulers_text(rs)
    assert "it takes every step the real runs took" in text
    sp, cp = rs["steps_pred_over_real"]["static"], rs["steps_pred_over_real"]["continuous"]
    assert (f"Priced one by one, the real runs' steps come out at static's prefill steps at {sp['prefill']:.0%} "
            f"and decode steps at {sp['decode']:.0%}; continuous's prefill steps at {cp['prefill']:.0%}") in text
    assert E.real_schedulers_rows(rs)[0][0] == "measured (simulated)"


# ---------------------------------------------------------------------- why batching
def test_knee_is_the_last_batch_before_the_curve_first_leaves_the_band():
    b = [1, 2, 4, 8, 16, 32]
    t = [10.0, 11.0, 12.4, 13.0, 25.0, 50.0]
    assert E.knee(b, t, 1.25) == 4          # 12.4 <= 12.5 < 13
    assert E.knee(b, t, 2.0) == 8           # 13 <= 20 < 25
    assert E.knee(b, t, 100.0) == 32
    # A later dip back under the band does not count: the run ended at the first exit.
    assert E.knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 1.25) == 1
    assert E.knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 2.0) == 4
    with pytest.raises(ValueError):
        E.knee(b, t, 0.9)
    with pytest.raises(ValueError):
        E.knee([1, 4, 2], [1.0, 1.0, 1.0], 2.0)
    with pytest.raises(ValueError):
        E.knee([1, 2], [1.0, float("nan")], 2.0)


def test_bstar_matches_the_conventions_and_the_cost_model():
    assert E.bstar_of(989e12, 3.35e12, 2) == pytest.approx(295.22, abs=0.01)
    assert E.bstar_of(989e12, 4.8e12, 2) == pytest.approx(206.04, abs=0.01)
    assert E.bstar_of(110e9, 18.5e9, 4) == pytest.approx(2 * 110 / 18.5)   # fp32: twice peak / bandwidth
    for model, dev in (("llama-8b", "h100"), ("llama-8b", "h200"), ("cpu-m", "cpu")):
        c = get_cost_model(model, dev)
        assert E.bstar_of(c.peak_flops, c.bandwidth, c.model.bytes_per_param) == pytest.approx(c.bstar(), rel=1e-12)
    with pytest.raises(ValueError):
        E.bstar_of(0.0, 1.0, 2)


def test_roofline_curve_values_and_crossing():
    m = H100_8B.model
    d = H100_8B.device
    b = [1, 2, 64, 256, 512, 1024]
    cur = E.roofline_curve(m, b, 128, d.bandwidth, H100_8B.peak_flops, d.step_overhead_s)
    # Same numbers as the simulator's cost model, step by step.
    for bi, t in zip(b, cur["time_s"]):
        assert t == pytest.approx(H100_8B.decode_step(bi, 128), rel=1e-12)
    assert cur["weights_s"][0] == pytest.approx(15.009849344e9 / 3.35e12)      # 4.48 ms: llama-8b's stream
    assert np.all(np.diff(cur["memory_s"]) > 0)                                # KV grows with the batch
    assert cur["compute_s"][3] / cur["compute_s"][0] == pytest.approx(256, rel=1e-3)
    assert list(cur["bound"]) == [0, 0, 0, 0, 1, 1]
    # With no context the memory and compute lines cross at B* (within the non-matmul params).
    dense = np.arange(1, 600)
    z = E.roofline_curve(m, dense, 0, d.bandwidth, H100_8B.peak_flops)
    cross = dense[np.argmax(z["compute_s"] > z["memory_s"])]
    assert abs(cross - H100_8B.bstar()) / H100_8B.bstar() < 0.02
    assert np.allclose(z["tokens_per_s"], dense / z["time_s"])


def test_stream_numbers_and_gpu_rooflines():
    s = E.stream_numbers(H100_8B, ctx=128, long_ctx=2048, long_batch=128)
    assert s["stream_ms"] == pytest.approx(4.4806, abs=1e-3)
    assert s["step_ms"] == pytest.approx(H100_8B.decode_step(1, 128) * 1e3)
    assert s["bstar_floor"] == 295 and s["tokens_s_bstar"] > 200 * s["tokens_s"]
    assert s["kv_long_gb"] == pytest.approx(128 * 2048 * 131072 / 1e9)
    assert s["long_fit"] == H100_8B.kv_capacity() // 2048
    cpu = E.stream_numbers(get_cost_model("cpu-m", "cpu"))
    assert cpu["bstar_copy"] < cpu["bstar"] and cpu["copy_gbs"] == 32.0
    with pytest.raises(ValueError):
        E.stream_numbers(get_cost_model("llama-70b", "h200", tp=2))
    gr = E.gpu_rooflines("llama-8b", ("h100", "h200"), batches=[1, 16, 128, 256, 512], ctxs=(128, 2048))
    h100, h200 = gr["devices"]["H100-SXM"], gr["devices"]["H200-SXM"]
    assert h200["bstar"] < h100["bstar"] and gr["dtype"] == "bf16"
    long = h100["ctx"][2048]
    assert list(long["fits"]) == [1, 1, 1, 0, 0]       # 208 rows of 2,048 tokens fit an H100
    assert list(h200["ctx"][2048]["fits"]) == [1, 1, 1, 1, 0]
    # Throughput at short context grows almost linearly below B*.
    short = h200["ctx"][128]["tokens_per_s"]
    assert short[1] / short[0] > 15


def _synthetic_sweep(device_type: str = "cpu") -> dict:
    """A live sweep as live_decode_sweep returns it, with hand-picked times (cpu-m, fp32)."""
    return {"meta": {"device": "cpu-here" if device_type == "cpu" else "H200-SXM", "device_type": device_type,
                     "device_name": "AMD EPYC" if device_type == "cpu" else "NVIDIA H200", "model": "cpu-m",
                     "dtype": "fp32", "params": 117198336.0, "threads": 2, "torch": "2.x", "reps": 5,
                     "date": "2026-11-30T00:00:00+00:00", "loadavg_before": 0.1, "loadavg_after": 0.2,
                     "wall_s": 30.0},
            "batch": np.array([1.0, 2.0, 4.0, 8.0]), "ctx": 128, "paths": ["uniform", "mixed", "gathered"],
            "uniform_ms": np.array([40.0, 41.0, 48.0, 70.0]), "uniform_p25_ms": np.array([39.0, 40.0, 47.0, 69.0]),
            "uniform_p75_ms": np.array([41.0, 42.0, 49.0, 71.0]),
            "mixed_ms": np.array([40.0, 42.0, 50.0, 77.0]), "mixed_p25_ms": np.array([39.0, 41.0, 49.0, 76.0]),
            "mixed_p75_ms": np.array([41.0, 43.0, 51.0, 78.0]),
            "gathered_ms": np.array([40.0, 45.0, 60.0, 140.0]),
            "gathered_p25_ms": np.array([39.0, 44.0, 59.0, 139.0]),
            "gathered_p75_ms": np.array([41.0, 46.0, 61.0, 141.0]),
            "matvec_gbs": 20.0, "copy_gbs": 30.0, "read_gbs": 33.0, "peak_tflops": 0.1}


def test_live_numbers_by_hand():
    from batching.models import get_model
    sw = _synthetic_sweep()
    n = E.live_numbers(sw)
    m = get_model("cpu-m")
    moved = m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)       # weights, KV read, KV written
    assert n["achieved_gbs"] == pytest.approx(moved / 0.040 / 1e9)
    assert n["efficiency"] == pytest.approx(moved / 0.040 / 20e9)
    assert n["efficiency_copy"] == pytest.approx(moved / 0.040 / 30e9)
    assert n["stream_ms"] == pytest.approx(m.weight_read_bytes / 20e9 * 1e3)
    assert n["bstar"] == pytest.approx(2 * 0.1e12 / 20e9)
    assert (n["knee125"], n["knee2"]) == (4, 8) and (n["gathered_knee125"], n["gathered_knee2"]) == (2, 4)
    assert n["tps_gain"] == pytest.approx(8 * 40 / 70) and n["per_token_max_ms"] == pytest.approx(70 / 8)
    assert n["gathered_gap_max"] == pytest.approx(2.0) and n["mixed_gap_max"] == pytest.approx(1.1)
    assert n["pred1_ms"] < n["t1_ms"] and n["over_pred"] == pytest.approx(n["t1_ms"] / n["pred1_ms"])
    assert "within 2x up to batch 8, close to the B* of 10.0" in E.knee_text(n)
    sw["uniform_ms"] = np.array([41.0, 40.0, 48.0, 70.0])
    with pytest.raises(ValueError):
        E.live_numbers({**sw, "batch": np.array([2.0, 4.0, 8.0, 16.0])})


def test_live_text_names_the_device_it_ran_on_and_never_claims_a_gpu_it_lacks():
    cpu = E.live_text(_synthetic_sweep("cpu"))
    assert "No GPU was present" in cpu and "AMD EPYC" in cpu and "GPU measurements" not in cpu
    gpu = E.live_text(_synthetic_sweep("cuda"))
    assert "NVIDIA H200" in gpu and "found a GPU" in gpu and "No GPU" not in gpu
    assert E.live_labels(_synthetic_sweep("cpu"))["kind"] == "CPU"
    assert E.live_labels(_synthetic_sweep("cuda"))["kind"] == "GPU"


def test_live_defaults():
    assert E.live_defaults("cpu") == ("cpu-m", [1, 2, 4, 8, 16, 32, 64, 128])
    assert E.live_defaults("cuda", free_bytes=100e9) == ("llama-8b", [2 ** i for i in range(9)])
    assert E.live_defaults("cuda", free_bytes=20e9)[0] == "llama-1b"
    assert E.live_defaults("cuda", model="tiny", free_bytes=1e9)[0] == "tiny"
    with pytest.raises(ValueError):
        E.live_defaults("cpu", batches=[2, 4])


def _gpu_profile() -> dict:
    """A made-up H200 profile of llama-8b (schema 1), as a later session might commit."""
    return {"schema": 1,
            "meta": {"device": "H200-SXM", "device_name": "NVIDIA H200", "model": "llama-8b", "dtype": "bf16",
                     "date": "2026-12-01T00:00:00+00:00"},
            "device": {"bandwidth": {"matvec": {"GBps_best": 4200.0}}, "matmul_peak": {"TFLOPs_best": 700.0}},
            "decode": {"batch": [1, 8, 64, 256], "ctx": [128, 1024],
                       "ms": [[4.0, 4.2], [4.1, 4.6], [4.6, 8.0], [8.0, 20.0]]},
            "prefill": {"tokens": [128, 1024], "ms": [6.0, 30.0]}}


def test_load_profiles_picks_up_every_profile_and_says_which_devices_are_measured(tmp_path):
    import json
    import shutil
    from pathlib import Path
    assert "No profile is committed" in E.profiles_text(E.load_profiles(tmp_path))
    shutil.copy(Path(E.PROFILE_DIR) / "cpu-here-cpu-s.json", tmp_path / "cpu-here-cpu-s.json")
    only_cpu = E.load_profiles(tmp_path)
    assert [p["gpu"] for p in only_cpu] == [False]
    assert "It was not measured on a GPU" in E.profiles_text(only_cpu)
    assert "None of them was measured on a GPU" in E.profiles_text(only_cpu + only_cpu)
    (tmp_path / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    both = E.load_profiles(tmp_path, ctx=100)
    assert [p["device"] for p in both] == ["cpu-here", "H200-SXM"]
    h200 = both[1]
    assert h200["gpu"] and h200["ref_ctx"] == 128 and h200["t1_ms"] == 4.0
    assert (h200["knee125"], h200["knee2"]) == (64, 256)     # 8.0 ms is exactly 2x: still inside
    assert h200["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    assert "NVIDIA H200" in h200["label"] and "2026-12-01" in h200["label"]
    text = E.profiles_text(both)
    assert "GPU measurements are among them (H200-SXM)" in text and "not measured on a GPU" not in text
    assert "None of them" not in text
    header, rows = E.profile_rows(both)
    assert len(rows) == len(only_cpu[0]["ctxs"]) + 2 and all(len(r) == len(header) for r in rows)
    roof = E.profile_roofline(h200, points=10)
    assert len(roof["batch"]) == 10 and roof["batch"][0] == 1 and roof["batch"][-1] == pytest.approx(256)


def test_profile_chunk_steps_reads_the_measured_mixed_steps_as_they_are(tmp_path):
    import json
    prof = _gpu_profile()
    # 8 decodes at 128 tokens each: 4.1 ms alone (decode grid), then chunks of 64..1024.
    prof["mixed"] = {"prefill_tokens": [1024, 64, 256, 64, 256, 1024], "decode_rows": [8, 8, 8, 1, 1, 1],
                     "decode_ctx": [128] * 6, "ms": [16.0, 4.1 * 1.25, 8.0, 4.5, 7.0, 15.0]}
    (tmp_path / "h200-llama-8b.json").write_text(json.dumps(prof))
    no_mixed = _gpu_profile()
    no_mixed["meta"]["model"] = "llama-1b"
    (tmp_path / "h200-llama-1b.json").write_text(json.dumps(no_mixed))
    curves = E.profile_chunk_steps(E.load_profiles(tmp_path), decodes=8)
    assert len(curves) == 1                             # the profile without mixed steps is left out
    c = curves[0]
    assert c["chunk"].tolist() == [64, 256, 1024] and c["step_ms"].tolist() == [5.125, 8.0, 16.0]
    assert c["decode_ms"] == 4.1 and c["ctx"] == 128 and c["decodes"] == 8
    assert c["over_decode"][0] == pytest.approx(1.25)
    tps = np.array([64 / 5.125e-3, 256 / 8e-3, 1024 / 16e-3])
    assert np.allclose(c["prefill_tps"], tps) and np.allclose(c["share"], tps / tps.max())
    assert c["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    assert c["short"] == "llama-8b bf16 on NVIDIA H200"
    text = E.profile_chunk_text(curves, chunks=(64, 256))
    # 256 tokens reach 0.5 of the best: 80% first at 1024 = 6 x B* (1024 / 166.7).
    assert "a 64-token chunk makes it 5.1 ms (1.2x) at 20%" in text
    assert "a 256-token chunk makes it 8.0 ms (2.0x) at 50%" in text
    assert "80% of it takes chunks of 1024 tokens, 6 times B* (= 167)" in text
    assert "No committed profile" in E.profile_chunk_text([])
    assert E.profile_chunk_steps(E.load_profiles(tmp_path), decodes=16) == []
    for cs in (curves, []):
        fig = plots.chunk_profile_figure(cs)
        png, _ = plots.save(fig, "chunk-profile", tmp_path)
        assert png.stat().st_size > 5000
        matplotlib.pyplot.close(fig)


def test_why_batching_figures_draw_and_save(tmp_path):
    import json
    plots.style()
    sw = _synthetic_sweep()
    gr = E.gpu_rooflines(batches=[1, 4, 16, 64, 256, 1024])
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    profs = E.load_profiles(E.PROFILE_DIR) + E.load_profiles(tmp_path / "p")
    figs = {
        "roofline": plots.gpu_roofline_figure(gr),
        "live": plots.live_decode_figure(sw, E.live_numbers(sw), E.live_roofline(sw, points=20)),
        "profiles": plots.profiles_figure(profs, [E.profile_roofline(p) for p in profs], live=sw, gpu=gr),
        "no_profiles": plots.profiles_figure([], [], live=sw),
    }
    for name, fig in figs.items():
        png, svg = plots.save(fig, name, tmp_path)
        assert png.stat().st_size > 5000 and svg.read_text().startswith("<?xml"), name
        matplotlib.pyplot.close(fig)


@pytest.mark.model
def test_live_decode_sweep_measures_every_path_on_the_cpu():
    pytest.importorskip("torch")
    sw = E.live_decode_sweep(model="tiny", device="cpu", batches=[1, 2, 4], ctx=16, reps=2, peak_n=128,
                             bandwidth_bytes=1 << 20)
    assert sw["paths"] == ["uniform", "mixed", "gathered"]
    assert sw["meta"]["device"] == "cpu-here" and sw["meta"]["device_type"] == "cpu"
    assert sw["meta"]["model"] == "tiny" and sw["meta"]["dtype"] == "fp32"
    for p in sw["paths"]:
        assert sw[f"{p}_ms"].shape == (3,) and np.all(sw[f"{p}_ms"] > 0)
        assert np.all(sw[f"{p}_p25_ms"] <= sw[f"{p}_p75_ms"])
    assert sw["matvec_gbs"] > 0 and sw["peak_tflops"] > 0
    n = E.live_numbers(sw)
    assert 0 < n["efficiency"] and n["bmax"] == 4
    with pytest.raises(ValueError):
        E.live_decode_sweep(model="tiny", device="cpu", batches=[1, 2], ctx=1000)


def test_fidelity_summary_takes_the_worst_scheduler(tmp_path) -> None:
    """Every simulated figure quotes this: the worst of the schedulers, and the noise floor."""
    import json
    doc = {"model": "cpu-s", "date": "2026-11-30T08:00:00+00:00", "workload": {"requests": 200},
           "results": {"continuous": {"throughput_rel_err": 0.002, "e2e_median_abs_rel_err": 0.10,
                                      "step_median_abs_rel_err": 0.13, "real_vs_real_e2e_median_abs_rel_err": 0.18},
                       "chunked": {"throughput_rel_err": 0.001, "e2e_median_abs_rel_err": 0.13,
                                   "step_median_abs_rel_err": 0.26, "real_vs_real_e2e_median_abs_rel_err": 0.24}}}
    f = tmp_path / "fidelity.json"
    f.write_text(json.dumps(doc))
    s = E.fidelity_summary(str(f))
    assert (s["tput_err"], s["e2e_err"], s["step_err"], s["noise"]) == (0.002, 0.13, 0.26, 0.24)
    assert s["requests"] == 200 and s["date"] == "2026-11-30" and s["schedulers"] == "continuous, chunked"
    assert "0.2%" in s["text"] and "13%" in s["text"] and "24%" in s["text"]
    assert s["e2e_vs_median"] is None and "median over the real runs" not in s["text"]
    for r, x in zip(doc["results"].values(), (0.06, 0.08)):
        r["sim_vs_real_median_e2e_median_abs_rel_err"] = x
    f.write_text(json.dumps(doc))
    s = E.fidelity_summary(str(f))
    assert s["e2e_vs_median"] == 0.08 and "median over the real runs, 8%" in s["text"]
    # The committed measurement is readable and has the noise floor the pages quote.
    committed = E.fidelity_summary()
    assert committed["noise"] is not None and 0 <= committed["tput_err"] < 1
