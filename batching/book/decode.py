"""The "Decode on this device" section of chapters/measured.ipynb: what a live decode sweep
(:func:`batching.book.why.live_decode_sweep`) knows beyond the "Why batching" page's one
figure: the rates of its first two steps, the gathered path's copy, a table per path, the
device probes and the B* each gives, and the committed profiles' table. Numbers, small
verdicts and table rows only: the sentences are the notebook's.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..models import ModelShape
from .why import bstar_of, knee, sweep_shape


class Versus(enum.Enum):
    """How one measured step compares with another: within a tolerance, more, or less."""

    LESS = "less"
    SAME = "same"
    MORE = "more"


def versus(ratio: float, tol: float = 0.05) -> Versus:
    """Measured page: :class:`Versus` of a step-time ratio (``*_gap_max``):
    SAME within ``tol`` of 1."""
    if abs(ratio - 1.0) <= tol:
        return Versus.SAME
    return Versus.MORE if ratio > 1 else Versus.LESS


def first_step_rates(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Measured page: the weight-and-KV bytes per second of the uniform step at
    batch 1 (``rate1_gbs``) and at the sweep's next batch ``next_batch`` (``rate_next_gbs``),
    and ``split`` (1.0 where batch 1 ran the CPU's one-token kernel, each product split over
    the threads, ``Llama.linear``: the first step up of the curve is then partly a change of
    kernel). The sweep needs two batches at least."""
    from ..plan import StepWork
    from ..real.model import LINEAR_CPU

    b = [float(x) for x in sweep["batch"]]
    if len(b) < 2:
        raise ValueError(f"batches {b}: need two at least")
    shape, u = sweep_shape(sweep), np.asarray(sweep["uniform_ms"], dtype=float)
    rate = [
        shape.bytes_moved(StepWork(decode_rows=int(r), decode_ctx=int(r) * sweep["ctx"])) / (u[i] / 1e3) / 1e9
        for i, r in enumerate(b[:2])
    ]
    return {
        "rate1_gbs": rate[0],
        "next_batch": b[1],
        "rate_next_gbs": rate[1],
        "split": float(sweep["meta"].get("linear") == LINEAR_CPU),
    }


def gather_bytes(shape: ModelShape, rows: int, longest_ctx: int) -> float:
    """The gathered path: bytes of K and V the runner copies in one decode
    step, every layer, each row's slab up to the longest context plus the new token."""
    return float(
        2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_bytes * (longest_ctx + 1) * rows
    )


def gather_numbers(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> dict[str, float]:
    """Measured page: at the sweep's largest batch, the bytes the gathered path
    copies (``copy_mb``), the time that copy takes at the copy bandwidth of the same run,
    which counts a read and a write per byte (``copy_ms``), and how much longer the gathered
    step took than the mixed one (``extra_ms``; negative if shorter). Empty where the sweep
    timed no gathered path (CUDA graphs: :func:`~batching.book.why.decode_paths`)."""
    if "gathered_tmax_ms" not in numbers:
        return {}
    longest = round(sweep["ctx"] * 1.5)  # StepTimer.decode spreads contexts over ctx/2 .. 3ctx/2
    nbytes = gather_bytes(sweep_shape(sweep), int(numbers["bmax"]), longest)
    return {
        "copy_mb": nbytes / 1e6,
        "copy_ms": 2 * nbytes / (numbers["copy_gbs"] * 1e9) * 1e3,
        "extra_ms": numbers["gathered_tmax_ms"] - numbers["mixed_tmax_ms"],
    }


def path_rows(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> tuple[list[list[Any]], list[str]]:
    """Measured page: rows and header of the per-path table (batch-1 step,
    knee, step and tokens/s at the largest batch, that step over batch 1 and over the
    uniform path's)."""
    n, bmax = numbers, f"{numbers['bmax']:.0f}"
    header = ["path", "B=1 ms", "knee", f"B={bmax} ms", "x B=1", f"tokens/s at B={bmax}", "x uniform"]
    rows: list[list[Any]] = []
    for p in sweep.get("paths", ["uniform"]):
        pre = "" if p == "uniform" else f"{p}_"
        gap = 1.0 if p == "uniform" else n[f"{p}_gap_max"]
        rows.append(
            [
                p,
                f"{n[f'{pre}t1_ms']:,.1f}",
                f"{n[f'{pre}knee']:.0f}",
                f"{n[f'{pre}tmax_ms']:,.1f}",
                f"{n[f'{pre}ratio_max']:.1f}",
                f"{n[f'{pre}tps_max']:,.0f}",
                f"{gap:.2f}",
            ]
        )
    return rows, header


def probe_rows(
    numbers: Mapping[str, float], registry_gbs: float | None = None
) -> tuple[list[list[Any]], list[str]]:
    """Measured page: rows and header of the device-probe table: each
    bandwidth the sweep measured (and the device registry's matrix-vector figure, if given)
    with the B* it gives against the same run's matmul peak (``numbers``: :func:`~batching.book.why.live_numbers`)."""
    peak, bpp = numbers["peak_gflops"] * 1e9, numbers["bytes_per_param"]
    probes = [
        ("matrix-vector product over the weight bytes", numbers["matvec_gbs"]),
        ("copy (read + write)", numbers["copy_gbs"]),
        ("sum (read)", numbers["read_gbs"]),
    ]
    if registry_gbs is not None:
        probes.append(("device registry's matrix-vector figure", registry_gbs))
    rows: list[list[Any]] = [
        [name, f"{gbs:,.1f}", f"{bstar_of(peak, gbs * 1e9, bpp):,.1f}"] for name, gbs in probes
    ]
    return rows, ["bandwidth probe", "GB/s", "B*"]


def profile_rows(profiles: Sequence[Mapping[str, Any]]) -> tuple[list[list[Any]], list[str]]:
    """Measured page: rows and header of the committed-profiles table (one row
    per profile and context: batch-1 step, step at the largest batch, knee)."""
    header = ["device", "model", "ctx", "B=1 ms", "largest B", "ms", "knee"]
    rows: list[list[Any]] = []
    for p in profiles:
        m = p["meta"]  # model, dtype and date are in the figure's legend
        for j, c in enumerate(p["ctxs"]):
            col = p["ms"][:, j]
            rows.append(
                [
                    p["device"],
                    m["model"],
                    f"{c:.0f}",
                    f"{col[0]:.1f}",
                    f"{p['batch'][-1]:.0f}",
                    f"{col[-1]:.1f}",
                    f"{knee(p['batch'], col)}",
                ]
            )
    return rows, header
