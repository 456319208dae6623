"""Figures of the KV page: KV in use over time, what fits, and the budget sweep."""

from __future__ import annotations

from collections.abc import Mapping

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from ..plots import POLICY_COLORS, WIDTH, note


def kv_time_figure(series: Mapping[str, Mapping[str, np.ndarray]], capacity: float) -> Figure:
    """The KV page: KV tokens reserved (line) and written (shaded) over a run, one panel per
    policy on one scale (under ``exact`` the two coincide, so a shared panel hid one series
    behind another), and running requests below."""
    pols = list(series)
    fig, axes = plt.subplots(len(pols) + 1, 1, figsize=(WIDTH, 5.2), sharex=True)
    top = capacity / 1e3 * 1.45  # room above the capacity line for the legend
    for ax, pol in zip(axes, pols, strict=False):
        d, c = series[pol], POLICY_COLORS[pol]
        ax.step(d["t"], d["reserved"] / 1e3, where="pre", color=c, lw=1.3, zorder=3, label=f"{pol}: reserved")
        ax.fill_between(
            d["t"], d["used"] / 1e3, step="pre", color=c, alpha=0.4, lw=0, zorder=2, label=f"{pol}: written"
        )
        ax.axhline(capacity / 1e3, color="#999999", ls="--", lw=1)
        note(ax, "KV capacity", (0.0, capacity / 1e3), (2, 2), "y", va="bottom", fontsize=8, color="#666666")
        ax.set_ylim(0, top)
        ax.set_ylabel("KV (k tokens)")
        ax.legend(loc="upper right", ncol=2, fontsize=7.5)
    for pol in pols:
        axes[-1].step(
            series[pol]["t"], series[pol]["running"], where="pre", color=POLICY_COLORS[pol], lw=1.2, label=pol
        )
    axes[-1].set_ylabel("running requests")
    axes[-1].set_xlabel("time (s)")
    axes[-1].legend(loc="upper right", ncol=2)
    return fig


def kv_fit_figure(lengths: np.ndarray, fit: Mapping[str, float], bstar: float) -> Figure:
    """The KV page: request lengths against the slab, and sequences that fit beside B*."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    ax = axes[0]
    counts, _, _ = ax.hist(lengths, bins=60, color="#7f7f7f")
    ax.set_xlim(0, fit["max_context"] * 1.05)
    # Headroom above the tallest bar for the two labels, so that neither sits on a bar.
    top = float(np.max(counts)) if len(counts) else 1.0
    ax.set_ylim(0, top * 1.25)
    ax.axvline(fit["max_context"], color=POLICY_COLORS["slab"], lw=2)
    ax.text(
        fit["max_context"],
        top * 1.12,
        "slab ",
        color=POLICY_COLORS["slab"],
        fontsize=8.5,
        ha="right",
        va="center",
    )
    ax.axvline(fit["mean_final"], color=POLICY_COLORS["exact"], lw=1.5, ls="--")
    ax.text(fit["mean_final"], top * 1.12, " mean", color=POLICY_COLORS["exact"], fontsize=8.5, va="center")
    ax.set_xlabel("request length, prompt + output (tokens)")
    ax.set_ylabel("requests")
    ax = axes[1]
    names = ["slab\n(capacity / context)", "exact, final\nlengths", "exact, mean\nover life"]
    vals = [fit["slab"], fit["exact_final"], fit["exact_avg"]]
    cols = [POLICY_COLORS["slab"], POLICY_COLORS["exact"], POLICY_COLORS["exact"]]
    ax.bar(range(3), vals, color=cols, alpha=0.85)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8.5)
    ax.axhline(bstar, color="#444444", ls="--", lw=1)
    ax.text(-0.45, bstar, f"B* = {bstar:.0f}", va="bottom", fontsize=8, color="#444444")
    ax.set_ylim(0, max(max(vals), bstar) * 1.15)
    ax.set_xticks(range(3), names)
    ax.set_ylabel("sequences that fit")
    ax.grid(axis="x", visible=False)
    return fig


def kv_budget_figure(sweep: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """The KV page: throughput (preemptions beside its points) and peak running requests vs
    KV budget, per policy of continuous batching, and static batching under the same budget
    (series ``static``)."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    for pol, d in sweep.items():
        # Static's usual brown is the slab policy's here: grey, dashed, keeps the two apart.
        c = "#7f7f7f" if pol == "static" else POLICY_COLORS[pol]
        label = "static (B = budget / slab)" if pol == "static" else f"continuous, {pol}"
        style = "s--" if pol == "static" else "o-"
        axes[0].plot(d["budget"] / 1e3, d["throughput_tok"], style, color=c, label=label)
        axes[1].plot(d["budget"] / 1e3, d["running_peak"], style, color=c, label=label)
        if d["preemptions"].max() > 0:
            for x, y, p in zip(d["budget"] / 1e3, d["throughput_tok"], d["preemptions"]):
                note(axes[0], f"{int(p)}", (x, y), (3, -11), fontsize=7.5, color=c)
    axes[0].set_ylabel("output throughput (tokens/s)")
    axes[1].set_ylabel("peak running requests")
    for ax in axes:
        ax.set_xlabel("KV budget (k tokens)")
        ax.set_ylim(bottom=0)
    # Above the panels: inside, any corner of the left panel holds one of the curves.
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles,
        labels,
        loc="outside upper center",
        ncol=3,
        fontsize=7.5,
        frameon=False,
        title="numbers beside points: preemptions",
        title_fontsize=7.5,
    )
    return fig
