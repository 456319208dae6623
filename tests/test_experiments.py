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
from batching.schedulers import ContinuousScheduler, StaticScheduler, make_scheduler  # noqa: E402
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
def test_dense_batches_counts_members_per_batch_by_hand():
    # B = 3, timeout 1 s, every step 1 s, one output token each. Three arrivals by t = 0.4
    # fill a batch; the one at t = 5 is sealed alone by its timeout at t = 6; the two at
    # t = 10 and 10.5 are sealed together at t = 11. Batches of 3, 1 and 2.
    res = run(reqs((0, 4, 1), (0.2, 4, 1), (0.4, 4, 1), (5, 4, 1), (10, 4, 1), (10.5, 4, 1)),
              StaticScheduler(3, 64, timeout=1.0), UNIT)
    assert E.dense_batches(res) == {"n": 3.0, "mean": 2.0, "p50": 2.0, "full_share": pytest.approx(1 / 3)}
    with pytest.raises(ValueError):
        E.dense_batches(run(reqs((0, 4, 1)), ContinuousScheduler(2, 64), UNIT))


def test_batch_fill_seals_static_batches_at_the_timeout_and_skips_continuous():
    # 40 requests, one every 0.25 s (4 req/s): a 1 s timeout seals about 1 + 4 x 1 = 5
    # members (the opener plus the next four arrivals), far below the 32 slots; dynamic
    # batching (no wait) takes whatever has arrived whenever the device is free.
    w = Workload.from_arrays(0.25 * np.arange(40), [64] * 40, [4] * 40)
    fill = E.batch_fill(w, H100_8B, {"static": dict(scheduler="static", slots=32, timeout=1.0),
                                     "dynamic": dict(scheduler="dynamic", slots=32, timeout=0.0),
                                     "continuous": dict(scheduler="continuous", slots=32)})
    assert set(fill) == {"static", "dynamic"}
    assert fill["static"]["timeout_expect"] == pytest.approx(1 + 40 / 9.75)
    assert fill["static"]["n"] == 8 and fill["static"]["mean"] == 5 and fill["static"]["full_share"] == 0
    assert "timeout_expect" not in fill["dynamic"] and fill["dynamic"]["mean"] < 5


def test_metric_range_names_the_lowest_and_highest_configuration():
    sweep = {"a": {"time_scale": np.array([1.0, 2.0]), "bw": np.array([0.7, 0.5])},
             "b": {"time_scale": np.array([1.0, 2.0]), "bw": np.array([0.6, 0.9])}}
    assert E.metric_range(sweep, "bw", 2.0) == {"lo": 0.5, "hi": 0.9, "lo_name": "a", "hi_name": "b"}
    assert E.metric_range(sweep, "bw", 1.0)["lo_name"] == "b"


def test_slab_text_says_whether_memory_or_the_slots_bind():
    # llama-8b on one H100: (0.9 x 80 GB - 16.06 GB of weights) / 128 KiB per token =
    # 426,784 tokens, 52 slabs of 8,192; a stub with room for 2 slabs binds before 4 slots do.
    t = E.slab_text(H100_8B, 32)
    assert "(8,192 tokens)" in t and "426,784 KV tokens" in t and "52 slabs, more than the 32 slots" in t
    assert 'kv_policy="slab"' in t

    class Stub:
        model = type("M", (), {"max_context": 8192})()

        def kv_capacity(self) -> float:
            return 20000.0

    t = E.slab_text(Stub(), 4)
    assert "only 2 slabs for 4 slots, so memory, not the slots, limits" in t


def test_capped_text_never_writes_request_s():
    assert E.capped_text(0) == "no request here"
    assert E.capped_text(1) == "1 request here"
    assert E.capped_text(1234) == "1,234 requests here"
    with pytest.raises(ValueError):
        E.capped_text(-1)


def test_hw_compute_text_names_the_scheduler_it_compares_and_where_static_sits():
    # The build's heavy load: dynamic 46%, continuous 34%, static 20% in batches of 8.2.
    hw = {"static": 0.20, "dynamic": 0.46, "continuous": 0.34}
    text = E.hw_compute_text(hw, 8.2, 32, 2.0)
    assert text.startswith("Counting every FLOP, dynamic batching keeps the device busier than continuous "
                           "batching (46% against 34%), because padding and dead rows are real FLOPs.")
    assert ("Static batching's 20% is lower because its batches are small: its 2 s timeout seals them at "
            "8.2 requests on average, of 32 slots") in text
    assert "dense batching" not in text
    assert "about as busy as continuous batching (36% against 34%)" in E.hw_compute_text({**hw, "dynamic": 0.36},
                                                                                          8.2, 32, 2.0)
    low = E.hw_compute_text({**hw, "dynamic": 0.25}, 8.2, 32, 2.0)
    assert "less busy than continuous batching (25% against 34%), even with" in low
    assert E.hw_compute_text({**hw, "static": 0.33}, 8.2, 32, 2.0).endswith("Static batching keeps it at 33%.")


def test_bend_text_finds_where_a_static_curve_bends_back():
    sweep = {"static": {"time_scale": np.array([0.5, 1.0, 2.0]), "e2e_p99": np.array([10.0, 900.0, 400.0])},
             "continuous": {"time_scale": np.array([0.5, 1.0, 2.0]), "e2e_p99": np.array([1.0, 2.0, 30.0])}}
    assert E.bend_text(sweep, "static", 2.0) == (
        "The static curve bends back: past 1x its latency falls as the load rises (900 s to 400 s at p99 "
        "by 2x), because faster arrivals fill more of each batch before its 2 s timeout seals it.")
    assert E.bend_text(sweep, "continuous", 2.0) == "The continuous curve rises with the load over the whole sweep."


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


