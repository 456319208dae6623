"""Dynamic batching: the free executor takes up to ``batch_size`` waiting requests once that
many wait or the oldest has waited ``max_wait``; then it is a static batch.
"""

from __future__ import annotations

import math

from ..request import Request
from ..validate import number
from .static import DenseBatchScheduler


class DynamicScheduler(DenseBatchScheduler):
    name = "dynamic"

    def __init__(
        self,
        batch_size: int,
        max_context: int,
        max_wait: float = 0.0,
        kv_capacity: float = math.inf,
        kv_policy: str = "slab",
    ) -> None:
        super().__init__(batch_size, max_context, kv_capacity, kv_policy)
        self.max_wait = number("max_wait", max_wait, unit="seconds")

    def config(self) -> dict:
        return {**super().config(), "max_wait": self.max_wait}

    def _next_batch(self, now: float) -> list[Request]:
        w = self.waiting
        if len(w) >= self.max_slots or (w and w[0].arrival + self.max_wait <= now):
            batch = [w.popleft()]
            # FCFS: stop at the first request the dense batch cannot pad to.
            while w and len(batch) < self.max_slots and self.fits_beside(batch, w[0]):
                batch.append(w.popleft())
            return batch
        return []

    def wakeup(self) -> float | None:
        return self.waiting[0].arrival + self.max_wait if self.waiting and not self.batch else None
