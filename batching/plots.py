"""Every figure of chapter 7's notebooks, and the helpers that publish them.

One palette for the whole book: what a batch row does in a step (:data:`PHASE_COLORS`:
prefill, decode, padding, dead rows of a static batch, idle), which scheduler ran
(:data:`SCHEDULER_COLORS`) and which KV reservation policy (:data:`POLICY_COLORS`).
Figures are sized for the book's text column (:data:`WIDTH` inches) and saved as PNG and
SVG under ``_build/figures/`` by :func:`publish`, which also glues them for the page.

Plot functions take the tidy dicts of :mod:`batching.experiments`; they draw and return
the figure, they compute nothing beyond unit conversions.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from .experiments import KINDS, Segment

#: What a batch row does in a step. Colour-blind safe (Okabe-Ito), the same in every chapter.
PHASE_COLORS: dict[str, str] = {
    "prefill": "#0072B2",   # blue
    "decode": "#009E73",    # green
    "padding": "#E69F00",   # orange
    "dead": "#D55E00",      # vermilion: a finished row the dense batch still computes
    "idle": "#E6E6E6",      # light grey: nothing scheduled in the slot
}
PHASE_LABELS: dict[str, str] = {
    "prefill": "prefill", "decode": "decode", "padding": "padding",
    "dead": "dead row (finished, still computed)", "idle": "idle (free slot)",
}
SCHEDULER_COLORS: dict[str, str] = {
    "static": "#8C564B",      # brown
    "dynamic": "#CC79A7",     # pink
    "continuous": "#222222",  # near black
    "chunked": "#56B4E9",     # sky blue
}
POLICY_COLORS: dict[str, str] = {"slab": "#8C564B", "exact": "#0072B2"}
#: Book text column width (inches) and the resolution of saved PNGs.
WIDTH = 7.0
DPI = 150

FIGURE_DIR = Path("_build") / "figures"


def style() -> None:
    """Matplotlib defaults for the book: readable at column width, light grid, no top/right spines."""
    plt.rcParams.update({
        "figure.dpi": DPI, "savefig.dpi": DPI, "font.size": 9.5, "axes.titlesize": 10,
        "axes.labelsize": 9.5, "legend.fontsize": 8.5, "xtick.labelsize": 8.5, "ytick.labelsize": 8.5,
        "axes.spines.top": False, "axes.spines.right": False, "axes.grid": True,
        "grid.color": "#dddddd", "grid.linewidth": 0.6, "legend.frameon": False,
        "figure.constrained_layout.use": True, "svg.fonttype": "none",
    })


def figure_dir(smoke: bool = False) -> Path:
    """Where :func:`publish` writes: ``_build/figures`` (``_build/figures/smoke`` in smoke runs,
    so that the tests never overwrite the book's full-size figures)."""
    return FIGURE_DIR / "smoke" if smoke else FIGURE_DIR


def save(fig: Figure, name: str, directory: str | Path = FIGURE_DIR) -> list[Path]:
    """Write ``fig`` as ``<directory>/<name>.png`` and ``.svg``; returns the paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.png", d / f"{name}.svg"]
    fig.savefig(paths[0], dpi=DPI)
    fig.savefig(paths[1])
    return paths


def publish(fig: Figure, name: str, smoke: bool = False) -> None:
    """Save ``fig`` (PNG + SVG, see :func:`save`), glue it as ``fig-<name>`` for a
    ``{glue:figure}`` directive, and close it (so the notebook shows it only where glued)."""
    from myst_nb import glue

    save(fig, name, figure_dir(smoke))
    glue(f"fig-{name}", fig, display=False)
    plt.close(fig)


def plain(value: Any) -> Any:
    """A numpy scalar or 0-d array as the Python number it holds (glue needs a literal repr)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.ndim == 0:
        return value.item()
    return value


def glue_values(values: Mapping[str, Any]) -> None:
    """Glue each value (Python numbers and strings only) without displaying it; the prose
    quotes them with ``{glue:text}`key:format```."""
    from myst_nb import glue

    for key, v in values.items():
        v = plain(v)
        if not isinstance(v, (int, float, str)) or isinstance(v, bool):
            raise TypeError(f"glue value {key!r}={v!r}: must be an int, float or str")
        if isinstance(v, float) and not math.isfinite(v):
            raise ValueError(f"glue value {key!r} is {v}: the prose would show a non-number")
        glue(key, v, display=False)


def _legend_patches(kinds: Sequence[str]) -> list[Patch]:
    return [Patch(facecolor=PHASE_COLORS[k], edgecolor="none", label=PHASE_LABELS[k]) for k in kinds]


def _log_ticks(ax: Any, lo: float, hi: float, axis: str = "x") -> None:
    """Readable major ticks (1-2-5 per decade) on a log axis, and no minor tick labels."""
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0 ** e for e in range(-4, 7) for m in mantissas if lo <= m * 10.0 ** e <= hi]
        if len(ticks) <= 7:
            break
    ticks = ticks or [lo, hi]
    a = ax.xaxis if axis == "x" else ax.yaxis
    a.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    a.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    a.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _pct(ax: Any, axis: str = "y") -> None:
    fmt = matplotlib.ticker.PercentFormatter(1.0, decimals=0)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


