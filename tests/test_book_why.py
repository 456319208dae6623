"""The numbers, verdicts and figures behind "Why batching" (batching/book/why.py), and the live
decode sweep, its committed profiles and its measured section (batching/book/decode.py):
hand-computed cases, and sweeps that must move the way theory says they do."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from helpers import H100_8B, _gpu_profile, _texts

from batching.book import common, decode, figures, plots, profiles, why
from batching.book.common import Claim
from batching.costs import get_cost_model, roofline
from batching.costs.knee import KNEE_FACTOR, knee
from batching.costs.profile import GPU_PROFILE_DIR, PROFILE_DIR
from batching.costs.roofline import decode_curve


# ---------------------------------------------------------------------- why batching
def test_knee_is_the_last_batch_before_the_curve_first_leaves_the_band():
    b = [1, 2, 4, 8, 16, 32]
    t = [10.0, 11.0, 12.4, 13.0, 25.0, 50.0]
    assert knee(b, t, 1.25) == 4  # 12.4 <= 12.5 < 13
    assert knee(b, t, 2.0) == 8  # 13 <= 20 < 25
    assert knee(b, t, 100.0) == 32
    # A later dip back under the band does not count: the run ended at the first exit.
    assert knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 1.25) == 1
    assert knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 2.0) == 4
    with pytest.raises(ValueError):
        knee(b, t, 0.9)
    with pytest.raises(ValueError):
        knee([1, 4, 2], [1.0, 1.0, 1.0], 2.0)
    with pytest.raises(ValueError):
        knee([1, 2], [1.0, float("nan")], 2.0)


def test_bstar_matches_the_conventions_and_the_cost_model():
    assert roofline.bstar(989e12, 3.35e12, 2) == pytest.approx(295.22, abs=0.01)
    assert roofline.bstar(989e12, 4.8e12, 2) == pytest.approx(206.04, abs=0.01)
    assert roofline.bstar(110e9, 18.5e9, 4) == pytest.approx(2 * 110 / 18.5)  # fp32: twice peak / bandwidth
    for model, dev in (("llama-8b", "h100"), ("llama-8b", "h200"), ("cpu-m", "cpu")):
        c = get_cost_model(model, dev)
        assert roofline.bstar(c.peak_flops, c.bandwidth, c.model.bytes_per_param) == pytest.approx(
            c.bstar(), rel=1e-12
        )
    with pytest.raises(ValueError):
        roofline.bstar(0.0, 1.0, 2)


def test_roofline_curve_values_and_crossing():
    m = H100_8B.model
    d = H100_8B.device
    b = [1, 2, 64, 256, 512, 1024]
    cur = decode_curve(m, b, 128, d.bandwidth, H100_8B.peak_flops, d.step_overhead_s)
    # Same numbers as the simulator's cost model, step by step.
    for bi, t in zip(b, cur["time_s"]):
        assert t == pytest.approx(H100_8B.decode_step(bi, 128), rel=1e-12)
    assert cur["weights_s"][0] == pytest.approx(15.009849344e9 / 3.35e12)  # 4.48 ms: llama-8b's stream
    assert np.all(np.diff(cur["memory_s"]) > 0)  # KV grows with the batch
    assert cur["compute_s"][3] / cur["compute_s"][0] == pytest.approx(256, rel=1e-3)
    assert list(cur["bound"]) == [0, 0, 0, 0, 1, 1]
    # With no context the memory and compute lines cross at B* (within the non-matmul params).
    dense = np.arange(1, 600)
    z = decode_curve(m, dense, 0, d.bandwidth, H100_8B.peak_flops)
    cross = dense[np.argmax(z["compute_s"] > z["memory_s"])]
    assert abs(cross - H100_8B.bstar()) / H100_8B.bstar() < 0.02
    assert np.allclose(z["tokens_per_s"], dense / z["time_s"])


def test_stream_numbers_and_gpu_rooflines():
    s = why.stream_numbers(H100_8B, ctx=128, long_ctx=2048, long_batch=128)
    assert s["stream_ms"] == pytest.approx(4.4806, abs=1e-3)
    assert s["step_ms"] == pytest.approx(H100_8B.decode_step(1, 128) * 1e3)
    assert s["bstar_floor"] == 295 and s["tokens_s_bstar"] > 200 * s["tokens_s"]
    assert s["kv_long_gb"] == pytest.approx(128 * 2048 * 131072 / 1e9)
    assert s["long_fit"] == H100_8B.kv_capacity() // 2048
    # The page's one B* is common.roofline_numbers': 989 / 3.35 in bf16.
    assert s["bstar"] == common.roofline_numbers(H100_8B)["bstar"] == pytest.approx(989 / 3.35)
    # 295 rows at 128 tokens: 15.01 GB of weights + 295 x 129 x 131 kB of KV at 3.35 TB/s,
    # + 0.3 ms, over batch 1's 4.786 ms: the headline "295 sequences for 1.31 times one".
    b295 = (15.009849344e9 + 295 * 129 * 131072) / 3.35e12 + 0.3e-3
    assert s["ratio_bstar"] == pytest.approx(b295 / (s["step_ms"] / 1e3), rel=1e-3)
    assert s["ratio_bstar"] == pytest.approx(1.31, abs=0.01)
    # KV of 2,048-token rows equals the 15.01 GB of weights at about 56 rows.
    assert s["kv_equal_batch"] == pytest.approx(15.009849344e9 / (2048 * 131072))
    assert round(s["kv_equal_batch"]) == 56
    with pytest.raises(ValueError):
        why.stream_numbers(get_cost_model("llama-70b", "h200", tp=2))
    gr = why.gpu_rooflines("llama-8b", ("h100", "h200"), batches=[1, 16, 128, 256, 512], ctxs=(128, 2048))
    h100, h200 = gr["devices"]["H100-SXM"], gr["devices"]["H200-SXM"]
    assert h200["bstar"] < h100["bstar"] and gr["dtype"] == "bf16"
    long = h100["ctx"][2048]
    assert list(long["fits"]) == [1, 1, 1, 0, 0]  # 208 rows of 2,048 tokens fit an H100
    assert list(h200["ctx"][2048]["fits"]) == [1, 1, 1, 1, 0]
    # Throughput at short context grows almost linearly below B*.
    short = h200["ctx"][128]["tokens_per_s"]
    assert short[1] / short[0] > 15


def _synthetic_sweep(device_type: str = "cpu") -> dict:
    """A live sweep as batching.real.sweep.decode_sweep returns it, with hand-picked times (cpu-m, fp32)."""
    return {
        "meta": {
            "device": "cpu-here" if device_type == "cpu" else "H200-SXM",
            "device_type": device_type,
            "device_name": "AMD EPYC" if device_type == "cpu" else "NVIDIA H200",
            "model": "cpu-m",
            "dtype": "fp32",
            "params": 117198336.0,
            "threads": 2,
            "torch": "2.x",
            "reps": 5,
            "date": "2026-11-30T00:00:00+00:00",
            "loadavg_before": 0.1,
            "loadavg_after": 0.2,
            "wall_s": 30.0,
        },
        "batch": np.array([1.0, 2.0, 4.0, 8.0]),
        "ctx": 128,
        "paths": ["uniform", "mixed", "gathered"],
        "uniform_ms": np.array([40.0, 41.0, 48.0, 70.0]),
        "uniform_p25_ms": np.array([39.0, 40.0, 47.0, 69.0]),
        "uniform_p75_ms": np.array([41.0, 42.0, 49.0, 71.0]),
        "mixed_ms": np.array([40.0, 42.0, 50.0, 77.0]),
        "mixed_p25_ms": np.array([39.0, 41.0, 49.0, 76.0]),
        "mixed_p75_ms": np.array([41.0, 43.0, 51.0, 78.0]),
        "gathered_ms": np.array([40.0, 45.0, 60.0, 140.0]),
        "gathered_p25_ms": np.array([39.0, 44.0, 59.0, 139.0]),
        "gathered_p75_ms": np.array([41.0, 46.0, 61.0, 141.0]),
        "matvec_gbs": 20.0,
        "copy_gbs": 30.0,
        "read_gbs": 33.0,
        "peak_tflops": 0.1,
    }


def test_live_numbers_by_hand():
    from batching.costs.models import get_model

    sw = _synthetic_sweep()
    n = decode.live_numbers(sw)
    m = get_model("cpu-m")
    moved = m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)  # weights, KV read, KV written
    assert n["achieved_gbs"] == pytest.approx(moved / 0.040 / 1e9)
    assert n["efficiency"] == pytest.approx(moved / 0.040 / 20e9)
    assert n["efficiency_copy"] == pytest.approx(moved / 0.040 / 30e9)
    assert n["bstar"] == pytest.approx(2 * 0.1e12 / 20e9)
    assert n["knee"] == 8 and n["gathered_knee"] == 4 and n["mixed_knee"] == 8  # 2x of 40 ms = 80 ms
    # B* = 10: the largest swept batch at or below it is 8, whose step is 70 / 40 of batch 1's.
    assert n["bstar_batch"] == 8 and n["ratio_bstar"] == pytest.approx(70 / 40)
    # The roofline of the same run at batch 8: compute 8 x 2 x params / 0.1 TFLOP/s stays below
    # the weight stream at 20 GB/s, so only the KV of 8 rows separates it from batch 1.
    kv = m.kv_bytes_per_token * (128 + 1)
    assert n["pred_ratio_bstar"] == pytest.approx((m.weight_read_bytes + 8 * kv) / (m.weight_read_bytes + kv))
    assert n["tps_max"] == pytest.approx(8 * 1e3 / 70) and n["per_token_max_ms"] == pytest.approx(70 / 8)
    assert n["gathered_gap_max"] == pytest.approx(2.0) and n["mixed_gap_max"] == pytest.approx(1.1)
    assert n["pred1_ms"] < n["t1_ms"] and n["over_pred"] == pytest.approx(n["t1_ms"] / n["pred1_ms"])
    sw["uniform_ms"] = np.array([41.0, 40.0, 48.0, 70.0])
    with pytest.raises(ValueError):
        decode.live_numbers({**sw, "batch": np.array([2.0, 4.0, 8.0, 16.0])})


def test_load_profiles_picks_up_every_profile_and_says_which_devices_are_measured(tmp_path):
    import json
    import shutil
    from pathlib import Path

    assert profiles.load_profiles(tmp_path) == []
    shutil.copy(Path(PROFILE_DIR) / "cpu-here-cpu-s.json", tmp_path / "cpu-here-cpu-s.json")
    only_cpu = profiles.load_profiles(tmp_path)
    assert [p["device"] for p in only_cpu] == ["cpu-here"]
    (tmp_path / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    both = profiles.load_profiles(tmp_path, ctx=100)
    assert [p["device"] for p in both] == ["cpu-here", "H200-SXM"]
    h200 = both[1]
    assert h200["ref_ctx"] == 128 and h200["ref_ms"].tolist()[0] == 4.0
    assert h200["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    rows, header = profiles.profile_rows(both)
    assert len(rows) == len(only_cpu[0]["ctxs"]) + 2 and all(len(r) == len(header) for r in rows)
    # The H200's two contexts by hand: 4.0 -> 8.0 ms, all within 2x (knee 256: 8.0 ms is exactly
    # 2x, still inside); 4.2 -> 20.0 ms, within 8.4 ms up to batch 64 (8.0), out at 256 (knee 64).
    assert rows[-2] == ["NVIDIA H200", "llama-8b", "128", "4.0", "256", "8.0", "256"]
    assert rows[-1] == ["NVIDIA H200", "llama-8b", "1024", "4.2", "256", "20.0", "64"]
    # Each named by the machine it was measured on, not the entry every CPU shares.
    cpu = json.loads((tmp_path / "cpu-here-cpu-s.json").read_text())["meta"]["machine"]
    assert [p["machine"] for p in both] == [f"{cpu['name']} ({cpu['threads']} threads)", "NVIDIA H200"]
    assert header[0] == "measured on"
    roof = profiles.profile_roofline(h200, points=10)
    assert len(roof["batch"]) == 10 and roof["batch"][0] == 1 and roof["batch"][-1] == pytest.approx(256)


def test_why_batching_figures_draw_and_save(tmp_path):
    import json

    plots.style()
    sw = _synthetic_sweep()
    gr = why.gpu_rooflines(batches=[1, 4, 16, 64, 256, 1024])
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    profs = profiles.load_profiles(PROFILE_DIR) + profiles.load_profiles(tmp_path / "p")
    figs = {
        "roofline": figures.why.gpu_roofline_figure(gr),
        "live": figures.why.live_decode_figure(
            sw, decode.live_numbers(sw), decode.live_roofline(sw, points=20)
        ),
        "live_uniform": figures.why.live_decode_figure(
            sw, decode.live_numbers(sw), decode.live_roofline(sw, points=20), paths=["uniform"]
        ),
        "profiles": figures.why.profiles_figure(
            profs, [profiles.profile_roofline(p) for p in profs], live=sw, gpu=gr
        ),
        "no_profiles": figures.why.profiles_figure([], [], live=sw),
    }
    for name, fig in figs.items():
        png, svg = plots.save(fig, name, tmp_path)
        assert png.stat().st_size > 5000 and svg.read_text().startswith("<?xml"), name
        matplotlib.pyplot.close(fig)


def test_why_figures_keep_their_labels_clear_of_legend_and_reference_lines():
    plots.style()
    gr = why.gpu_rooflines()
    fig = figures.why.gpu_roofline_figure(gr)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(r)
    bstars = [t for s, t in _texts(ax).items() if s.startswith("B*")]
    assert len(bstars) == 2 and not any(t.get_window_extent(r).overlaps(legend) for t in bstars)
    matplotlib.pyplot.close(fig)

    sw = _synthetic_sweep()
    n = decode.live_numbers(sw)  # 2x knee at batch 8 (t1 = 40 ms)
    fig = figures.why.live_decode_figure(sw, n, decode.live_roofline(sw, points=20))
    fig.canvas.draw()
    ax = fig.axes[0]
    texts = _texts(ax)
    r = fig.canvas.get_renderer()
    # The text's own box: an Annotation's extent would include its leader line.
    knee = matplotlib.text.Text.get_window_extent(texts["knee: 8"], r)
    assert not knee.overlaps(texts["2x batch 1"].get_window_extent(r))
    # The knee's reference line (2x batch 1) does not run through the label.
    to_px = ax.transData.transform
    for f in (KNEE_FACTOR,):
        y = to_px((1.0, f * 40.0))[1]
        assert not knee.y0 <= y <= knee.y1
    matplotlib.pyplot.close(fig)
    # A knee at the first batch writes its label to the right, inside the axes.
    n1 = {**n, "knee": 1.0}
    fig = figures.why.live_decode_figure(sw, n1, decode.live_roofline(sw, points=20))
    fig.canvas.draw()
    ax = fig.axes[0]
    lab = matplotlib.text.Text.get_window_extent(_texts(ax)["knee: 1"], fig.canvas.get_renderer())
    assert lab.x0 >= ax.get_window_extent().x0
    matplotlib.pyplot.close(fig)


@pytest.mark.parametrize("peak_tflops", [0.02, 0.07, 0.1])
def test_live_decode_figure_keeps_the_band_label_clear_of_b_star(peak_tflops):
    # A flat curve puts the 2x band near the top, where B*'s label sits: B* = 2 (left half of the
    # batch axis), 7 (under its right end) and 10 (past it); the band's label takes the other half.
    plots.style()
    sw = {**_synthetic_sweep(), "peak_tflops": peak_tflops}
    n = decode.live_numbers(sw)
    fig = figures.why.live_decode_figure(sw, n, decode.live_roofline(sw, points=20), paths=["uniform"])
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    texts = _texts(fig.axes[0])
    (bstar,) = (t for s, t in texts.items() if s.startswith("B* ="))
    assert not texts["2x batch 1"].get_window_extent(r).overlaps(bstar.get_window_extent(r))
    matplotlib.pyplot.close(fig)


def test_profiles_figure_tells_the_coinciding_gpu_predictions_apart():
    plots.style()
    sw = _synthetic_sweep()
    fig = figures.why.profiles_figure([], [], live=sw, gpu=why.gpu_rooflines())
    lines = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("roofline simulation")]
    assert len(lines) == 2
    assert (
        lines[0].get_marker() != lines[1].get_marker()
        and lines[0].get_linestyle() != lines[1].get_linestyle()
    )
    matplotlib.pyplot.close(fig)


def test_roofline_numbers_name_the_assumed_step_overhead():
    # 7.1's opening names the roofline's one unmeasured per-step constant.
    n = common.roofline_numbers(H100_8B)
    assert n["overhead_ms"] == pytest.approx(0.3)
    assert (
        H100_8B.decode_step(1, 1) * 1e3 > n["weight_read_gb"] / n["bandwidth_tbs"] + n["overhead_ms"] - 1e-9
    )


def test_flat_verdict_reads_the_step_at_bstar_against_the_roofline_then_the_knee():
    # Synthetic sweep: B* = 2 x 0.1 TFLOP/s / 20 GB/s = 10, so batch 8 decides: 70 / 40 = 1.75
    # against the roofline's ~1.02, more than 1.25 times it; every batch stays within 2x.
    sw = _synthetic_sweep()
    n = decode.live_numbers(sw)
    assert n["ratio_bstar"] > common.FLAT_TOL * n["pred_ratio_bstar"] and n["knee"] == 8
    assert common.flat_verdict(n) is common.Claim.PARTLY
    sw["uniform_ms"] = np.array([40.0, 40.5, 41.0, 42.0])  # 1.05 at batch 8: nearly free
    assert common.flat_verdict(decode.live_numbers(sw)) is common.Claim.HOLDS
    sw["uniform_ms"] = np.array([40.0, 81.0, 90.0, 120.0])  # no batch above 1 within 2x
    assert common.flat_verdict(decode.live_numbers(sw)) is common.Claim.DOES_NOT_HOLD
    # The tolerance is relative to the roofline's own ratio: 1.6 holds where 1.31 is predicted
    # (llama-8b on an H100 at batch 295), not where 1.0 is.
    assert (
        common.flat_verdict({"ratio_bstar": 1.6, "pred_ratio_bstar": 1.31, "knee": 256.0})
        is common.Claim.HOLDS
    )
    assert (
        common.flat_verdict({"ratio_bstar": 1.6, "pred_ratio_bstar": 1.0, "knee": 256.0})
        is common.Claim.PARTLY
    )
    assert [common.versus(r) for r in (0.9, 0.96, 1.04, 1.2)] == [
        common.Versus.LESS,
        common.Versus.SAME,
        common.Versus.SAME,
        common.Versus.MORE,
    ]


def test_first_step_rates_by_hand():
    from batching.costs.models import get_model

    m = get_model("cpu-m")
    sw = _synthetic_sweep()
    r1 = (m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)) / 0.040 / 1e9
    r2 = (m.weight_read_bytes + m.kv_bytes_per_token * 2 * (128 + 1)) / 0.041 / 1e9
    fs = decode.first_step_rates(sw)
    assert fs["rate1_gbs"] == pytest.approx(r1) and fs["rate_next_gbs"] == pytest.approx(r2)
    assert fs["next_batch"] == 2 and fs["split"] == 0.0  # an older sweep names no kernel
    sw["meta"]["linear_split"] = True
    assert decode.first_step_rates(sw)["split"] == 1.0
    with pytest.raises(ValueError):
        decode.first_step_rates({**sw, "batch": np.array([1.0])})


def test_gather_numbers_by_hand():
    from batching.costs.models import get_model

    # cpu-m: 12 layers x 4 KV heads x 64 dims x 4 bytes, K and V, 193 positions, 128 rows.
    assert decode.gather_bytes(get_model("cpu-m"), 128, 192) == 2 * 12 * 4 * 64 * 4 * 193 * 128
    sw = _synthetic_sweep()  # batch up to 8, ctx 128: longest context 192
    g = decode.gather_numbers(sw, decode.live_numbers(sw))
    copy = 2 * 12 * 4 * 64 * 4 * 193 * 8
    assert g["copy_mb"] == pytest.approx(copy / 1e6)
    assert g["copy_ms"] == pytest.approx(2 * copy / 30e9 * 1e3)  # a read and a write per byte
    assert g["extra_ms"] == pytest.approx(140.0 - 77.0)
    # CUDA graphs: no gathered path, nothing to say about it.
    gpu = _synthetic_sweep("cuda")
    gpu["paths"] = ["uniform", "mixed"]
    assert decode.gather_numbers(gpu, decode.live_numbers(gpu)) == {}


def test_path_and_probe_rows_by_hand():
    sw = _synthetic_sweep()
    n = decode.live_numbers(sw)
    rows, header = decode.path_rows(sw, n)
    assert header[3] == "B=8 ms" and [r[0] for r in rows] == ["uniform", "mixed", "gathered"]
    # gathered: 40 -> 140 ms, knee 4, 3.5x batch 1, 8 / 0.140 = 57 tokens/s, 2.00x uniform.
    assert rows[2][1:] == ["40.0", "4", "140.0", "3.5", "57", "2.00"]
    assert rows[0][-1] == "1.00" and rows[1][-1] == "1.10"
    probes, ph = decode.probe_rows(n, registry_gbs=18.5)
    assert ph == ["bandwidth probe", "GB/s", "B* (this run's matmul peak)"] and len(probes) == 4
    # fp32, 0.1 TFLOP/s: B* = 2 x 100 / GB/s.
    assert [r[2] for r in probes] == ["10.0", "6.7", "6.1", "10.8"]
    assert len(decode.probe_rows(n)[0]) == 3


def test_measured_gpus_judge_the_flat_claim_partly():
    """On Vidur's measured H100 (Llama-2-7B) and A100 (Llama-3-8B) linear layers the step at
    B* costs 1.73x and 1.87x batch 1's where the datasheet roofline predicts 1.0: extra rows
    are cheaper, not free (the rule that judges the live sweep); the knee (2x) lies past B*."""
    from batching.book import gpu

    curves = gpu.decode_curves()
    assert set(curves) == {"h100", "a100"}
    for c, (ratio, knee_at, bstar) in zip(curves.values(), [(1.73, 368, 295), (1.87, 232, 153)]):
        assert c["pred_ratio_bstar"] == pytest.approx(1.0, abs=0.01)
        assert c["ratio_bstar"] == pytest.approx(ratio, abs=0.01)
        assert c["knee"] == knee_at and c["knee"] > c["bstar"] and round(c["bstar"]) == bstar
        assert c["verdict"] is Claim.PARTLY
        # The roofline of the same layers never lies above the measurement at any batch.
        assert (c["roofline_ms"] <= c["measured_ms"]).all()
    assert gpu.weakest([c["verdict"] for c in curves.values()]) is Claim.PARTLY
    assert gpu.weakest([Claim.HOLDS, Claim.DOES_NOT_HOLD, Claim.PARTLY]) is Claim.DOES_NOT_HOLD
    assert gpu.weakest([Claim.HOLDS]) is Claim.HOLDS
    with pytest.raises(ValueError):
        gpu.weakest([])


def test_gpu_profile_records_list_every_committed_profile():
    """The measured page's list: one record per derived profile, each loadable, each stream
    below the datasheet, and a 70B model on two GPUs left far less KV room than on four."""
    from batching.book import gpu

    recs = gpu.profile_records()
    assert [r["file"] for r in recs] == sorted(p.name for p in GPU_PROFILE_DIR.glob("*.json"))
    assert len(recs) >= 8
    for r in recs:
        assert 0.5 < r["bandwidth_fraction"] < 1.0 and r["kv_tokens"] > 0 and r["tp"] in (1, 2, 4)
    by = {r["file"]: r for r in recs}
    assert by["h100-llama-2-70b-tp2.json"]["kv_tokens"] * 10 < by["h100-llama-2-70b-tp4.json"]["kv_tokens"]


def test_flat_verdict_counts_from_batch_2_where_batch_1_ran_its_own_kernel():
    """A CPU whose batch 1 ran the split matrix-vector kernel (meta linear_split): the claim is
    tested from batch 2, the first batch on the kernel every larger batch runs, to the largest
    swept batch at or below B*; batch 1's step is reported on its own (first_ratio)."""
    sw = _synthetic_sweep()
    # Batch 1 at 20 ms (its own kernel), then 41 -> 43 ms from batch 2 to 8: flat on one kernel.
    sw["uniform_ms"] = np.array([20.0, 41.0, 42.0, 43.0])
    plain = decode.live_numbers(sw)
    assert plain["split"] == 0.0 and plain["base_batch"] == 1
    assert common.flat_verdict(plain) is common.Claim.DOES_NOT_HOLD  # 41 / 20 > 2x from batch 1
    sw["meta"] = {**sw["meta"], "linear_split": True}
    n = decode.live_numbers(sw)
    assert n["split"] == 1.0 and n["base_batch"] == 2 and n["base_ms"] == 41.0
    assert n["test_batch"] == 8 and n["ratio_test"] == pytest.approx(43 / 41)
    assert n["knee_base"] == 8 and n["first_ratio"] == pytest.approx(41 / 20)
    assert n["tps_first_ratio"] == pytest.approx(2 * 20 / 41)  # batch 2 makes fewer tokens/s than batch 1
    assert common.flat_verdict(n) is common.Claim.HOLDS
    sw["uniform_ms"] = np.array([20.0, 40.0, 70.0, 95.0])  # within 2x of batch 2's 40 ms up to batch 4
    n = decode.live_numbers(sw)
    assert n["knee_base"] == 4 and common.flat_verdict(n) is common.Claim.PARTLY
    # One swept batch only: nothing to count from but batch 1.
    one = {**sw, "batch": np.array([1.0]), "uniform_ms": np.array([20.0])}
    one.update({k: np.array([20.0]) for k in sw if k.endswith("_ms") and k != "uniform_ms"})
    assert decode.base_index(one) == 0


