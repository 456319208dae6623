"""Why batching (chapters/why.ipynb): the roofline of one decode step, B*, the knee of a
measured step-time curve, and the verdict on "extra rows are nearly free until B*"."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..costs import RooflineCost
from ..costs.base import MEM_RESERVE
from ..costs.models import ModelShape
from .common import Claim, roofline_numbers


def bstar_of(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """B* = peak x bytes per weight / (2 x bandwidth): the batch at which a decode step's
    2 FLOPs per weight per row take as long as streaming the weights once."""
    if not (peak_flops > 0 and bandwidth > 0 and bytes_per_param > 0):
        raise ValueError(f"peak={peak_flops}, bandwidth={bandwidth}, bytes={bytes_per_param}: must be > 0")
    return float(peak_flops * bytes_per_param / (2.0 * bandwidth))


#: Up to the knee a batch of B rows costs at most this many times batch 1's step, so each
#: token costs at most 2/B of batch 1's device time.
KNEE_FACTOR = 2.0


def knee(batch: ArrayLike, times: ArrayLike, factor: float = KNEE_FACTOR) -> int:
    """The largest batch up to which the step time stays within ``factor`` times the first
    batch's: the first point above ends it, a later dip back under does not count."""
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
    """The roofline of one decode step of ``b`` rows of ``ctx`` KV tokens each, at each of
    ``batches`` (or, with ``points`` > 1, that many batches spread geometrically over them).

    Arrays, times in s: ``batch``, ``weights_s`` (the weight stream alone), ``memory_s``
    (weights and KV), ``compute_s``, ``time_s`` = max(memory, compute) + ``overhead_s``
    (``RooflineCost.decode_step`` on one device), ``tokens_per_s`` and ``bound`` (1 where
    compute binds).
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


#: The device and model numbers of :func:`~batching.book.common.roofline_numbers` that the
#: batch-1 derivation quotes.
_STREAM_ROOF = (
    "peak_tflops",
    "bandwidth_tbs",
    "weight_read_gb",
    "params_b",
    "bstar",
    "kv_kb_per_token",
    "overhead_ms",
)


def stream_numbers(
    cost: RooflineCost, ctx: int = 1, long_ctx: int = 2048, long_batch: int = 128
) -> dict[str, float]:
    """The batch-1 derivation on one device (times in ms, sizes in GB): the weight stream, the
    step at ``ctx`` KV tokens per row at batch 1 and at B* rounded down, and the KV of
    ``long_batch`` rows of ``long_ctx`` tokens against the weights and the usable memory;
    with the device numbers it starts from (``bstar`` is every page's B*)."""
    if cost.tp != 1:
        raise ValueError("stream_numbers is the single-device derivation: tp must be 1")
    m = cost.model
    hw = roofline_numbers(cost)
    bs = max(1, int(cost.bstar()))
    step, step_bs = cost.decode_step(1, ctx), cost.decode_step(bs, ctx)
    kv_long = long_batch * long_ctx * m.kv_bytes_per_token
    return {
        **{k: hw[k] for k in _STREAM_ROOF},
        "stream_ms": m.weight_read_bytes / cost.bandwidth * 1e3,
        "step_ms": step * 1e3,
        "tokens_s": 1.0 / step,
        "ctx": float(ctx),
        "bstar_floor": float(bs),
        "step_bstar_ms": step_bs * 1e3,
        "tokens_s_bstar": bs / step_bs,
        "ratio_bstar": step_bs / step,
        "long_ctx": float(long_ctx),
        "long_batch": float(long_batch),
        "kv_long_gb": kv_long / 1e9,
        "kv_long_ratio": kv_long / m.weight_read_bytes,
        "kv_equal_batch": m.weight_read_bytes / (long_ctx * m.kv_bytes_per_token),
        "long_fit": float(cost.kv_capacity() // long_ctx),
        "mem_usable": 1 - MEM_RESERVE,
        "mem_gb": cost.device.mem_bytes / 1e9,
    }


def gpu_rooflines(
    model: str = "llama-8b",
    devices: Sequence[str] = ("h100", "h200"),
    batches: Sequence[int] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024),
    ctxs: Sequence[int] = (128, 2048),
) -> dict[str, Any]:
    """Roofline predictions (datasheet constants, not measurements) of a decode step for
    ``model`` on each device, at each context per row: ``{"model", "dtype", "devices":
    {device name: {"bstar", "kv_capacity", "ctx": {ctx: roofline_curve(...) + "fits"}}}}``,
    ``fits`` being 1 where the batch's KV fits the device."""
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
#: batch at or below B*, for extra rows to count as nearly free there.
FLAT_TOL = 1.25


def flat_verdict(numbers: Mapping[str, float]) -> Claim:
    """The claim "extra rows are nearly free until B*", on one measured curve
    (:func:`~batching.book.decode.live_numbers`), tested on the kernels batching uses: from
    ``base_batch`` (batch 2 where batch 1 ran a one-token kernel of its own, else batch 1) to
    ``test_batch`` (the largest swept batch at or below B*). HOLDS: the step there is within
    :data:`FLAT_TOL` of the roofline's ratio to ``base_batch``'s; PARTLY: it rises more, but
    some larger batch stays within :data:`KNEE_FACTOR` of ``base_batch``'s step;
    DOES_NOT_HOLD: none does."""
    # A curve without a kernel change (the GPU profiles) counts from batch 1, at B*.
    ratio = numbers.get("ratio_test", numbers["ratio_bstar"])
    pred = numbers.get("pred_ratio_test", numbers["pred_ratio_bstar"])
    base, knee_at = numbers.get("base_batch", 1.0), numbers.get("knee_base", numbers["knee"])
    if ratio <= FLAT_TOL * pred:
        return Claim.HOLDS
    return Claim.PARTLY if knee_at > base else Claim.DOES_NOT_HOLD
