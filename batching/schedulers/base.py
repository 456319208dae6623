"""What every scheduler shares: a waiting queue, slots, KV accounting, commit, preemption.
``schedule(now)`` returns a :class:`~batching.plan.StepPlan` (None: nothing until an arrival
or ``wakeup()``); ``commit`` applies the executed step."""

from __future__ import annotations

import heapq
import math
from collections import deque
from collections.abc import Sequence

from ..kv import KVCache
from ..plan import StepPlan
from ..request import Request, RequestError
from ..steplog import SchedulerState
from ..validate import integer


class Scheduler:
    """Base class. Subclasses implement ``schedule`` (and may override ``wakeup``)."""

    name = "base"

    def __init__(
        self, max_slots: int, max_context: int, kv_capacity: float = math.inf, kv_policy: str = "slab"
    ) -> None:
        self.max_slots = integer("max_slots", max_slots)
        self.kv = KVCache(kv_capacity, kv_policy, integer("max_context", max_context))
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []  # holding a slot, in admission order
        self._free_slots = list(range(self.max_slots))  # a heap: the lowest free row first
        self.preemptions = 0
        self.num_finished = 0

    def config(self) -> dict:
        return {
            "scheduler": self.name,
            "max_slots": self.max_slots,
            "max_context": self.kv.max_context,
            "kv_capacity": None if self.kv.capacity == math.inf else self.kv.capacity,  # None: unlimited
            "kv_policy": self.kv.policy,
        }

    def validate(self, req: Request) -> None:
        """Refuse up front a request that could never run (never leave it waiting forever)."""
        total = req.prompt_len + req.output_len
        if total > self.kv.max_context:
            raise RequestError(
                f"request {req.rid}: prompt_len={req.prompt_len} + output_len={req.output_len} = {total} "
                f"exceeds the model's max_context={self.kv.max_context} (cap the workload to the context)"
            )
        if not self.kv.fits_alone(total):
            raise RequestError(
                f"request {req.rid}: needs {total} KV tokens, more than the kv capacity={self.kv.capacity}"
            )

    def on_arrival(self, req: Request) -> None:
        self.waiting.append(req)

    def schedule(self, now: float) -> StepPlan | None:
        raise NotImplementedError

    def wakeup(self) -> float | None:
        """The earliest time at which ``schedule`` may return work without a new arrival."""
        return None

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    @property
    def num_waiting(self) -> int:
        """Requests that arrived and hold no slot yet, in whatever queues the scheduler keeps."""
        return len(self.waiting)

    def snapshot(self, plan: StepPlan | None = None) -> SchedulerState:
        """Queue and KV now; given the ``plan`` just scheduled, during that step: KV used then
        counts the tokens the step writes (its prefill chunks with their padding, one per decode)."""
        written = 0 if plan is None else plan.work().prefill_tokens + len(plan.decodes)
        return SchedulerState(self.num_waiting, len(self.running), self.kv.reserved, self.kv.used + written)

    @property
    def max_step_prompt_tokens(self) -> int:
        """The most prompt positions one step can carry (the real executor's warm-up): a
        full-context prompt in every slot."""
        return self.max_slots * self.kv.max_context

    def commit(self, plan: StepPlan, now: float, token_ids: dict[int, int] | None = None) -> None:
        """Apply one executed step that ended at ``now``."""
        for c in plan.prefills:
            c.req.on_prefill(c.n, c.pad)
            if c.completes:
                c.req.on_token(now, token_ids.get(c.req.rid) if token_ids else None)
        if token_ids:
            for r in plan.decodes:
                r.on_decode()
                r.on_token(now, token_ids.get(r.rid))
        else:
            step = [now]
            for r in plan.decodes:  # one decode step each, checked as cheaply as a fast run
                r.on_decode_run(step)
        self._retire(plan.emitting)

    def commit_run(self, plan: StepPlan, ends: Sequence[float]) -> None:
        """Apply ``len(ends)`` identical decode-only steps (the engine's fast path)."""
        k = len(ends)
        assert plan.is_decode_only and 1 <= k <= plan.steady, (k, plan.steady)
        if self.kv.policy == "exact" and k > 1:
            for r in plan.decodes:  # the first step's token was reserved by schedule()
                self.kv.reserve(r, k - 1)
        times = list(ends)
        for r in plan.decodes:
            r.on_decode_run(times)
        self._retire(plan.decodes)

    def _retire(self, emitted: list[Request]) -> None:
        """Free the slots and KV of requests that finished (static batching overrides)."""
        for r in emitted:
            if r.done:
                self._release(r)
                self.num_finished += 1

    def _admit(self, req: Request, now: float, new_tokens: int) -> None:
        assert self._free_slots, "no free slot"
        self.kv.reserve(req, new_tokens)
        req.on_admit(heapq.heappop(self._free_slots), now)
        self.running.append(req)

    def _release(self, req: Request) -> None:
        assert req.slot is not None, f"request {req.rid} released without a slot"
        heapq.heappush(self._free_slots, req.slot)
        self.running.remove(req)
        self.kv.free_request(req)
        req.on_release()

    def _newest(self, prefilling: bool = False) -> Request:
        """Preemption's victim, the one rule for every scheduler: the newest running request
        (``prefilling``: the newest still in its prefill), so that the oldest always progress."""
        if prefilling:
            return next(v for v in reversed(self.running) if v.in_prefill)
        return self.running[-1]

    def _preempt(self, req: Request) -> None:
        """vLLM's recompute preemption: free everything, go back to the front of the queue."""
        self._release(req)
        req.on_preempt()
        self.waiting.appendleft(req)
        self.preemptions += 1

    def _reserve_decodes(self, decodes: list[Request]) -> tuple[list[Request], bool]:
        """Reserve one KV token per decode, oldest first, preempting the newest when full;
        the decodes that keep running, and whether anything was preempted."""
        if self.kv.reserve_each(decodes, 1):
            return list(decodes), False
        kept: list[Request] = []
        preempted = False
        queue = deque(decodes)
        while queue:
            r = queue.popleft()
            while not self.kv.can_reserve(r, 1):
                victim = self._newest()
                self._preempt(victim)
                preempted = True
                if victim is r:
                    break
                if victim in queue:
                    queue.remove(victim)
            else:
                self.kv.reserve(r, 1)
                kept.append(r)
        return kept, preempted

    def _decode_plan(self, decodes: list[Request], preempted: bool) -> StepPlan | None:
        """A decode-only step of ``decodes`` (None if there are none). After a preemption the
        freed KV may admit the queue head next step, so such a step is not steady."""
        if not decodes:
            return None
        return StepPlan(
            decodes=decodes,
            steady=1 if preempted else self._steady(decodes),
            arrival_sensitive=not self.waiting and bool(self._free_slots),
        )

    def _steady(self, decodes: list[Request]) -> int:
        """How many identical decode-only steps can run before this state changes."""
        k = min(r.remaining_output for r in decodes)
        if self.kv.policy == "exact" and math.isfinite(self.kv.free):
            # Steps after the first reserve one token per decode each; stop before a preemption.
            k = min(k, 1 + int(self.kv.free // len(decodes)))
        return max(k, 1)

    def check_idle(self) -> None:
        """Leak check after a run: no queue, no slot, no KV held."""
        assert not self.waiting and not self.running, (len(self.waiting), len(self.running))
        assert len(self._free_slots) == self.max_slots, "slot leak"
        self.kv.check_empty()