def test_kernel_numbers_and_the_two_dtypes_table_by_hand():
    """The sweep's kernel record: which dtype, whether the probe chose it (and the other's
    cost), batch 1's and batch 2's paths; the two dtypes' steps side by side."""
    sw = _synthetic_sweep()
    sw["meta"] = {
        **sw["meta"],
        "dtype": "bf16",
        "kernels": {
            "dtype": "bf16",
            "dtype_reason": "faster here: ...",
            "buckets": [[1, "dnnl", 2], [2, "dnnl", 2], [8, "wx", 8], [512, "dnnl", 0]],
            "geomean_ms": {"fp32": 16.0, "bf16": 5.0},
        },
    }
    kn = decode.kernel_numbers(sw)
    assert kn == {
        "dtype": "bf16",
        "probed": True,
        "gm_ms": 5.0,
        "other": "fp32",
        "other_gm_ms": 16.0,
        "path1": "dnnl",
        "rows1": 2,
        "path2": "dnnl",
    }
    asked = {**sw, "meta": {**sw["meta"], "kernels": {**sw["meta"]["kernels"], "dtype_reason": "asked for"}}}
    assert decode.kernel_numbers(asked)["probed"] is False
    assert decode.kernel_numbers({**sw, "meta": {"dtype": "bf16"}})["probed"] is False  # a GPU: no record
    other = {
        **_synthetic_sweep(),
        "batch": np.array([1.0, 4.0, 8.0]),
        "uniform_ms": np.array([80.0, 100.0, 200.0]),
    }
    other["meta"] = {**other["meta"], "dtype": "fp32"}
    rows, header = decode.dtype_rows(sw, other)
    assert header == ["batch", "bf16 ms", "bf16 x B=1", "fp32 ms", "fp32 x B=1"]
    # Only the batches both timed (the synthetic sweep: 1, 2, 4, 8 at 40, 40, 48, 70 ms).
    assert rows == [
        ["1", "40.0", "1.00", "80.0", "1.00"],
        ["4", "48.0", "1.20", "100.0", "1.25"],
        ["8", "70.0", "1.75", "200.0", "2.50"],
    ]


def test_dtype_figure_draws_both_dtypes(tmp_path):
    from batching.book.figures.why import dtype_figure

    a = _synthetic_sweep()
    a["meta"] = {**a["meta"], "dtype": "bf16"}
    b = {**_synthetic_sweep(), "uniform_ms": np.array([80.0, 90.0, 100.0, 200.0])}
    b["meta"] = {**b["meta"], "dtype": "fp32"}
    fig = dtype_figure(a, b)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    assert labels == ["bf16 (this build's pages)", "fp32"]
    assert "log" in fig.axes[0].get_xlabel() and fig.axes[1].lines[1].get_ydata()[-1] == pytest.approx(2.5)


def test_decode_reading_names_how_the_sweeps_rows_read_their_kv():
    from batching.book import decode

    assert decode.decode_reading({"meta": {"device_type": "cuda", "decode_attention": "sdpa"}}) == "graphs"
    assert decode.decode_reading({"meta": {"device_type": "cpu", "decode_attention": "kernel"}}) == "kernel"
    assert decode.decode_reading({"meta": {"device_type": "cpu", "decode_attention": "sdpa"}}) == "sdpa"
    assert decode.decode_reading({"meta": {"device_type": "cpu"}}) == "sdpa"  # recorded before the kernel