# ------------------------------------------------------------------------------ 7.1
def padding_figure(pc: Mapping[str, float]) -> Figure:
    """7.1 (a): prefill tokens computed and roofline prefill time, padded vs not."""
    short, long = int(pc["short"]), int(pc["long"])
    labels = [f"{short}-token prompt\nalone", f"{short}-token prompt\npadded to {long:,}",
              f"batch of both,\nno padding", f"batch of both,\npadded (static)"]
    useful = np.array([short, short, short + long, short + long], dtype=float)
    padding = np.array([0, long - short, 0, long - short], dtype=float)
    times = np.array([pc["t_short"], pc["t_short_padded"], pc["t_batch_unpadded"], pc["t_batch_padded"]]) * 1e3
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.9), sharey=True)
    y = np.arange(len(labels))[::-1]
    ax = axes[0]
    ax.barh(y, useful, color=PHASE_COLORS["prefill"], label="prompt tokens")
    ax.barh(y, padding, left=useful, color=PHASE_COLORS["padding"], label="padding tokens")
    ax.set_yticks(y, labels)
    ax.set_xlabel("tokens computed in the prefill step")
    ax.legend(loc="upper right")
    ax.grid(axis="y", visible=False)
    ax = axes[1]
    ax.barh(y, times, color=["#7fb3d5", PHASE_COLORS["padding"], "#7fb3d5", PHASE_COLORS["padding"]])
    for yi, t in zip(y, times):
        ax.text(t, yi, f" {t:.1f} ms", va="center", fontsize=8.5)
    ax.set_xlabel("roofline prefill time (ms)")
    ax.set_xlim(0, times.max() * 1.3)
    ax.grid(axis="y", visible=False)
    return fig


