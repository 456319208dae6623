"""Where a measured step-time curve stops being flat: the knee (the last batch within a
factor of batch 1's step) and the first batch to reach a factor of it."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

#: Up to the knee a batch of B rows costs at most this many times batch 1's step, so each
#: token costs at most 2/B of batch 1's device time.
KNEE_FACTOR = 2.0


def _curve(batch: ArrayLike, times: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    b, t = np.asarray(batch, dtype=float), np.asarray(times, dtype=float)
    if b.ndim != 1 or b.shape != t.shape or len(b) == 0:
        raise ValueError(f"batch {b.shape} and times {t.shape}: need two 1-d arrays of the same length")
    return b, t


def knee(batch: ArrayLike, times: ArrayLike, factor: float = KNEE_FACTOR) -> int:
    """The largest batch up to which the step time stays within ``factor`` times the first
    batch's: the first point above ends it, a later dip back under does not count."""
    b, t = _curve(batch, times)
    if np.any(np.diff(b) <= 0) or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("batch must be increasing and times finite and > 0")
    if factor < 1:
        raise ValueError(f"factor={factor}: must be >= 1")
    ok = t <= factor * t[0]
    n = len(ok) if ok.all() else int(np.argmin(ok))
    return int(b[n - 1])


def first_reaching(batch: ArrayLike, times: ArrayLike, factor: float) -> int | None:
    """The first batch whose time is at least ``factor`` times the first batch's; None if none."""
    b, t = _curve(batch, times)
    if factor < 1:
        raise ValueError(f"factor={factor}: must be >= 1")
    hit = np.flatnonzero(t >= factor * t[0])
    return int(b[hit[0]]) if len(hit) else None
