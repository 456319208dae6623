"""What workloads, their length distributions and the trace loaders share: the error they
raise (:class:`WorkloadError`, part of :mod:`batching.workload`'s API), the argument checks
that word it alike, and the rounding rule for scaled and sampled lengths.
"""

from __future__ import annotations

import math

import numpy as np


class WorkloadError(ValueError):
    """A workload, or a parameter used to build one, that cannot be served or sampled."""


def _positive_finite(name: str, value: object, *, allow_inf: bool = False) -> float:
    """``value`` as a float > 0 (finite unless ``allow_inf``), or raise naming the field."""
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise WorkloadError(f"{name}={value!r}: must be a number > 0")
    v = float(value)
    if math.isnan(v) or v <= 0 or (math.isinf(v) and not allow_inf):
        limit = "> 0" if allow_inf else "finite and > 0"
        raise WorkloadError(f"{name}={value!r}: must be {limit}")
    return v


def _count(name: str, value: object, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise WorkloadError(f"{name}={value!r}: must be an integer >= {minimum}")
    return int(value)


def _round_half_up(x: np.ndarray) -> np.ndarray:
    # np.rint rounds half to even; half-up keeps "divide by k" predictable for readers.
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def colon_pair(text: str, conv: type) -> tuple:
    """``"A:B"`` as ``(conv(A), conv(B))``; ValueError otherwise (each caller words it)."""
    a, sep, b = text.partition(":")
    if not sep:
        raise ValueError(text)
    return conv(a), conv(b)