def test_stall_numbers_derive_the_long_step_from_the_cost_models_flops():
    # llama-8b: 32 layers x 218.1M matrix parameters = 6.98B, so 13.96 GFLOP per prompt token
    # (the 8.03B total includes embeddings and the LM head, which prefill rows skip); causal
    # attention over 4,000 tokens: 4 x 32 x 32 x 128 x 4000 x 4001 / 2 = 4.1954 TFLOP.
    rf = E.stall_numbers(H100_8B, 512, 4000, decodes=30)
    assert rf["layer_params_b"] == pytest.approx(6.979, abs=1e-3)
    assert rf["tok_gflop"] == pytest.approx(13.959, abs=1e-3)
    assert rf["attn_tflop"] == pytest.approx(4.19535, abs=1e-4)
    # The step: prompt matrices + attention + 30 decode rows (matrices, LM head, KV reads).
    assert 4000 * rf["tok_gflop"] / 1e3 + rf["attn_tflop"] < rf["long_tflop"] < 4000 * 16 / 1e3
    assert rf["long_compute_ms"] == pytest.approx(rf["long_tflop"] / 989.0 * 1e3, rel=1e-3)
    # Compute-bound: the roofline's step is exactly that time plus its overhead.
    assert rf["long_ms"] == pytest.approx(rf["long_compute_ms"] + rf["overhead_ms"], rel=1e-9)


def test_chunk_for_itl_is_the_largest_chunk_within_the_itl_target():
    # llama-8b on an H100, 30 decodes at 300 tokens: the decode-only step is memory-bound,
    # 15.0 GB of weights + 1.18 GB of KV over 3.35 TB/s + 0.3 ms = 5.13 ms. Twice that leaves
    # 10.27 - 0.3 ms of compute: at 13.96 GFLOP a token (+ the 30 rows' LM head and a little
    # attention) about 700 tokens with the decodes, so a chunk of about 665.
    ex = E.chunk_for_itl(H100_8B, 2.0, decodes=30, ctx=300, reference=[256, 4096])
    assert ex["decode_ms"] == pytest.approx(5.134, abs=1e-3) and 655 <= ex["chunk"] <= 675
    t = E.chunk_step_times(H100_8B, [int(ex["chunk"]), int(ex["chunk"]) + 1], decodes=30, ctx=300)["step_s"]
    assert t[0] <= 2 * ex["decode_ms"] / 1e3 < t[1]
    assert ex["step_ms"] == pytest.approx(t[0] * 1e3) and 0.9 < ex["share"] < 1
    with pytest.raises(ValueError):
        E.chunk_for_itl(H100_8B, 1.0)


def test_spike_summary_splits_the_slow_steps_around_the_long_prompt():
    # A step costs 1 s + 1 s per token it carries; budget 8, chunks of 8. Steps 1-2 prefill
    # r0's then r1's 8-token prompt: r0, decoding from t = 9, waits 9 s for its next token
    # (slow: the decode-only median is 3 s) before the newcomer exists. The newcomer's 16
    # tokens at t = 30 go 6 + 6 + 4 beside the two decodes: steps of 9, 9 and 7 s, all > 6 s.
    w = Workload.from_arrays([0, 0, 30.0], [8, 8, 16], [20, 20, 2])
    res = run(w.fresh(), make_scheduler("chunked", max_context=64, slots=3, token_budget=8, chunk_size=8),
              SimExecutor(LinearCost(1.0, 1.0)))
    s = E.spike_summary(res, [0, 1], 2)
    assert (s["steps_over_2x_before"], s["steps_over_2x_during"], s["steps_over_2x_after"]) == (1, 3, 0)
    assert s["steps_over_2x"] == 4 and s["itl_p50_ms"] == 3000 and s["itl_max_ms"] == 9000
    assert s["ttft_ms"] == 25000  # first token at the end of the third chunk step, t = 55
    assert s["prefill_itl_p50_ms"] == 9000  # r0's ITLs over those steps: 9, 9 and 7 s
    rs = {"numbers": {"chk_steps_over_2x_before": 7.0, "chk_steps_over_2x_during": 12.0,
                      "chk_steps_over_2x_after": 1.0}, "chunks": 12, "chunk": 128, "running_prompt": 128,
          "budget": 137}
    t = E.slow_steps_text(rs)
    assert t.startswith("Of the 20 steps that took more than twice the median, 12 came while the long prompt "
                        "was prefilled (it takes 12 chunks of 128 tokens); 7 came before it arrived: the running")
    assert t.endswith("; 1 came after its first token, with nothing left to prefill: run-to-run noise on this "
                      "machine.")
    rs["numbers"].update(chk_steps_over_2x_before=0.0, chk_steps_over_2x_after=0.0)
    assert E.slow_steps_text(rs) == ("Of the 12 steps that took more than twice the median, 12 came while the long "
                                     "prompt was prefilled (it takes 12 chunks of 128 tokens).")
    rs["numbers"].update(chk_steps_over_2x_during=0.0)
    assert E.slow_steps_text(rs) == "No step took more than twice the median."


def test_calibration_text_names_the_calibration_step_and_the_runs_median_itl():
    # The build's run: calibration 15.5 ms, the runs' median ITLs 22.6, 24.0 and 22.8 ms.
    rs = {"decode_ms": 15.5, "lead_steps": 10, "at_s": 0.764,
          "numbers": {"mix_itl_p50_ms": 22.6, "sep_itl_p50_ms": 24.0, "chk_itl_p50_ms": 22.8}}
    t = E.calibration_text(rs)
    assert t.startswith("A calibration run first times the running batch's decode-only step, 15.5 ms here (the "
                        "median of its later steps), only to place the long prompt: it arrives 10 such steps after "
                        "their prefill ends, at t = 0.76 s.")
    assert ("median inter-token latency was 22.6 to 24.0 ms, not the calibration's 15.5 ms: the table quotes "
            "the runs' own median, and every stall below is a multiple of it.") in t
    close = E.calibration_text({**rs, "numbers": {"mix_itl_p50_ms": 16.0, "sep_itl_p50_ms": 16.0,
                                                  "chk_itl_p50_ms": 16.0}})
    assert close.endswith("median inter-token latency was 16.0 ms, close to it.")


