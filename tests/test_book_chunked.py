"""The numbers, verdicts and figures behind 7.3 chunked prefill (batching/book/chunked.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from helpers import LinearCost, _gpu_profile, _texts, reqs

from batching.book import (
    checks,
    chunked,
    plots,
    static,
    why,
)
from batching.costs import get_cost_model
from batching.engine import SimExecutor, run
from batching.schedulers import ContinuousScheduler, make_scheduler
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


def test_itl_spike_without_chunks_and_none_with_them():
    w = chunked.long_prompt_among_decodes(running=30, prompt=4000, at=0.5)
    cfg = {
        "mix": ("mixed", "continuous", {}),
        "chk": ("chunked", "chunked", {"token_budget": 512 + 32, "chunk_size": 512}),
    }
    st = chunked.stall_runs(w, H100_8B, cfg, running=range(30), newcomer=30, slots=32)
    n = st["numbers"]
    rf = chunked.stall_numbers(H100_8B, 512, 4000, decodes=30)
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
    rf = chunked.stall_numbers(H100_8B, 512, 4000, decodes=30)
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
    ex = chunked.chunk_for_itl(H100_8B, 2.0, decodes=30, ctx=300, reference=[256, 4096])
    assert ex["decode_ms"] == pytest.approx(5.134, abs=1e-3) and 655 <= ex["chunk"] <= 675
    t = chunked.chunk_step_times(H100_8B, [int(ex["chunk"]), int(ex["chunk"]) + 1], decodes=30, ctx=300)[
        "step_s"
    ]
    assert t[0] <= 2 * ex["decode_ms"] / 1e3 < t[1]
    assert ex["step_ms"] == pytest.approx(t[0] * 1e3) and 0.9 < ex["share"] < 1
    with pytest.raises(ValueError):
        chunked.chunk_for_itl(H100_8B, 1.0)


def test_spike_summary_splits_the_slow_steps_around_the_long_prompt():
    # A step costs 1 s + 1 s per token it carries; budget 8, chunks of 8. Steps 1-2 prefill
    # r0's then r1's 8-token prompt: r0, decoding from t = 9, waits 9 s for its next token
    # (slow: the decode-only median is 3 s) before the newcomer exists. The newcomer's 16
    # tokens at t = 30 go 6 + 6 + 4 beside the two decodes: steps of 9, 9 and 7 s, all > 6 s.
    w = Workload.from_arrays([0, 0, 30.0], [8, 8, 16], [20, 20, 2])
    res = run(
        w.fresh(),
        make_scheduler("chunked", max_context=64, slots=3, token_budget=8, chunk_size=8),
        SimExecutor(LinearCost(1.0, 1.0)),
    )
    s = chunked.spike_summary(res, [0, 1], 2)
    assert (s["steps_over_2x_before"], s["steps_over_2x_during"], s["steps_over_2x_after"]) == (1, 3, 0)
    assert s["steps_over_2x"] == 4 and s["itl_p50_ms"] == 3000 and s["itl_max_ms"] == 9000
    assert s["ttft_ms"] == 25000  # first token at the end of the third chunk step, t = 55
    assert s["prefill_itl_p50_ms"] == 9000  # r0's ITLs over those steps: 9, 9 and 7 s
    rs = {
        "numbers": {
            "chk_steps_over_2x_before": 7.0,
            "chk_steps_over_2x_during": 12.0,
            "chk_steps_over_2x_after": 1.0,
        },
        "chunks": 12,
        "chunk": 128,
        "running_prompt": 128,
        "budget": 137,
    }
    t = chunked.slow_steps_text(rs)
    assert t.startswith(
        "Of the 20 steps that took more than twice the median, 12 came while the long prompt "
        "was prefilled (it takes 12 chunks of 128 tokens); 7 came before it arrived: the running"
    )
    assert t.endswith(
        "; 1 came after its first token, with nothing left to prefill: run-to-run noise on this machine."
    )
    rs["numbers"].update(chk_steps_over_2x_before=0.0, chk_steps_over_2x_after=0.0)
    assert chunked.slow_steps_text(rs) == (
        "Of the 12 steps that took more than twice the median, 12 came while the long "
        "prompt was prefilled (it takes 12 chunks of 128 tokens)."
    )
    rs["numbers"].update(chk_steps_over_2x_during=0.0)
    assert chunked.slow_steps_text(rs) == "No step took more than twice the median."


def test_calibration_text_names_the_calibration_step_and_the_runs_median_itl():
    # The build's run: calibration 15.5 ms, the runs' median ITLs 22.6, 24.0 and 22.8 ms.
    rs = {
        "decode_ms": 15.5,
        "lead_steps": 10,
        "at_s": 0.764,
        "numbers": {"mix_itl_p50_ms": 22.6, "sep_itl_p50_ms": 24.0, "chk_itl_p50_ms": 22.8},
    }
    t = chunked.calibration_text(rs)
    assert t.startswith(
        "A calibration run first times the running batch's decode-only step, 15.5 ms here (the "
        "median of its later steps), only to place the long prompt: it arrives 10 such steps after "
        "their prefill ends, at t = 0.76 s."
    )
    assert (
        "median inter-token latency was 22.6 to 24.0 ms, not the calibration's 15.5 ms: the table quotes "
        "the runs' own median, and every stall below is a multiple of it."
    ) in t
    close = chunked.calibration_text(
        {**rs, "numbers": {"mix_itl_p50_ms": 16.0, "sep_itl_p50_ms": 16.0, "chk_itl_p50_ms": 16.0}}
    )
    assert close.endswith("median inter-token latency was 16.0 ms, close to it.")


def test_trace_contrast_by_hand():
    code = Workload.from_arrays([0.0, 1.0], [2000, 1000], [20, 40])
    conv = Workload.from_arrays([0.0, 1.0, 2.0], [1000, 500, 300], [200, 300, 400])
    c = chunked.trace_contrast(code, conv)
    assert (c["prompt_mean"], c["output_mean"], c["other_prompt_mean"], c["other_output_mean"]) == (
        1500,
        30,
        600,
        300,
    )
    assert c["prompt_ratio"] == 2.5 and c["output_shorter"] == 10.0
    with pytest.raises(ValueError):
        chunked.trace_contrast(Workload.from_arrays([], [], []), conv)


def test_ttft_cost_text_reports_a_delay_only_beyond_the_noise():
    assert chunked.ttft_cost_text({"chk_ttft_ms": 1330.0, "mix_ttft_ms": 891.0}) == (
        "The newcomer paid for the chunks: its first token came 1,330 ms after arrival instead of 891 ms, 49% later."
    )
    assert chunked.ttft_cost_text({"chk_ttft_ms": 1102.0, "mix_ttft_ms": 1132.0}).endswith(
        "against 1,132 ms unchunked: in this run its chunks did not delay it measurably."
    )


def test_real_chunk_text_reads_the_run_against_its_devices_profile():
    curve = {
        "device": "cpu-here",
        "bstar": 12.8,
        "chunk": np.array([64, 128, 256]),
        "share": np.array([0.5, 0.7, 0.9]),
    }
    rs = {
        "executor": {"hardware": "cpu-here"},
        "chunk": 128,
        "chunks": 12,
        "numbers": {"chk_prefill_itl_p50_ms": 108.0, "chk_itl_p50_ms": 20.0},
    }
    t = chunked.real_chunk_text([curve], rs)
    assert t.startswith("A 128-token chunk is 10 times this machine's B* (= 13, from its profile)")
    assert "still wait 5.4x their median" in t and "over the prompt's 12 chunks rather than remove it" in t
    assert "runs at 70% of the best" in t and "and reaching 80% of it takes 256-token chunks." in t
    t = chunked.real_chunk_text(
        [curve], {**rs, "numbers": {"chk_prefill_itl_p50_ms": 30.0, "chk_itl_p50_ms": 20.0}}
    )
    assert (
        "rather than remove it" not in t
        and "the median chunk step holds the running requests for only 1.5x" in t
    )
    t = chunked.real_chunk_text([curve], {**rs, "executor": {"hardware": "h200"}})
    assert t.startswith("No committed profile of this device (h200)")


def test_chunk_roofline_is_flat_below_bstar_and_linear_above():
    d = chunked.chunk_step_times(H100_8B, [16, 32, 64, 1024, 2048, 4096], decodes=30, ctx=300)
    small, big = d["step_s"][:3], d["step_s"][3:]
    assert np.ptp(small) / small[0] < 0.01  # memory-bound: chunk rides for free
    assert big[2] / big[1] == pytest.approx(2.0, rel=0.1)  # compute-bound: time follows tokens
    assert np.all(np.diff(d["prefill_tps"][:3]) > 0)
    assert chunked.stall_numbers(H100_8B, 512, 4000, reference=[256, 1024, 4096])["chunk_share"] <= 1.0


def test_chunk_sweep_itl_grows_with_chunk_size_and_no_chunking_is_worst():
    w = synthetic(
        80,
        4.0,
        LogNormal(median=2000, sigma=0.6, lo=64, hi=7000),
        LogNormal(median=20, sigma=0.8, lo=2, hi=200),
        seed=5,
    )
    cs = chunked.chunk_sweep(w, H100_8B, [128, 512, 2048], slots=16, time_scales=(1.0,))[1.0]
    assert np.all(np.diff(cs["itl_p99"]) > 0)
    assert cs["continuous_itl_p99"][0] > cs["itl_p99"][-1]
    nums = chunked.tradeoff_numbers({1.0: cs}, {"c": 512}, {"l1": 1.0})
    assert nums["l1c_itl_p99_ms"] == pytest.approx(cs["itl_p99"][1] * 1e3)
    assert nums["loads_text"] == "1"


def test_itl_series_by_hand():
    res = run(reqs((0, 4, 3), (0, 4, 2)), ContinuousScheduler(2, 64), SimExecutor(LinearCost(1.0, 0.5)))
    s = chunked.itl_series(res, [0, 1])
    # Step 1 computes 8 prompt tokens (5 s), step 2 two decodes (2 s), step 3 one decode (1.5 s).
    assert s["t"].tolist() == [7.0, 7.0, 8.5] and s["itl"].tolist() == [2.0, 2.0, 1.5]


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
    mk = lambda itl, ttft: {
        "chunk": np.array([128.0, 256, 512]),
        "itl_p99": np.array(itl) / 1e3,
        "ttft_p99": np.array(ttft),
        "continuous_itl_p99": np.array([0.15]),
        "continuous_ttft_p99": np.array([ttft[-1]]),
    }
    fig = plots.chunk_tradeoff_figure(
        {
            "1x": mk([5.4, 5.5, 9.5], [7.5, 1.5, 0.9]),
            "2x": mk([5.5, 5.5, 9.6], [15.0, 5.3, 3.8]),
            "4x": mk([5.5, 5.6, 9.7], [30.0, 9.5, 7.7]),
        }
    )
    ax = fig.axes[0]
    curves = [ln for ln in ax.lines if ln.get_linestyle() == "-"]
    assert len({ln.get_color() for ln in curves}) == 3 and len({ln.get_marker() for ln in curves}) == 3
    assert [t.get_text() for t in ax.texts].count("128") == 3  # every load's smallest chunk is labelled
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    boxes = [t.get_window_extent(r) for t in ax.texts]
    assert not any(p.overlaps(q) for i, p in enumerate(boxes) for q in boxes[i + 1 :])
    matplotlib.pyplot.close(fig)


@pytest.mark.model
def test_real_stall_serves_the_long_prompt_whole_or_in_chunks_on_the_model():
    pytest.importorskip("torch")
    # tail_steps=20: the running requests keep decoding through the newcomer's chunks even
    # if the calibration overstated the step 4x (a noisy neighbour on a shared machine).
    st = chunked.real_stall(
        model="tiny",
        device="cpu",
        running=3,
        prompt=100,
        chunk=16,
        tail_steps=20,
        running_prompt=40,
        threads=1,
    )
    assert st["budget"] == 16 + 4 and st["at_s"] > 0 and st["decode_ms"] > 0
    output = 2 * 10 + math.ceil(100 / 16) + 20
    for tag, res in st["results"].items():
        done = {r.rid: len(r.token_ids) for r in res.requests}
        assert done == {0: output, 1: output, 2: output, 3: 8}, tag  # every token, nobody dropped
        L = res.log.cols
        prefills = [int(p) for p in L["prefill"] if p]
        if tag == "chk":
            # Budget 20 with the 3 running decodes: the newcomer's 100 tokens go in chunks
            # of 16 (chunk_size), the last 4 left over, in steps that carry all 3 decodes.
            assert [int(p) for p, d in zip(L["prefill"], L["decode"]) if p and d == 3] == [16] * 6 + [4]
            assert max(prefills) <= 20
        else:  # the running prompts together, then the whole long prompt in one step
            assert prefills == [3 * 40, 100], tag
    n = st["numbers"]
    assert set(n) == {
        f"{t}_{k}"
        for t in ("mix", "sep", "chk")
        for k in (
            "itl_max_ms",
            "itl_p50_ms",
            "stall",
            "steps_over_2x",
            "steps_over_2x_before",
            "steps_over_2x_during",
            "steps_over_2x_after",
            "prefill_itl_p50_ms",
            "ttft_ms",
        )
    }
    for t in ("mix", "sep", "chk"):
        assert (
            sum(n[f"{t}_steps_over_2x_{k}"] for k in ("before", "during", "after")) == n[f"{t}_steps_over_2x"]
        )
    assert set(st["series"]) == set(st["labels"].values()) and st["model"] == "tiny"
    with pytest.raises(ValueError, match="chunk=0"):
        chunked.real_stall(model="tiny", device="cpu", running=3, prompt=100, chunk=0)


def _stall_doc(device: str, device_name: str, model: str, mix_ms: float, chk_ms: float) -> dict:
    """A bench_stall.py result with hand-picked numbers."""
    return {
        "device": device,
        "device_name": device_name,
        "model": model,
        "dtype": "bf16",
        "date": "2026-12-01T00:00:00+00:00",
        "command": "python benchmarks/bench_stall.py",
        "padding": {
            "short": 50.0,
            "long": 4000.0,
            "short_ms": 2.0,
            "long_ms": 30.0,
            "token_ratio": 80.0,
            "time_ratio_short": 15.0,
            "time_ratio_batch": 1.9,
        },
        "stall": {
            "running": 30,
            "prompt": 4000,
            "chunk": 512,
            "decode_ms": 4.0,
            "numbers": {
                "mix_itl_max_ms": mix_ms,
                "mix_stall": mix_ms / 5.0,
                "chk_itl_max_ms": chk_ms,
                "mix_ttft_ms": mix_ms,
                "chk_ttft_ms": 41.0,
            },
        },
    }


def test_committed_real_runs_are_read_cpu_first_and_described(tmp_path):
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    assert checks.committed_real_runs(str(tmp_path)) == []
    assert "No other device's measurement" in chunked.committed_stall_text([])
    (res / "stall-h200-llama-1b.json").write_text(
        json.dumps(_stall_doc("H200-SXM", "NVIDIA H200", "llama-1b", 36.0, 6.0))
    )
    (res / "stall-cpu-here-cpu-s.json").write_text(
        json.dumps(_stall_doc("cpu-here", "AMD EPYC", "cpu-s", 900.0, 110.0))
    )
    docs = checks.committed_real_runs(str(tmp_path))
    assert [d["device"] for d in docs] == ["cpu-here", "H200-SXM"]
    assert docs[1]["path"] == "benchmarks/results/stall-h200-llama-1b.json"
    text = chunked.committed_stall_text(docs)
    assert (
        "llama-1b bf16 on NVIDIA H200, measured 2026-12-01 (`benchmarks/results/stall-h200-llama-1b.json`): "
        "with 30 requests decoding at a median inter-token latency of 5.0 ms (a calibration run had timed "
        "their decode-only step at 4.0 ms), a 4,000-token prompt prefilled whole held their next token for "
        "36 ms (7x that median), in 512-token chunks for at most 6 ms"
    ) in text
    assert "No GPU measurement" not in text
    assert "No GPU measurement is among them yet" in chunked.committed_stall_text(docs[:1])
    bad = _stall_doc("cpu-here", "AMD EPYC", "cpu-s", 1.0, 1.0)
    del bad["stall"]
    (res / "stall-cpu-here-bad.json").write_text(json.dumps(bad))
    with pytest.raises(ValueError, match=r"stall-cpu-here-bad.json: no 'stall'"):
        checks.committed_real_runs(str(tmp_path))


def test_profile_chunk_steps_reads_the_measured_mixed_steps_as_they_are(tmp_path):
    import json

    prof = _gpu_profile()
    # 8 decodes at 128 tokens each: 4.1 ms alone (decode grid), then chunks of 64..1024.
    prof["mixed"] = {
        "prefill_tokens": [1024, 64, 256, 64, 256, 1024],
        "decode_rows": [8, 8, 8, 1, 1, 1],
        "decode_ctx": [128] * 6,
        "ms": [16.0, 4.1 * 1.25, 8.0, 4.5, 7.0, 15.0],
    }
    (tmp_path / "h200-llama-8b.json").write_text(json.dumps(prof))
    no_mixed = _gpu_profile()
    no_mixed["meta"]["model"] = "llama-1b"
    (tmp_path / "h200-llama-1b.json").write_text(json.dumps(no_mixed))
    curves = chunked.profile_chunk_steps(why.load_profiles(tmp_path), decodes=8)
    assert len(curves) == 1  # the profile without mixed steps is left out
    c = curves[0]
    assert c["chunk"].tolist() == [64, 256, 1024] and c["step_ms"].tolist() == [5.125, 8.0, 16.0]
    assert c["decode_ms"] == 4.1 and c["ctx"] == 128 and c["decodes"] == 8
    assert c["over_decode"][0] == pytest.approx(1.25)
    tps = np.array([64 / 5.125e-3, 256 / 8e-3, 1024 / 16e-3])
    assert np.allclose(c["prefill_tps"], tps) and np.allclose(c["share"], tps / tps.max())
    assert c["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    assert c["short"] == "llama-8b bf16 on NVIDIA H200"
    text = chunked.profile_chunk_text(curves, chunks=(64, 256))
    # 256 tokens reach 0.5 of the best: 80% first at 1024 = 6 x B* (1024 / 166.7).
    assert "a 64-token chunk makes it 5.1 ms (1.2x) at 20%" in text
    assert "a 256-token chunk makes it 8.0 ms (2.0x) at 50%" in text
    assert "; reaching 80% of it takes 1024-token chunks, 6 times B* (= 167)" in text
    assert "No committed profile" in chunked.profile_chunk_text([])
    assert chunked.profile_chunk_steps(why.load_profiles(tmp_path), decodes=16) == []
    for cs in (curves, []):
        fig = plots.chunk_profile_figure(cs)
        png, _ = plots.save(fig, "chunk-profile", tmp_path)
        assert png.stat().st_size > 5000
        matplotlib.pyplot.close(fig)


def test_chunk_profile_figure_reads_the_itl_multiplier_as_1x_2x_5x():
    plots.style()
    curve = {
        "short": "m",
        "decodes": 8,
        "chunk": np.array([2.0, 64, 512]),
        "over_decode": np.array([1.2, 2.5, 12.0]),
        "share": np.array([0.05, 0.6, 1.0]),
        "bstar": 13.0,
    }
    fig = plots.chunk_profile_figure([curve])
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1x", "2x", "5x", "10x"]
    matplotlib.pyplot.close(fig)
