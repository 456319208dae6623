"""Figures of continuous batching: utilization against load, the real engine's schedulers,
iterations per probe, and capacity at a latency target (also the chunked page's)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from ..plots import SCHEDULER_COLORS, WIDTH, box, log_ticks, note, percent_axis


def _config_color(name: str) -> str:
    """A configuration's colour from the scheduler its label starts with."""
    return SCHEDULER_COLORS.get(name.split()[0].rstrip(","), "#999999")


def utilization_load_figure(
    sweep: Mapping[str, Mapping[str, np.ndarray]],
    trace_rate: float,
    marks: Sequence[tuple[str, str, float, float]] = (),
) -> Figure:
    """Slot utilization (left) and all-FLOP hardware compute utilization (right) against
    offered rate, one line per configuration of a :func:`~batching.book.continuous.rate_sweep`
    (hollow markers where the queue grows), the trace's own rate dotted. ``marks``
    (:func:`~batching.book.continuous.utilization_marks`: configuration, ``slot_util`` or
    ``hw_compute``, rate, value) are drawn as stars in the configuration's colour, each with
    its value written beside it."""
    keys = ("slot_util", "hw_compute")
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.0), sharex=True)
    for name, d in sweep.items():
        c = _config_color(name)
        x = np.asarray(d["offered_rate"], dtype=float)
        ok = np.asarray(d["stable"], dtype=bool)
        for ax, key in zip(axes, keys):
            y = np.asarray(d[key], dtype=float)
            ls = "--" if "32" in name else "-"
            ax.plot(x, y, ls, color=c, lw=1.2, label=name)
            ax.plot(x[ok], y[ok], "o", color=c, ms=4)
            ax.plot(x[~ok], y[~ok], "o", color=c, ms=4, mfc="white")
    for name, key, rate, value in marks:
        ax = axes[keys.index(key)]
        ax.plot([rate], [value], "*", color=_config_color(name), ms=13, mec="black", mew=0.8, zorder=5)
        note(
            ax,
            f"{value:.0%}",
            (rate, value),
            (-7, 0),
            ha="right",
            va="center",
            fontsize=8.5,
            fontweight="bold",
            bbox=box(0.15, 0.9),
            zorder=6,
        )
    xs = np.concatenate(
        [np.asarray(d["offered_rate"], dtype=float) for d in sweep.values()]
        + [np.array([m[2] for m in marks])]
    )
    for ax, t in zip(axes, ("slot utilization", "hardware compute utilization (all FLOPs)")):
        ax.set_title(t, fontsize=9)
        ax.set_xscale("log")
        log_ticks(ax, xs.min(), xs.max())
        ax.set_ylim(0, 1.02)
        percent_axis(ax)
        ax.set_xlabel("offered rate (req/s, log scale)")
        ax.axvline(trace_rate, color="#999999", lw=1, ls=":")
    extra = [
        Line2D([], [], marker="o", color="#666666", ls="none", label="stable"),
        Line2D([], [], marker="o", color="#666666", mfc="white", ls="none", label="queue grows"),
    ]
    if marks:
        extra.append(
            Line2D(
                [],
                [],
                marker="*",
                color="#666666",
                mec="black",
                mew=0.8,
                ms=10,
                ls="none",
                label="at capacity",
            )
        )
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(
        handles + extra,
        names + [h.get_label() for h in extra],
        loc="outside lower center",
        ncol=3,
        fontsize=8,
    )
    return fig


def real_schedulers_figure(rs: Mapping[str, Any]) -> Figure:
    """Slot utilization, p99 end-to-end latency and output tokens/s of each run of
    :func:`~batching.book.checks.real_schedulers` (solid bars), with the simulator's
    prediction beside them (hatched) where it ran. A run whose queue grew over the replay
    (``stable`` 0) has its p99 bar drawn hollow and marked: that percentile does not count."""
    keys = (
        ("slot_util", "slot utilization"),
        ("e2e_p99", "p99 end-to-end (s)"),
        ("throughput_tok", "output tokens/s"),
    )
    names = list(rs["real"])
    sim = rs.get("sim")
    fig, axes = plt.subplots(1, len(keys), figsize=(WIDTH, 2.6))
    w = 0.38 if sim else 0.7
    for ax, (key, title) in zip(axes, keys):
        for i, n in enumerate(names):
            c = _config_color(n)
            x = i - w / 2 if sim else i
            grew = key == "e2e_p99" and not rs["real"][n].get("stable", 1.0)
            v = rs["real"][n][key]
            if grew:
                ax.bar(x, v, width=w, color="white", edgecolor=c, linewidth=1.5)
                ax.annotate(
                    "queue grew",
                    (x, v),
                    xytext=(0, 2),
                    textcoords="offset points",
                    ha="center",
                    va="bottom",
                    fontsize=8,
                    color="#666666",
                )
                ax.margins(y=0.12)
            else:
                ax.bar(x, v, width=w, color=c, label="measured" if i == 0 else None)
            if sim:
                ax.bar(
                    i + w / 2,
                    sim[n][key],
                    width=w,
                    color="white",
                    edgecolor=c,
                    hatch="////",
                    label="simulated" if i == 0 else None,
                )
        ax.set_xticks(range(len(names)), names)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="x", visible=False)
        if key == "slot_util":
            ax.set_ylim(0, 1.02)
            percent_axis(ax)
    if sim:
        axes[0].legend(loc="upper left", fontsize=8)
    return fig