def test_trace_contrast_by_hand():
    code = Workload.from_arrays([0.0, 1.0], [2000, 1000], [20, 40])
    conv = Workload.from_arrays([0.0, 1.0, 2.0], [1000, 500, 300], [200, 300, 400])
    c = E.trace_contrast(code, conv)
    assert (c["prompt_mean"], c["output_mean"], c["other_prompt_mean"], c["other_output_mean"]) == (1500, 30, 600, 300)
    assert c["prompt_ratio"] == 2.5 and c["output_shorter"] == 10.0
    with pytest.raises(ValueError):
        E.trace_contrast(Workload.from_arrays([], [], []), conv)


def test_ttft_cost_text_reports_a_delay_only_beyond_the_noise():
    assert E.ttft_cost_text({"chk_ttft_ms": 1330.0, "mix_ttft_ms": 891.0}) == (
        "The newcomer paid for the chunks: its first token came 1,330 ms after arrival instead of 891 ms, 49% later.")
    assert E.ttft_cost_text({"chk_ttft_ms": 1102.0, "mix_ttft_ms": 1132.0}).endswith(
        "against 1,132 ms unchunked: in this run its chunks did not delay it measurably.")


def test_real_chunk_text_reads_the_run_against_its_devices_profile():
    curve = {"device": "cpu-here", "bstar": 12.8, "chunk": np.array([64, 128, 256]),
             "share": np.array([0.5, 0.7, 0.9])}
    rs = {"executor": {"hardware": "cpu-here"}, "chunk": 128, "chunks": 12,
          "numbers": {"chk_prefill_itl_p50_ms": 108.0, "chk_itl_p50_ms": 20.0}}
    t = E.real_chunk_text([curve], rs)
    assert t.startswith("A 128-token chunk is 10 times this machine's B* (= 13, from its profile)")
    assert "still wait 5.4x their median" in t and "over the prompt's 12 chunks rather than remove it" in t
    assert "runs at 70% of the best" in t and "and reaching 80% of it takes 256-token chunks." in t
    t = E.real_chunk_text([curve], {**rs, "numbers": {"chk_prefill_itl_p50_ms": 30.0, "chk_itl_p50_ms": 20.0}})
    assert "rather than remove it" not in t and "the median chunk step holds the running requests for only 1.5x" in t
    t = E.real_chunk_text([curve], {**rs, "executor": {"hardware": "h200"}})
    assert t.startswith("No committed profile of this device (h200)")


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


def test_latency_figure_plots_requests_per_second_and_labels_replay_speeds_without_overlap():
    plots.style()
    a = {"time_scale": np.array([0.5, 1.0, 2.0]), "throughput_req": np.array([0.5, 1.0, 1.2]),
         "e2e_p50": np.array([1.0, 2.0, 50.0]), "e2e_p99": np.array([2.0, 4.0, 90.0])}
    b = {**a, "throughput_req": a["throughput_req"] + 1e-3, "e2e_p50": a["e2e_p50"] * 1.01,
         "e2e_p99": a["e2e_p99"] * 1.01}  # b sits on a: its labels would cover a's
    fig = plots.latency_throughput_figure({"static": a, "dynamic": b}, label_scales=[0.5, 2.0])
    ax0 = fig.axes[0]
    assert ax0.get_xlabel() == "achieved throughput (requests/s)"
    assert np.allclose(ax0.lines[0].get_xdata(), [0.5, 1.0, 1.2])
    texts = [t.get_text() for t in ax0.texts]
    assert "1x" not in texts and texts.count("0.5x") == 1 and texts.count("2x") == 1  # b's copies dropped
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for ax in fig.axes for t in ax.texts]
    assert not any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1:])
    matplotlib.pyplot.close(fig)


def test_timeline_panels_share_the_time_axis_on_request():
    short = [Seg(0, 0, "decode", 0.0, 2.0, 2)]
    long = [Seg(0, 0, "decode", 0.0, 5.0, 5)]
    fig = plots.timeline_figure([("a", short), ("b", long)])
    assert [ax.get_xlim()[1] for ax in fig.axes] == [2.0, 5.0]
    fig = plots.timeline_figure([("a", short), ("b", long)], sharex=True)
    assert [ax.get_xlim()[1] for ax in fig.axes] == [5.0, 5.0]
    matplotlib.pyplot.close("all")


def test_itl_figure_keeps_the_arrival_label_inside_the_axes():
    plots.style()
    t = np.linspace(0.65, 2.2, 60)
    itl = np.where((t > 0.77) & (t < 1.85), 1.08, 0.022)
    series = {"continuous, mixed prefill": {"t": t, "itl": itl}}
    # Near the window's left edge (the measured run) the label goes right of the line; else left.
    for arrival, right_of_line in ((0.765, True), (1.5, False)):
        fig = plots.itl_figure(series, arrival, window=(0.65, 2.2))
        fig.canvas.draw()
        r = fig.canvas.get_renderer()
        ax = fig.axes[0]
        note = _texts(ax)["long prompt arrives"]
        box, axes_box = note.get_window_extent(r), ax.get_window_extent(r)
        assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1
        assert not any(box.overlaps(tl.get_window_extent(r)) for tl in ax.get_yticklabels() if tl.get_text())
        line_x = ax.transData.transform((arrival, 0.0))[0]
        assert (box.x0 >= line_x) if right_of_line else (box.x1 <= line_x)
        matplotlib.pyplot.close(fig)


