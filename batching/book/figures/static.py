"""Figures of 7.1 (static batching): padded prefill (roofline and real), slot timelines, the
batch-size sweep and the wait of dynamic batching."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from ...steplog import KINDS, Segment
from ..plots import PHASE_COLORS, SCHEDULER_COLORS, WIDTH, box, legend_patches, log2_x, note, percent_axis

#: The padding figures' bar colours: unpadded prefills light blue, padded ones orange.
_UNPADDED_COLOR = "#7fb3d5"


def _padding_labels(short: int, long: int) -> list[str]:
    return [
        f"{short}-token prompt\nalone",
        f"{short}-token prompt\npadded to {long:,}",
        "batch of both,\nno padding",
        "batch of both,\npadded (static)",
    ]


def _prefill_time_bars(ax: Any, y: np.ndarray, times_ms: np.ndarray, xlabel: str) -> None:
    """Horizontal bars of four prefill times (alone, padded, packed, padded pair), labelled in ms."""
    ax.barh(y, times_ms, color=[_UNPADDED_COLOR, PHASE_COLORS["padding"]] * 2)
    for yi, t in zip(y, times_ms):
        ax.text(t, yi, f" {t:,.1f} ms" if t < 100 else f" {t:,.0f} ms", va="center", fontsize=8.5)
    ax.set_xlabel(xlabel)
    ax.set_xlim(0, times_ms.max() * 1.3)
    ax.grid(axis="y", visible=False)


def padding_figure(pc: Mapping[str, float]) -> Figure:
    """7.1 (a): prefill tokens computed and roofline prefill time, padded vs not."""
    short, long = int(pc["short"]), int(pc["long"])
    labels = _padding_labels(short, long)
    useful = np.array([short, short, short + long, short + long], dtype=float)
    padding = np.array([0, long - short, 0, long - short], dtype=float)
    times = (
        np.array([pc["t_short"], pc["t_short_padded"], pc["t_batch_unpadded"], pc["t_batch_padded"]]) * 1e3
    )
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.9), sharey=True)
    y = np.arange(len(labels))[::-1]
    ax = axes[0]
    ax.barh(y, useful, color=PHASE_COLORS["prefill"], label="prompt tokens")
    ax.barh(y, padding, left=useful, color=PHASE_COLORS["padding"], label="padding tokens")
    ax.set_yticks(y, labels)
    ax.set_xlabel("tokens computed in the prefill step")
    ax.legend(loc="upper right")
    ax.grid(axis="y", visible=False)
    _prefill_time_bars(axes[1], y, times, "roofline prefill time (ms)")
    return fig


def real_padding_figure(rp: Mapping[str, Any]) -> Figure:
    """7.1 (a), measured: the four prefill steps of :func:`~batching.book.static.real_padding`
    (the short prompt alone, padded to the long one, the pair packed and the pair padded),
    median measured time of each, with the positions it computed beside its label."""
    short, long = int(rp["short"]), int(rp["long"])
    positions = [short, long, short + long, 2 * long]
    labels = [f"{lab}\n{n:,} positions" for lab, n in zip(_padding_labels(short, long), positions)]
    times = np.array([rp["short_ms"], rp["long_ms"], rp["packed_ms"], rp["padded_ms"]], dtype=float)
    fig, ax = plt.subplots(figsize=(WIDTH, 2.6))
    y = np.arange(len(labels))[::-1]
    ax.set_yticks(y, labels)
    _prefill_time_bars(ax, y, times, "measured prefill time (ms)")
    return fig


def timeline_figure(
    panels: Sequence[tuple[str, Sequence[Segment]]],
    height_per_panel: float = 2.3,
    marks: Sequence[Sequence[tuple[float, str]]] | None = None,
    sharex: bool = False,
) -> Figure:
    """Per-slot timelines (7.1 (b), 7.2): one panel per (title, segments), a row per slot,
    coloured by what it does; ``marks[i]``: (time, label) dotted lines on panel i; ``sharex``:
    every panel spans the longest one's time."""
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(WIDTH, height_per_panel * len(panels) + 0.5), squeeze=False
    )
    used: set[str] = set()
    for pi, (ax, (title, segs)) in enumerate(zip(axes[:, 0], panels)):
        nslots = max(s.slot for s in segs) + 1
        for t, label in marks[pi] if marks else ():
            ax.axvline(t, color="black", ls=":", lw=1, zorder=5)
            note(ax, label, (t, 0.5), (4, 0), "x", fontsize=8, zorder=6, bbox=box(0.2, 0.85))
        for kind in KINDS:
            bars: dict[int, list[tuple[float, float]]] = {}
            for s in segs:
                if s.kind == kind and s.t1 > s.t0:
                    bars.setdefault(s.slot, []).append((s.t0, s.t1 - s.t0))
            for slot, spans in bars.items():
                ax.broken_barh(spans, (slot - 0.45, 0.9), facecolors=PHASE_COLORS[kind], edgecolor="none")
            if bars:
                used.add(kind)
        ax.set_xlim(0, max(s.t1 for _, sg in (panels if sharex else [(title, segs)]) for s in sg))
        ax.set_ylim(nslots - 0.5, -0.5)
        ax.set_ylabel("slot")
        ax.set_title(title, loc="left")
        ax.grid(False)
        step = max(1, nslots // 4)
        ax.set_yticks(range(0, nslots, step))
    axes[-1, 0].set_xlabel("time (s)")
    fig.legend(
        handles=legend_patches([k for k in KINDS if k in used]), loc="outside lower center", ncol=len(used)
    )
    return fig


def batch_sweep_figure(sweep: Mapping[str, np.ndarray]) -> Figure:
    """7.1 (c): slot utilization (simulated and the formula) and padding fraction of static
    batching vs batch size."""
    b = sweep["batch"]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.6))
    ax = axes[0]
    ax.plot(b, sweep["analytic"], "-", color="#999999", lw=2.5, label="formula: Σ outputs / (B · Σ longest)")
    ax.plot(b, sweep["slot_util"], "o", color=SCHEDULER_COLORS["static"], label="simulated")
    ax.set_ylabel("slot utilization")
    ax.legend(loc="lower left")
    axes[1].plot(b, sweep["padding_fraction"], "o-", color=PHASE_COLORS["padding"])
    axes[1].set_ylabel("padding / prefill positions")
    for ax in axes:
        log2_x(ax, b)
        ax.set_xlabel("static batch size B (log 2)")
        ax.set_ylim(0, 1.05)
        percent_axis(ax)
    return fig


