"""Figures of the decode roofline: the GPU rooflines, a live decode sweep against its own
roofline, and the committed profiles beside it."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...costs.knee import KNEE_FACTOR
from ..common import machine_label
from ..plots import PHASE_COLORS, POLICY_COLORS, SOURCE_COLORS, WIDTH, box, log2_x, log_ticks, log_y, note

#: The measured decode paths (equal or mixed contexts, contiguous or gathered slabs) and the
#: roofline's lines.
PATH_COLORS: dict[str, str] = {
    "uniform": PHASE_COLORS["decode"],
    "mixed": "#56B4E9",
    "gathered": POLICY_COLORS["slab"],
}
PATH_LABELS: dict[str, str] = {
    "uniform": "measured, uniform: equal contexts, contiguous slots",
    "mixed": "measured, mixed: mixed contexts, contiguous slots",
    "gathered": "measured, gathered: mixed contexts, scattered slots",
}
PATH_MARKERS: dict[str, str] = {"uniform": "o", "mixed": "^", "gathered": "s"}
ROOF_STYLE: dict[str, dict[str, Any]] = {
    "time": {"color": "#222222", "ls": "-", "lw": 1.3},
    "memory": {"color": "#0072B2", "ls": "--", "lw": 1.1},
    "compute": {"color": "#E69F00", "ls": ":", "lw": 1.5},
}
DEVICE_COLORS: dict[str, str] = {
    "H100-SXM": "#0072B2",
    "H200-SXM": "#CC79A7",
    "A100-SXM": "#999999",
    "cpu-here": PHASE_COLORS["decode"],
}


#: The batch axis of every figure on the page: log 2, and it says so.
BATCH_LABEL = "batch (sequences per step, log scale)"


def _pow2_axis(ax: Any, lo: float, hi: float) -> None:
    """Log-2 batch axis with plain labels at the powers of two (every other one if crowded),
    labelled :data:`BATCH_LABEL`."""
    ticks = [2.0**i for i in range(0, 14) if lo <= 2.0**i <= hi]
    log2_x(ax, ticks[::2] if len(ticks) > 9 else ticks)
    ax.set_xlabel(BATCH_LABEL)


def _bstar_line(
    ax: Any, bstar: float, color: str = "#666666", label: str = "B*", y: float = 0.96, left: bool = False
) -> None:
    """A dash-dot line at B*, labelled at height ``y`` (axes fraction), on its left if ``left``."""
    ax.axvline(bstar, color=color, ls="-.", lw=1)
    note(
        ax,
        f"{label} = {bstar:.0f}",
        (bstar, y),
        (-3 if left else 3, 0),
        "x",
        va="top",
        ha="right" if left else "left",
        fontsize=7.5,
        color=color,
        bbox=box(),
    )


def gpu_roofline_figure(gr: Mapping[str, Any]) -> Figure:
    """Roofline predictions of a decode step on several GPUs
    (:func:`batching.book.why.gpu_rooflines`). Left: step time at the shortest context, with
    its memory and compute lines and B*. Right: tokens/s at every context, drawn where the
    batch's KV fits the device."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.1))
    ctxs = sorted(next(iter(gr["devices"].values()))["ctx"])
    c0 = ctxs[0]
    styles = ["-", "--", ":", "-."]
    lo, hi, top = math.inf, 0.0, 0.0
    for i, (dev, d) in enumerate(gr["devices"].items()):
        col = DEVICE_COLORS.get(dev, "#444444")
        cur = d["ctx"][c0]
        b = cur["batch"]
        lo, hi, top = min(lo, b.min()), max(hi, b.max()), max(top, cur["time_s"].max() * 1e3)
        ax = axes[0]
        ax.plot(b, cur["time_s"] * 1e3, "-", color=col, lw=2.2, alpha=0.8)
        ax.plot(b, cur["memory_s"] * 1e3, "--", color=col, lw=1)
        ax.plot(b, cur["compute_s"] * 1e3, ":", color=col, lw=1.4)
        _bstar_line(
            ax,
            d["bstar"],
            col,
            f"B* {dev.split('-')[0]}",
            y=0.97 - 0.09 * i,
            left=d["bstar"] < max(x["bstar"] for x in gr["devices"].values()),
        )
        for ls, c in zip(styles, ctxs):
            cur = d["ctx"][c]
            ok = cur["fits"] > 0
            axes[1].plot(
                cur["batch"][ok],
                cur["tokens_per_s"][ok] / 1e3,
                ls,
                color=col,
                marker="o",
                ms=2.5,
                label=f"{dev}, {c:,} tokens/row",
            )
    ax = axes[0]
    ax.set_ylim(0, top * 1.05)
    ax.set_ylabel("decode step (ms)")
    ax.set_title(f"step time, {c0:,} KV tokens per row", fontsize=9)
    handles = [
        Line2D([], [], color=DEVICE_COLORS.get(dev, "#444444"), lw=2, label=f"{dev}: roofline")
        for dev in gr["devices"]
    ]
    handles += [
        Line2D([], [], color="#666666", ls="--", lw=1, label="memory: bytes / bandwidth"),
        Line2D([], [], color="#666666", ls=":", lw=1.4, label="compute: FLOPs / peak"),
    ]
    # Mid-height on the left: the top of the panel holds the B* labels, the bottom the curves.
    ax.legend(handles=handles, loc="center left", bbox_to_anchor=(0.0, 0.6), fontsize=7.5)
    axes[1].set_ylabel("output tokens/s (thousands)")
    axes[1].set_title("throughput (lines end when KV fills memory)", fontsize=9)
    axes[1].set_ylim(bottom=0)
    axes[1].legend(loc="upper left", fontsize=7.5)
    for a in axes:
        _pow2_axis(a, lo, hi)
    return fig