def test_chunk_tradeoff_figure_separates_loads_and_keeps_labels_apart():
    plots.style()
    # Like the Azure code trace: every load's 128- and 256-token chunks at about the same ITL.
    mk = lambda itl, ttft: {"chunk": np.array([128.0, 256, 512]), "itl_p99": np.array(itl) / 1e3,  # noqa: E731
                            "ttft_p99": np.array(ttft), "continuous_itl_p99": np.array([0.15]),
                            "continuous_ttft_p99": np.array([ttft[-1]])}
    fig = plots.chunk_tradeoff_figure({"1x": mk([5.4, 5.5, 9.5], [7.5, 1.5, 0.9]),
                                       "2x": mk([5.5, 5.5, 9.6], [15.0, 5.3, 3.8]),
                                       "4x": mk([5.5, 5.6, 9.7], [30.0, 9.5, 7.7])})
    ax = fig.axes[0]
    curves = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len({ln.get_color() for ln in curves}) == 3 and len({ln.get_marker() for ln in curves}) == 3
    assert [t.get_text() for t in ax.texts].count("128") == 3  # every load's smallest chunk is labelled
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in ax.texts]
    assert not any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1:])
    matplotlib.pyplot.close(fig)


def test_chunk_profile_figure_reads_the_itl_multiplier_as_1x_2x_5x():
    plots.style()
    curve = {"short": "m", "decodes": 8, "chunk": np.array([2.0, 64, 512]), "over_decode": np.array([1.2, 2.5, 12.0]),
             "share": np.array([0.05, 0.6, 1.0]), "bstar": 13.0}
    fig = plots.chunk_profile_figure([curve])
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1x", "2x", "5x", "10x"]
    matplotlib.pyplot.close(fig)


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
                      for k in ("itl_max_ms", "itl_p50_ms", "stall", "steps_over_2x", "steps_over_2x_before",
                                "steps_over_2x_during", "steps_over_2x_after", "prefill_itl_p50_ms", "ttft_ms")}
    for t in ("mix", "sep", "chk"):
        assert sum(n[f"{t}_steps_over_2x_{k}"] for k in ("before", "during", "after")) == n[f"{t}_steps_over_2x"]
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
                      "numbers": {"mix_itl_max_ms": mix_ms, "mix_stall": mix_ms / 5.0, "chk_itl_max_ms": chk_ms,
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
            "with 30 requests decoding at a median inter-token latency of 5.0 ms (a calibration run had timed "
            "their decode-only step at 4.0 ms), a 4,000-token prompt prefilled whole held their next token for "
            "36 ms (7x that median), in 512-token chunks for at most 6 ms") in text
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
    assert (f"Priced by the profile, static's prefill steps come to {sp['prefill']:.0%} of their measured time "
            f"and its decode steps {sp['decode']:.0%}; continuous's {cp['prefill']:.0%} and {cp['decode']:.0%}.") in text
    assert E.real_schedulers_rows(rs)[0][0] == "measured (simulated)"


def test_real_schedulers_text_says_how_far_the_simulation_is_in_words_by_hand():
    def m(slot: float, p99: float, tput: float, busy: float, steps: float) -> dict:
        return {"slot_util": slot, "e2e_p99": p99, "throughput_tok": tput, "busy_s": busy, "steps": steps}
    rs = {"real": {"static": m(0.49, 29.3, 100.0, 20.0, 400), "continuous": m(0.68, 5.6, 310.0, 15.0, 300)},
          "sim": {"static": m(0.49, 29.0, 100.0, 20.06, 402), "continuous": m(0.68, 5.0, 300.0, 13.05, 300)},
          "profile": "data/profiles/cpu-here-cpu-s.json",
          "steps_pred_over_real": {"static": {"prefill": 0.93, "decode": 1.20},
                                   "continuous": {"prefill": 0.86, "decode": 0.94}}}
    text = E.real_schedulers_text(rs)
    # 13.05 / 15 - 1 = -13%; 20.06 / 20 - 1 = +0.3%, which "+0%" or "-0%" would misstate.
    assert ("it takes 402 steps for static batching and 300 for continuous, where the real runs took 400 and 300, "
            "and its busy time comes out 13% below the measured one for continuous batching and within 1% of it "
            "for static.") in text
    assert "-0%" not in text and "+0%" not in text and "about the steps" not in text
    assert text.endswith("Priced by the profile, static's prefill steps come to 93% of their measured time and its "
                         "decode steps 120%; continuous's 86% and 94%.")
    rs["sim"]["static"]["busy_s"] = 21.0                      # 5% above
    assert "and 5% above it for static." in E.real_schedulers_text(rs)
    # A scheduler whose runs had no decode-only step: its kinds are named, not left to the reader.
    rs["steps_pred_over_real"]["continuous"]["decode"] = None
    assert E.real_schedulers_text(rs).endswith("continuous's prefill steps 86%.")


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


def test_batch1_kernel_text_gives_both_batches_read_rates_on_a_split_kernel_only():
    """Why batching: a CPU model's one-token steps split each product over the threads
    (Llama.linear); the page says so, with batch 1's and batch 2's read rates by hand."""
    from batching.model import LINEAR_CPU
    from batching.models import get_model
    m = get_model("cpu-m")
    sw = _synthetic_sweep()
    assert E.batch1_kernel_text(sw) == ""                                 # an older sweep: no kernel named
    sw["meta"]["linear"] = LINEAR_CPU
    r1 = (m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)) / 0.040 / 1e9
    r2 = (m.weight_read_bytes + m.kv_bytes_per_token * 2 * (128 + 1)) / 0.041 / 1e9
    text = E.batch1_kernel_text(sw)
    assert f"split over the 2 threads" in text
    assert f"Batch 1 reads its weights and KV at {r1:.1f} GB/s, batch 2 at {r2:.1f}" in text
    assert E.batch1_kernel_text({**sw, "batch": np.array([1.0, 4.0, 8.0, 16.0])}) == ""   # no batch 2
    gpu = _synthetic_sweep("cuda")
    gpu["meta"]["linear"] = "F.linear"
    assert E.batch1_kernel_text(gpu) == ""


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
    assert "; reaching 80% of it takes 1024-token chunks, 6 times B* (= 167)" in text
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
    assert s["e2e_vs_median"] == 0.08 and "(two real runs differ by 24%; against each request's median over the real runs, 8%)" in s["text"]
    assert s["busy_err"] is None and "busy time" not in s["text"]
    for r, x in zip(doc["results"].values(), (1.04, 0.93)):
        r["busy_pred_over_real"] = x
    f.write_text(json.dumps(doc))
    s = E.fidelity_summary(str(f))
    assert s["busy_err"] == pytest.approx(0.07)                   # the worse of +4% and -7%
    assert "its steps summed to within 7% of the measured busy time (median step 26%)" in s["text"]
    # The committed measurement is readable and has the noise floor the pages quote.
    committed = E.fidelity_summary()
    assert committed["noise"] is not None and 0 <= committed["tput_err"] < 1


