"""Figures of 7.3 (chunked prefill): inter-token latency around a long prompt, the chunk-size
roofline and profile, and the TTFT-ITL trade-off."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure

from ..plots import (
    LOAD_STYLES,
    PHASE_COLORS,
    SCHEDULER_COLORS,
    SOURCE_COLORS,
    WIDTH,
    drop_overlapping,
    log2_x,
    log_ticks,
    note,
)


def _config_style(name: str) -> dict[str, Any]:
    """Line style of a 7.3 configuration from its label."""
    if "chunk" in name and "no chunk" not in name:
        return {"color": SCHEDULER_COLORS["chunked"], "ls": "-"}
    if "separate" in name:
        return {"color": "#888888", "ls": "--"}
    return {"color": SCHEDULER_COLORS["continuous"], "ls": "-"}


def itl_figure(
    series: Mapping[str, Mapping[str, np.ndarray]],
    arrival: float,
    first_tokens: Mapping[str, float] | None = None,
    window: tuple[float, float] | None = None,
    xlabel: str = "time (s)",
) -> Figure:
    """7.3: the inter-token latency the running requests see, per configuration; triangles
    on the time axis mark the newcomer's first token."""
    fig, ax = plt.subplots(figsize=(WIDTH, 2.9))
    top = 0.0
    for name, d in series.items():
        t, g = d["t"], d["itl"] * 1e3
        # Every running request sees the same step: draw one line of the step-by-step ITL.
        u, idx = np.unique(t, return_index=True)
        ax.step(u, g[idx], where="pre", lw=1.5, label=name, **_config_style(name))
        top = max(top, float(g.max(initial=0.0)))
    ax.axvline(arrival, color="#999999", ls=":", lw=1)
    label = note(
        ax, "long prompt arrives", (arrival, 0.93), (-4, 0), "x", ha="right", fontsize=8, color="#666666"
    )
    if first_tokens:
        # Stacked a little apart on the time axis: first tokens a few ms apart would otherwise
        # hide one another behind a single triangle.
        for k, (name, tf) in enumerate(first_tokens.items()):
            ax.plot(
                [tf],
                [0.035 * k],
                marker="v",
                ms=8,
                clip_on=False,
                zorder=6,
                mec="white",
                color=_config_style(name)["color"],
                transform=ax.get_xaxis_transform(),
            )
    if window:
        ax.set_xlim(*window)
    ax.set_xlabel(xlabel)
    ax.set_ylabel("inter-token latency of\nthe running requests (ms)")
    # Headroom above the tallest stall for the legend, which would otherwise sit on it.
    ax.set_ylim(0, top * 1.45 if top > 0 else None)
    ax.legend(loc="upper right")
    # Left of the arrival line unless that runs out of the axes (an arrival near the window's
    # left edge, as in the measured run): then it would sit on the y tick labels, so right of it.
    fig.canvas.draw()
    if label.get_window_extent().x0 < ax.get_window_extent().x0:
        label.xyann = (4, 0)
        label.set_horizontalalignment("left")
    return fig


def _chunk_x(ax: Any, ticks: Iterable[float] | None) -> None:
    """The prefill-chunk axis of 7.3's figures: log 2, labelled at ``ticks``."""
    log2_x(ax, ticks)
    ax.tick_params(axis="x", labelrotation=45)
    ax.set_xlabel("prefill chunk (tokens, log 2)")


def _bstar_label(ax: Any, bstar: float, color: str) -> None:
    """ "B*" beside a dotted B* line, near the top (the bottom holds the decode-only step)."""
    note(ax, "B*", (bstar, 0.9), (3, 0), "x", fontsize=8, color=color)


