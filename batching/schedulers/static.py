"""Static batching: collect B requests or time out, pad to the longest prompt, and decode
until the longest member ends, finished members' rows still computed (``StepPlan.dead``).
"""

from __future__ import annotations

import math
from collections import deque

from ..plan import PrefillChunk, StepPlan
from ..request import Request
from ..validate import ConfigError, integer, number
from .base import Scheduler


class DenseBatchScheduler(Scheduler):
    """A dense batch of up to ``batch_size`` rows, from padded prefill to its longest member;
    subclasses decide when a batch is formed (``_next_batch``)."""

    def __init__(
        self, batch_size: int, max_context: int, kv_capacity: float = math.inf, kv_policy: str = "slab"
    ) -> None:
        super().__init__(integer("batch_size", batch_size), max_context, kv_capacity, kv_policy)
        # The dense cache is [batch_size, max_context]: refuse a batch the KV budget can't hold.
        if batch_size * max_context > kv_capacity:
            raise ConfigError(
                f"batch_size={batch_size} x max_context={max_context} = {batch_size * max_context} KV tokens "
                f"exceeds kv capacity={kv_capacity}: a static batch reserves its dense cache up front"
            )
        self.batch: list[Request] = []

    def config(self) -> dict:
        return {**super().config(), "batch_size": self.max_slots}

    def _next_batch(self, now: float) -> list[Request]:
        raise NotImplementedError

    def fits_beside(self, members: list[Request], req: Request) -> bool:
        """Whether ``req`` can join ``members`` in one dense batch: the longest prompt plus the
        longest output must fit the context."""
        longest = max([m.prefill_target for m in members] + [req.prefill_target])
        most = max([m.output_len for m in members] + [req.output_len])
        return longest + most <= self.kv.max_context

    def schedule(self, now: float) -> StepPlan | None:
        if self.batch:
            live = [r for r in self.batch if not r.done]
            dead = [r for r in self.batch if r.done]
            for r in live:  # capacity was checked for the whole dense batch at construction
                self.kv.reserve(r, 1)
            return StepPlan(
                decodes=live,
                dead=dead,
                steady=self._steady(live),
                arrival_sensitive=False,
            )
        members = self._next_batch(now)
        if not members:
            return None
        longest = max(r.prefill_target for r in members)
        for r in members:
            self._admit(r, now, longest)
        self.batch = members
        return StepPlan(
            prefills=[PrefillChunk(r, r.prefill_target, longest - r.prefill_target) for r in members],
            arrival_sensitive=False,
        )

    def _retire(self, emitted: list[Request]) -> None:
        # Finished members keep their row (and KV) until the whole batch is done.
        if all(r.done for r in self.batch):
            for r in self.batch:
                self._release(r)
            self.num_finished += len(self.batch)
            self.batch = []

    @property
    def has_work(self) -> bool:
        return bool(self.batch) or super().has_work


class StaticScheduler(DenseBatchScheduler):
    """Batches are sealed when they hold ``batch_size`` requests or the oldest has waited
    ``max_wait`` seconds (its timeout); a sealed batch waits for the executor, and later arrivals go to
    the next batch."""

    name = "static"

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
        self.forming: list[Request] = []
        self.sealed: deque[list[Request]] = deque()

    def config(self) -> dict:
        return {**super().config(), "max_wait": self.max_wait}

    def _seal_due(self, t: float, strict: bool = False) -> None:
        if not self.forming:
            return
        due = self.forming[0].arrival + self.max_wait
        if due < t if strict else due <= t:
            self.sealed.append(self.forming)
            self.forming = []

    def on_arrival(self, req: Request) -> None:
        # A timeout that expired before this arrival seals without it; one expiring at the
        # same instant fires after it (the engine delivers arrivals first, then schedules).
        self._seal_due(req.arrival, strict=True)
        if self.forming and not self.fits_beside(self.forming, req):
            self.sealed.append(self.forming)  # the batch cannot pad to this prompt: seal it now
            self.forming = []
        self.forming.append(req)
        if len(self.forming) == self.max_slots:
            self.sealed.append(self.forming)
            self.forming = []

    def _next_batch(self, now: float) -> list[Request]:
        self._seal_due(now)
        return self.sealed.popleft() if self.sealed else []

    def wakeup(self) -> float | None:
        return self.forming[0].arrival + self.max_wait if self.forming else None

    @property
    def has_work(self) -> bool:
        return bool(self.forming or self.sealed) or super().has_work

    @property
    def num_waiting(self) -> int:
        """Static batching queues in the forming batch and the sealed ones, never in ``waiting``."""
        return len(self.forming) + sum(len(b) for b in self.sealed)