def test_fidelity_summary_says_the_gpu_figures_are_unchecked_until_a_gpu_run_lands(tmp_path) -> None:
    """The CPU check validates the profile-driven simulator, not the GPU roofline figures it is
    quoted under: the sentence says so while no GPU fidelity run is committed, and reports the
    GPU run (and drops "not yet checked") once one is."""
    import json
    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    run = lambda dev, err: {"model": "cpu-s" if dev == "cpu-here" else "llama-1b", "device": dev,  # noqa: E731
                            "date": "2026-12-01T08:00:00+00:00", "workload": {"requests": 200},
                            "results": {"continuous": {"throughput_rel_err": err, "e2e_median_abs_rel_err": 2 * err,
                                                       "step_median_abs_rel_err": 0.1}}}
    (res / "fidelity.json").write_text(json.dumps(run("cpu-here", 0.01)))
    (res / "fidelity-600.json").write_text(json.dumps(run("cpu-here", 0.5)))  # a CPU variant: not a GPU check
    s = E.fidelity_summary(root=str(tmp_path))
    assert s["gpu_checks"] == 0 and E.gpu_fidelity_files(str(tmp_path)) == []
    assert s["text"].startswith("Simulator checked on the book's CPU only: driven by a step profile")
    assert ("median per-request latency came within 2%, and output throughput, which these arrivals mostly set, "
            "within 1.0%.") in s["text"]
    assert s["text"].endswith("roofline predictions from datasheet constants, not yet checked against a GPU.")
    assert s["gpu"] in s["text"]
    (res / "fidelity-h200-llama-1b.json").write_text(json.dumps(run("h200", 0.03)))
    s = E.fidelity_summary(root=str(tmp_path))
    assert s["gpu_checks"] == 1
    assert [f.name for f in E.gpu_fidelity_files(str(tmp_path))] == ["fidelity-h200-llama-1b.json"]
    assert "not yet checked" not in s["text"] and "CPU only" not in s["text"]
    assert ("h200 (llama-1b, 200 requests, 2026-12-01): output throughput within 3.0%, "
            "median per-request latency 6%") in s["text"]
    assert s["tput_err"] == 0.01  # the CPU numbers still come from the CPU file


# ------------------------------------------- review fixes: why.ipynb and static.ipynb
def test_static_batch_sizes_close_a_batch_early_at_the_context_by_hand():
    # B = 3, context 100: request 2 (prompt 60) cannot join [10/50, 10/5] (60 + 50 > 100),
    # so that batch closes at 2; [60/5, 10/5, 10/5] is full; the last request is alone.
    prompts, outputs = [10, 10, 60, 10, 10, 10], [50, 5, 5, 5, 5, 5]
    assert E.static_batch_sizes(prompts, outputs, 3, 100) == [2, 3, 1]
    assert E.static_batch_sizes(prompts, outputs, 3, 10_000) == [3, 3]
    # Over the batches formed: maxima 50, 5, 5; full batches [50, 5, 5], [5, 5, 5]: 50, 5.
    assert E.analytic_static_utilization(outputs, 3, [2, 3, 1]) == pytest.approx(75 / (3 * 60))
    assert E.analytic_static_utilization(outputs, 3) == pytest.approx(75 / (3 * 55))
    with pytest.raises(ValueError):
        E.analytic_static_utilization(outputs, 3, [3, 2])        # does not cover the requests
    with pytest.raises(ValueError):
        E.static_batch_sizes([1, 2], [1], 2, 100)


def _long_prompt_trace() -> Workload:
    """small_trace with a few prompts so long that no other long output fits beside them
    in llama-8b's 8,192-token context: the static scheduler closes batches early there."""
    w = small_trace(128)
    p, o = np.array(w.prompt_lens), np.array(w.output_lens)
    p[[10, 50, 90]], o[[10, 50, 90]] = 7800, 10      # each fits alone ...
    o[[11, 51, 91]] = 500                             # ... but not beside the next request
    return Workload.from_arrays(np.zeros(len(w)), p, o, name="long prompts")


def test_static_sweep_equals_the_formula_over_the_batches_the_scheduler_forms():
    sweep = E.static_batch_sweep(_long_prompt_trace(), H100_8B, [1, 4, 16, 32])
    assert sweep["closed_early"][1:].min() >= 1 and np.all(sweep["batches"] >= sweep["batches_full"])
    np.testing.assert_allclose(sweep["slot_util"], sweep["analytic_formed"], rtol=1e-12)
    assert np.any(np.abs(sweep["slot_util"] - sweep["analytic"]) > 1e-6)
    text = E.sweep_agreement_text(sweep, 16, H100_8B.model.max_context)
    assert "not equal to it" in text and "8,192-token context" in text and "exactly at every *B* of this sweep" in text
    assert "$" not in text                     # glued markdown shows $B$ raw: italics instead
    plain = E.static_batch_sweep(small_trace(128), H100_8B, [1, 4, 16])
    assert np.all(plain["closed_early"] == 0)
    assert E.sweep_agreement_text(plain, 4, 8192).startswith("The simulated slot utilization equals the formula")


