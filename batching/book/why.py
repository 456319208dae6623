"""Why batching (chapters/why.ipynb): the roofline of one decode step, B*, the knee of a
measured step-time curve, and the verdict on "extra rows are nearly free until B*"."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..costs import RooflineCost, get_cost_model
from ..costs.base import MEM_RESERVE
from .common import roofline_numbers

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
    {device name: {"bstar", "kv_capacity", "ctx": {ctx: RooflineCost.curve(...) + "fits"}}}}``,
    ``fits`` being 1 where the batch's KV fits the device."""

    out: dict[str, Any] = {"model": model, "devices": {}}
    for dev in devices:
        cost = get_cost_model(model, dev)
        assert isinstance(cost, RooflineCost), "a named device gives a roofline cost model"
        out["dtype"] = cost.model.dtype
        per: dict[int, dict[str, np.ndarray]] = {}
        for c in ctxs:
            cur = cost.curve(batches, c)
            cur["fits"] = (cur["batch"] * c <= cost.kv_capacity()).astype(float)
            per[int(c)] = cur
        out["devices"][cost.device.name] = {
            "bstar": float(cost.bstar()),
            "kv_capacity": float(cost.kv_capacity()),
            "ctx": per,
        }
    return out
