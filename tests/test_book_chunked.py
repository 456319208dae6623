"""The numbers, verdicts and figures behind 7.3 chunked prefill (batching/book/chunked.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import math

import matplotlib
import numpy as np
import pytest
from helpers import H100_8B, LinearCost, _gpu_profile, _texts, reqs

from batching import capacity
from batching.book import (
    checks,
    chunked,
    decode,
    figures,
    plots,
    profiles,
)
from batching.book.common import Versus
from batching.costs.profile import GPU_PROFILE_DIR
from batching.engine import SimExecutor, run
from batching.schedulers import ContinuousScheduler, make_scheduler
from batching.workloads import Workload, synthetic, trace_workload
from batching.workloads.lengths import LogNormal


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
    assert rf["tok_gflop"] == pytest.approx(13.959, abs=1e-3)
    assert rf["attn_tflop"] == pytest.approx(4.19535, abs=1e-4)
    # The step: prompt matrices + attention + 30 decode rows (matrices, LM head, KV reads).
    assert 4000 * rf["tok_gflop"] / 1e3 + rf["attn_tflop"] < rf["long_tflop"] < 4000 * 16 / 1e3
    # Compute-bound: the roofline's step is exactly that compute at peak plus its overhead.
    assert rf["long_ms"] == pytest.approx(rf["long_tflop"] / 989.0 * 1e3 + rf["overhead_ms"], rel=1e-3)


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
    # The measured page's row of such a run: the slow steps split 1 / 3 / 0 around the prompt.
    st = chunked.stall_summary({"chk": ("chunked", res)}, [0, 1], 2)
    rows = chunked.live_stall_rows({**st, "labels": {"chk": "chunked"}})
    assert rows == [["chunked", "9000", "3000.0", "9000", "25,000", "1 / 3 / 0"]]
    # No step inside the prefill (a short prompt on a fast device): a dash, not "nan".
    st["numbers"]["chk_prefill_itl_p50_ms"] = float("nan")
    assert chunked.live_stall_rows({**st, "labels": {"chk": "chunked"}})[0][3] == "-"


def test_stall_verdict_removed_spread_or_not_cut():
    # The committed cpu-s run: whole 804 ms at a 23.0 ms median (35x); chunked worst 161 ms,
    # its chunk steps 119.5 ms against a 24.1 ms median (5.0x): the stall is spread, not gone.
    n = {
        "mix_itl_max_ms": 804.0,
        "mix_stall": 35.0,
        "mix_ttft_ms": 808.0,
        "chk_itl_max_ms": 161.0,
        "chk_itl_p50_ms": 24.0,
        "chk_prefill_itl_p50_ms": 120.0,
        "chk_ttft_ms": 1463.0,
    }
    assert chunked.stall_verdict(n) == "spread"
    # The chunk steps are exactly 5.0x the median: removed at a factor of 5, not of 4.9.
    assert chunked.stall_verdict(n, factor=5.0) == "removed"
    assert chunked.stall_verdict(n, factor=4.9) == "spread"
    # Chunk steps at 1.5x the median: removed.
    assert chunked.stall_verdict({**n, "chk_prefill_itl_p50_ms": 36.0}) == "removed"
    # A chunked worst step no better than the whole prompt's: not cut.
    assert chunked.stall_verdict({**n, "chk_itl_max_ms": 804.0}) == "not cut"


def test_real_chunk_numbers_read_the_run_against_this_builds_probed_bstar():
    """One B* per device, from one source: the live sweep's probes (the why page's), not a
    committed profile that may come from another machine."""
    curve = {
        "device": "cpu-here",
        "bstar": 12.8,
        "chunk": np.array([64, 128, 256]),
        "share": np.array([0.5, 0.7, 0.9]),
        "over_decode": np.array([2.0, 4.0, 8.0]),
    }
    epyc = {"kind": "cpu", "name": "AMD EPYC", "threads": 2}
    # B* = 0.1 TFLOP/s x 4 bytes / (2 x 20 GB/s) = 10.
    sweep = {
        "meta": {"model": "cpu-m", "dtype": "fp32", "reps": 1, "wall_s": 1.0, "machine": epyc},
        "batch": np.array([1.0, 16.0]),
        "ctx": 128,
        "paths": ["uniform"],
        "uniform_ms": np.array([40.0, 60.0]),
        "matvec_gbs": 20.0,
        "copy_gbs": 30.0,
        "read_gbs": 33.0,
        "peak_tflops": 0.1,
    }
    bstar = decode.live_numbers(sweep)["bstar"]
    assert bstar == pytest.approx(10.0)
    rs = {"executor": {"hardware": "cpu-here", "machine": epyc}, "chunk": 128}
    r = chunked.real_chunk_numbers(sweep, rs, bstar)
    assert r == {
        "bstar": pytest.approx(10.0),
        "chunk_over_bstar": pytest.approx(12.8),
        "above_bstar": True,
        "same_machine": True,
    }
    small = chunked.real_chunk_numbers(sweep, {**rs, "chunk": 8}, bstar)
    assert not small["above_bstar"]
    xeon = {"kind": "cpu", "name": "Intel Xeon", "threads": 2}
    assert not chunked.real_chunk_numbers(sweep, {**rs, "executor": {"machine": xeon}}, bstar)["same_machine"]
    # B* depends on the dtype: the sweep in the run's dtype is the one to read (torch's name or
    # the registry's), the first where none matches.
    bf16 = {**sweep, "meta": {**sweep["meta"], "dtype": "bf16"}}
    run32 = {**rs, "executor": {**rs["executor"], "dtype": "float32"}}
    assert chunked.sweep_in_run_dtype([bf16, sweep], run32) is sweep
    assert chunked.sweep_in_run_dtype([sweep, bf16], {**rs, "executor": {"dtype": "bfloat16"}}) is bf16
    assert chunked.sweep_in_run_dtype([bf16], run32) is bf16
    # 80% first at 256 tokens = 20 x B*, 8x the decode-only step; nothing reaches 95%.
    assert chunked.chunk_efficiency(curve) == {
        "chunk": 256.0,
        "times_bstar": 20.0,
        "over_decode": 8.0,
    }
    assert chunked.chunk_efficiency(curve, share=0.95) is None


def test_stall_rows_by_hand():
    st = {"numbers": {"mix_itl_max_ms": 61.46, "mix_itl_p50_ms": 5.13, "mix_ttft_ms": 61.5}}
    assert chunked.stall_rows(st, {"mix": "mixed"}) == [["mixed", "61.5", "62"]]


def test_trace_contrast_by_hand():
    code = Workload.from_arrays([0.0, 1.0], [2000, 1000], [20, 40])
    conv = Workload.from_arrays([0.0, 1.0, 2.0], [1000, 500, 300], [200, 300, 400])
    c = chunked.trace_contrast(code, conv)
    assert c == {"prompt_ratio": 1500 / 600, "output_shorter": 300 / 30}
    with pytest.raises(ValueError):
        chunked.trace_contrast(Workload.from_arrays([], [], []), conv)


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
        fig = figures.chunked.itl_figure(series, arrival, window=(0.65, 2.2))
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
    fig = figures.chunked.chunk_tradeoff_figure(
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
    # The newcomer is placed by step count: the same steps on any machine, busy or not.
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
    assert st["cpus"] >= 1 and st["busy"] == (st["load"] > st["cpus"])
    # Chunked prefill takes the running prompts (3 x 40) in 7 steps of 20 tokens (from the
    # 4th on, the decodes of the prompts done take their share), the others in 1: the
    # newcomer arrives 10 decode steps after the slowest prefill, at step 17.
    assert st["at_step"] == 7 + 10
    output = 10 + math.ceil(100 / 16) + 20
    for tag, res in st["results"].items():
        done = {r.rid: len(r.token_ids) for r in res.requests}
        assert done == {0: output, 1: output, 2: output, 3: 8}, tag  # every token, nobody dropped
        L = res.log.cols
        # On the measured clock again: back to back, each row one measured step.
        assert L["t"][1:] == pytest.approx(list(np.cumsum(L["dur"])[:-1])) and min(L["dur"]) > 0
        newcomer = next(r for r in res.requests if r.rid == 3)
        assert newcomer.arrival == pytest.approx(sum(L["dur"][:17])), tag  # after the 17th step
        assert chunked.stall_overlaps(res, range(3), 3), tag
        # The figure's times count from this run's own arrival, which differs between runs.
        label = st["labels"][tag]
        ts = st["series"][label]["t"]
        assert ts + newcomer.arrival == pytest.approx(chunked.itl_series(res, range(3))["t"]), tag
        assert st["first_token"][label] == pytest.approx(newcomer.token_times[0] - newcomer.arrival), tag
        assert ts.min() < 0 < ts.max(), tag  # decodes before and after the arrival
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
    assert set(st["series"]) == set(st["labels"].values()) and st["executor"]["model"] == "tiny"
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


def test_committed_real_runs_are_read_cpu_first_and_tabulated(tmp_path):
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    assert checks.committed_real_runs(str(tmp_path)) == []
    assert chunked.committed_stall_rows([]) == []
    (res / "stall-h200-llama-1b.json").write_text(
        json.dumps(_stall_doc("H200-SXM", "NVIDIA H200", "llama-1b", 36.0, 6.0))
    )
    (res / "stall-cpu-here-cpu-s.json").write_text(
        json.dumps(_stall_doc("cpu-here", "AMD EPYC", "cpu-s", 900.0, 110.0))
    )
    docs = checks.committed_real_runs(str(tmp_path))
    assert [d["device"] for d in docs] == ["cpu-here", "H200-SXM"]
    assert docs[1]["path"] == "benchmarks/results/stall-h200-llama-1b.json"
    assert [d["machine_label"] for d in docs] == ["AMD EPYC", "NVIDIA H200"] and checks.any_gpu(docs)
    assert not any(d["same_machine"] for d in docs)  # no live run given
    # Built on the H200, its run is this machine's and comes first; on an Intel Xeon, neither is.
    on_h200 = checks.committed_real_runs(
        str(tmp_path), here={"machine": {"kind": "cuda", "name": "NVIDIA H200"}}
    )
    assert [(d["device"], d["same_machine"]) for d in on_h200] == [("H200-SXM", True), ("cpu-here", False)]
    on_xeon = checks.committed_real_runs(str(tmp_path), here={"device": "cpu", "device_name": "Intel Xeon"})
    assert not any(d["same_machine"] for d in on_xeon) and not checks.any_gpu(on_xeon[:1])
    # The median ITL is the unchunked run's own: worst 36 ms at a stall of 36 / 5 = 7.2x.
    assert chunked.committed_stall_rows(docs)[1] == [
        "llama-1b bf16, NVIDIA H200",
        "2026-12-01",
        "30 x 4,000, 512",
        "5.0",
        "36 / 6",
        "36 / 41",
    ]
    rows = chunked.committed_stall_rows(docs)
    assert len(rows) == 2 and all(len(r) == len(chunked.COMMITTED_STALL_HEADER) for r in rows)
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
    curves = chunked.profile_chunk_steps(profiles.load_profiles(tmp_path), decodes=8)
    assert len(curves) == 1  # the profile without mixed steps is left out
    c = curves[0]
    assert c["chunk"].tolist() == [64, 256, 1024] and c["decodes"] == 8
    assert np.allclose(c["over_decode"], np.array([5.125, 8.0, 16.0]) / 4.1)
    assert c["over_decode"][0] == pytest.approx(1.25)
    tps = np.array([64 / 5.125e-3, 256 / 8e-3, 1024 / 16e-3])
    assert np.allclose(c["share"], tps / tps.max())
    assert c["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    assert c["short"] == "llama-8b bf16 on NVIDIA H200"
    # 256 tokens reach 0.5 of the best: 80% first at 1024 = 6.1 x B* (1024 / 166.7), 3.9x decode-only.
    e = chunked.chunk_efficiency(c)
    assert (
        e["chunk"] == 1024
        and e["times_bstar"] == pytest.approx(6.144)
        and e["over_decode"] == pytest.approx(16 / 4.1)
    )
    assert chunked.profile_chunk_steps(profiles.load_profiles(tmp_path), decodes=16) == []
    for cs in (curves, []):
        fig = figures.chunked.chunk_profile_figure(cs)
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
    fig = figures.chunked.chunk_profile_figure([curve])
    fig.canvas.draw()
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["1x", "2x", "5x", "10x"]
    matplotlib.pyplot.close(fig)


def test_chunk_profile_figure_keeps_its_legend_off_the_panels():
    # A label as wide as a panel (a long machine name) and a B* near the left of the chunk axis:
    # the legend, under the panels, covers neither a B* label nor a panel.
    plots.style()
    chunk = np.array([2.0, 16, 128, 512])
    curves = [
        {
            "short": f"llama-8b bf16 on a machine with a very long name, number {i}",
            "decodes": 8,
            "chunk": chunk,
            "over_decode": np.array([1.1, 1.5, 4.0, 12.0]),
            "share": np.array([0.02, 0.2, 0.8, 1.0]),
            "bstar": bstar,
        }
        for i, bstar in enumerate((3.0, 14.0))
    ]
    fig = figures.chunked.chunk_profile_figure(curves)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    (legend,) = fig.legends
    box = legend.get_window_extent(r)
    bstars = [t for a in fig.axes for t in a.texts if t.get_text() == "B*"]
    assert len(bstars) == 2 and not any(box.overlaps(t.get_window_extent(r)) for t in bstars)
    assert not any(box.overlaps(a.get_window_extent(r)) for a in fig.axes)
    matplotlib.pyplot.close(fig)


def test_slo_steps_by_hand():
    # llama-8b on an H100: a prompt token is 13.96 GFLOP in the matrices, 14.11 us at 989 TFLOP/s.
    # Beside 32 decodes of 4,096 tokens (15.0 GB of weights + 17.2 GB of KV: 9.9 ms, memory-bound)
    # a 480-token chunk still rides under the memory time; the 2,048 budget is compute-bound.
    ss = chunked.slo_steps(H100_8B, 49.55, [512, 2048])
    assert ss["token_us"] == pytest.approx(14.114, abs=1e-3)
    assert ss["budget_512_ms"] == pytest.approx(9.93, abs=0.01)
    assert 2016 * ss["token_us"] / 1e3 < ss["budget_2048_ms"] < 2048 * 16 / 989 + 0.3 + 1.5
    n = int(ss["slo_tokens"])
    t = chunked.chunk_step_times(H100_8B, [n, n + 1], decodes=32, ctx=4096)["step_s"]
    assert t[0] <= 49.55e-3 < t[1] and 3000 < n < 3500  # about (49.55 - 0.3) ms / 14.1 us, less the decodes
    assert chunked.chunk_within(H100_8B, 1e-3, decodes=32, ctx=4096) == 0  # below the decode-only step
    with pytest.raises(ValueError, match="budget=32"):
        chunked.slo_steps(H100_8B, 49.55, [32])


# ------------------------------------------------------------------ the trade-off on a bursty trace
def _load(ttft: list[float], itl: list[float], none_ttft: float, none_itl: float) -> dict[str, np.ndarray]:
    return {
        "chunk": np.array([128.0, 512.0, 2048.0]),
        "ttft_p99": np.array(ttft),
        "itl_p99": np.array(itl),
        "continuous_ttft_p99": np.array([none_ttft]),
        "continuous_itl_p99": np.array([none_itl]),
    }


def test_tradeoff_rows_by_hand():
    sweep = {
        1.0: {
            **_load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.7, 0.15),
            "itl_p50": np.array([0.005, 0.005, 0.005]),
        },
        4.0: {
            **_load([30.0, 7.7, 7.4], [0.01, 0.02, 0.04], 8.0, 0.2),
            "itl_p50": np.array([0.005, 0.0083, 0.031]),
        },
    }
    rows, header = chunked.tradeoff_rows(sweep, [128, 2048], 4.0)
    assert header == ["chunk (tokens)", "median ITL, 4x (ms)", "p99 TTFT, 4x (s)"]
    assert rows == [["128", "5.0", "30.0"], ["2,048", "31.0", "7.4"]]


def test_capacity_numbers_by_hand():
    rows = [
        {"config": "continuous, mixed prefill", "slo": "strict", "rate": 14.7, "itl_p99_ms": 49.1},
        {"config": "chunked, budget 2048", "slo": "relaxed", "rate": 39.0, "itl_p99_ms": 32.5},
        {"config": "static", "slo": "strict", "rate": 1.6, "itl_p99_ms": 40.0},  # not on this page
        {"config": "chunked, budget 512", "slo": "strict", "rate": 0.0, "itl_p99_ms": float("nan")},
    ]
    assert chunked.capacity_numbers(rows) == {
        "mix_strict": 14.7,
        "mix_strict_itl_ms": 49.1,
        "b2048_relaxed": 39.0,
        "b2048_relaxed_itl_ms": 32.5,
        "b512_strict": 0.0,
    }
    # 49.1 ms against a 50 ms target: the ITL binds; 39.0 req/s under both SLOs: the same.
    cap = {"mix_strict_itl_ms": 49.1, "b2048_strict": 39.0, "b2048_relaxed": 39.0}
    assert chunked.capacity_limits(cap, 50.0) == {"mix_itl_bound": True, "budget_same": True}
    cap = {"b2048_strict": 30.0, "b2048_relaxed": 39.0}  # no strict ITL at capacity: the queue
    assert chunked.capacity_limits(cap, 50.0) == {"mix_itl_bound": False, "budget_same": False}


def test_capacity_ratio_is_chunked_at_budget_512_over_separate_prefill():
    cap = {
        "sep_strict": 11.2,
        "b512_strict": 34.6,
        "b2048_strict": 37.7,
        "sep_relaxed": 26.7,
        "b512_relaxed": 34.6,
    }
    assert chunked.capacity_ratio(cap) == pytest.approx(34.6 / 11.2)  # not budget 2,048's
    assert chunked.capacity_ratio(cap, "relaxed") == pytest.approx(34.6 / 26.7)
    assert chunked.capacity_ratio({"sep_strict": 0.0, "b512_strict": 1.0}) == math.inf
    assert chunked.SARATHI_SERVE_RATIO == 2.6  # Agrawal et al., OSDI 2024: Mistral-7B, one A100
    assert set(chunked.RATIO_CONFIGS) <= set(chunked.CAPACITY_TAGS)
    rows, header = chunked.ratio_rows(
        {
            "roofline, H100-SXM": {"strict_ms": 49.55, "sep_strict": 11.21, "b512_strict": 34.58},
            "measured, A100-SXM": {"strict_ms": 119.44, "sep_strict": 2.8, "b512_strict": 6.11},
        }
    )
    assert header == ["", "roofline, H100-SXM", "measured, A100-SXM"]
    assert rows == [
        ["continuous, separate prefill (req/s)", "11.2", "2.8"],
        ["chunked, budget 512 (req/s)", "34.6", "6.1"],
    ]


def test_strict_slo_of_a_roofline_and_of_vidurs_measured_a100():
    from batching.book import gpu
    from batching.costs import get_cost_model

    assert chunked.strict_slo_ms(H100_8B) == pytest.approx(capacity.slos(H100_8B)["strict_ms"], rel=1e-12)
    # The A100 profile: 32 decodes at 4,096 tokens take 23.9 ms (linear layers measured, KV
    # at the measured batch-1 bandwidth), so the strict SLO is 5 x that = 119 ms.
    a100 = get_cost_model("llama-8b", "a100", profile=str(GPU_PROFILE_DIR / gpu.BOOK_PROFILES["a100"]))
    assert chunked.strict_slo_ms(a100) == pytest.approx(119.4, abs=0.1)


def test_ratio_capacity_runs_the_two_configurations_at_the_strict_slo_only():
    w = synthetic(
        80,
        4.0,
        LogNormal(median=600, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=400),
        seed=5,
    )
    r = chunked.ratio_capacity(w, H100_8B, iters=2)
    assert {k for k in r if not k.endswith("_itl_ms")} == {"sep_strict", "b512_strict", "strict_ms", "ratio"}
    assert r["strict_ms"] == pytest.approx(chunked.strict_slo_ms(H100_8B))
    assert r["ratio"] == pytest.approx(r["b512_strict"] / r["sep_strict"]) and r["ratio"] >= 1


def test_chunk_cost_figure_draws_each_gpu_with_its_dot_at_the_chunk():
    curves = {
        "GPU A": {"tokens": np.array([128.0, 256, 512, 1024]), "ratio_floor": np.array([2.5, 1.8, 1.2, 1.0])},
        "GPU B": {"tokens": np.array([128.0, 256, 512, 1024]), "ratio_floor": np.array([1.6, 1.2, 1.0, 1.1])},
    }
    fig = figures.chunked.chunk_cost_figure(curves, 512, 1.10, 1.25)
    ax = fig.axes[0]
    dots = [ln for ln in ax.get_lines() if ln.get_marker() == "o"]
    assert [tuple(d.get_xydata()[0]) for d in dots] == [(512.0, 1.2), (512.0, 1.0)]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels[:2] == ["GPU A", "GPU B"] and "within 10% of the cheapest" in labels
    lo, hi = ax.get_ylim()
    assert lo < 1.0 and hi > 2.5
    matplotlib.pyplot.close(fig)


def test_chunked_prefill_more_than_doubles_separate_prefills_capacity_on_the_measured_a100():
    """7.3's measured-GPU capacity, on the smoke slice (300 conversations): chunked prefill at
    budget 512 sustains over twice separate prefill's rate at the A100's strict SLO (the full
    page: 2.2x measured, 3.0x on the H100 roofline, 2.6x published)."""
    from batching.book import gpu
    from batching.costs import get_cost_model

    a100 = get_cost_model("llama-8b", "a100", profile=str(GPU_PROFILE_DIR / gpu.BOOK_PROFILES["a100"]))
    conv = trace_workload("azure-conv", limit=300, max_context=a100.model.max_context)
    r = chunked.ratio_capacity(conv, a100, iters=3)
    assert r["strict_ms"] == pytest.approx(119.4, abs=0.1)
    assert r["sep_strict_itl_ms"] <= r["strict_ms"] and r["b512_strict_itl_ms"] <= r["strict_ms"]
    assert 2.0 < r["ratio"] < 4.0


# ------------------------------------------------ the newcomer's TTFT, matching, and past the chunk
def test_newcomer_ttft_rises_stays_or_falls_within_the_tolerance():
    # The committed cpu-s run: 808 ms whole, 1,463 ms chunked, 81% later.
    t = chunked.newcomer_ttft({"mix_ttft_ms": 808.0, "chk_ttft_ms": 1463.0})
    assert (t["whole_ms"], t["chunked_ms"]) == (808.0, 1463.0)
    assert t["change"] == pytest.approx(655 / 808) and t["verdict"] is Versus.MORE
    # 436 -> 650 ms (+49%): later; under 10% is noise, 11% is not.
    assert chunked.newcomer_ttft({"mix_ttft_ms": 436.0, "chk_ttft_ms": 650.0})["verdict"] is Versus.MORE
    assert chunked.newcomer_ttft({"mix_ttft_ms": 400.0, "chk_ttft_ms": 439.0})["verdict"] is Versus.SAME
    assert chunked.newcomer_ttft({"mix_ttft_ms": 400.0, "chk_ttft_ms": 444.0})["verdict"] is Versus.MORE
    assert chunked.newcomer_ttft({"mix_ttft_ms": 400.0, "chk_ttft_ms": 300.0})["verdict"] is Versus.LESS
    # The roofline's 65 -> 67 ms is the same within the measured tolerance, not within 1%.
    n = {"mix_ttft_ms": 65.0, "chk_ttft_ms": 67.0}
    assert chunked.newcomer_ttft(n)["verdict"] is Versus.SAME
    assert chunked.newcomer_ttft(n, tol=0.01)["verdict"] is Versus.MORE
    with pytest.raises(ValueError):
        chunked.newcomer_ttft({"mix_ttft_ms": 0.0, "chk_ttft_ms": 1.0})


def test_nochunk_verdict_matches_within_5_percent_and_beats_beyond():
    # The Azure code trace at its rate: 2,048-token chunks at 0.83 s against 0.85 s whole is
    # a match (2.4% apart), not a win; their p99 ITL (40 ms against 150) is a win.
    v = chunked.nochunk_verdict(_load([3.0, 1.0, 0.83], [0.01, 0.02, 0.04], 0.85, 0.15))
    assert (v["chunk"], v["ttft"], v["ttft_whole"], v["itl"]) == (2048, 0.83, 0.85, 0.04)
    assert v["ttft_vs"] is Versus.SAME and v["itl_vs"] is Versus.LESS
    # 0.80 against 0.85 s is 5.9% lower: beaten. 0.85 against 0.80: the unchunked TTFT is better.
    assert (
        chunked.nochunk_verdict(_load([3.0, 1.0, 0.80], [0.01, 0.02, 0.04], 0.85, 0.15))["ttft_vs"]
        is Versus.LESS
    )
    assert (
        chunked.nochunk_verdict(_load([3.0, 1.0, 0.85], [0.01, 0.02, 0.04], 0.80, 0.15))["ttft_vs"]
        is Versus.MORE
    )
    # The chunk with the lowest TTFT is the one judged, wherever it sits.
    assert chunked.nochunk_verdict(_load([3.0, 0.7, 0.8], [0.01, 0.02, 0.04], 0.9, 0.15))["chunk"] == 512


def test_past_chunk_ttft_flat_falls_or_rises_while_itl_grows():
    # Like the Azure code trace: from 512 to 2,048 tokens TTFT moves under 10% at every load
    # while the p99 ITL rises from 9.5-9.7 ms to 35-36 ms.
    sweep = {
        1.0: _load([7.6, 0.949, 0.856], [0.0054, 0.0095, 0.0348], 0.87, 0.15),
        4.0: _load([29.9, 7.71, 7.43], [0.0055, 0.0097, 0.0359], 7.9, 0.2),
    }
    p = chunked.past_chunk(sweep, 512)
    assert (p["chunk"], p["largest"], p["ttft_load"]) == (512, 2048, 1.0)  # 1x moves most: -9.8%
    assert p["ttft_ratio"] == pytest.approx(0.856 / 0.949) and p["ttft_vs"] is Versus.SAME
    assert p["itl_ratio_min"] == pytest.approx(0.0348 / 0.0095)
    assert p["itl_ratio_max"] == pytest.approx(0.0359 / 0.0097)
    # At a tolerance of 5% the same TTFT falls; a TTFT 20% higher at 2,048 rises.
    assert chunked.past_chunk(sweep, 512, tol=0.05)["ttft_vs"] is Versus.LESS
    up = {**sweep, 4.0: _load([29.9, 7.71, 9.3], [0.0055, 0.0097, 0.0359], 7.9, 0.2)}
    assert chunked.past_chunk(up, 512)["ttft_vs"] is Versus.MORE
    with pytest.raises(ValueError, match="chunk=2048"):
        chunked.past_chunk(sweep, 2048)
    with pytest.raises(ValueError, match="chunk=300"):
        chunked.past_chunk(sweep, 300)