def _wait_sweep_by_hand() -> dict:
    waits = np.array([0.0, 1.0, 8.0, 16.0])
    return {"static": {"wait": waits, "queue_mean": np.array([800.0, 200.0, 4.3, 6.3]),
                       "slot_util": np.array([0.03, 0.07, 0.30, 0.45])},
            "dynamic": {"wait": waits, "queue_mean": np.array([1.6, 1.6, 4.2, 6.3]),
                        "slot_util": np.array([0.12, 0.13, 0.31, 0.45])}}


def test_wait_summary_and_takeaway_say_where_dynamic_batching_helps():
    ws = _wait_sweep_by_hand()
    s = E.wait_summary(ws, rate=2.35, batch=32)
    assert s["fill_s"] == pytest.approx(32 / 2.35) and s["converge_wait"] == 8.0 and s["converge_i"] == 2
    text = E.wait_takeaway(ws, s)
    assert "ahead where the timeout is short: at *T* = 0 s" in text and "From *T* = 8 s on the two agree" in text
    assert "$" not in text
    # Each number at the one precision the prose prints it at too (wait_point): 3.0% and
    # 800 s for static at T = 0, 12% and 1.6 s for dynamic, 45% and 6.3 s at T = 16 s.
    assert "it reached 12% slot utilization at 1.6 s of queueing, static batching 3.0% slot utilization at 800 s" in text
    assert "static 45% slot utilization at 6.3 s of queueing" in text
    assert E.wait_point(ws["static"], 0) == {"util": "3.0%", "queue": "800 s"}
    assert E.wait_point(ws["static"], -1) == {"util": "45%", "queue": "6.3 s"}
    assert E.wait_point({"slot_util": [0.0999], "queue_mean": [99.94]}, 0) == {"util": "10.0%", "queue": "99.9 s"}
    assert E.wait_point({"slot_util": [0.1], "queue_mean": [1234.5]}, 0) == {"util": "10%", "queue": "1,234 s"}
    # A later point that disagrees again: no convergence "from T on".
    ws["dynamic"]["queue_mean"][-1] = 3.0
    s2 = E.wait_summary(ws, rate=2.35, batch=32)
    assert s2["converge_wait"] == -1.0 and "At no timeout of the sweep" in E.wait_takeaway(ws, s2)
    with pytest.raises(ValueError):
        E.wait_summary(ws, rate=0.0, batch=32)


def test_real_padding_text_follows_the_measured_ratios():
    base = dict(short=50.0, long=2000.0, short_ms=34.6, long_ms=1144.0, packed_ms=1141.2, token_ratio=40.0,
                positions_ratio=4000 / 2050, time_ratio_short=1144 / 34.6, executor={"device": "cpu"})
    more = E.real_padding_text({**base, "padded_ms": 2653.9, "time_ratio_batch": 2653.9 / 1141.2})
    assert "The short prompt's time grew less than its positions" in more
    assert "batch's time grew more than its positions" in more and "costs more per position" in more
    assert "0.663 ms" in more and "0.557 ms" in more and "On a GPU the roofline" in more
    even = E.real_padding_text({**base, "padded_ms": 2230.0, "time_ratio_batch": 2230.0 / 1141.2})
    assert "batch's time grew in proportion to its positions" in even and "more per position" not in even
    # The build's run: 2.12x the time for 1.95x the positions, 9% more per position: not "in proportion".
    slight = E.real_padding_text({**base, "padded_ms": 2420.0, "time_ratio_batch": 2420.0 / 1141.2})
    assert ("batch's time grew slightly more than in proportion to its positions (9% more per position): "
            "per position, the padded 4,000-position step cost 0.605 ms") in slight
    assert "costs more per position" not in slight
    less = E.real_padding_text({**base, "padded_ms": 2100.0, "time_ratio_batch": 2100.0 / 1141.2})
    assert "slightly less than in proportion to its positions (6% less per position)" in less
    # The thresholds, on the per-position ratio r: in proportion to 3%, slightly to 10%, beyond that not.
    pr = base["positions_ratio"]
    for r, words in ((1.02, "in proportion"), (0.975, "in proportion"), (1.05, "slightly more than in"),
                     (0.92, "slightly less than in"), (1.12, "more than its positions"),
                     (0.85, "less than its positions")):
        text = E.real_padding_text({**base, "padded_ms": 2230.0, "time_ratio_batch": pr * r})
        assert f"The padded batch's time grew {words}" in text, (r, text)
    gpu = E.real_padding_text({**base, "padded_ms": 2230.0, "time_ratio_batch": 1.95,
                               "executor": {"device": "cuda:0"}})
    assert "On a GPU the roofline" not in gpu


def test_knee_text_never_says_up_to_batch_1():
    n = {"knee125": 1.0, "knee2": 4.0, "bstar": 13.4}
    text = E.knee_text(n)
    assert "up to batch 1 " not in text and "up to batch 1," not in text
    assert text.startswith("No batch above 1 keeps the uniform step within 1.25x") and "up to batch 4" in text
    assert "nor within 2x" in E.knee_text({**n, "knee2": 1.0})
    assert E.knee_text({**n, "knee125": 2.0}).startswith("The uniform step stays within 1.25x of batch 1 up to batch 2")


def test_slab_cost_text_states_only_what_the_measurement_shows():
    n = {"bmax": 128.0, "mixed_gap_max": 1.00, "gathered_gap_max": 0.91}
    flat_ = E.slab_cost_text(n)
    assert "1.00 times the uniform one (the same within 5%)" in flat_ and "0.91 times (9% less)" in flat_
    assert "does not show in the step time" in flat_ and "copy does not show" in flat_
    assert "grows with batch times context" not in flat_
    assert "did not show" in E.slab_cost_takeaway(n)
    n2 = {**n, "mixed_gap_max": 1.03, "gathered_gap_max": 1.45}
    shown = E.slab_cost_text(n2)
    assert "45% more" in shown and "it takes 41% longer" in shown and "grows with batch times context" in shown
    assert E.slab_cost_takeaway(n2) == "The slab KV layout's extra work shows at batch 128: gathered slabs 1.45x the uniform step."


