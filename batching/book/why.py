"""Why batching carries the load (chapters/why.ipynb): one decode step streams every weight,
so extra rows are nearly free until compute binds at B*. The roofline of a decode step (B*,
the knee of a step-time curve, the roofline curve, the batch-1 derivation and the GPU
predictions) and the verdict on the page's claim from a live sweep's numbers. Torch-free: the
live sweep is :mod:`batching.book.decode`'s, the committed profiles
:mod:`batching.book.profiles`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..cost_base import MEM_RESERVE
from ..costs import RooflineCost
from ..models import ModelShape
from .common import Claim, roofline_numbers


def bstar_of(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """Why batching: B* = peak x bytes per weight / (2 x bandwidth), the batch at which a
    decode step's 2 FLOPs per weight per row take as long as streaming the weights once."""
    if not (peak_flops > 0 and bandwidth > 0 and bytes_per_param > 0):
        raise ValueError(f"peak={peak_flops}, bandwidth={bandwidth}, bytes={bytes_per_param}: must be > 0")
    return float(peak_flops * bytes_per_param / (2.0 * bandwidth))


#: The knee of a measured step-time curve: the largest batch whose step costs at most this
#: many times batch 1's. Up to there a batch of B rows gets its tokens for at most 2/B of
#: batch 1's device time per token; one factor for the live sweep, its paths and profiles.
KNEE_FACTOR = 2.0


def knee(batch: ArrayLike, times: ArrayLike, factor: float = KNEE_FACTOR) -> int:
    """Why batching: the largest batch up to which the step time *stays* within ``factor``
    times the first batch's (the first point above it ends the run; later points that dip
    back under do not count). ``batch`` must be increasing; ``factor`` >= 1."""
    b, t = np.asarray(batch, dtype=float), np.asarray(times, dtype=float)
    if b.ndim != 1 or b.shape != t.shape or len(b) == 0:
        raise ValueError(f"batch {b.shape} and times {t.shape}: need two 1-d arrays of the same length")
    if np.any(np.diff(b) <= 0) or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("batch must be increasing and times finite and > 0")
    if factor < 1:
        raise ValueError(f"factor={factor}: must be >= 1")
    ok = t <= factor * t[0]
    n = len(ok) if ok.all() else int(np.argmin(ok))
    return int(b[n - 1])


def roofline_curve(
    shape: ModelShape,
    batches: ArrayLike,
    ctx: int,
    bandwidth: float,
    peak_flops: float,
    overhead_s: float = 0.0,
    points: int = 0,
) -> dict[str, np.ndarray]:
    """Why batching: the roofline of one decode step of ``b`` rows, each holding ``ctx``
    KV tokens, for every ``b`` in ``batches`` (with ``points`` > 1: that many batch sizes
    spread geometrically over their range, for a smooth curve).

    Arrays: ``batch``; ``weights_s`` (weight bytes streamed / bandwidth, the same at every
    batch); ``memory_s`` (weights + KV read and written, ``ModelShape.bytes_arrays``, over
    bandwidth); ``compute_s`` (``ModelShape.flops_arrays`` over peak); ``time_s`` =
    max(memory, compute) + ``overhead_s`` (what ``RooflineCost.decode_step`` returns for a
    single device); ``tokens_per_s`` = batch / time; ``bound`` (1 where compute binds).
    """
    b = np.asarray(batches, dtype=np.float64)
    if points > 1:
        b = np.geomspace(b[0], b[-1], points)
    z = np.zeros_like(b)
    mem = shape.bytes_arrays(z, z, b, b * float(ctx)) / bandwidth
    cmp = shape.flops_arrays(z, z, b, b * float(ctx)) / peak_flops
    t = np.maximum(mem, cmp) + overhead_s
    return {
        "batch": b,
        "weights_s": np.full_like(b, shape.weight_read_bytes / bandwidth),
        "memory_s": mem,
        "compute_s": cmp,
        "time_s": t,
        "tokens_per_s": b / t,
        "bound": (cmp > mem).astype(float),
    }


