"""What every page shares: the roofline numbers of a cost model, how a machine is named,
the verdict enums, and the helpers that turn results into glue values. Simulating a run
(:func:`batching.simulate.simulate`) and reading its metrics
(:func:`batching.metrics.run_metrics`) are the library's."""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import RooflineCost
from ..costs.devices import machine_of, same_machine

#: The repository root: committed results (``benchmarks/results``) and profiles
#: (``data/profiles``) are read relative to it.
ROOT = Path(__file__).resolve().parents[2]


def roofline_numbers(cost: RooflineCost) -> dict[str, float]:
    """The device and model numbers the pages derive from (TFLOP/s, TB/s, GB, kB, ms); peak and
    bandwidth count all devices together; ``bstar`` is the batch where decode turns
    compute-bound."""
    m = cost.model
    return {
        "peak_tflops": cost.peak_flops / 1e12,
        "bandwidth_tbs": cost.bandwidth / 1e12,
        "weight_gb": m.weight_bytes / 1e9,
        "weight_read_gb": m.weight_read_bytes / 1e9,
        "params_b": m.params / 1e9,
        "bstar": float(cost.bstar()),
        "kv_kb_per_token": m.kv_bytes_per_token / 1e3,
        "kv_capacity": float(cost.kv_capacity()),
        "max_context": float(m.max_context),
        "overhead_ms": cost.device.step_overhead_s * 1e3,
    }


def machine_label(record: Mapping[str, Any]) -> str:
    """How tables, legends and glue name the machine of a profile's or a run's record
    (:func:`~batching.costs.devices.machine_of`): ``AMD EPYC (2 threads)``; the registry
    entry where the record names no machine."""
    m = machine_of(record)
    return m.label if m is not None else str(record.get("device", "?"))


def same_machine_as(record: Mapping[str, Any], here: Mapping[str, Any] | None) -> bool:
    """Whether a committed file's record (a profile's ``meta``, a result) is of the machine of
    ``here``, a live run's record of this build (a sweep's ``meta``, an executor record): only
    then may a page call it this machine's. Unrecorded on either side: False."""
    return here is not None and same_machine(machine_of(record), machine_of(here))


class Claim(str, enum.Enum):
    """How a claim fares against the numbers that test it; the notebook words each one."""

    HOLDS = "holds"
    #: True in part; the numbers say which part.
    PARTLY = "partly"
    #: Holds counted in slots, not in hardware FLOPs at any slot count tried.
    SLOT_LEVEL_ONLY = "slot-level-only"
    #: Holds in slots, and in hardware FLOPs only once the slot cap is lifted.
    NEEDS_WIDE_BATCH = "needs-wide-batch"
    DOES_NOT_HOLD = "does not hold"


#: How every page words a :class:`Claim`'s verdict in its prose (glued as text).
CLAIM_WORDS: dict[Claim, str] = {
    Claim.HOLDS: "holds",
    Claim.PARTLY: "holds in part",
    Claim.SLOT_LEVEL_ONLY: "holds at the slot level, not in hardware FLOPs",
    Claim.NEEDS_WIDE_BATCH: "holds at the slot level; in hardware FLOPs only once the batch may grow past its slot cap",
    Claim.DOES_NOT_HOLD: "does not hold",
}


class Versus(str, enum.Enum):
    """How a measured ratio compares with 1 (one step's time over another's, or over its
    positions): within a tolerance, more, or less."""

    LESS = "less"
    SAME = "same"
    MORE = "more"


def versus(ratio: float, tol: float = 0.05) -> Versus:
    """:class:`Versus` of ``ratio``: SAME within ``tol`` of 1, else LESS or MORE."""
    if not (ratio > 0 and 0 <= tol < 1):
        raise ValueError(f"ratio={ratio}, tol={tol}: need a positive ratio and 0 <= tol < 1")
    if abs(ratio - 1.0) <= tol:
        return Versus.SAME
    return Versus.MORE if ratio > 1 else Versus.LESS


def choose(smoke: bool, full: Any, small: Any) -> Any:
    """``small`` in smoke runs (the tests), ``full`` for the book: one rule for every notebook."""
    return small if smoke else full


def columns(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """A sweep's runs (one mapping of scalars per run) as one array per key, in run order."""
    return {k: np.asarray([r[k] for r in rows]) for k in (rows[0] if keys is None else keys)}


def at(sweep: Mapping[str, np.ndarray], key: str, value: float) -> dict[str, float]:
    """The scalars of a sweep (arrays over one swept variable) where ``sweep[key] == value``."""
    idx = np.flatnonzero(np.isclose(np.asarray(sweep[key], dtype=float), value))
    if idx.size == 0:
        raise KeyError(f"{key}={value} is not in the sweep ({list(np.asarray(sweep[key]))})")
    i, shape = int(idx[0]), np.asarray(sweep[key]).shape
    return {k: float(np.asarray(v)[i]) for k, v in sweep.items() if np.asarray(v).shape[:1] == shape}


def flat(prefix: str, values: Mapping[str, Any], keys: Sequence[str] | None = None) -> dict[str, Any]:
    """``{f"{prefix}_{k}": v}`` for the chosen keys (glue keys; ``plots.glue_values`` makes
    numpy scalars plain)."""
    return {f"{prefix}_{k}": values[k] for k in (values if keys is None else keys)}


#: How far above the roofline's own prediction a measured step may rise, at the largest swept
#: batch at or below B*, for extra rows to count as nearly free there.
FLAT_TOL = 1.25


def flat_verdict(numbers: Mapping[str, float]) -> Claim:
    """The claim "extra rows are nearly free until B*", on one measured curve (the live sweep's
    :func:`~batching.book.decode.live_numbers`, a GPU profile's
    :func:`~batching.book.gpu.decode_numbers`), tested on the kernels batching uses: from
    ``base_batch`` (batch 2 where batch 1 ran a one-token kernel of its own, else batch 1) to
    ``test_batch`` (the largest swept batch at or below B*). HOLDS: the step there is within
    :data:`FLAT_TOL` of the roofline's ratio to ``base_batch``'s; PARTLY: it rises more, but
    some larger batch stays within :data:`~batching.costs.knee.KNEE_FACTOR` of
    ``base_batch``'s step; DOES_NOT_HOLD: none does."""
    # A curve without a kernel change (the GPU profiles) counts from batch 1, at B*.
    ratio = numbers.get("ratio_test", numbers["ratio_bstar"])
    pred = numbers.get("pred_ratio_test", numbers["pred_ratio_bstar"])
    base, knee_at = numbers.get("base_batch", 1.0), numbers.get("knee_base", numbers["knee"])
    if ratio <= FLAT_TOL * pred:
        return Claim.HOLDS
    return Claim.PARTLY if knee_at > base else Claim.DOES_NOT_HOLD
