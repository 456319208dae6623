"""Token-length distributions for synthetic workloads: small classes with ``sample(n, rng)``
that draw ``n`` lengths >= 1 (:class:`Fixed`, :class:`LogNormal`, :class:`Empirical`, the
last from a quantile table derived from the real traces, :func:`quantile_table`).
"""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol

import numpy as np

from ..validate import integer, number
from .errors import WorkloadError

__all__ = [
    "LengthDist",
    "Fixed",
    "LogNormal",
    "Empirical",
    "as_length_dist",
    "QUANTILE_DIR",
    "quantile_table",
]

#: Derived length tables (see data/README.md); next to the package, not inside it.
QUANTILE_DIR = Path(__file__).resolve().parents[2] / "data" / "length_quantiles"


def round_half_up(x: np.ndarray) -> np.ndarray:
    """Scaled and sampled lengths, rounded: np.rint rounds half to even; half-up keeps
    "divide by k" predictable for readers."""
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


class LengthDist(Protocol):
    """Anything that draws ``n`` token lengths (ints >= 1)."""

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray: ...


@dataclass(frozen=True)
class Fixed:
    """Every request gets ``value`` tokens."""

    value: int

    def __post_init__(self) -> None:
        integer("value", self.value, 1, error=WorkloadError, where=" (Fixed)", whole_floats=True)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        return np.full(integer("n", n, 0, error=WorkloadError), self.value, dtype=np.int64)


@dataclass(frozen=True)
class LogNormal:
    """Long-tailed lengths: lognormal with this ``median`` and log-``sigma``, clipped to
    [lo, hi] (``hi=None`` leaves the tail open)."""

    median: float
    sigma: float
    lo: int = 1
    hi: int | None = None

    def __post_init__(self) -> None:
        where = " (LogNormal)"
        number("median", self.median, above=True, error=WorkloadError, where=where)
        number("sigma", self.sigma, error=WorkloadError, where=where)
        integer("lo", self.lo, 1, error=WorkloadError, where=where, whole_floats=True)
        if self.hi is not None:
            integer("hi", self.hi, 1, error=WorkloadError, where=where, whole_floats=True)
        if self.hi is not None and self.hi < self.lo:
            raise WorkloadError(f"LogNormal: hi={self.hi!r} < lo={self.lo!r}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        x = rng.lognormal(
            mean=math.log(self.median), sigma=self.sigma, size=integer("n", n, 0, error=WorkloadError)
        )
        hi = np.inf if self.hi is None else self.hi
        return round_half_up(np.clip(x, self.lo, hi))


@dataclass(frozen=True)
class Empirical:
    """Inverse-CDF sampling from a quantile table, linear between the given quantiles;
    ``q`` must rise strictly from 0 to 1 and ``values`` must not decrease."""

    q: tuple[float, ...]
    values: tuple[float, ...]
    source: str = ""

    def __post_init__(self) -> None:
        q = np.asarray(self.q, dtype=np.float64)
        v = np.asarray(self.values, dtype=np.float64)
        # Python floats for the messages: numpy 2 reprs read "np.float64(2.0)".
        ql, vl = q.tolist(), v.tolist()
        where = f" ({self.source})" if self.source else ""
        if q.ndim != 1 or len(q) < 2 or len(q) != len(v):
            raise WorkloadError(
                f"Empirical{where}: need >= 2 quantiles and as many values, got {len(q)} and {len(v)}"
            )
        if not (np.all(np.isfinite(q)) and np.all(np.isfinite(v))):
            raise WorkloadError(f"Empirical{where}: quantiles and values must be finite")
        if q[0] != 0.0 or q[-1] != 1.0:
            raise WorkloadError(
                f"Empirical{where}: quantiles must run from 0 to 1, got {ql[0]!r}..{ql[-1]!r}"
            )
        bad = np.flatnonzero(np.diff(q) <= 0)
        if len(bad):
            raise WorkloadError(
                f"Empirical{where}: quantile q={ql[bad[0] + 1]!r} does not exceed the previous {ql[bad[0]]!r}"
            )
        bad = np.flatnonzero(np.diff(v) < 0)
        if len(bad):
            raise WorkloadError(
                f"Empirical{where}: value {vl[bad[0] + 1]!r} at q={ql[bad[0] + 1]!r} is below the previous {vl[bad[0]]!r}"
            )
        if v[0] < 1:
            raise WorkloadError(f"Empirical{where}: value {vl[0]!r} at q=0 must be >= 1")

    @classmethod
    def from_csv(cls, path: str | Path, column: str) -> Empirical:
        """Read columns ``q`` and ``column`` from a CSV whose ``#`` lines are comments."""
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as e:
            raise WorkloadError(f"cannot read quantile table {path}: {e}") from None
        rows = [
            (n, line)
            for n, line in enumerate(text.splitlines(), 1)
            if line.strip() and not line.lstrip().startswith("#")
        ]
        if not rows:
            raise WorkloadError(f"{path}: no header line (only comments or blank lines)")
        header_line, header = rows[0]
        cols = [c.strip() for c in next(csv.reader([header]))]
        for need in ("q", column):
            if need not in cols:
                raise WorkloadError(
                    f"{path}, line {header_line}: no column {need!r} (columns: {', '.join(cols)})"
                )
        iq, iv = cols.index("q"), cols.index(column)
        qs: list[float] = []
        vs: list[float] = []
        for n, line in rows[1:]:
            fields = next(csv.reader([line]))
            if len(fields) != len(cols):
                raise WorkloadError(f"{path}, line {n}: {len(fields)} fields, header has {len(cols)}")
            for i, name, out in ((iq, "q", qs), (iv, column, vs)):
                try:
                    out.append(float(fields[i]))
                except ValueError:
                    raise WorkloadError(
                        f"{path}, line {n}, column {name!r}: {fields[i]!r} is not a number"
                    ) from None
        return cls(tuple(qs), tuple(vs), source=f"{path.name}:{column}")

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        u = rng.random(integer("n", n, 0, error=WorkloadError))
        return np.maximum(1, round_half_up(np.interp(u, self.q, self.values)))

    def quantile(self, p: float | np.ndarray) -> float | np.ndarray:
        """The table's (interpolated) value at quantile ``p``."""
        return np.interp(p, self.q, self.values)


def quantile_table(name: str, column: Literal["prompt", "output"]) -> Empirical:
    """Load ``data/length_quantiles/<name>.csv`` column ``prompt`` or ``output``."""
    path = QUANTILE_DIR / f"{name}.csv"
    if not path.exists():
        have = sorted(p.stem for p in QUANTILE_DIR.glob("*.csv")) if QUANTILE_DIR.is_dir() else []
        raise WorkloadError(
            f"no quantile table {name!r}: {path} does not exist (tables: {', '.join(have) or 'none'})"
        )
    return Empirical.from_csv(path, column)


def as_length_dist(spec: int | LengthDist, field: str) -> LengthDist:
    """An int means :class:`Fixed`; anything with ``sample(n, rng)`` passes through."""
    if isinstance(spec, (int, np.integer)) and not isinstance(spec, bool):
        return Fixed(int(spec))
    if callable(getattr(spec, "sample", None)):
        return spec  # type: ignore[return-value]
    raise WorkloadError(f"{field}={spec!r}: must be an int or have a sample(n, rng) method")


def _describe(d: object) -> str:
    return repr(d) if not isinstance(d, Empirical) else f"Empirical({d.source or 'table'})"
