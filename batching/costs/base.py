"""What both cost models share: the memory reserve, and the plumbing that makes
``decode_run`` (k decode-only steps at once) return exactly the floats k ``step_time`` would."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np

from ..plan import StepWork
from .devices import DeviceSpec
from .models import ModelShape

#: Fraction of device memory kept for activations, CUDA graphs, the runtime and
#: fragmentation: the complement of vLLM's gpu_memory_utilization, whose default was 0.9 for
#: most of its releases (0.92 in vLLM 0.32.0, vllm/config/cache.py); the chapter keeps 0.9.
MEM_RESERVE = 0.10


@runtime_checkable
class CostModel(Protocol):
    """What a page, a metric or the simulator reads of a cost model (the roofline or a
    measured profile): the model and device it prices, how many devices, their peak and
    bandwidth summed, the KV they hold, and a step's time."""

    model: ModelShape
    device: DeviceSpec
    tp: int
    peak_flops: float
    bandwidth: float

    def kv_capacity(self) -> int: ...

    def step_time(self, work: StepWork) -> float: ...

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


class _VectorCost:
    """Shared plumbing: subclasses define ``_times`` on float64 arrays (elementwise only)."""

    model: ModelShape
    device: DeviceSpec
    tp: int = 1

    def usable_bytes(self) -> float:
        """Memory of the ``tp`` devices left after the reserve."""
        return self.tp * self.device.mem_bytes * (1 - MEM_RESERVE)

    def kv_capacity(self) -> int:
        """KV tokens that fit in the devices' usable memory after the weights."""
        free = self.usable_bytes() - self.model.weight_bytes
        return max(0, int(free // self.model.kv_bytes_per_token))

    def _times(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        raise NotImplementedError

    def step_time(self, work: StepWork) -> float:
        """Seconds for one step; 0.0 for a step that computes nothing."""
        # Python floats through the same expressions as the arrays of decode_run: the
        # same IEEE operations in the same order, so the same bits, at a tenth of the cost.
        return float(
            self._times(
                float(work.prefill_tokens),
                float(work.prefill_attn),
                float(work.decode_rows),
                float(work.decode_ctx),
            )
        )

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray:
        """Durations of ``k`` decode-only steps of ``rows`` rows, summed context ``ctx0 + j*growth``
        (``growth``: the live rows; a static batch's dead rows do not grow), bit-identical to
        ``step_time`` of each."""
        if k < 0 or rows < 0 or ctx0 < 0 or growth < 0:
            raise ValueError(
                f"decode_run(rows={rows}, ctx0={ctx0}, growth={growth}, k={k}): arguments must be >= 0"
            )
        ctx = (ctx0 + np.arange(k, dtype=np.int64) * growth).astype(np.float64)
        return self._decode_times(float(rows), ctx)

    def _decode_times(self, rows: float, ctx: np.ndarray) -> np.ndarray:
        zeros = np.zeros(len(ctx), dtype=np.float64)
        return self._times(zeros, zeros, np.full(len(ctx), rows), ctx)

    def flops(self, work: StepWork) -> float:
        """Model FLOPs of the step, all devices together (see ``ModelShape.flops``)."""
        return self.model.flops(work)

    def bytes_moved(self, work: StepWork) -> float:
        """Bytes the step moves, all devices together (see ``ModelShape.bytes_moved``)."""
        return self.model.bytes_moved(work)