def live_decode_figure(
    sweep: Mapping[str, Any],
    numbers: Mapping[str, float],
    roof: Mapping[str, np.ndarray],
    paths: Sequence[str] | None = None,
    from_base: bool = False,
) -> Figure:
    """A live sweep (:func:`batching.real.sweep.decode_sweep`) against ``roof``, the roofline
    from its own bandwidth and peak. Left: step time of each of ``paths`` (default: every
    measured one; median, bar = interquartile range), the roofline's lines, B*, the knee's
    band (``KNEE_FACTOR`` x batch 1) and the uniform path's knee. Right: tokens/s.

    With ``from_base``, where batch 1 ran a kernel of its own (``numbers["split"]``), the band
    and the knee count from ``base_batch`` (``knee_base``), as :func:`~batching.book.why.flat_verdict`
    does, and batch 1's points are labelled as that kernel's."""
    b = np.asarray(sweep["batch"], dtype=float)
    own1 = from_base and numbers.get("split", 0.0) > 0
    shown = list(sweep["paths"] if paths is None else paths)
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.4))
    ax = axes[0]
    rb = roof["batch"]
    ax.plot(rb, roof["time_s"] * 1e3, label="roofline: max(memory, compute)", **ROOF_STYLE["time"])
    ax.plot(rb, roof["memory_s"] * 1e3, label="memory: (weights + KV) / bandwidth", **ROOF_STYLE["memory"])
    ax.plot(rb, roof["compute_s"] * 1e3, label="compute: FLOPs / peak", **ROOF_STYLE["compute"])
    ys = [roof["time_s"] * 1e3, roof["compute_s"] * 1e3]
    for path in shown:
        y = np.asarray(sweep[f"{path}_ms"])
        ys.append(y)
        err = np.vstack([y - np.asarray(sweep[f"{path}_p25_ms"]), np.asarray(sweep[f"{path}_p75_ms"]) - y])
        ax.errorbar(
            b,
            y,
            yerr=np.maximum(err, 0),
            fmt=PATH_MARKERS[path] + "-",
            color=PATH_COLORS[path],
            ms=4,
            lw=1.2,
            capsize=2,
            label=PATH_LABELS[path],
            zorder=4,
        )
    u = np.asarray(sweep["uniform_ms"], dtype=float)
    base = numbers["base_batch"] if own1 else float(b[0])
    band = KNEE_FACTOR * float(u[list(b).index(base)])
    ax.axhline(band, color="#bbbbbb", lw=0.8, zorder=1)
    k = numbers["knee_base"] if own1 else numbers["knee"]
    ky = float(u[list(b).index(k)])
    ax.plot([k], [ky], "o", ms=11, mfc="none", mec="black", mew=1.2, zorder=5)
    # Far below the circle (a factor 3.5 on the log axis), with a leader line: the knee's
    # band and its label run above the knee (it sits at most that factor above batch 1),
    # and the measured points and the roofline close under it.
    first = k <= b.min()  # a knee at the first batch has no room on its left
    ax.annotate(
        f"knee: {k:.0f}",
        (k, ky),
        xytext=(k, ky / 3.5),
        textcoords="data",
        ha="left" if first else "right",
        va="top",
        fontsize=7.5,
        zorder=6,
        bbox=box(),
        arrowprops={"arrowstyle": "-", "color": "black", "lw": 0.7, "shrinkB": 6},
    )
    if own1:
        # Batch 1 multiplies by its weights in a kernel of its own (a matrix-vector product
        # split over the threads): the label sits under its point, the curve runs above it.
        ax.annotate(
            "batch 1:\none-token\nkernel",
            (float(b[0]), float(u[0])),
            xytext=(float(b[0]) * 1.1, float(u[0]) / 5),
            textcoords="data",
            ha="left",
            va="top",
            fontsize=7,
            color=PATH_COLORS["uniform"],
            zorder=6,
            bbox=box(0.1),
            arrowprops={"arrowstyle": "-", "color": PATH_COLORS["uniform"], "lw": 0.7, "shrinkB": 4},
        )
    _bstar_line(ax, numbers["bstar"], y=0.97)
    log_y(ax, ys, headroom=1.6)
    ax.set_ylabel("decode step (ms, log)")
    ax.set_title("step time", fontsize=9)
    ax = axes[1]
    ax.plot(rb, roof["tokens_per_s"], label="roofline", **ROOF_STYLE["time"])
    tps = [roof["tokens_per_s"]]
    for path in shown:
        y = b / (np.asarray(sweep[f"{path}_ms"]) / 1e3)
        tps.append(y)
        ax.plot(b, y, PATH_MARKERS[path] + "-", color=PATH_COLORS[path], ms=4, lw=1.2)
    if own1:
        i = list(b).index(numbers["base_batch"])
        note(
            ax,
            f"batch {numbers['base_batch']:.0f}:\nkernel change",
            (float(b[i]), float(b[i] / u[i] * 1e3)),
            (2, 4),
            ha="right",
            va="bottom",
            fontsize=7,
            color=PATH_COLORS["uniform"],
            bbox=box(0.1),
        )
    # Low on the right of its line: throughput rises with the batch, so past B* the curves
    # run high and the panel's lower right is empty (at 0.75 the label sat on the curve).
    _bstar_line(ax, numbers["bstar"], y=0.12)
    log_y(ax, tps, headroom=1.3)
    ax.set_ylabel("output tokens/s (log)")
    ax.set_title("throughput", fontsize=9)
    for a in axes:
        _pow2_axis(a, b.min(), b.max())
    # The band's label goes to the half of the panel away from B* (once the batch axis is
    # final): B*'s label, at the top right of its line, covers it where the band runs near the
    # top and B* lies in the band label's half.
    ax = axes[0]
    lo, hi = ax.get_xlim()
    right = math.log(numbers["bstar"] / lo) / math.log(hi / lo) < 0.5
    note(
        ax,
        f"{KNEE_FACTOR:g}x batch {base:.0f}",
        (1.0 if right else 0.02, band),
        (-2 if right else 0, 1),
        "y",
        ha="right" if right else "left",
        va="bottom",
        fontsize=7,
        color="#888888",
        bbox=box(0.1),
    )
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7.5)
    return fig