def iterations_figure(its: Mapping[str, Mapping[str, np.ndarray]], probe: int) -> Figure:
    """Distributions of the iterations (from arrival) and the seconds (from admission) a
    ``probe``-token request lives through, per scheduler (:func:`~batching.book.continuous.probe_runs`)."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.9))
    for name, d in its.items():
        c = _config_color(name)
        for ax, key in ((axes[0], "from_arrival"), (axes[1], "service")):
            x = np.sort(d[key])
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(x, y, where="post", color=c, label=name)
    axes[0].axvline(probe, color="#999999", ls="--", lw=1)
    note(
        axes[0],
        f"{probe} iterations",
        (probe, 0.55),
        (5, 0),
        fontsize=8,
        color="#666666",
        bbox=box(0.2, None),
    )
    axes[0].set_xscale("log")
    axes[0].set_xlim(left=probe / 2)
    axes[0].set_xlabel("engine iterations from arrival to last token (log)")
    axes[1].set_xscale("log")
    service = np.concatenate([np.asarray(d["service"], dtype=float) for d in its.values()])
    log_ticks(axes[1], float(service.min()), float(service.max()))
    axes[1].set_xlabel("seconds from admission to last token (log)")
    for ax in axes:
        ax.set_ylabel("fraction of probes")
        ax.set_ylim(0, 1.02)
    axes[1].legend(loc="lower right")
    return fig


def capacity_figure(
    rows: Sequence[Mapping[str, Any]], trace_rate: float, slo_labels: Mapping[str, str]
) -> Figure:
    """Capacity at a latency target (:func:`batching.capacity.capacity_table`): per
    configuration one bar per SLO (labelled by ``slo_labels``), the sustained request rate
    written at its end, and the trace's own rate (req/s) dotted for scale."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    slos = list(dict.fromkeys(r["slo"] for r in rows))
    rate = {(r["config"], r["slo"]): float(r["rate"]) for r in rows}
    fig, ax = plt.subplots(figsize=(WIDTH, 0.27 * len(configs) * len(slos) + 1.0))
    h = 0.8 / len(slos)
    shades = {0: 1.0, 1: 0.45}
    top = max(rate.values())
    for j, slo in enumerate(slos):
        for i, name in enumerate(configs):
            v = rate.get((name, slo), float("nan"))
            c = _config_color(name)
            y = i + (j - (len(slos) - 1) / 2) * h
            ax.barh(
                y,
                v,
                height=h * 0.9,
                color=c,
                alpha=shades.get(j, 0.3),
                label=slo_labels[slo] if i == 0 else None,
            )
            ax.text(v + top * 0.01, y, f"{v:.1f}" if v > 0 else "0 (none met)", va="center", fontsize=7.5)
    ax.set_yticks(range(len(configs)), configs)
    ax.invert_yaxis()
    ax.set_xlabel("capacity: highest sustained request rate (req/s)")
    ax.set_xlim(0, top * 1.15)
    ax.axvline(trace_rate, color="#999999", ls=":", lw=1.0)
    ax.text(trace_rate, -0.75, " trace's own rate", fontsize=7, color="#666666", va="bottom")
    handles = [
        Patch(facecolor="#555555", alpha=shades.get(j, 0.3), label=slo_labels[s]) for j, s in enumerate(slos)
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=7.5, frameon=False)
    return fig


#: Colours of the servers beside this engine's schedulers (Okabe-Ito, apart from the palette's).
SERVER_COLORS = {"hf-serve": "#E69F00", "vllm-serve": "#009E73"}


def serve_figure(rows: Mapping[str, Mapping[str, float | None]], labels: Mapping[str, str]) -> Figure:
    """Median time to first token, inter-token gap and end-to-end latency (ms) of each mode in
    ``labels`` (its order, top to bottom) that ``rows`` has (:func:`batching.book.serve.numbers`'
    ``rows``), one horizontal bar each, the value written at its end (one decimal below 10 ms)."""
    keys = (("ttft_p50", "median TTFT (ms)"), ("itl_p50", "median ITL (ms)"), ("e2e_p50", "median E2E (ms)"))
    modes = [m for m in labels if m in rows]
    fig, axes = plt.subplots(1, len(keys), figsize=(WIDTH, 0.32 * len(modes) + 1.0), sharey=True)
    for ax, (key, title) in zip(axes, keys):
        vals = [1e3 * (rows[m][key] or math.nan) for m in modes]
        top = max((v for v in vals if math.isfinite(v)), default=1.0)
        for i, (m, v) in enumerate(zip(modes, vals)):
            c = SERVER_COLORS.get(m) or _config_color(m.removeprefix("ours-"))
            ax.barh(i, v, height=0.7, color=c)
            if math.isfinite(v):
                ax.text(v + top * 0.02, i, f"{v:.1f}" if v < 10 else f"{v:.0f}", va="center", fontsize=7.5)
        ax.set_xlim(0, top * 1.3)
        ax.set_title(title, fontsize=9)
        ax.grid(axis="y", visible=False)
    axes[0].set_yticks(range(len(modes)), [labels[m] for m in modes])
    axes[0].invert_yaxis()
    return fig
