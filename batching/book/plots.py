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

import html
import math
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch

from .common import KINDS
from .static import Segment

#: What a batch row does in a step. Colour-blind safe (Okabe-Ito), the same in every chapter.
PHASE_COLORS: dict[str, str] = {
    "prefill": "#0072B2",  # blue
    "decode": "#009E73",  # green
    "padding": "#E69F00",  # orange
    "dead": "#D55E00",  # vermilion: a finished row the dense batch still computes
    "idle": "#E6E6E6",  # light grey: nothing scheduled in the slot
}
PHASE_LABELS: dict[str, str] = {
    "prefill": "prefill",
    "decode": "decode",
    "padding": "padding",
    "dead": "dead row (finished, still computed)",
    "idle": "idle (free slot)",
}
SCHEDULER_COLORS: dict[str, str] = {
    "static": "#8C564B",  # brown
    "dynamic": "#CC79A7",  # pink
    "continuous": "#222222",  # near black
    "chunked": "#56B4E9",  # sky blue
}
POLICY_COLORS: dict[str, str] = {"slab": "#8C564B", "exact": "#0072B2"}
#: One (colour, marker) per load of a sweep (7.3's trade-off): distinct hues, not shades.
LOAD_STYLES: tuple[tuple[str, str], ...] = (
    ("#56B4E9", "o"),
    ("#E69F00", "s"),
    ("#0072B2", "^"),
    ("#CC79A7", "v"),
)
#: Book text column width (inches) and the resolution of saved PNGs.
WIDTH = 7.0
DPI = 150

FIGURE_DIR = Path("_build") / "figures"


def style() -> None:
    """Matplotlib defaults for the book: readable at column width, light grid, no top/right spines."""
    plt.rcParams.update(
        {
            "figure.dpi": DPI,
            "savefig.dpi": DPI,
            "font.size": 9.5,
            "axes.titlesize": 10,
            "axes.labelsize": 9.5,
            "legend.fontsize": 8.5,
            "xtick.labelsize": 8.5,
            "ytick.labelsize": 8.5,
            "axes.spines.top": False,
            "axes.spines.right": False,
            "axes.grid": True,
            "grid.color": "#dddddd",
            "grid.linewidth": 0.6,
            "legend.frameon": False,
            "figure.constrained_layout.use": True,
            "svg.fonttype": "none",
        }
    )


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


def _log_y(ax: Any, series: list, headroom: float) -> None:
    """Log y axis spanning every series, with room above the highest for labels."""
    lo = min(float(np.min(v)) for v in series) * 0.8
    hi = max(float(np.max(v)) for v in series) * headroom
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    _log_ticks(ax, lo, hi, axis="y")