def profiles_figure(
    profiles: Sequence[Mapping[str, Any]],
    roofs: Sequence[Mapping[str, np.ndarray]],
    live: Mapping[str, Any],
    gpu: Mapping[str, Any] | None = None,
) -> Figure:
    """The live sweep's uniform path beside every committed profile
    (:func:`batching.book.profiles.load_profiles`) and, if given, the GPU rooflines
    (:func:`batching.book.why.gpu_rooflines`, shortest context). Left: step time against
    batch, each profile at its ``ref_ctx`` with its own roofline (``roofs[i]``, dashed).
    Right: the same relative to batch 1, where devices of any speed compare, with the knee's
    band."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.5))
    m = live["meta"]
    series: list[tuple[str, np.ndarray, np.ndarray, str, Mapping[str, np.ndarray] | None]] = [
        (
            f"this build: {m['model']} {m['dtype']} on {machine_label(m)}, {live['ctx']} tok/row",
            np.asarray(live["batch"], dtype=float),
            np.asarray(live["uniform_ms"], dtype=float),
            PATH_COLORS["uniform"],
            None,
        )
    ]
    for i, (p, roof) in enumerate(zip(profiles, roofs)):
        m = p["meta"]
        series.append(
            (
                f"profile: {m['model']} {p['shape'].dtype} on {p['machine']}, {m['date'][:10]}, "
                f"{p['ref_ctx']:,.0f} tok/row",
                np.asarray(p["batch"], dtype=float),
                np.asarray(p["ref_ms"], dtype=float),
                SOURCE_COLORS[i % len(SOURCE_COLORS)],
                roof,
            )
        )
    lo, hi = math.inf, 0.0
    for label, b, ms, col, own in series:
        lo, hi = min(lo, b.min()), max(hi, b.max())
        axes[0].plot(b, ms, "o-", color=col, ms=3.5, lw=1.4, label=label)
        axes[1].plot(b, ms / ms[0], "o-", color=col, ms=3.5, lw=1.4)
        if own is not None:
            axes[0].plot(own["batch"], own["time_s"] * 1e3, "--", color=col, lw=1)
    if gpu is not None:
        # Below B* both GPUs' relative costs are the same ratio of bytes, so their lines lie
        # on top of each other: distinct markers (open vs filled) keep both visible.
        for (dev, d), (ls, gc, mk, mfc) in zip(
            gpu["devices"].items(),
            (
                ("--", "#888888", "s", "none"),
                (":", "#222222", "^", "#222222"),
                ("-.", "#555555", "D", "none"),
            ),
        ):
            cur = d["ctx"][min(d["ctx"])]
            ok = (cur["batch"] >= lo) & (cur["batch"] <= hi)
            axes[1].plot(
                cur["batch"][ok],
                (cur["time_s"] / cur["time_s"][0])[ok],
                ls,
                color=gc,
                lw=1.3,
                marker=mk,
                ms=5 if mfc == "none" else 3,
                mfc=mfc,
                mec=gc,
                label=f"roofline simulation: {gpu['model']} {gpu['dtype']} on {dev}, "
                f"{min(d['ctx']):,} tok/row",
            )

    axes[1].axhline(KNEE_FACTOR, color="#bbbbbb", lw=0.8, zorder=1)
    axes[0].set_yscale("log")
    axes[0].set_ylabel("decode step (ms, log)\nsolid: measured, dashed: roofline")
    axes[0].set_title("step time", fontsize=9)
    axes[1].set_yscale("log")
    rel = [ms / ms[0] for _, _, ms, _, _ in series]
    top = max(2.2, max(float(r.max()) for r in rel) * 1.15)
    axes[1].set_ylim(0.9, top)
    log_ticks(axes[1], 1.0, top, axis="y")
    axes[1].set_ylabel("step time / step time at batch 1 (log)")
    axes[1].set_title("relative cost of a bigger batch", fontsize=9)
    for a in axes:
        _pow2_axis(a, lo, hi)
    h0, l0 = axes[0].get_legend_handles_labels()
    h1, l1 = axes[1].get_legend_handles_labels()
    fig.legend(h0 + h1, l0 + l1, loc="outside lower center", ncol=1, fontsize=7.5)
    return fig


#: The measured GPUs' curves (colour-blind-safe, distinct from the roofline's black).
MEASURED_GPU_COLORS: dict[str, str] = {"h100": "#0072B2", "a100": "#D55E00"}


def measured_gpu_figure(curves: Mapping[str, Mapping[str, Any]]) -> Figure:
    """The linear part of a decode step against batch on each measured GPU
    (:func:`batching.book.gpu.decode_curves`), one panel each: Vidur's measured medians, the
    datasheet roofline of the same part, B*, the ``KNEE_FACTOR`` x batch 1 line and the
    knee (circled)."""
    fig, axes = plt.subplots(1, len(curves), figsize=(WIDTH, 3.0), sharey=False)
    axes = np.atleast_1d(axes)
    for ax, (gpu, c) in zip(axes, curves.items()):
        b, y, roof = c["batch"], c["measured_ms"], c["roofline_ms"]
        col = MEASURED_GPU_COLORS.get(gpu, "#444444")
        ax.plot(b, roof, label="roofline (datasheet)", **ROOF_STYLE["time"])
        ax.plot(b, y, "o-", color=col, ms=3, lw=1.3, label="measured (Vidur)", zorder=4)
        band = KNEE_FACTOR * float(y[0])
        ax.axhline(band, color="#bbbbbb", lw=0.8, zorder=1)
        note(
            ax,
            f"{KNEE_FACTOR:g}x batch 1",
            (0.02, band),
            (0, 1),
            "y",
            ha="left",
            va="bottom",
            fontsize=7,
            color="#888888",
            bbox=box(0.1),
        )
        k = c["knee"]
        ky = float(y[list(b).index(k)])
        ax.plot([k], [ky], "o", ms=10, mfc="none", mec="black", mew=1.2, zorder=5)
        note(ax, f"knee: {k:.0f}", (k, ky), (7, -7), "data", ha="left", va="top", fontsize=7.5, bbox=box())
        _bstar_line(ax, c["bstar"], y=0.97, left=True)
        ax.set_ylim(0, max(float(y.max()), float(roof.max())) * 1.08)
        _pow2_axis(ax, float(b.min()), float(b.max()))
        ax.set_title(f"{c['model']}, {c['device']}", fontsize=9)
    axes[0].set_ylabel("linear layers per step (ms)")
    axes[0].legend(loc="upper left", fontsize=7.5)
    return fig


#: The two dtypes of a CPU's kernels, as the dtype figure draws them.
DTYPE_STYLE: dict[str, dict[str, Any]] = {
    "bf16": {"color": PHASE_COLORS["decode"], "marker": "o"},
    "fp32": {"color": "#E69F00", "marker": "s"},
}


def dtype_figure(chosen: Mapping[str, Any], other: Mapping[str, Any]) -> Figure:
    """The uniform decode step of two sweeps of one model in two dtypes: left, the step (ms,
    log); right, the step over each dtype's own batch 1."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.0))
    lo, hi = math.inf, 0.0
    steps = [np.asarray(sw["uniform_ms"], dtype=float) for sw in (chosen, other)]
    for sw in (chosen, other):
        dt = str(sw["meta"]["dtype"])
        b = np.asarray(sw["batch"], dtype=float)
        u = np.asarray(sw["uniform_ms"], dtype=float)
        st = DTYPE_STYLE.get(dt, {"color": "#666666", "marker": "^"})
        tag = " (this build's pages)" if sw is chosen else ""
        axes[0].plot(b, u, "-", ms=4, lw=1.3, label=f"{dt}{tag}", **st)
        axes[1].plot(b, u / u[0], "-", ms=4, lw=1.3, **st)
        lo, hi = min(lo, b[0]), max(hi, b[-1])
    for ax in axes:
        _pow2_axis(ax, lo, hi)
        ax.grid(True, which="major", alpha=0.3)
    log_y(axes[0], steps, 1.3)
    axes[0].set_ylabel("decode step (ms, log scale)")
    axes[1].set_ylabel("step / batch 1's step")
    axes[1].axhline(KNEE_FACTOR, color="#bbbbbb", lw=0.8)
    axes[0].legend(fontsize=7.5, loc="upper left")
    return fig