def test_gather_bytes_and_answer_by_hand():
    from batching.models import get_model
    # cpu-m: 12 layers x 4 KV heads x 64 dims x 4 bytes, K and V, 193 positions, 128 rows.
    assert E.gather_bytes(get_model("cpu-m"), 128, 192) == 2 * 12 * 4 * 64 * 4 * 193 * 128
    sw = _synthetic_sweep()                 # batch up to 8, ctx 128: longest context 192
    text = E.gather_answer_text(sw, E.live_numbers(sw))
    copy = 2 * 12 * 4 * 64 * 4 * 193 * 8
    assert f"copies {copy / 1e6:,.0f} MB" in text and f"takes {2 * copy / 30e9 * 1e3:,.1f} ms" in text
    assert "took 63.0 ms longer than the mixed one" in text
    # The copy (1.26 ms at 30 GB/s, read and write) explains 2% of the 63 ms; the rest is said
    # to be more than its bytes, and not given a cause the sweep did not measure.
    copy_ms = 2 * copy / 30e9 * 1e3
    assert f"explain {copy_ms / 63.0:.0%} of the extra time. The other {63.0 - copy_ms:,.1f} ms is more" in text
    n = {**E.live_numbers(sw), "gathered_tmax_ms": 77.0 + copy_ms / 2}   # the copy covers all of it
    assert E.gather_answer_text(sw, n).endswith("the copy's bytes are enough to account for all of it.")
    n["gathered_tmax_ms"] = 75.0
    assert "yet the step took no longer than the mixed one (2.0 ms less)." in E.gather_answer_text(sw, n)


def test_profile_stream_and_size_efficiency_on_the_committed_profile():
    profs = E.load_profiles(E.PROFILE_DIR)
    p = E.find_profile(profs, "cpu-s")
    cs = E.profile_stream(p)
    assert cs["weight_mb"] == pytest.approx(p["shape"].weight_read_bytes / 1e6)
    assert cs["stream_ms"] == pytest.approx(cs["weight_mb"] / 1e3 / cs["bandwidth_gbs"] * 1e3)
    assert cs["stream_fraction"] == pytest.approx(cs["stream_ms"] / p["t1_ms"])
    assert cs["efficiency"] == pytest.approx(cs["achieved_gbs"] / cs["bandwidth_gbs"])
    with pytest.raises(ValueError, match="no committed profile of cpu-l"):
        E.find_profile(profs, "cpu-l")
    sw = _synthetic_sweep()
    entries = E.stream_entries(profs, sw, E.live_numbers(sw))
    assert [e["model"] for e in entries][:2] == ["cpu-s", "cpu-m"]
    text = E.size_efficiency_text(entries)
    rising = entries[1]["efficiency"] > entries[0]["efficiency"]
    assert text.startswith("The measurements on this page agree" if rising else "The measurements on this page do not")
    assert "committed profile" in text and "this build" in text
    assert text.count("GB/s counting weight and KV bytes,") == 2      # the measure, named: not weights alone
    one = E.size_efficiency_text([e for e in entries if e["model"] == "cpu-m"])
    assert one.startswith("This page has measured one model per device only")


def test_stream_share_text_claims_more_only_when_the_share_is_larger():
    e = [{"model": "cpu-s", "source": "committed profile", "stream_fraction": 0.46},
         {"model": "cpu-m", "source": "this build", "stream_fraction": 0.63}]
    assert "so cpu-m's flat region says more about bandwidth" in E.stream_share_text(e, "cpu-m", "cpu-s")
    # One measure for both models, named (weights alone), so that it is not read as the
    # weight-and-KV efficiency of size_efficiency_text.
    assert E.stream_share_text(e, "cpu-m", "cpu-s").startswith(
        "Streaming the weights alone (weight bytes at the matrix-vector bandwidth of the run, KV bytes left out) "
        "fills 63% of cpu-m's batch-1 step (this build) and 46% of cpu-s's (committed profile)")
    e[1]["stream_fraction"] = 0.40
    assert "proves no more than cpu-s's" in E.stream_share_text(e, "cpu-m", "cpu-s")
    assert "no measurement of cpu-l" in E.stream_share_text(e, "cpu-l", "cpu-s")


def test_bandwidth_note_and_bstar_answer():
    sw = _synthetic_sweep()
    n = E.live_numbers(sw)
    note = E.bandwidth_note(18.5, sw, n)
    assert "20.0 GB/s in this build, 1.08 times the registry's," in note and "split" not in note
    sw["meta"]["matvec_layout"] = "matvec_split"        # the fastest product was the thread-split one
    assert "split over the threads" in E.bandwidth_note(18.5, sw, n)
    assert "another device" in E.bandwidth_note(18.5, _synthetic_sweep("cuda"), n)
    a100 = E.stream_numbers(get_cost_model("llama-8b", "a100"))
    h200 = E.stream_numbers(get_cost_model("llama-8b", "h200"))
    text = E.bstar_answer_text(a100, h200, "A100", "H200")
    # B* = peak / bandwidth in bf16: 312 / 2.039 = 153 against 989 / 4.8 = 206.
    assert text.startswith("The H200:") and "= 153" in text and "= 206" in text
    assert "3.2 times the A100's compute but only 2.4 times its bandwidth" in text
    assert E.bstar_answer_text(h200, a100, "H200", "A100").startswith("The H200:")
    assert h200["mem_reserve"] == 0.10 and h200["mem_usable"] == 0.90 and h200["mem_gb"] == 141
    # 412 rows of 2,048 tokens: what 90% of 141 GB holds after the weights, not 100%.
    from batching.models import get_model
    m = get_model("llama-8b")
    assert h200["long_fit"] == (0.9 * 141e9 - m.weight_bytes) // m.kv_bytes_per_token // 2048