def _log_ticks(ax: Any, lo: float, hi: float, axis: str = "x") -> None:
    """Readable major ticks (1-2-5 per decade) on a log axis, and no minor tick labels."""
    for mantissas in ((1, 2, 5), (1, 3), (1,)):
        ticks = [m * 10.0**e for e in range(-4, 7) for m in mantissas if lo <= m * 10.0**e <= hi]
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
    kinds: Sequence[str] = KINDS,
    height_per_panel: float = 2.3,
    time_unit: str = "s",
    marks: Sequence[Sequence[tuple[float, str]]] | None = None,
    sharex: bool = False,
) -> Figure:
    """Per-slot timelines (7.1 (b), 7.2): one panel per (title, segments); rows are slots,
    time runs left to right, colour is what the row does (:data:`PHASE_COLORS`).
    ``marks[i]`` lists (time in s, label) pairs drawn as dotted lines on panel i.
    ``sharex``: every panel spans the longest one's time, so panels compare by eye (7.2)."""
    scale = {"s": 1.0, "ms": 1e3}[time_unit]
    fig, axes = plt.subplots(
        len(panels), 1, figsize=(WIDTH, height_per_panel * len(panels) + 0.5), squeeze=False
    )
    used: set[str] = set()
    for pi, (ax, (title, segs)) in enumerate(zip(axes[:, 0], panels)):
        nslots = max(s.slot for s in segs) + 1
        for t, label in marks[pi] if marks else ():
            ax.axvline(t * scale, color="black", ls=":", lw=1, zorder=5)
            ax.annotate(
                label,
                (t * scale, 0.5),
                xycoords=("data", "axes fraction"),
                xytext=(4, 0),
                textcoords="offset points",
                fontsize=8,
                zorder=6,
                bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85},
            )
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
        if sharex:
            t_end = max(max(s.t1 for s in sg) for _, sg in panels) * scale
        ax.set_xlim(0, t_end)
        ax.set_ylim(nslots - 0.5, -0.5)
        ax.set_ylabel("slot")
        ax.set_title(title, loc="left")
        ax.grid(False)
        step = max(1, nslots // 4)
        ax.set_yticks(range(0, nslots, step))
    axes[-1, 0].set_xlabel(f"time ({time_unit})")
    fig.legend(
        handles=_legend_patches([k for k in kinds if k in used]), loc="outside lower center", ncol=len(used)
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
    ax.set_xscale("log", base=2)
    ax.set_xticks(b, [f"{x:g}" for x in b])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("static batch size B")
    ax.set_ylabel("slot utilization")
    ax.set_ylim(0, 1.05)
    _pct(ax)
    ax.legend(loc="lower left")
    ax = axes[1]
    ax.plot(b, sweep["padding_fraction"], "o-", color=PHASE_COLORS["padding"])
    ax.set_xscale("log", base=2)
    ax.set_xticks(b, [f"{x:g}" for x in b])
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.set_xlabel("static batch size B")
    ax.set_ylabel("padding / prefill positions")
    ax.set_ylim(0, 1.05)
    _pct(ax)
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
                ax.annotate(
                    text,
                    (x, y),
                    textcoords="offset points",
                    xytext=off,
                    ha=ha,
                    va=va,
                    fontsize=7.5,
                    color=SCHEDULER_COLORS[name],
                )
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
    _pct(ax)
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


# ------------------------------------------------------------------------------ 7.2
def _config_color(name: str) -> str:
    """A 7.2 configuration's colour from the scheduler its label starts with."""
    return SCHEDULER_COLORS.get(name.split()[0].rstrip(","), "#999999")


def utilization_load_figure(
    sweep: Mapping[str, Mapping[str, np.ndarray]], trace_rate: float | None = None
) -> Figure:
    """7.2 (70B): slot utilization (left) and all-FLOP hardware compute utilization (right)
    against offered rate, one line per configuration of a :func:`~batching.book.continuous.rate_sweep`;
    filled markers where the run is stable, hollow where its queue grows over the replay."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.0), sharex=True)
    for name, d in sweep.items():
        c = _config_color(name)
        x = np.asarray(d["offered_rate"], dtype=float)
        ok = np.asarray(d["stable"], dtype=bool)
        for ax, key in zip(axes, ("slot_util", "hw_compute")):
            y = np.asarray(d[key], dtype=float)
            ls = "--" if "32" in name else "-"
            ax.plot(x, y, ls, color=c, lw=1.2, label=name)
            ax.plot(x[ok], y[ok], "o", color=c, ms=4)
            ax.plot(x[~ok], y[~ok], "o", color=c, ms=4, mfc="white")
    xs = np.concatenate([np.asarray(d["offered_rate"], dtype=float) for d in sweep.values()])
    for ax, t in zip(axes, ("slot utilization", "hardware compute utilization (all FLOPs)")):
        ax.set_title(t, fontsize=9)
        ax.set_xscale("log")
        _log_ticks(ax, xs.min(), xs.max())
        ax.set_ylim(0, 1.02)
        _pct(ax)
        ax.set_xlabel("offered rate (req/s)")
        if trace_rate:
            ax.axvline(trace_rate, color="#999999", lw=1, ls=":")
    marks = [
        Line2D([], [], marker="o", color="#666666", ls="none", label="stable"),
        Line2D([], [], marker="o", color="#666666", mfc="white", ls="none", label="queue grows"),
    ]
    handles, names = axes[0].get_legend_handles_labels()
    fig.legend(
        handles + marks, names + ["stable", "queue grows"], loc="outside lower center", ncol=3, fontsize=8
    )
    return fig


def real_schedulers_figure(rs: Mapping[str, Any]) -> Figure:
    """7.2, measured: slot utilization, p99 end-to-end latency and output tokens/s of each
    scheduler of :func:`~batching.book.checks.real_schedulers` on the real engine (solid bars);
    where a profile of this machine exists, the simulator's prediction beside them (hatched)."""
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
            ax.bar(x, rs["real"][n][key], width=w, color=c, label="measured" if i == 0 else None)
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
            _pct(ax)
    if sim:
        axes[0].legend(loc="upper left", fontsize=8)
    return fig


def _drop_overlapping(
    fig: Figure,
    texts: Sequence[Any],
    pad: float = 2.0,
    avoid: Sequence[tuple[Any, Any, Any]] = (),
    marker_px: float = 4.0,
) -> None:
    """Remove every text whose box (grown by ``pad`` pixels) overlaps one kept before it, a
    marker of ``avoid`` ((axes, xs, ys) in data coordinates, each point ``marker_px`` pixels
    either side), or leaves its axes: point labels stay readable however the curves fall.
    Earlier texts win, so list the most important first."""
    from matplotlib.transforms import Bbox

    fig.canvas.draw()  # lays the figure out, so the boxes are where they will be saved
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # Agg and every raster canvas have it
    kept: list[Any] = []
    for ax, xs, ys in avoid:
        for px, py in ax.transData.transform(np.column_stack([np.asarray(xs, float), np.asarray(ys, float)])):
            kept.append(Bbox([[px - marker_px, py - marker_px], [px + marker_px, py + marker_px]]))
    for t in texts:
        raw = t.get_window_extent(renderer)
        box = raw.padded(pad)
        inside = (
            t.axes is None or t.axes.bbox.contains(raw.x0, raw.y0) and t.axes.bbox.contains(raw.x1, raw.y1)
        )
        if not inside or any(box.overlaps(k) for k in kept):
            t.remove()
        else:
            kept.append(box)


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
    axes[0].annotate(
        f"{probe} iterations",
        (probe, 0.55),
        xytext=(5, 0),
        textcoords="offset points",
        fontsize=8,
        color="#666666",
        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none"},
    )
    axes[0].set_xscale("log")
    axes[0].set_xlim(left=probe / 2)
    axes[0].set_xlabel("engine iterations from arrival to last token (log)")
    axes[1].set_xscale("log")
    service = np.concatenate([np.asarray(d["service"], dtype=float) for d in its.values()])
    _log_ticks(axes[1], float(service.min()), float(service.max()))
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


def itl_figure(
    series: Mapping[str, Mapping[str, np.ndarray]],
    arrival: float,
    first_tokens: Mapping[str, float] | None = None,
    window: tuple[float, float] | None = None,
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
    note = ax.annotate(
        "long prompt arrives",
        (arrival, 0.93),
        xycoords=("data", "axes fraction"),
        xytext=(-4, 0),
        textcoords="offset points",
        ha="right",
        fontsize=8,
        color="#666666",
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
    ax.set_xlabel("time (s)")
    ax.set_ylabel("inter-token latency of\nthe running requests (ms)")
    # Headroom above the tallest stall for the legend, which would otherwise sit on it.
    ax.set_ylim(0, top * 1.45 if top > 0 else None)
    ax.legend(loc="upper right")
    # Left of the arrival line unless that runs out of the axes (an arrival near the window's
    # left edge, as in the measured run): then it would sit on the y tick labels, so right of it.
    fig.canvas.draw()
    if note.get_window_extent().x0 < ax.get_window_extent().x0:
        note.xyann = (4, 0)
        note.set_horizontalalignment("left")
    return fig


def chunk_roofline_figure(chunks: np.ndarray, step_s: np.ndarray, decode_s: float, bstar: float) -> Figure:
    """7.3: roofline time of one step (running decodes + one prefill chunk) vs chunk size,
    and the prefill throughput that chunk size gets."""
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 2.7))
    ax = axes[0]
    ax.plot(chunks, step_s * 1e3, "o-", color=SCHEDULER_COLORS["chunked"], ms=3.5)
    ax.axhline(decode_s * 1e3, color=PHASE_COLORS["decode"], ls="--", lw=1)
    ax.annotate(
        "decode-only step",
        (1.0, decode_s * 1e3),
        xycoords=("axes fraction", "data"),
        xytext=(0, 3),
        textcoords="offset points",
        ha="right",
        va="bottom",
        fontsize=8,
        color=PHASE_COLORS["decode"],
    )
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
        # At the top: the decode-only step's line runs along the bottom of the left panel.
        a.annotate(
            "B*",
            (bstar, 0.9),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
            color="#666666",
        )
    return fig


def chunk_profile_figure(curves: Sequence[Mapping[str, Any]]) -> Figure:
    """7.3, measured: for each :func:`batching.experiments.profile_chunk_steps` curve, the step
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
        axes[1].annotate(
            "B*",
            (c["bstar"], 0.9),
            xycoords=("data", "axes fraction"),
            xytext=(3, 0),
            textcoords="offset points",
            fontsize=8,
            color=col,
        )
    if not curves:
        axes[0].text(
            0.5, 0.5, "no measured mixed steps", ha="center", va="center", transform=axes[0].transAxes
        )
    axes[0].set_yscale("log")
    if curves:  # 1x, 2x, 5x... : a multiplier reads better than 10^0, 10^1
        over = np.concatenate([np.asarray(c["over_decode"], dtype=float) for c in curves])
        _log_ticks(axes[0], min(1.0, over.min()) * 0.9, over.max() * 1.1, axis="y")
        axes[0].yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}x"))
    axes[0].set_ylabel("step / decode-only step (log)")
    axes[0].axhline(1.0, color="#bbbbbb", lw=0.8, zorder=1)
    axes[1].set_ylabel("prefill throughput\n(% of best measured)")
    axes[1].set_ylim(0, 105)
    for a in axes:
        a.set_xscale("log", base=2)
        if ticks:
            a.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(sorted(ticks)))
        a.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
        a.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        a.tick_params(axis="x", labelrotation=45)
        a.set_xlabel("prefill chunk (tokens)")
    if curves:
        axes[0].legend(loc="upper left", fontsize=7)
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
    _log_ticks(ax, xs.min() * 0.8, xs.max() * 1.25)
    _log_ticks(ax, ys.min() * 0.8, ys.max() * 1.25, axis="y")
    ax.set_ylim(ys.min() * 0.6, ys.max() * 1.6)  # room for the labels under the lowest curve
    ax.set_xlabel("p99 inter-token latency (ms, log)")
    ax.set_ylabel("p99 time to first token (s, log)")
    ax.legend(loc="upper right", ncol=max(1, len(sweeps)), fontsize=7.5)  # one column per load
    _drop_overlapping(fig, labels, avoid=points)
    return fig


# ------------------------------------------------------------------------------- KV
def kv_time_figure(series: Mapping[str, Mapping[str, np.ndarray]], capacity: float) -> Figure:
    """The KV page: KV tokens reserved (solid) and written (dotted) over a run,
    and running requests, per policy."""
    fig, axes = plt.subplots(2, 1, figsize=(WIDTH, 4.2), sharex=True, height_ratios=(3, 2))
    for pol, d in series.items():
        c = POLICY_COLORS[pol]
        axes[0].step(d["t"], d["reserved"] / 1e3, where="pre", color=c, lw=1.3, label=f"{pol}: reserved")
        axes[0].step(d["t"], d["used"] / 1e3, where="pre", color=c, lw=1.0, ls=":", label=f"{pol}: written")
        axes[1].step(d["t"], d["running"], where="pre", color=c, lw=1.2, label=pol)
    axes[0].axhline(capacity / 1e3, color="#999999", ls="--", lw=1)
    axes[0].annotate(
        "KV capacity",
        (0.0, capacity / 1e3),
        xycoords=("axes fraction", "data"),
        xytext=(2, 2),
        textcoords="offset points",
        va="bottom",
        fontsize=8,
        color="#666666",
    )
    axes[0].set_ylim(0, capacity / 1e3 * 1.4)
    axes[0].set_ylabel("KV cache (k tokens)")
    axes[0].legend(loc="upper right", ncol=4, fontsize=7.5)
    axes[1].set_ylabel("running requests")
    axes[1].set_xlabel("time (s)")
    axes[1].legend(loc="upper right", ncol=2)
    return fig


def kv_fit_figure(
    lengths: np.ndarray,
    fit: Mapping[str, float],
    measured_peak: Mapping[str, float] | None = None,
    bstar: float | None = None,
) -> Figure:
    """The KV page: request lengths against the slab, and sequences that fit (with ``bstar``:
    a line at the batch where decode turns compute-bound; with ``measured_peak``: black bars
    at the most requests a run held at once, per policy)."""
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
    for pol, v in (measured_peak or {}).items():
        i = 0 if pol == "slab" else 1
        ax.plot([i - 0.4, i + 0.4], [v, v], color="black", lw=1.5)
        ax.text(i + 0.42, v, f"peak {v:.0f}", va="center", fontsize=7.5)
    if bstar is not None:
        ax.axhline(bstar, color="#444444", ls="--", lw=1)
        ax.text(-0.45, bstar, f"B* = {bstar:.0f}", va="bottom", fontsize=8, color="#444444")
        ax.set_ylim(0, max(max(vals), bstar) * 1.15)
    ax.set_xticks(range(3), names)
    ax.set_ylabel("sequences that fit")
    ax.grid(axis="x", visible=False)
    return fig


def kv_budget_figure(sweep: Mapping[str, Mapping[str, np.ndarray]]) -> Figure:
    """The KV page: throughput and preemptions vs KV budget, per policy of
    continuous batching, and static batching under the same budget (series ``static``)."""
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
                axes[0].annotate(
                    f"{int(p)}", (x, y), textcoords="offset points", xytext=(3, -11), fontsize=7.5, color=c
                )
    axes[0].set_xlabel("KV budget (k tokens)")
    axes[0].set_ylabel("output throughput (tokens/s)")
    axes[0].set_ylim(bottom=0)
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
    axes[1].set_xlabel("KV budget (k tokens)")
    axes[1].set_ylabel("peak running requests")
    axes[1].set_ylim(bottom=0)
    return fig


class Table:
    """A table for a page: rendered as an HTML table in the book (``_repr_html_``, numbers
    right-aligned by ``_static/book.css``) and as aligned plain text by ``str()``."""

    def __init__(self, rows: Sequence[Sequence[Any]], header: Sequence[str]) -> None:
        self.header = [str(h) for h in header]
        self.rows = [[c for c in r] for r in rows]
        for r in self.rows:
            if len(r) != len(self.header):
                raise ValueError(f"table row {r!r}: {len(r)} cells for {len(self.header)} columns")

    def __str__(self) -> str:
        cells = [self.header] + [[str(c) for c in r] for r in self.rows]
        w = [max(len(r[i]) for r in cells) for i in range(len(self.header))]
        line = lambda r: "  ".join(c.rjust(w[i]) for i, c in enumerate(r))
        return "\n".join([line(cells[0]), "  ".join("-" * x for x in w), *map(line, cells[1:])])

    def _repr_html_(self) -> str:
        def cell(tag: str, c: Any) -> str:
            num = isinstance(c, (int, float, np.number)) or bool(
                re.fullmatch(r"[-+]?[\d.,]+\s*[%x]?", str(c))
            )
            cls = ' class="num"' if num else ""
            return f"<{tag}{cls}>{html.escape(str(c))}</{tag}>"

        head = "".join(cell("th", h) for h in self.header)
        body = "".join("<tr>" + "".join(cell("td", c) for c in r) + "</tr>" for r in self.rows)
        return f'<table class="book-table"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>'


def table(rows: Sequence[Sequence[Any]], header: Sequence[str]) -> Table:
    """A table for notebook output: an HTML table on the page, aligned text when printed."""
    return Table(rows, header)


# ------------------------------------------------------------------ why batching
#: "Why batching": the two measured decode paths (a uniform batch in contiguous slots; a
#: live batch with mixed contexts whose slabs are gathered) and the roofline's lines.
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


SOURCE_COLORS: tuple[str, ...] = ("#8C564B", "#CC79A7", "#0072B2", "#E69F00", "#56B4E9", "#000000")


def _pow2_axis(ax: Any, lo: float, hi: float) -> None:
    """Log-2 batch axis with plain labels at the powers of two (every other one if crowded)."""
    ax.set_xscale("log", base=2)
    ticks = [2.0**i for i in range(0, 14) if lo <= 2.0**i <= hi]
    if len(ticks) > 9:
        ticks = ticks[::2]
    ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(ticks))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def _bstar_line(
    ax: Any, bstar: float, color: str = "#666666", label: str = "B*", y: float = 0.96, left: bool = False
) -> None:
    ax.axvline(bstar, color=color, ls="-.", lw=1)
    ax.annotate(
        f"{label} = {bstar:.0f}",
        (bstar, y),
        xycoords=("data", "axes fraction"),
        xytext=(-3 if left else 3, 0),
        textcoords="offset points",
        va="top",
        ha="right" if left else "left",
        fontsize=7.5,
        color=color,
        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
    )


def gpu_roofline_figure(gr: Mapping[str, Any]) -> Figure:
    """Why batching: roofline predictions of a decode step (datasheet constants) for one
    model on several GPUs (:func:`batching.experiments.gpu_rooflines`). Left: step time at
    the shortest context (linear axis), with its memory and compute lines and B*. Right:
    tokens/s at every context, drawn only where the batch's KV cache fits the device."""
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
        a.set_xlabel("batch (sequences per decode step)")
    return fig


def live_decode_figure(
    sweep: Mapping[str, Any],
    numbers: Mapping[str, float],
    roof: Mapping[str, np.ndarray],
    paths: Sequence[str] | None = None,
) -> Figure:
    """Why batching: the live sweep (:func:`batching.book.why.live_decode_sweep`) against
    the roofline from the same run's bandwidth and peak (``roof``, a dense
    :func:`batching.book.why.roofline_curve`). Left: step time of each path in ``paths``
    (default: every measured one; median, bar = interquartile range), memory/compute/roofline
    lines, B*, the band of the knee (``why.KNEE_FACTOR`` times batch 1) and the uniform
    path's knee. Right: tokens/s."""
    from .why import KNEE_FACTOR

    b = np.asarray(sweep["batch"], dtype=float)
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
    t1 = float(np.asarray(sweep["uniform_ms"])[0])
    for f in (KNEE_FACTOR,):
        ax.axhline(f * t1, color="#bbbbbb", lw=0.8, zorder=1)
        ax.annotate(
            f"{f:g}x batch 1",
            (1.0, f * t1),
            xycoords=("axes fraction", "data"),
            xytext=(-2, 1),
            textcoords="offset points",
            ha="right",
            va="bottom",
            fontsize=7,
            color="#888888",
            bbox={"boxstyle": "round,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.8},
        )
    k = numbers["knee"]
    ky = float(np.asarray(sweep["uniform_ms"])[list(b).index(k)])
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
        bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.8},
        arrowprops={"arrowstyle": "-", "color": "black", "lw": 0.7, "shrinkB": 6},
    )
    _bstar_line(ax, numbers["bstar"], y=0.97)
    _log_y(ax, ys, headroom=1.6)
    ax.set_ylabel("decode step (ms, log)")
    ax.set_title("step time", fontsize=9)
    ax = axes[1]
    ax.plot(rb, roof["tokens_per_s"], label="roofline", **ROOF_STYLE["time"])
    tps = [roof["tokens_per_s"]]
    for path in shown:
        y = b / (np.asarray(sweep[f"{path}_ms"]) / 1e3)
        tps.append(y)
        ax.plot(b, y, PATH_MARKERS[path] + "-", color=PATH_COLORS[path], ms=4, lw=1.2)
    _bstar_line(ax, numbers["bstar"], y=0.75)
    _log_y(ax, tps, headroom=1.3)
    ax.set_ylabel("output tokens/s (log)")
    ax.set_title("throughput", fontsize=9)
    for a in axes:
        _pow2_axis(a, b.min(), b.max())
        a.set_xlabel("batch (sequences per decode step)")
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=2, fontsize=7.5)
    return fig