def stream_numbers(
    cost: RooflineCost, ctx: int = 1, long_ctx: int = 2048, long_batch: int = 128
) -> dict[str, float]:
    """Why batching: the batch-1 derivation on one device: :func:`~batching.book.common.roofline_numbers`
    (whose ``bstar`` is every page's B*), the batch-1 step at ``ctx`` KV tokens against the weight
    stream, the same at B* rounded down, and the KV of ``long_batch`` rows of ``long_ctx`` tokens
    against the weights and the memory the cost model counts (``mem_usable`` of ``mem_gb``)."""
    if cost.tp != 1:
        raise ValueError("stream_numbers is the single-device derivation: tp must be 1")
    m = cost.model
    out = roofline_numbers(cost)
    bs = max(1, int(cost.bstar()))
    step, step_bs = cost.decode_step(1, ctx), cost.decode_step(bs, ctx)
    kv_long = long_batch * long_ctx * m.kv_bytes_per_token
    out.update(
        stream_ms=m.weight_read_bytes / cost.bandwidth * 1e3,
        step_ms=step * 1e3,
        tokens_s=1.0 / step,
        ctx=float(ctx),
        bstar_floor=float(bs),
        step_bstar_ms=step_bs * 1e3,
        tokens_s_bstar=bs / step_bs,
        ratio_bstar=step_bs / step,
        long_ctx=float(long_ctx),
        long_batch=float(long_batch),
        kv_long_gb=kv_long / 1e9,
        kv_long_ratio=kv_long / m.weight_read_bytes,
        kv_equal_batch=m.weight_read_bytes / (long_ctx * m.kv_bytes_per_token),
        long_fit=float(cost.kv_capacity() // long_ctx),
        mem_usable=1 - MEM_RESERVE,
        mem_gb=cost.device.mem_bytes / 1e9,
    )
    return out


def gpu_rooflines(
    model: str = "llama-8b",
    devices: Sequence[str] = ("h100", "h200"),
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    ctxs: Sequence[int] = (128, 2048),
) -> dict[str, Any]:
    """Why batching: roofline predictions (datasheet constants, not measurements) of a
    decode step for ``model`` on each device, at each context per row.

    Returns ``{"model", "dtype", "devices": {device name: {"bstar", "kv_capacity",
    "ctx": {ctx: roofline_curve(...) + "fits"}}}}``; ``fits`` is 1 where batch x ctx KV
    tokens fit the device's KV capacity (``RooflineCost.kv_capacity``).
    """
    from ..costs import get_cost_model

    out: dict[str, Any] = {"model": model, "devices": {}}
    for dev in devices:
        cost = get_cost_model(model, dev)
        assert isinstance(cost, RooflineCost), "a named device gives a roofline cost model"
        out["dtype"] = cost.model.dtype
        per: dict[int, dict[str, np.ndarray]] = {}
        for c in ctxs:
            cur = roofline_curve(
                cost.model, batches, c, cost.bandwidth, cost.peak_flops, cost.device.step_overhead_s
            )
            cur["fits"] = (cur["batch"] * c <= cost.kv_capacity()).astype(float)
            per[int(c)] = cur
        out["devices"][cost.device.name] = {
            "bstar": float(cost.bstar()),
            "kv_capacity": float(cost.kv_capacity()),
            "ctx": per,
        }
    return out


#: How far above the roofline's own prediction a measured step may rise, at the largest swept
#: batch at or below B*, for extra rows to count as nearly free there (:func:`flat_verdict`).
FLAT_TOL = 1.25


def flat_verdict(numbers: Mapping[str, float], tol: float = FLAT_TOL) -> Claim:
    """Why batching: the page's claim, "extra rows are nearly free until B*", on one measured
    curve (:func:`~batching.book.decode.live_numbers`), at the largest swept batch at or below
    B*. HOLDS: the step there is within ``tol`` of the roofline's predicted ratio to batch 1
    (``ratio_bstar`` against ``pred_ratio_bstar``); PARTLY: it rises more, but some batch above
    1 stays within :data:`KNEE_FACTOR` of batch 1 (``knee``); DOES_NOT_HOLD: none does."""
    if numbers["ratio_bstar"] <= tol * numbers["pred_ratio_bstar"]:
        return Claim.HOLDS
    return Claim.PARTLY if numbers["knee"] > 1 else Claim.DOES_NOT_HOLD