def timeline_figure(panels: Sequence[tuple[str, Sequence[Segment]]], kinds: Sequence[str] = KINDS,
                    height_per_panel: float = 2.3, time_unit: str = "s",
                    marks: Sequence[Sequence[tuple[float, str]]] | None = None) -> Figure:
    """Per-slot timelines (7.1 (b), 7.2): one panel per (title, segments); rows are slots,
    time runs left to right, colour is what the row does (:data:`PHASE_COLORS`).
    ``marks[i]`` lists (time in s, label) pairs drawn as dotted lines on panel i."""
    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    fig, axes = plt.subplots(len(panels), 1, figsize=(WIDTH, height_per_panel * len(panels) + 0.5),
                             squeeze=False)
    used: set[str] = set()
    for pi, (ax, (title, segs)) in enumerate(zip(axes[:, 0], panels)):
        nslots = max(s.slot for s in segs) + 1
        for t, label in (marks[pi] if marks else ()):
            ax.axvline(t * scale, color="black", ls=":", lw=1, zorder=5)
            ax.annotate(label, (t * scale, 0.5), xycoords=("data", "axes fraction"), xytext=(4, 0),
                        textcoords="offset points", fontsize=8, zorder=6,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
        for kind in kinds:
            bars: dict[int, list[tuple[float, float]]] = {}
            for s in segs:
                if s.kind == kind and s.t1 > s.t0:
                    bars.setdefault(s.slot, []).append((s.t0 * scale, (s.t1 - s.t0) * scale))
            for slot, spans in bars.items():
                ax.broken_barh(spans, (slot - 0.45, 0.9), facecolors=PHASE_COLORS[kind], edgecolor="none")
            if bars:
                used.add(kind)
        t_end = max(s.t1 for s in segs) * scale
        ax.set_xlim(0, t_end)
        ax.set_ylim(nslots - 0.5, -0.5)
        ax.set_ylabel("slot")
        ax.set_title(title, loc="left")
        ax.grid(False)
        step = max(1, nslots // 4)
        ax.set_yticks(range(0, nslots, step))
    axes[-1, 0].set_xlabel(f"time ({time_unit})")
    fig.legend(handles=_legend_patches([k for k in kinds if k in used]), loc="outside lower center",
               ncol=len(used))
    return fig


def batch_sweep_figure(sweep: Mapping[str, np.ndarray]) -> Figure:
    """7.1 (c): slot utilization and padding fraction of static batching vs batch size."""
    b = sweep["batch"]
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    ax = axes[0]
    ax.plot(b, sweep["analytic"], "-", color="#999999", lw=2.5, label="analytic: Σ outputs / (B · Σ longest)")
    ax.plot(b, sweep["slot_util"], "o", color=SCHEDULER_COLORS["static"], label="simulated (per step)")
    ax.plot(b, sweep["slot_util_tw"], "s--", color=SCHEDULER_COLORS["static"], mfc="white", ms=4,
            label="simulated (time-weighted)")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("static batch size B")
    ax.set_ylabel("slot utilization")
    ax.set_ylim(0, 1.05)
    _pct(ax)
    ax.legend(loc="lower left")
    ax = axes[1]
    ax.plot(b, sweep["padding_fraction"], "o-", color=PHASE_COLORS["padding"], label="padding / prefill tokens")
    ax.plot(b, sweep["hw_compute"], "^-", color="#555555", label="hardware compute util. (all FLOPs)")
    ax.plot(b, sweep["useful_compute"], "v--", color="#555555", mfc="white",
            label="same, useful FLOPs only")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("static batch size B")
    ax.set_ylabel("fraction")
    ax.set_ylim(0, 1.05)
    _pct(ax)
    ax.legend(loc="upper left")
    return fig


def wait_figure(sweep: Mapping[str, Mapping[str, np.ndarray]], ceiling: float | None = None) -> Figure:
    """7.1 (d): mean queueing delay vs slot utilization as the collection timeout grows."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.0))
    for name, d in sweep.items():
        q = np.maximum(d["queue_mean"], 1e-3)
        ax.plot(q, d["slot_util"], "o-", color=SCHEDULER_COLORS[name],
                label=f"{name} ({'timeout' if name == 'static' else 'max_wait'} T, s)")
        last: tuple[float, float] | None = None
        for x, y, w in zip(q, d["slot_util"], d["wait"]):
            # Skip a label that would sit on the previous one (points bunch up at small T).
            if last is not None and abs(math.log10(x / last[0])) < 0.12 and abs(y - last[1]) < 0.03:
                continue
            last = (x, y)
            below = name == "static"
            ax.annotate(f"{w:g}", (x, y), textcoords="offset points", xytext=(4, -10) if below else (-4, 5),
                        ha="left" if below else "right", fontsize=7.5, color=SCHEDULER_COLORS[name])
    if ceiling is not None:
        ax.axhline(ceiling, color="#999999", ls="--", lw=1.2)
        ax.annotate("full batches of B (first-finisher ceiling)", (0.99, ceiling),
                    xycoords=("axes fraction", "data"), ha="right", va="bottom", fontsize=8, color="#666666")
    ax.set_xscale("log")
    ax.set_xlabel("mean queueing delay, arrival to admission (s, log scale)")
    ax.set_ylabel("slot utilization")
    ax.set_ylim(0, max(0.6, (ceiling or 0) * 1.25))
    _pct(ax)
    ax.legend(loc="upper left")
    return fig


# ------------------------------------------------------------------------------ 7.2
def rate_util_figure(sweep: Mapping[str, Mapping[str, np.ndarray]], trace_rate: float | None = None) -> Figure:
    """7.2: slot utilization, hardware compute and bandwidth utilization vs offered rate."""
    fig, axes = plt.subplots(1, 3, figsize=(WIDTH, 2.8), sharex=True)
    for name, d in sweep.items():
        c = SCHEDULER_COLORS[name.split()[0]] if name.split()[0] in SCHEDULER_COLORS else None
        x = d["offered_rate"]
        axes[0].plot(x, d["slot_util"], "o-", color=c, ms=3.5, label=name)
        axes[1].plot(x, d["hw_compute"], "o-", color=c, ms=3.5)
        axes[1].plot(x, d["useful_compute"], "o--", color=c, ms=3.5, mfc="white")
        axes[2].plot(x, d["hw_bandwidth"], "o-", color=c, ms=3.5)
    titles = ["slot utilization", "hardware compute utilization\n(solid: all FLOPs, dashed: useful)",
              "hardware bandwidth\nutilization"]
    xs = np.concatenate([d["offered_rate"] for d in sweep.values()])
    for ax, t in zip(axes, titles):
        ax.set_title(t, fontsize=9)
        ax.set_xscale("log")
        _log_ticks(ax, xs.min(), xs.max())
        ax.set_ylim(0, 1.02)
        _pct(ax)
        ax.set_xlabel("offered rate (req/s)")
        if trace_rate:
            ax.axvline(trace_rate, color="#999999", lw=1, ls=":")
    axes[0].legend(loc="upper left")
    return fig


def latency_throughput_figure(sweep: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """7.2: p50 and p99 end-to-end latency vs achieved output throughput, one point per rate."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.9), sharey=True)
    for name, d in sweep.items():
        c = SCHEDULER_COLORS.get(name.split()[0])
        for ax, key in zip(axes, ("e2e_p50", "e2e_p99")):
            ax.plot(d["throughput_tok"], d[key], "o-", color=c, ms=3.5, label=name)
    for ax, t in zip(axes, ("p50 end-to-end latency", "p99 end-to-end latency")):
        ax.set_yscale("log")
        ax.set_xlabel("achieved output throughput (tokens/s)")
        ax.set_title(t, fontsize=9)
    axes[0].set_ylabel("seconds (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=len(labels))
    return fig


def iterations_figure(its: Mapping[str, Mapping[str, np.ndarray]], probe: int) -> Figure:
    """7.2: iterations and time a ``probe``-token request lives through, per scheduler."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.9))
    for name, d in its.items():
        c = SCHEDULER_COLORS.get(name.split()[0])
        for ax, key in ((axes[0], "from_arrival"), (axes[1], "service")):
            x = np.sort(d[key])
            y = np.arange(1, len(x) + 1) / len(x)
            ax.step(x, y, where="post", color=c, label=name)
    axes[0].axvline(probe, color="#999999", ls="--", lw=1)
    axes[0].annotate(f"{probe} iterations", (probe, 0.55), xytext=(5, 0), textcoords="offset points",
                     fontsize=8, color="#666666", bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none"})
    axes[0].set_xscale("log")
    axes[0].set_xlim(left=probe / 2)
    axes[0].set_xlabel("engine iterations from arrival to last token (log)")
    axes[1].set_xscale("log")
    axes[1].set_xlabel("seconds from admission to last token (log)")
    for ax in axes:
        ax.set_ylabel("fraction of probes")
        ax.set_ylim(0, 1.02)
    axes[1].legend(loc="lower right")
    return fig


# ------------------------------------------------------------------------------ 7.3
def _config_style(name: str) -> dict[str, Any]:
    """Line style of a 7.3 configuration from its label."""
    if "chunk" in name and "no chunk" not in name:
        return {"color": SCHEDULER_COLORS["chunked"], "ls": "-"}
    if "separate" in name:
        return {"color": "#888888", "ls": "--"}
    return {"color": SCHEDULER_COLORS["continuous"], "ls": "-"}


def itl_figure(series: Mapping[str, Mapping[str, np.ndarray]], arrival: float,
               first_tokens: Mapping[str, float] | None = None, window: tuple[float, float] | None = None) -> Figure:
    """7.3: the inter-token latency the running requests see, per configuration; triangles
    on the time axis mark the newcomer's first token."""
    fig, ax = plt.subplots(figsize=(WIDTH, 2.9))
    for name, d in series.items():
        t, g = d["t"], d["itl"] * 1e3
        # Every running request sees the same step: draw one line of the step-by-step ITL.
        u, idx = np.unique(t, return_index=True)
        ax.step(u, g[idx], where="pre", lw=1.5, label=name, **_config_style(name))
    ax.axvline(arrival, color="#999999", ls=":", lw=1)
    ax.annotate("long prompt arrives", (arrival, 0.93), xycoords=("data", "axes fraction"), xytext=(-4, 0),
                textcoords="offset points", ha="right", fontsize=8, color="#666666")
    if first_tokens:
        for name, tf in first_tokens.items():
            ax.plot([tf], [0], marker="v", ms=8, clip_on=False, zorder=6, color=_config_style(name)["color"],
                    mec="white")
    if window:
        ax.set_xlim(*window)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("inter-token latency of\nthe running requests (ms)")
    ax.set_ylim(bottom=0)
    ax.legend(loc="upper right")
    return fig


def chunk_roofline_figure(chunks: np.ndarray, step_s: np.ndarray, decode_s: float, bstar: float) -> Figure:
    """7.3: roofline time of one step (running decodes + one prefill chunk) vs chunk size,
    and the prefill throughput that chunk size gets."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.7))
    ax = axes[0]
    ax.plot(chunks, step_s * 1e3, "o-", color=SCHEDULER_COLORS["chunked"], ms=3.5)
    ax.axhline(decode_s * 1e3, color=PHASE_COLORS["decode"], ls="--", lw=1)
    ax.annotate("decode-only step", (1.0, decode_s * 1e3), xycoords=("axes fraction", "data"), xytext=(0, 3),
                textcoords="offset points", ha="right", va="bottom", fontsize=8, color=PHASE_COLORS["decode"])
    ax.set_yscale("log")
    _log_ticks(ax, float(min(step_s.min(), decode_s)) * 1e3 * 0.9, float(step_s.max()) * 1e3 * 1.1, axis="y")
    ax.set_ylabel("step time = decodes' ITL (ms)")
    ax = axes[1]
    ax.plot(chunks, chunks / step_s / 1e3, "o-", color=PHASE_COLORS["prefill"], ms=3.5)
    ax.set_ylabel("prefill throughput (k tokens/s)")
    for a in axes:
        a.set_xscale("log", base=2)
        a.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(list(chunks)))
        a.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        a.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        a.tick_params(axis="x", labelrotation=45)
        a.set_xlabel("prefill chunk (tokens)")
        a.axvline(bstar, color="#999999", ls=":", lw=1)
        a.annotate("B*", (bstar, 0.02), xycoords=("data", "axes fraction"), xytext=(3, 0),
                   textcoords="offset points", fontsize=8, color="#666666")
    return fig


def chunk_tradeoff_figure(sweeps: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """7.3: TTFT p99 vs ITL p99 as the chunk size varies, one curve per load; the hollow
    marker is continuous batching without chunks."""
    fig, ax = plt.subplots(figsize=(WIDTH, 3.2))
    cmap = plt.get_cmap("Blues")
    n = len(sweeps)
    for i, (label, d) in enumerate(sweeps.items()):
        c = cmap(0.45 + 0.55 * (i + 1) / n)
        ax.plot(d["itl_p99"] * 1e3, d["ttft_p99"], "o-", color=c, label=f"chunked, {label}")
        for x, y, ch in zip(d["itl_p99"] * 1e3, d["ttft_p99"], d["chunk"]):
            ax.annotate(f"{int(ch)}", (x, y), textcoords="offset points", xytext=(3, 4), fontsize=7.5, color=c)
        ax.plot(d["continuous_itl_p99"] * 1e3, d["continuous_ttft_p99"], "D", mfc="white", color=c, ms=6,
                label=f"no chunking, {label}")
    ax.set_xscale("log")
    ax.set_yscale("log")
    xs = np.concatenate([np.r_[d["itl_p99"], d["continuous_itl_p99"]] for d in sweeps.values()]) * 1e3
    ys = np.concatenate([np.r_[d["ttft_p99"], d["continuous_ttft_p99"]] for d in sweeps.values()])
    _log_ticks(ax, xs.min() * 0.8, xs.max() * 1.25)
    _log_ticks(ax, ys.min() * 0.8, ys.max() * 1.25, axis="y")
    ax.set_xlabel("p99 inter-token latency (ms, log)")
    ax.set_ylabel("p99 time to first token (s, log)")
    ax.legend(loc="upper right", ncol=2, fontsize=7.5)
    return fig


# ------------------------------------------------------------------------------- KV
def kv_time_figure(series: Mapping[str, Mapping[str, np.ndarray]], capacity: float) -> Figure:
    """What chapter 7 sets up: KV tokens reserved (solid) and written (dotted) over a run,
    and running requests, per policy."""
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 4.2), sharex=True, height_ratios=(3, 2))
    for pol, d in series.items():
        c = POLICY_COLORS[pol]
        axes[0].step(d["t"], d["reserved"] / 1e3, where="pre", color=c, lw=1.3, label=f"{pol}: reserved")
        axes[0].step(d["t"], d["used"] / 1e3, where="pre", color=c, lw=1.0, ls=":", label=f"{pol}: written")
        axes[1].step(d["t"], d["running"], where="pre", color=c, lw=1.2, label=pol)
    axes[0].axhline(capacity / 1e3, color="#999999", ls="--", lw=1)
    axes[0].annotate("KV capacity", (0.0, capacity / 1e3), xycoords=("axes fraction", "data"), xytext=(2, 2),
                     textcoords="offset points", va="bottom", fontsize=8, color="#666666")
    axes[0].set_ylim(0, capacity / 1e3 * 1.4)
    axes[0].set_ylabel("KV cache (k tokens)")
    axes[0].legend(loc="upper right", ncol=4, fontsize=7.5)
    axes[1].set_ylabel("running requests")
    axes[1].set_xlabel("time (s)")
    axes[1].legend(loc="upper right", ncol=2)
    return fig


def kv_fit_figure(lengths: np.ndarray, fit: Mapping[str, float], measured_peak: Mapping[str, float]) -> Figure:
    """What chapter 7 sets up: request lengths against the slab, and sequences that fit."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    ax = axes[0]
    ax.hist(lengths, bins=60, color="#7f7f7f")
    ax.set_xlim(0, fit["max_context"] * 1.05)
    ax.axvline(fit["max_context"], color=POLICY_COLORS["slab"], lw=2)
    ax.text(fit["max_context"], ax.get_ylim()[1] * 0.9, " slab", color=POLICY_COLORS["slab"], fontsize=8.5,
            ha="right")
    ax.axvline(fit["mean_final"], color=POLICY_COLORS["exact"], lw=1.5, ls="--")
    ax.text(fit["mean_final"], ax.get_ylim()[1] * 0.75, " mean", color=POLICY_COLORS["exact"], fontsize=8.5)
    ax.set_xlabel("request length, prompt + output (tokens)")
    ax.set_ylabel("requests")
    ax = axes[1]
    names = ["slab\n(capacity / context)", "exact, final\nlengths", "exact, mean\nover life"]
    vals = [fit["slab"], fit["exact_final"], fit["exact_avg"]]
    cols = [POLICY_COLORS["slab"], POLICY_COLORS["exact"], POLICY_COLORS["exact"]]
    ax.bar(range(3), vals, color=cols, alpha=0.85)
    for i, v in enumerate(vals):
        ax.text(i, v, f"{v:,.0f}", ha="center", va="bottom", fontsize=8.5)
    for pol, v in measured_peak.items():
        i = 0 if pol == "slab" else 1
        ax.plot([i - 0.4, i + 0.4], [v, v], color="black", lw=1.5)
        ax.text(i + 0.42, v, f"run peak {v:.0f}", va="center", fontsize=7.5)
    ax.set_xticks(range(3), names)
    ax.set_ylabel("sequences that fit")
    ax.grid(axis="x", visible=False)
    return fig


def kv_budget_figure(sweep: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """What chapter 7 sets up: throughput and preemptions vs KV budget, per policy."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.8))
    for pol, d in sweep.items():
        c = POLICY_COLORS[pol]
        axes[0].plot(d["budget"] / 1e3, d["throughput_tok"], "o-", color=c, label=pol)
        axes[1].plot(d["budget"] / 1e3, d["running_peak"], "o-", color=c, label=f"{pol}: peak running")
        if d["preemptions"].max() > 0:
            for x, y, p in zip(d["budget"] / 1e3, d["throughput_tok"], d["preemptions"]):
                axes[0].annotate(f"{int(p)}", (x, y), textcoords="offset points", xytext=(3, -11),
                                 fontsize=7.5, color=c)
    axes[0].set_xlabel("KV budget (k tokens)")
    axes[0].set_ylabel("output throughput (tokens/s)")
    axes[0].set_ylim(bottom=0)
    axes[0].legend(loc="lower right", title="numbers: preemptions", title_fontsize=7.5)
    axes[1].set_xlabel("KV budget (k tokens)")
    axes[1].set_ylabel("peak running requests")
    axes[1].set_ylim(bottom=0)
    axes[1].legend(loc="upper left")
    return fig


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> str:
    """A plain-text table for notebook output (the real-engine cross-check)."""
    cells = [[str(h) for h in header]] + [[str(c) for c in r] for r in rows]
    w = [max(len(r[i]) for r in cells) for i in range(len(header))]
    line = lambda r: "  ".join(c.rjust(w[i]) for i, c in enumerate(r))  # noqa: E731
    return "\n".join([line(cells[0]), "  ".join("-" * x for x in w), *map(line, cells[1:])])