#: 7.1 (d): the least white (pixels at the book's DPI) between a point label and the ceiling line.
WAIT_LABEL_CLEAR_PX = 3.0


def wait_figure(sweep: Mapping[str, Mapping[str, np.ndarray]], ceiling: float | None = None) -> Figure:
    """7.1 (d): mean queueing delay vs slot utilization as the collection timeout grows; a run
    whose queue grew over the replay (``stable`` 0) is drawn hollow."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.3))
    top = max(0.6, (ceiling or 0) * 1.25)
    qs, labels = [], []
    unstable = False
    for name, d in sweep.items():
        q = np.maximum(d["queue_mean"], 1e-3)
        qs.append(q)
        ax.plot(
            q,
            d["slot_util"],
            "o-",
            color=SCHEDULER_COLORS[name],
            label=f"{name} ({'timeout' if name == 'static' else 'max_wait'} T, s)",
        )
        # A run whose queue grew over the replay: hollow, its delay is only a lower bound.
        grew = np.asarray(d["stable"]) == 0 if "stable" in d else np.zeros(len(q), dtype=bool)
        if grew.any():
            ax.plot(q[grew], np.asarray(d["slot_util"])[grew], "o", color=SCHEDULER_COLORS[name], mfc="white")
            unstable = True
        # Points that bunch up (small T) share one label listing every T of the bunch,
        # written below it, where the curves leave room; a lone point keeps its own label.
        groups: list[list[int]] = []
        for j, (x, y) in enumerate(zip(q, d["slot_util"])):
            x0, y0 = (q[groups[-1][0]], d["slot_util"][groups[-1][0]]) if groups else (None, None)
            if groups and abs(math.log10(x / x0)) < 0.12 and abs(y - y0) < 0.03:
                groups[-1].append(j)
            else:
                groups.append([j])
        for g in groups:
            x, y = q[g[0]], d["slot_util"][g[0]]
            text = ", ".join(f"{d['wait'][j]:g}" for j in g)
            if len(g) > 1:
                off, ha, va = (2, -9), "left", "top"
            elif name == "static" and y > 0.08 * top:
                off, ha, va = (4, -10), "left", "baseline"
            elif name == "static":  # near the axis: above, not cut off below it
                off, ha, va = (4, 5), "left", "baseline"
            else:
                off, ha, va = (-4, 5), "right", "baseline"
            labels.append(
                note(ax, text, (x, y), off, ha=ha, va=va, fontsize=7.5, color=SCHEDULER_COLORS[name])
            )
    if ceiling is not None:
        ax.axhline(ceiling, color="#999999", ls="--", lw=1.2)
        ax.annotate(
            "full batches of B (first-finisher ceiling)",
            (0.99, ceiling),
            xycoords=("axes fraction", "data"),
            ha="right",
            va="bottom",
            fontsize=8,
            color="#666666",
        )
    ax.set_xscale("log")
    allq = np.concatenate(qs) if qs else np.array([1.0])
    ax.set_xlim(allq.min() / 1.6, allq.max() * 1.8)  # room for the labels at both ends
    ax.set_xlabel("mean queueing delay, arrival to admission (s, log scale)")
    ax.set_ylabel("slot utilization")
    ax.set_ylim(0, top)
    percent_axis(ax)
    handles, names = ax.get_legend_handles_labels()
    if unstable:
        handles.append(Line2D([], [], ls="none", marker="o", color="#666666", mfc="white"))
        names.append("hollow: queue grows over the replay")
    fig.legend(handles, names, loc="outside lower center", ncol=len(names))
    if ceiling is not None:
        # The best points sit just under the ceiling, so a label written above its point can
        # land on (or touch) the dashed line: such a label moves just above the line, at its
        # point's x.
        fig.canvas.draw()
        y_line = ax.transData.transform((1.0, ceiling))[1]
        for t in labels:
            box = t.get_window_extent()
            if box.y0 - WAIT_LABEL_CLEAR_PX <= y_line <= box.y1 + WAIT_LABEL_CLEAR_PX:
                t.xy = (t.xy[0], ceiling)
                t.xyann = (t.xyann[0], 3)
                t.set_verticalalignment("bottom")
    return fig