def profiles_figure(
    profiles: Sequence[Mapping[str, Any]],
    roofs: Sequence[Mapping[str, np.ndarray]],
    live: Mapping[str, Any] | None = None,
    gpu: Mapping[str, Any] | None = None,
) -> Figure:
    """Why batching: every committed profile (:func:`batching.experiments.load_profiles`)
    beside this build's live sweep (its uniform path) and, as predictions, the GPU
    rooflines (:func:`batching.experiments.gpu_rooflines`, shortest context).

    Left: measured decode step against batch at each profile's ``ref_ctx`` (solid), with
    its roofline from its own bandwidth and peak (``roofs[i]``, dashed, same colour).
    Right: the same step times relative to batch 1, where devices of any speed compare,
    with the GPU roofline predictions (grey) and the knee's band (``why.KNEE_FACTOR``).
    """
    fig, axes = plt.subplots(1, 2, figsize=(WIDTH, 3.5))
    series: list[tuple[str, np.ndarray, np.ndarray, str, Mapping[str, np.ndarray] | None]] = []
    if live is not None:
        m = live["meta"]
        series.append(
            (
                f"this build: {m['model']} {m['dtype']} on {m['device']}, {live['ctx']} tok/row",
                np.asarray(live["batch"], dtype=float),
                np.asarray(live["uniform_ms"], dtype=float),
                PATH_COLORS["uniform"],
                None,
            )
        )
    for i, (p, roof) in enumerate(zip(profiles, roofs)):
        m = p["meta"]
        series.append(
            (
                f"profile: {m['model']} {p['shape'].dtype} on {p['device']}, {m['date'][:10]}, "
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
    from .why import KNEE_FACTOR

    axes[1].axhline(KNEE_FACTOR, color="#bbbbbb", lw=0.8, zorder=1)
    if not series:
        axes[0].text(
            0.5, 0.5, "no measurement to show", ha="center", va="center", transform=axes[0].transAxes
        )
    axes[0].set_yscale("log")
    axes[0].set_ylabel("decode step (ms, log)\nsolid: measured, dashed: roofline")
    axes[0].set_title("step time", fontsize=9)
    axes[1].set_yscale("log")
    rel = [ms / ms[0] for _, _, ms, _, _ in series] or [np.array([1.0, 2.0])]
    top = max(2.2, max(float(r.max()) for r in rel) * 1.15)
    axes[1].set_ylim(0.9, top)
    _log_ticks(axes[1], 1.0, top, axis="y")
    axes[1].set_ylabel("step time / step time at batch 1 (log)")
    axes[1].set_title("relative cost of a bigger batch", fontsize=9)
    for a in axes:
        if math.isfinite(lo):
            _pow2_axis(a, lo, hi)
        a.set_xlabel("batch (sequences per decode step)")
    h0, l0 = axes[0].get_legend_handles_labels()
    h1, l1 = axes[1].get_legend_handles_labels()
    fig.legend(h0 + h1, l0 + l1, loc="outside lower center", ncol=1, fontsize=7.5)
    return fig


def glue_markdown(values: Mapping[str, str]) -> None:
    """Glue each string as Markdown (not displayed): the prose pastes it with
    ``{glue:md}`key``` as MyST, so a generated sentence or paragraph (which device a
    measurement ran on, which profiles exist) reads as plain text, code spans included,
    where ``{glue:text}`` would paste it verbatim in bold."""
    from myst_nb import glue

    for key, v in values.items():
        if not isinstance(v, str):
            raise TypeError(f"glue_markdown {key!r}={v!r}: must be a str")
        glue(key, markdown(v), display=False)


def markdown(text: str) -> Any:
    """An IPython ``Markdown`` object holding ``text`` itself. ``Markdown(text)`` reads a
    string that names an existing path as that file ("." raised IsADirectoryError, a phrase
    equal to a file name would paste the file), so the text is set after construction."""
    from IPython.display import Markdown

    md = Markdown("")
    md.data = text
    return md


# ------------------------------------------------------------------ capacity (7.2, 7.3)
def capacity_figure(
    rows: Sequence[Mapping[str, Any]],
    trace_rate: float | None = None,
    slo_labels: Mapping[str, str] | None = None,
) -> Figure:
    """Capacity at a latency target (:func:`batching.book.capacity.capacity_table`): one row of
    bars per configuration, one bar per SLO, the sustained request rate written at its end.
    ``trace_rate``: the trace's own rate (req/s), drawn as a dotted line for scale."""
    configs = list(dict.fromkeys(r["config"] for r in rows))
    slos = list(dict.fromkeys(r["slo"] for r in rows))
    rate = {(r["config"], r["slo"]): float(r["rate"]) for r in rows}
    labels = dict(slo_labels or {})
    fig, ax = plt.subplots(figsize=(WIDTH, 0.27 * len(configs) * len(slos) + 1.0))
    h = 0.8 / len(slos)
    shades = {0: 1.0, 1: 0.45}
    top = max(rate.values()) if rate else 1.0
    for j, slo in enumerate(slos):
        for i, name in enumerate(configs):
            v = rate.get((name, slo), float("nan"))
            c = SCHEDULER_COLORS.get(name.split(",")[0].split()[0], "#555555")
            y = i + (j - (len(slos) - 1) / 2) * h
            ax.barh(
                y,
                v,
                height=h * 0.9,
                color=c,
                alpha=shades.get(j, 0.3),
                label=labels.get(slo, slo) if i == 0 else None,
            )
            ax.text(v + top * 0.01, y, f"{v:.1f}" if v > 0 else "0 (none met)", va="center", fontsize=7.5)
    ax.set_yticks(range(len(configs)), configs)
    ax.invert_yaxis()
    ax.set_xlabel("capacity: highest sustained request rate (req/s)")
    ax.set_xlim(0, top * 1.15)
    if trace_rate:
        ax.axvline(trace_rate, color="#999999", ls=":", lw=1.0)
        ax.text(trace_rate, -0.75, " trace's own rate", fontsize=7, color="#666666", va="bottom")
    handles = [
        Patch(facecolor="#555555", alpha=shades.get(j, 0.3), label=labels.get(s, s))
        for j, s in enumerate(slos)
    ]
    ax.legend(handles=handles, loc="upper right", fontsize=7.5, frameon=False)
    return fig
