"""The roofline cost model: a step's time from the model's FLOPs and bytes and the device's
datasheet peak and bandwidth (tensor parallelism with ring all-reduces)."""

from __future__ import annotations

from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from ..plan import StepWork
from .base import MEM_RESERVE, _VectorCost
from .devices import DeviceSpec
from .models import ModelShape


def bstar(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """B* = peak x bytes per weight / (2 x bandwidth): the batch at which a decode step's
    2 FLOPs per weight per row take as long as streaming the weights once."""
    if not (peak_flops > 0 and bandwidth > 0 and bytes_per_param > 0):
        raise ValueError(f"peak={peak_flops}, bandwidth={bandwidth}, bytes={bytes_per_param}: must be > 0")
    return float(peak_flops * bytes_per_param / (2.0 * bandwidth))


def decode_curve(
    shape: ModelShape,
    batches: ArrayLike,
    ctx: int,
    bandwidth: float,
    peak_flops: float,
    overhead_s: float = 0.0,
    points: int = 0,
) -> dict[str, np.ndarray]:
    """The roofline of one decode step of ``b`` rows of ``ctx`` KV tokens each on one device
    of ``bandwidth`` and ``peak_flops``, at each of ``batches`` (or, with ``points`` > 1, that
    many batches spread geometrically over them): a measured device's rates or a datasheet's
    (:meth:`RooflineCost.curve`).

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


class RooflineCost(_VectorCost):
    """Roofline step time, tensor-parallel over ``tp`` identical devices: per device
    max(bytes / bandwidth, FLOPs / peak) + step overhead, plus for ``tp > 1`` two ring
    all-reduces per layer of the step's activations (2(tp-1)/tp x bytes / link + latency,
    not overlapped). Refuses weights + ``kv_capacity_tokens`` of KV that do not fit.
    ``dtype`` re-stores the weights (``'fp8'`` for 70B on one H200).
    """

    def __init__(
        self,
        model: ModelShape,
        device: DeviceSpec,
        tp: int = 1,
        dtype: str | None = None,
        kv_capacity_tokens: int = 0,
    ) -> None:
        if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
            raise ValueError(f"tp={tp!r} must be a positive integer")
        if tp > 1 and (model.heads % tp or model.kv_heads % tp):
            raise ValueError(
                f"tp={tp} must divide {model.name}'s {model.heads} heads and {model.kv_heads} KV heads"
            )
        if tp > 1 and device.link_bandwidth <= 0:
            raise ValueError(f"{device.name} has no tensor-parallel interconnect: use tp=1")
        self.model = model if dtype is None else model.with_dtype(dtype)
        self.device = device
        self.tp = tp
        self.device_peak = device.peak(self.model.dtype)
        self.peak_flops = tp * self.device_peak
        self.bandwidth = tp * device.bandwidth
        self._check_fits(kv_capacity_tokens)

    def _check_fits(self, kv_tokens: int) -> None:
        m, need = self.model, self.model.weight_bytes + kv_tokens * self.model.kv_bytes_per_token
        have = self.usable_bytes()
        if need <= have:
            return
        what = "of weights" + (f" + {kv_tokens} KV tokens" if kv_tokens else "")
        hints = []
        for tp in (2, 4, 8):
            if tp > self.tp and m.heads % tp == 0 and m.kv_heads % tp == 0 and need <= have / self.tp * tp:
                hints.append(f"tp >= {tp}")
                break
        fp8 = m.with_dtype("fp8")
        if (
            m.dtype != "fp8"
            and "fp8" in self.device.peak_flops
            and fp8.weight_bytes + kv_tokens * fp8.kv_bytes_per_token <= have
        ):
            hints.append("fp8")
        raise ValueError(
            f"{m.name} {m.dtype} needs {need / 1e9:.1f} GB {what}, {self.tp} x "
            f"{self.device.name} has {have / 1e9:.1f} GB usable "
            f"({1 - MEM_RESERVE:.0%} of memory)" + (f": use {' or '.join(hints)}" if hints else "")
        )

    def bstar(self) -> float:
        """Batch where decode turns compute-bound: peak x bytes per weight / (2 x bandwidth)."""
        return bstar(self.device_peak, self.device.bandwidth, self.model.bytes_per_param)

    def curve(self, batches: ArrayLike, ctx: int, points: int = 0) -> dict[str, np.ndarray]:
        """:func:`decode_curve` of this model on one of these devices, step overhead included."""
        if self.tp != 1:
            raise ValueError(f"curve() is the single-device roofline: tp is {self.tp}")
        return decode_curve(
            self.model, batches, ctx, self.bandwidth, self.peak_flops, self.device.step_overhead_s, points
        )

    def decode_step(self, batch: int = 1, ctx: int = 1) -> float:
        """Seconds of one decode step of ``batch`` rows with ``ctx`` KV tokens each (quick checks)."""
        return self.step_time(StepWork(decode_rows=batch, decode_ctx=batch * ctx))

    def _parts(
        self, pt: np.ndarray, pa: np.ndarray, rows: np.ndarray, ctx: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Per-device memory time, compute time, and all-reduce time of steps."""
        m, d, tp = self.model, self.device, float(self.tp)
        mem_s = m.bytes_arrays(pt, pa, rows, ctx) / tp / d.bandwidth
        cmp_s = m.flops_arrays(pt, pa, rows, ctx) / tp / self.device_peak
        comm_s = 0.0 * mem_s
        if self.tp > 1:
            act = 4.0 if m.dtype == "fp32" else 2.0
            one = (
                2.0 * (tp - 1.0) / tp * ((pt + rows) * float(m.hidden) * act) / d.link_bandwidth
                + d.allreduce_latency_s
            )
            comm_s = comm_s + 2.0 * m.layers * one
        return mem_s, cmp_s, comm_s

    def _decode_times(self, rows: float, ctx: np.ndarray) -> np.ndarray:
        # Only the context varies along a decode run: the rest stays Python floats, and
        # numpy broadcasts them through the same expressions (same operations, same bits).
        return np.asarray(self._times(0.0, 0.0, rows, ctx), dtype=np.float64)

    def _times(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        """Step times for float64 arrays or Python floats (see ``step_time``)."""
        mem_s, cmp_s, comm_s = self._parts(pt, pa, rows, ctx)
        if isinstance(mem_s, float):
            t = max(mem_s, cmp_s) + self.device.step_overhead_s + comm_s
            return t if pt + rows > 0 else 0.0
        t = np.maximum(mem_s, cmp_s) + self.device.step_overhead_s + comm_s
        return np.where((pt + rows) > 0, t, 0.0)

    def terms(self, work: StepWork) -> dict[str, float | str]:
        """The step time's parts in seconds and which roof binds ("Why batching" figures)."""
        one = [
            np.array([v], dtype=np.float64)
            for v in (work.prefill_tokens, work.prefill_attn, work.decode_rows, work.decode_ctx)
        ]
        mem_s, cmp_s, comm_s = (float(x[0]) for x in self._parts(*one))
        return {
            "memory_s": mem_s,
            "compute_s": cmp_s,
            "allreduce_s": comm_s,
            "overhead_s": self.device.step_overhead_s,
            "bound": "memory" if mem_s >= cmp_s else "compute",
        }

    def describe(self) -> dict[str, Any]:
        m, d = self.model, self.device
        return {
            "kind": "roofline",
            "model": m.name,
            "dtype": m.dtype,
            "kv_dtype": m.kv_dtype,
            "device": d.name,
            "tp": self.tp,
            "params": m.params,
            "weight_bytes": m.weight_bytes,
            "device_bandwidth": d.bandwidth,
            "device_peak_flops": self.device_peak,
            "step_overhead_s": d.step_overhead_s,
            "link_bandwidth": d.link_bandwidth,
            "allreduce_latency_s": d.allreduce_latency_s,
            "mem_reserve": MEM_RESERVE,
            "kv_capacity_tokens": self.kv_capacity(),
            "bstar": self.bstar(),
            "device_source": d.source,
        }
