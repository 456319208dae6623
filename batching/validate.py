"""The input checks every layer shares, worded alike (``name=value: must be ...``) and raised
as the caller's error class, each a ValueError, which the CLI turns into one line and exit
status 2. The core defines them, so that workloads, costs and servers check the way the
schedulers do without importing anything above the core.
"""

from __future__ import annotations

import math

import numpy as np


class ConfigError(ValueError):
    """A scheduler or engine configuration that cannot work."""


def integer(
    name: str,
    value: object,
    lo: int = 1,
    *,
    error: type[ValueError] = ConfigError,
    where: str = "",
    whole_floats: bool = False,
) -> int:
    """``value`` as an int >= ``lo``, or raise ``error`` naming the field and the value;
    ``whole_floats``: also take a float with no fractional part (a length read from a file)."""
    ok = not isinstance(value, bool) and isinstance(value, (int, np.integer))
    if whole_floats and isinstance(value, float):
        ok = math.isfinite(value) and value == int(value)
    if not ok or value < lo:  # type: ignore[operator]  # a number once ok
        raise error(f"{name}={value!r}{where}: must be an integer >= {lo}")
    return int(value)  # type: ignore[call-overload]


def number(
    name: str,
    value: object,
    lo: float = 0.0,
    *,
    above: bool = False,
    finite: bool = True,
    unit: str = "",
    error: type[ValueError] = ConfigError,
    where: str = "",
) -> float:
    """``value`` as a float ``> lo`` (``above``) or ``>= lo``, finite unless ``finite=False``
    (inf then passes), or raise ``error`` naming the field and the value."""
    kind = ("a finite number" if finite else "a number") + (f" of {unit}" if unit else "")
    bound = f"{'>' if above else '>='} {lo:g}"
    if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise error(f"{name}={value!r}{where}: must be {kind} {bound}")
    v = float(value)
    if math.isnan(v) or (finite and math.isinf(v)) or (v <= lo if above else v < lo):
        raise error(f"{name}={value!r}{where}: must be {kind} {bound}")
    return v


def colon_pair(text: str, conv: type) -> tuple:
    """``"A:B"`` as ``(conv(A), conv(B))``; ValueError otherwise (each caller words it)."""
    a, sep, b = text.partition(":")
    if not sep:
        raise ValueError(text)
    return conv(a), conv(b)
