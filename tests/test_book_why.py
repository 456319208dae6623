"""The numbers, verdicts and figures behind "Why batching" (batching/book/why.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pytest
from helpers import LinearCost, _gpu_profile, _texts

from batching.book import (
    common,
    plots,
    static,
    why,
)
from batching.costs import get_cost_model
from batching.engine import SimExecutor
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


# ---------------------------------------------------------------------- why batching
def test_knee_is_the_last_batch_before_the_curve_first_leaves_the_band():
    b = [1, 2, 4, 8, 16, 32]
    t = [10.0, 11.0, 12.4, 13.0, 25.0, 50.0]
    assert why.knee(b, t, 1.25) == 4  # 12.4 <= 12.5 < 13
    assert why.knee(b, t, 2.0) == 8  # 13 <= 20 < 25
    assert why.knee(b, t, 100.0) == 32
    # A later dip back under the band does not count: the run ended at the first exit.
    assert why.knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 1.25) == 1
    assert why.knee([1, 2, 4, 8, 16], [10.0, 13.0, 12.0, 30.0, 15.0], 2.0) == 4
    with pytest.raises(ValueError):
        why.knee(b, t, 0.9)
    with pytest.raises(ValueError):
        why.knee([1, 4, 2], [1.0, 1.0, 1.0], 2.0)
    with pytest.raises(ValueError):
        why.knee([1, 2], [1.0, float("nan")], 2.0)


def test_bstar_matches_the_conventions_and_the_cost_model():
    assert why.bstar_of(989e12, 3.35e12, 2) == pytest.approx(295.22, abs=0.01)
    assert why.bstar_of(989e12, 4.8e12, 2) == pytest.approx(206.04, abs=0.01)
    assert why.bstar_of(110e9, 18.5e9, 4) == pytest.approx(2 * 110 / 18.5)  # fp32: twice peak / bandwidth
    for model, dev in (("llama-8b", "h100"), ("llama-8b", "h200"), ("cpu-m", "cpu")):
        c = get_cost_model(model, dev)
        assert why.bstar_of(c.peak_flops, c.bandwidth, c.model.bytes_per_param) == pytest.approx(
            c.bstar(), rel=1e-12
        )
    with pytest.raises(ValueError):
        why.bstar_of(0.0, 1.0, 2)


def test_roofline_curve_values_and_crossing():
    m = H100_8B.model
    d = H100_8B.device
    b = [1, 2, 64, 256, 512, 1024]
    cur = why.roofline_curve(m, b, 128, d.bandwidth, H100_8B.peak_flops, d.step_overhead_s)
    # Same numbers as the simulator's cost model, step by step.
    for bi, t in zip(b, cur["time_s"]):
        assert t == pytest.approx(H100_8B.decode_step(bi, 128), rel=1e-12)
    assert cur["weights_s"][0] == pytest.approx(15.009849344e9 / 3.35e12)  # 4.48 ms: llama-8b's stream
    assert np.all(np.diff(cur["memory_s"]) > 0)  # KV grows with the batch
    assert cur["compute_s"][3] / cur["compute_s"][0] == pytest.approx(256, rel=1e-3)
    assert list(cur["bound"]) == [0, 0, 0, 0, 1, 1]
    # With no context the memory and compute lines cross at B* (within the non-matmul params).
    dense = np.arange(1, 600)
    z = why.roofline_curve(m, dense, 0, d.bandwidth, H100_8B.peak_flops)
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
    cpu = why.stream_numbers(get_cost_model("cpu-m", "cpu"))
    assert cpu["bstar_copy"] < cpu["bstar"] and cpu["copy_gbs"] == 32.0
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
    """A live sweep as live_decode_sweep returns it, with hand-picked times (cpu-m, fp32)."""
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
    from batching.models import get_model

    sw = _synthetic_sweep()
    n = why.live_numbers(sw)
    m = get_model("cpu-m")
    moved = m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)  # weights, KV read, KV written
    assert n["achieved_gbs"] == pytest.approx(moved / 0.040 / 1e9)
    assert n["efficiency"] == pytest.approx(moved / 0.040 / 20e9)
    assert n["efficiency_copy"] == pytest.approx(moved / 0.040 / 30e9)
    assert n["stream_ms"] == pytest.approx(m.weight_read_bytes / 20e9 * 1e3)
    assert n["bstar"] == pytest.approx(2 * 0.1e12 / 20e9)
    assert (n["knee125"], n["knee2"]) == (4, 8) and (n["gathered_knee125"], n["gathered_knee2"]) == (2, 4)
    assert n["tps_gain"] == pytest.approx(8 * 40 / 70) and n["per_token_max_ms"] == pytest.approx(70 / 8)
    assert n["gathered_gap_max"] == pytest.approx(2.0) and n["mixed_gap_max"] == pytest.approx(1.1)
    assert n["pred1_ms"] < n["t1_ms"] and n["over_pred"] == pytest.approx(n["t1_ms"] / n["pred1_ms"])
    assert "within 2x up to batch 8, close to the B* of 10.0" in why.knee_text(n)
    sw["uniform_ms"] = np.array([41.0, 40.0, 48.0, 70.0])
    with pytest.raises(ValueError):
        why.live_numbers({**sw, "batch": np.array([2.0, 4.0, 8.0, 16.0])})


def test_batch1_kernel_text_gives_both_batches_read_rates_on_a_split_kernel_only():
    """Why batching: a CPU model's one-token steps split each product over the threads
    (Llama.linear); the page says so, with batch 1's and batch 2's read rates by hand."""
    from batching.models import get_model
    from batching.real.model import LINEAR_CPU

    m = get_model("cpu-m")
    sw = _synthetic_sweep()
    assert why.batch1_kernel_text(sw) == ""  # an older sweep: no kernel named
    sw["meta"]["linear"] = LINEAR_CPU
    r1 = (m.weight_read_bytes + m.kv_bytes_per_token * (128 + 1)) / 0.040 / 1e9
    r2 = (m.weight_read_bytes + m.kv_bytes_per_token * 2 * (128 + 1)) / 0.041 / 1e9
    text = why.batch1_kernel_text(sw)
    assert "split over the 2 threads" in text
    assert f"Batch 1 reads its weights and KV at {r1:.1f} GB/s, batch 2 at {r2:.1f}" in text
    assert why.batch1_kernel_text({**sw, "batch": np.array([1.0, 4.0, 8.0, 16.0])}) == ""  # no batch 2
    gpu = _synthetic_sweep("cuda")
    gpu["meta"]["linear"] = "F.linear"
    assert why.batch1_kernel_text(gpu) == ""


def test_live_text_names_the_device_it_ran_on_and_never_claims_a_gpu_it_lacks():
    cpu = why.live_text(_synthetic_sweep("cpu"))
    assert "No GPU was present" in cpu and "AMD EPYC" in cpu and "GPU measurements" not in cpu
    gpu = why.live_text(_synthetic_sweep("cuda"))
    assert "NVIDIA H200" in gpu and "found a GPU" in gpu and "No GPU" not in gpu
    assert why.live_labels(_synthetic_sweep("cpu"))["kind"] == "CPU"
    assert why.live_labels(_synthetic_sweep("cuda"))["kind"] == "GPU"


def test_live_defaults():
    assert why.live_defaults("cpu") == ("cpu-m", [1, 2, 4, 8, 16, 32, 64, 128])
    assert why.live_defaults("cuda", free_bytes=100e9) == ("llama-8b", [2**i for i in range(9)])
    assert why.live_defaults("cuda", free_bytes=20e9)[0] == "llama-1b"
    assert why.live_defaults("cuda", model="tiny", free_bytes=1e9)[0] == "tiny"
    with pytest.raises(ValueError):
        why.live_defaults("cpu", batches=[2, 4])


def test_load_profiles_picks_up_every_profile_and_says_which_devices_are_measured(tmp_path):
    import json
    import shutil
    from pathlib import Path

    assert "No profile is committed" in why.profiles_text(why.load_profiles(tmp_path))
    shutil.copy(Path(why.PROFILE_DIR) / "cpu-here-cpu-s.json", tmp_path / "cpu-here-cpu-s.json")
    only_cpu = why.load_profiles(tmp_path)
    assert [p["gpu"] for p in only_cpu] == [False]
    assert "It was not measured on a GPU" in why.profiles_text(only_cpu)
    assert "None of them was measured on a GPU" in why.profiles_text(only_cpu + only_cpu)
    (tmp_path / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    both = why.load_profiles(tmp_path, ctx=100)
    assert [p["device"] for p in both] == ["cpu-here", "H200-SXM"]
    h200 = both[1]
    assert h200["gpu"] and h200["ref_ctx"] == 128 and h200["t1_ms"] == 4.0
    assert (h200["knee125"], h200["knee2"]) == (64, 256)  # 8.0 ms is exactly 2x: still inside
    assert h200["bstar"] == pytest.approx(700e12 * 2 / (2 * 4200e9))
    assert "NVIDIA H200" in h200["label"] and "2026-12-01" in h200["label"]
    text = why.profiles_text(both)
    assert "GPU measurements are among them (H200-SXM)" in text and "not measured on a GPU" not in text
    assert "None of them" not in text
    header, rows = why.profile_rows(both)
    assert len(rows) == len(only_cpu[0]["ctxs"]) + 2 and all(len(r) == len(header) for r in rows)
    roof = why.profile_roofline(h200, points=10)
    assert len(roof["batch"]) == 10 and roof["batch"][0] == 1 and roof["batch"][-1] == pytest.approx(256)


def test_why_batching_figures_draw_and_save(tmp_path):
    import json

    plots.style()
    sw = _synthetic_sweep()
    gr = why.gpu_rooflines(batches=[1, 4, 16, 64, 256, 1024])
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "h200-llama-8b.json").write_text(json.dumps(_gpu_profile()))
    profs = why.load_profiles(why.PROFILE_DIR) + why.load_profiles(tmp_path / "p")
    figs = {
        "roofline": plots.gpu_roofline_figure(gr),
        "live": plots.live_decode_figure(sw, why.live_numbers(sw), why.live_roofline(sw, points=20)),
        "profiles": plots.profiles_figure(profs, [why.profile_roofline(p) for p in profs], live=sw, gpu=gr),
        "no_profiles": plots.profiles_figure([], [], live=sw),
    }
    for name, fig in figs.items():
        png, svg = plots.save(fig, name, tmp_path)
        assert png.stat().st_size > 5000 and svg.read_text().startswith("<?xml"), name
        matplotlib.pyplot.close(fig)


@pytest.mark.model
def test_live_decode_sweep_measures_every_path_on_the_cpu():
    pytest.importorskip("torch")
    sw = why.live_decode_sweep(
        model="tiny", device="cpu", batches=[1, 2, 4], ctx=16, reps=2, peak_n=128, bandwidth_bytes=1 << 20
    )
    assert sw["paths"] == ["uniform", "mixed", "gathered"]
    assert sw["meta"]["device"] == "cpu-here" and sw["meta"]["device_type"] == "cpu"
    assert sw["meta"]["model"] == "tiny" and sw["meta"]["dtype"] == "fp32"
    for p in sw["paths"]:
        assert sw[f"{p}_ms"].shape == (3,) and np.all(sw[f"{p}_ms"] > 0)
        assert np.all(sw[f"{p}_p25_ms"] <= sw[f"{p}_p75_ms"])
    assert sw["matvec_gbs"] > 0 and sw["peak_tflops"] > 0
    n = why.live_numbers(sw)
    assert n["efficiency"] > 0 and n["bmax"] == 4
    with pytest.raises(ValueError):
        why.live_decode_sweep(model="tiny", device="cpu", batches=[1, 2], ctx=1000)


def test_knee_text_never_says_up_to_batch_1():
    n = {"knee125": 1.0, "knee2": 4.0, "bstar": 13.4}
    text = why.knee_text(n)
    assert "up to batch 1 " not in text and "up to batch 1," not in text
    assert text.startswith("No batch above 1 keeps the uniform step within 1.25x") and "up to batch 4" in text
    assert "nor within 2x" in why.knee_text({**n, "knee2": 1.0})
    assert why.knee_text({**n, "knee125": 2.0}).startswith(
        "The uniform step stays within 1.25x of batch 1 up to batch 2"
    )


def test_slab_cost_text_states_only_what_the_measurement_shows():
    n = {"bmax": 128.0, "mixed_gap_max": 1.00, "gathered_gap_max": 0.91}
    flat_ = why.slab_cost_text(n)
    assert "1.00 times the uniform one (the same within 5%)" in flat_ and "0.91 times (9% less)" in flat_
    assert "does not show in the step time" in flat_ and "copy does not show" in flat_
    assert "grows with batch times context" not in flat_
    assert "did not show" in why.slab_cost_takeaway(n)
    n2 = {**n, "mixed_gap_max": 1.03, "gathered_gap_max": 1.45}
    shown = why.slab_cost_text(n2)
    assert (
        "45% more" in shown and "it takes 41% longer" in shown and "grows with batch times context" in shown
    )
    assert (
        why.slab_cost_takeaway(n2)
        == "The slab KV layout's extra work shows at batch 128: gathered slabs 1.45x the uniform step."
    )


def test_gather_bytes_and_answer_by_hand():
    from batching.models import get_model

    # cpu-m: 12 layers x 4 KV heads x 64 dims x 4 bytes, K and V, 193 positions, 128 rows.
    assert why.gather_bytes(get_model("cpu-m"), 128, 192) == 2 * 12 * 4 * 64 * 4 * 193 * 128
    sw = _synthetic_sweep()  # batch up to 8, ctx 128: longest context 192
    text = why.gather_answer_text(sw, why.live_numbers(sw))
    copy = 2 * 12 * 4 * 64 * 4 * 193 * 8
    assert f"copies {copy / 1e6:,.0f} MB" in text and f"takes {2 * copy / 30e9 * 1e3:,.1f} ms" in text
    assert "took 63.0 ms longer than the mixed one" in text
    # The copy (1.26 ms at 30 GB/s, read and write) explains 2% of the 63 ms; the rest is said
    # to be more than its bytes, and not given a cause the sweep did not measure.
    copy_ms = 2 * copy / 30e9 * 1e3
    assert (
        f"explain {copy_ms / 63.0:.0%} of the extra time. The other {63.0 - copy_ms:,.1f} ms is more" in text
    )
    n = {**why.live_numbers(sw), "gathered_tmax_ms": 77.0 + copy_ms / 2}  # the copy covers all of it
    assert why.gather_answer_text(sw, n).endswith("the copy's bytes are enough to account for all of it.")
    n["gathered_tmax_ms"] = 75.0
    assert "yet the step took no longer than the mixed one (2.0 ms less)." in why.gather_answer_text(sw, n)


def test_profile_stream_and_size_efficiency_on_the_committed_profile():
    profs = why.load_profiles(why.PROFILE_DIR)
    p = why.find_profile(profs, "cpu-s")
    cs = why.profile_stream(p)
    assert cs["weight_mb"] == pytest.approx(p["shape"].weight_read_bytes / 1e6)
    assert cs["stream_ms"] == pytest.approx(cs["weight_mb"] / 1e3 / cs["bandwidth_gbs"] * 1e3)
    assert cs["stream_fraction"] == pytest.approx(cs["stream_ms"] / p["t1_ms"])
    assert cs["efficiency"] == pytest.approx(cs["achieved_gbs"] / cs["bandwidth_gbs"])
    with pytest.raises(ValueError, match="no committed profile of cpu-l"):
        why.find_profile(profs, "cpu-l")
    sw = _synthetic_sweep()
    entries = why.stream_entries(profs, sw, why.live_numbers(sw))
    assert [e["model"] for e in entries][:2] == ["cpu-s", "cpu-m"]
    text = why.size_efficiency_text(entries)
    rising = entries[1]["efficiency"] > entries[0]["efficiency"]
    assert text.startswith(
        "The measurements on this page agree" if rising else "The measurements on this page do not"
    )
    assert "committed profile" in text and "this build" in text
    assert text.count("GB/s counting weight and KV bytes,") == 2  # the measure, named: not weights alone
    one = why.size_efficiency_text([e for e in entries if e["model"] == "cpu-m"])
    assert one.startswith("This page has measured one model per device only")


def test_stream_share_text_claims_more_only_when_the_share_is_larger():
    e = [
        {"model": "cpu-s", "source": "committed profile", "stream_fraction": 0.46},
        {"model": "cpu-m", "source": "this build", "stream_fraction": 0.63},
    ]
    assert "so cpu-m's flat region says more about bandwidth" in why.stream_share_text(e, "cpu-m", "cpu-s")
    # One measure for both models, named (weights alone), so that it is not read as the
    # weight-and-KV efficiency of size_efficiency_text.
    assert why.stream_share_text(e, "cpu-m", "cpu-s").startswith(
        "Streaming the weights alone (weight bytes at the matrix-vector bandwidth of the run, KV bytes left out) "
        "fills 63% of cpu-m's batch-1 step (this build) and 46% of cpu-s's (committed profile)"
    )
    e[1]["stream_fraction"] = 0.40
    assert "proves no more than cpu-s's" in why.stream_share_text(e, "cpu-m", "cpu-s")
    assert "no measurement of cpu-l" in why.stream_share_text(e, "cpu-l", "cpu-s")


def test_bandwidth_note_and_bstar_answer():
    sw = _synthetic_sweep()
    n = why.live_numbers(sw)
    note = why.bandwidth_note(18.5, sw, n)
    assert "20.0 GB/s in this build, 1.08 times the registry's," in note and "split" not in note
    sw["meta"]["matvec_layout"] = "matvec_split"  # the fastest product was the thread-split one
    assert "split over the threads" in why.bandwidth_note(18.5, sw, n)
    assert "another device" in why.bandwidth_note(18.5, _synthetic_sweep("cuda"), n)
    a100 = why.stream_numbers(get_cost_model("llama-8b", "a100"))
    h200 = why.stream_numbers(get_cost_model("llama-8b", "h200"))
    text = why.bstar_answer_text(a100, h200, "A100", "H200")
    # B* = peak / bandwidth in bf16: 312 / 2.039 = 153 against 989 / 4.8 = 206.
    assert text.startswith("The H200:") and "= 153" in text and "= 206" in text
    assert "3.2 times the A100's compute but only 2.4 times its bandwidth" in text
    assert why.bstar_answer_text(h200, a100, "H200", "A100").startswith("The H200:")
    assert h200["mem_reserve"] == 0.10 and h200["mem_usable"] == 0.90 and h200["mem_gb"] == 141
    # 412 rows of 2,048 tokens: what 90% of 141 GB holds after the weights, not 100%.
    from batching.models import get_model

    m = get_model("llama-8b")
    assert h200["long_fit"] == (0.9 * 141e9 - m.weight_bytes) // m.kv_bytes_per_token // 2048


def test_why_figures_keep_their_labels_clear_of_legend_and_reference_lines():
    plots.style()
    gr = why.gpu_rooflines()
    fig = plots.gpu_roofline_figure(gr)
    fig.canvas.draw()
    r = fig.canvas.get_renderer()
    ax = fig.axes[0]
    legend = ax.get_legend().get_window_extent(r)
    bstars = [t for s, t in _texts(ax).items() if s.startswith("B*")]
    assert len(bstars) == 2 and not any(t.get_window_extent(r).overlaps(legend) for t in bstars)
    matplotlib.pyplot.close(fig)

    sw = _synthetic_sweep()
    n = why.live_numbers(sw)  # 2x knee at batch 8 (t1 = 40 ms)
    fig = plots.live_decode_figure(sw, n, why.live_roofline(sw, points=20))
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
    fig = plots.live_decode_figure(sw, n1, why.live_roofline(sw, points=20))
    fig.canvas.draw()
    ax = fig.axes[0]
    lab = matplotlib.text.Text.get_window_extent(_texts(ax)["2x knee: 1"], fig.canvas.get_renderer())
    assert lab.x0 >= ax.get_window_extent().x0
    matplotlib.pyplot.close(fig)


def test_profiles_figure_tells_the_coinciding_gpu_predictions_apart():
    plots.style()
    sw = _synthetic_sweep()
    fig = plots.profiles_figure([], [], live=sw, gpu=why.gpu_rooflines())
    lines = [ln for ln in fig.axes[1].get_lines() if ln.get_label().startswith("roofline prediction")]
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
    assert H100_8B.decode_step(1, 1) * 1e3 == pytest.approx(n["decode_ms"])
    assert n["decode_ms"] > n["weight_read_gb"] / n["bandwidth_tbs"] + n["overhead_ms"] - 1e-9


def test_a_sweep_without_a_gathered_path_says_why():
    # CUDA steps replay graphs, which gather by their own rule: the sweep times two paths.
    assert list(why.decode_paths(graphs=True)) == ["uniform", "mixed"]
    assert list(why.decode_paths()) == ["uniform", "mixed", "gathered"]
    sw = _synthetic_sweep("cuda")
    sw["paths"] = ["uniform", "mixed"]
    for k in ("gathered_ms", "gathered_p25_ms", "gathered_p75_ms"):
        del sw[k]
    n = why.live_numbers(sw)
    assert "gathered_gap_max" not in n
    text = why.slab_cost_text(n)
    assert "no separate gathered path was timed" in text and "gathered step" not in text
    assert (
        why.slab_cost_takeaway(n)
        == "The slab KV layout's extra work shows at batch 8: mixed contexts 1.10x the uniform step."
    )
    assert "timed no separate gathered path" in why.gather_answer_text(sw, n)
    assert "brown squares" not in why.live_labels(sw)["paths"]
    assert "brown squares" in why.live_labels(_synthetic_sweep())["paths"]
    # One name per path in the prose, the caption and the legend.
    paths = why.live_labels(_synthetic_sweep())["paths"]
    for p in ("uniform", "mixed", "gathered"):
        assert f"{p} (" in paths and plots.PATH_LABELS[p].startswith(f"measured, {p}: ")
    fig = plots.live_decode_figure(sw, n, why.live_roofline(sw, points=10))
    matplotlib.pyplot.close(fig)