def chunk_roofline_figure(chunks: np.ndarray, step_s: np.ndarray, decode_s: float, bstar: float) -> Figure:
    """7.3: roofline time of one step (running decodes + one prefill chunk) vs chunk size,
    and the prefill throughput that chunk size gets."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.7))
    ax = axes[0]
    ax.plot(chunks, step_s * 1e3, "o-", color=SCHEDULER_COLORS["chunked"], ms=3.5)
    ax.axhline(decode_s * 1e3, color=PHASE_COLORS["decode"], ls="--", lw=1)
    note(
        ax,
        "decode-only step",
        (1.0, decode_s * 1e3),
        (0, 3),
        "y",
        ha="right",
        va="bottom",
        fontsize=8,
        color=PHASE_COLORS["decode"],
    )
    ax.set_yscale("log")
    log_ticks(ax, float(min(step_s.min(), decode_s)) * 1e3 * 0.9, float(step_s.max()) * 1e3 * 1.1, axis="y")
    ax.set_ylabel("step time = decodes' ITL\n(ms, log)")
    ax = axes[1]
    ax.plot(chunks, chunks / step_s / 1e3, "o-", color=PHASE_COLORS["prefill"], ms=3.5)
    ax.set_ylabel("prefill throughput (k tokens/s)")
    for a in axes:
        _chunk_x(a, chunks)
        a.axvline(bstar, color="#999999", ls=":", lw=1)
        _bstar_label(a, bstar, "#666666")
    return fig


def chunk_profile_figure(curves: Sequence[Mapping[str, Any]]) -> Figure:
    """7.3, measured: for each :func:`~batching.book.chunked.profile_chunk_steps` curve, the step
    carrying running decodes and one prefill chunk over the decode-only step (the running
    requests' ITL multiplier, left) and the chunk's prefill throughput as a share of the best
    measured (right), against the chunk size; dotted: each profile's B*."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    ticks: set[float] = set()
    for i, c in enumerate(curves):
        col = SOURCE_COLORS[i % len(SOURCE_COLORS)]
        label = f"{c['short']}, {c['decodes']} decodes"
        axes[0].plot(c["chunk"], c["over_decode"], "o-", color=col, ms=3.5, lw=1.4, label=label)
        axes[1].plot(c["chunk"], c["share"] * 100, "o-", color=col, ms=3.5, lw=1.4)
        ticks.update(float(x) for x in c["chunk"])
        for a in axes:
            a.axvline(c["bstar"], color=col, ls=":", lw=1)
        _bstar_label(axes[1], c["bstar"], col)
    if not curves:
        axes[0].text(
            0.5, 0.5, "no measured mixed steps", ha="center", va="center", transform=axes[0].transAxes
        )
    axes[0].set_yscale("log")
    if curves:  # 1x, 2x, 5x... : a multiplier reads better than 10^0, 10^1
        over = np.concatenate([np.asarray(c["over_decode"], dtype=float) for c in curves])
        log_ticks(axes[0], min(1.0, over.min()) * 0.9, over.max() * 1.1, axis="y")
        axes[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    axes[0].set_ylabel("step / decode-only step (log)")
    axes[0].axhline(1.0, color="#bbbbbb", lw=0.8, zorder=1)
    axes[1].set_ylabel("prefill throughput\n(% of best measured)")
    axes[1].set_ylim(0, 105)
    for a in axes:
        _chunk_x(a, sorted(ticks) or None)
    if curves:
        # Below the panels, not in one: a profile's label names its machine and can run as wide
        # as a panel, over the B* lines and their labels (and over the curves' largest chunks).
        handles, labels = axes[0].get_legend_handles_labels()
        fig.legend(handles, labels, loc="outside lower center", ncol=1, fontsize=7)
    return fig


def chunk_tradeoff_figure(sweeps: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """7.3: TTFT p99 vs ITL p99 as the chunk size varies, one curve per load; the hollow
    marker is continuous batching without chunks."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.4))
    labels: list[Any] = []
    points: list[tuple[Any, Any, Any]] = []
    for i, (label, d) in enumerate(sweeps.items()):
        c, mk = LOAD_STYLES[i % len(LOAD_STYLES)]
        points += [
            (ax, d["itl_p99"] * 1e3, d["ttft_p99"]),
            (ax, d["continuous_itl_p99"] * 1e3, d["continuous_ttft_p99"]),
        ]
        ax.plot(d["itl_p99"] * 1e3, d["ttft_p99"], "-", marker=mk, color=c, ms=5, label=f"chunked, {label}")
        first = int(np.argmin(d["chunk"]))
        for j, (x, y, ch) in enumerate(zip(d["itl_p99"] * 1e3, d["ttft_p99"], d["chunk"])):
            # The smallest chunks of every load sit at about the same ITL, where each curve
            # drops in from above: label those to the left of the point, the others below it.
            xy, ha = ((-6, -3), "right") if j == first else ((0, -13), "center")
            t = ax.annotate(
                f"{int(ch)}", (x, y), textcoords="offset points", xytext=xy, ha=ha, fontsize=7.5, color=c
            )
            labels.insert(0, t) if j == first else labels.append(t)  # the smallest chunks' labels win
        ax.plot(
            d["continuous_itl_p99"] * 1e3,
            d["continuous_ttft_p99"],
            "D",
            mfc="white",
            color=c,
            ms=6,
            label=f"no chunking, {label}",
        )
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = np.concatenate([np.r_[d["itl_p99"], d["continuous_itl_p99"]] for d in sweeps.values()]) * 1e3
    ys = np.concatenate([np.r_[d["ttft_p99"], d["continuous_ttft_p99"]] for d in sweeps.values()])
    log_ticks(ax, xs.min() * 0.8, xs.max() * 1.25)
    log_ticks(ax, ys.min() * 0.8, ys.max() * 1.25, axis="y")
    ax.set_ylim(ys.min() * 0.6, ys.max() * 1.6)  # room for the labels under the lowest curve
    ax.set_xlabel("p99 inter-token latency (ms, log)")
    ax.set_ylabel("p99 time to first token (s, log)")
    ax.legend(loc="upper right", ncol=max(1, len(sweeps)), fontsize=7.5)  # one column per load
    drop_overlapping(fig, labels, avoid=points)
    return fig


def chunk_cost_figure(
    curves: Mapping[str, Mapping[str, np.ndarray]], chunk: int, tol: float, partly: float
) -> Figure:
    """7.3, measured GPUs: each ``{label: gpu.chunk_curve(...)}``'s per-token linear-layer cost
    over its cheapest, against the chunk size (log 2 x); shaded: within ``tol`` of the cheapest,
    dashed: ``partly``; dotted: the ``chunk`` the page argues for, with each curve's point there."""
    fig, ax = plt.subplots(figsize=(WIDTH, 2.8))
    hi = 1.0
    for i, (label, c) in enumerate(curves.items()):
        col = SOURCE_COLORS[(i + 2) % len(SOURCE_COLORS)]
        x, r = np.asarray(c["tokens"], dtype=float), np.asarray(c["ratio_floor"], dtype=float)
        ax.plot(x, r, "-", color=col, lw=1.6, label=label)
        ax.plot([chunk], [np.interp(chunk, x, r)], "o", color=col, ms=5, zorder=5)
        hi = max(hi, float(r.max()))
    ax.axhspan(1.0, tol, color="#dddddd", zorder=0, lw=0, label=f"within {tol - 1:.0%} of the cheapest")
    ax.axhline(partly, color="#999999", ls="--", lw=0.9, label=f"within {partly - 1:.0%}")
    ax.axvline(chunk, color="#999999", ls=":", lw=1)
    ticks = [t for t in (1.0, partly, 1.5, 2.0, 2.5, 3.0) if t <= hi * 1.05]
    ax.yaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    ax.set_ylim(0.95, hi * 1.05)
    xs = np.concatenate([np.asarray(c["tokens"], dtype=float) for c in curves.values()])
    _chunk_x(ax, [2.0**k for k in range(int(np.log2(xs.min())), int(np.log2(xs.max())) + 1)])
    ax.set_ylabel("per-token cost of the\nlinear layers / cheapest")
    ax.legend(loc="upper right", fontsize=8)
    return fig