def _texts(ax) -> dict:
    return {t.get_text(): t for t in ax.texts}


def test_why_figures_keep_their_labels_clear_of_legend_and_reference_lines():
    plots.style()
    gr = E.gpu_rooflines()
    fig = plots.gpu_roofline_figure(gr)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(r)
    bstars = [t for s, t in _texts(ax).items() if s.startswith("B*")]
    assert len(bstars) == 2 and not any(t.get_window_extent(r).overlaps(legend) for t in bstars)
    matplotlib.pyplot.close(fig)

    sw = _synthetic_sweep()
    n = E.live_numbers(sw)                             # 2x knee at batch 8 (t1 = 40 ms)
    fig = plots.live_decode_figure(sw, n, E.live_roofline(sw, points=20))
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = _texts(ax)
    r = fig.canvas.get_renderer()
    # The text's own box: an Annotation's extent would include its leader line.
    knee = matplotlib.text.Text.get_window_extent(texts["2x knee: 8"], r)
    for ref in ("2x batch 1", "1.25x batch 1"):
        assert not knee.overlaps(texts[ref].get_window_extent(r))
    # Neither reference line (1.25x and 2x of batch 1) runs through the label.
    to_px = ax.transData.transform
    for f in (1.25, 2.0):
        y = to_px((1.0, f * 40.0))[1]
        assert not knee.y0 <= y <= knee.y1
    matplotlib.pyplot.close(fig)
    # A knee at the first batch writes its label to the right, inside the axes.
    n1 = {**n, "knee2": 1.0}
    fig = plots.live_decode_figure(sw, n1, E.live_roofline(sw, points=20))
    fig.canvas.draw()
    ax = fig.axes[0]
    lab = matplotlib.text.Text.get_window_extent(_texts(ax)["2x knee: 1"], fig.canvas.get_renderer())
    assert lab.x0 >= ax.get_window_extent().x0
    matplotlib.pyplot.close(fig)


def test_profiles_figure_tells_the_coinciding_gpu_predictions_apart():
    plots.style()
    sw = _synthetic_sweep()
    fig = plots.profiles_figure([], [], live=sw, gpu=E.gpu_rooflines())
    lines = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("roofline prediction")]
    assert len(lines) == 2
    assert lines[0].get_marker() != lines[1].get_marker() and lines[0].get_linestyle() != lines[1].get_linestyle()
    matplotlib.pyplot.close(fig)


def test_wait_figure_labels_every_point_even_where_they_bunch():
    plots.style()
    ws = _wait_sweep_by_hand()
    ws["dynamic"]["queue_mean"] = np.array([1.59, 1.60, 4.2, 6.3])     # 0 and 1 s on one spot
    fig = plots.wait_figure(ws, ceiling=0.46)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    texts = _texts(ax)
    assert "0, 1" in texts                                             # one label for the bunch
    for t in ax.texts:                                                 # none cut off by the axes
        assert ax.get_window_extent().contains(*t.get_window_extent(r).p0), t.get_text()
        assert ax.get_window_extent().contains(*t.get_window_extent(r).p1), t.get_text()
    # The dynamic T = 16 point sits at 45%, just under the 46% ceiling: its label (above its
    # point by default) must not sit on the dashed line, nor may any other.
    y_line = ax.transData.transform((1.0, 0.46))[1]
    for t in ax.texts:
        if t.get_text().startswith("full batches"):              # the line's own label, on it
            continue
        box = t.get_window_extent(r)
        clear = plots.WAIT_LABEL_CLEAR_PX
        assert not box.y0 - clear <= y_line <= box.y1 + clear, t.get_text()
    sixteen = [t for t in ax.texts if t.get_text() == "16" and t.get_color() == plots.SCHEDULER_COLORS["dynamic"]]
    assert len(sixteen) == 1 and sixteen[0].get_window_extent(r).y0 > y_line
    matplotlib.pyplot.close(fig)


def test_roofline_numbers_name_the_assumed_step_overhead():
    # 7.1's opening names the roofline's one unmeasured per-step constant.
    n = E.roofline_numbers(H100_8B)
    assert n["overhead_ms"] == pytest.approx(0.3)
    assert H100_8B.decode_step(1, 1) * 1e3 == pytest.approx(n["decode_ms"])
    assert n["decode_ms"] > n["weight_read_gb"] / n["bandwidth_tbs"] + n["overhead_ms"] - 1e-9


def test_a_sweep_without_a_gathered_path_says_why():
    # CUDA steps replay graphs, which gather by their own rule: the sweep times two paths.
    assert list(E.decode_paths(graphs=True)) == ["uniform", "mixed"]
    assert list(E.decode_paths()) == ["uniform", "mixed", "gathered"]
    sw = _synthetic_sweep("cuda")
    sw["paths"] = ["uniform", "mixed"]
    for k in ("gathered_ms", "gathered_p25_ms", "gathered_p75_ms"):
        del sw[k]
    n = E.live_numbers(sw)
    assert "gathered_gap_max" not in n
    text = E.slab_cost_text(n)
    assert "no separate gathered path was timed" in text and "gathered step" not in text
    assert E.slab_cost_takeaway(n) == "The slab KV layout's extra work shows at batch 8: mixed contexts 1.10x the uniform step."
    assert "timed no separate gathered path" in E.gather_answer_text(sw, n)
    assert "brown squares" not in E.live_labels(sw)["paths"]
    assert "brown squares" in E.live_labels(_synthetic_sweep())["paths"]
    # One name per path in the prose, the caption and the legend.
    paths = E.live_labels(_synthetic_sweep())["paths"]
    for p in ("uniform", "mixed", "gathered"):
        assert f"{p} (" in paths and plots.PATH_LABELS[p].startswith(f"measured, {p}: ")
    fig = plots.live_decode_figure(sw, n, E.live_roofline(sw, points=10))
    matplotlib.pyplot.close(fig)
