"""What every figure of the book shares (one palette, sized for the text column) and the
helpers that put numbers, tables and figures on a page. The figures themselves are drawn by
:mod:`batching.book.figures`, one module per page, from the page module's tidy dicts."""

from __future__ import annotations

import html
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import matplotlib
import matplotlib.pyplot as plt
import matplotlib.ticker
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch

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

SOURCE_COLORS: tuple[str, ...] = ("#8C564B", "#CC79A7", "#0072B2", "#E69F00", "#56B4E9", "#000000")

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


def save(fig: Figure, name: str, directory: str | Path = FIGURE_DIR) -> list[Path]:
    """Write ``fig`` as ``<directory>/<name>.png`` and ``.svg``; returns the paths."""
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    paths = [d / f"{name}.png", d / f"{name}.svg"]
    fig.savefig(paths[0], dpi=DPI)
    fig.savefig(paths[1])
    return paths


def publish(fig: Figure, name: str, smoke: bool = False) -> None:
    """Save ``fig`` under ``_build/figures`` (``.../smoke`` in smoke runs, so tests never
    overwrite the book's figures), glue it as ``fig-<name>`` and close it (shown only where glued)."""
    from myst_nb import glue

    save(fig, name, FIGURE_DIR / "smoke" if smoke else FIGURE_DIR)
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


def box(pad: float = 0.15, alpha: float | None = 0.8) -> dict[str, Any]:
    """A white, borderless box behind a label that sits on lines (``bbox=``)."""
    b: dict[str, Any] = {"boxstyle": f"round,pad={pad}", "fc": "white", "ec": "none"}
    return b if alpha is None else {**b, "alpha": alpha}


#: :func:`note`'s coordinates: data, or a line's (data x, axes y; axes x, data y).
_COORDS: dict[str, Any] = {"data": "data", "x": ("data", "axes fraction"), "y": ("axes fraction", "data")}


def note(
    ax: Any,
    text: str,
    xy: tuple[float, float],
    offset: tuple[float, float] = (0, 0),
    on: str = "data",
    **kw: Any,
) -> Any:
    """``text`` at ``xy`` shifted by ``offset`` points; ``on="x"``: xy is (data x, axes-fraction
    y), a label on a vertical line; ``on="y"``: (axes-fraction x, data y), on a horizontal one."""
    return ax.annotate(text, xy, xycoords=_COORDS[on], xytext=offset, textcoords="offset points", **kw)


def legend_patches(kinds: Sequence[str]) -> list[Patch]:
    return [Patch(facecolor=PHASE_COLORS[k], edgecolor="none", label=PHASE_LABELS[k]) for k in kinds]


def log_y(ax: Any, series: list, headroom: float) -> None:
    """Log y axis spanning every series, with room above the highest for labels."""
    lo = min(float(np.min(v)) for v in series) * 0.8
    hi = max(float(np.max(v)) for v in series) * headroom
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    log_ticks(ax, lo, hi, axis="y")


def log_ticks(ax: Any, lo: float, hi: float, axis: str = "x") -> None:
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


def log2_x(ax: Any, ticks: Iterable[float] | None = None) -> None:
    """Log-2 x axis with plain labels ("64", not "2^6"), at ``ticks`` if given, and no minor
    tick labels."""
    ax.set_xscale("log", base=2)
    if ticks is not None:
        ax.xaxis.set_major_locator(matplotlib.ticker.FixedLocator(list(ticks)))
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())


def percent_axis(ax: Any, axis: str = "y") -> None:
    fmt = matplotlib.ticker.PercentFormatter(1.0, decimals=0)
    (ax.yaxis if axis == "y" else ax.xaxis).set_major_formatter(fmt)


def drop_overlapping(
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


#: ``plots.table(rows, header)``: what a notebook cell ends with to show a table.
table = Table


def glue_markdown(values: Mapping[str, str]) -> None:
    """Glue each string as Markdown (not displayed), for ``{glue:md}`key```: a generated
    phrase reads as plain text, code spans included, where ``{glue:text}`` pastes it verbatim."""
    from myst_nb import glue

    for key, v in values.items():
        if not isinstance(v, str):
            raise TypeError(f"glue_markdown {key!r}={v!r}: must be a str")
        glue(key, markdown(v), display=False)


def markdown(text: str) -> Any:
    """An IPython ``Markdown`` holding ``text`` itself (``Markdown(text)`` reads a string that
    names an existing path as that file)."""
    from IPython.display import Markdown

    md = Markdown("")
    md.data = text
    return md
