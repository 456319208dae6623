"""Chunked prefill (Sarathi-Serve, DeepSpeed's Dynamic SplitFuse): each step takes every
running decode, then fills the rest of ``token_budget`` with prefill chunks of at most
``chunk_size`` tokens, FCFS: part-way prefills first, then new admissions.
"""

from __future__ import annotations

import math

from ..plan import PrefillChunk, StepPlan
from ..validate import ConfigError, integer
from .base import Scheduler


class ChunkedPrefillScheduler(Scheduler):
    name = "chunked"

    def __init__(
        self,
        max_slots: int,
        max_context: int,
        token_budget: int = 512,
        chunk_size: int | None = None,
        kv_capacity: float = math.inf,
        kv_policy: str = "slab",
    ) -> None:
        super().__init__(max_slots, max_context, kv_capacity, kv_policy)
        self.token_budget = integer("token_budget", token_budget)
        self.chunk_size = integer("chunk_size", token_budget if chunk_size is None else chunk_size)
        if self.token_budget < self.max_slots:
            raise ConfigError(
                f"token_budget={token_budget} < max_slots={max_slots}: the decodes alone could exceed "
                f"the budget; use token_budget >= max_slots"
            )

    def config(self) -> dict:
        return {**super().config(), "token_budget": self.token_budget, "chunk_size": self.chunk_size}

    @property
    def max_step_prompt_tokens(self) -> int:
        """Decodes and chunks of one step share the token budget."""
        return self.token_budget

    def schedule(self, now: float) -> StepPlan | None:
        decodes = [r for r in self.running if not r.in_prefill]
        preempted = False
        if self.kv.policy == "exact":
            decodes, preempted = self._reserve_decodes(decodes)
        budget = self.token_budget - len(decodes)
        chunks: list[PrefillChunk] = []
        stalled = False
        # Requests already part-way through their prefill, in admission order.
        for r in list(self.running):
            if budget == 0:
                break
            if not r.in_prefill or r.slot is None:  # decoding, or preempted just now
                continue
            n = min(r.remaining_prefill, self.chunk_size, budget)
            # Under exact KV, make room by preempting newer requests (never older ones,
            # so the oldest prefill always progresses); failing that take what is free.
            while not self.kv.can_reserve(r, n) and self._newest(prefilling=True) is not r:
                self._preempt(self._newest(prefilling=True))
                preempted = True
            n = min(n, int(self.kv.free)) if not self.kv.can_reserve(r, n) else n
            if n == 0:
                stalled = True
                break
            self.kv.reserve(r, n)
            chunks.append(PrefillChunk(r, n))
            budget -= n
        # Then new admissions, FCFS; a request preempted in this step waits for the next.
        while not (preempted or stalled) and budget > 0 and self.waiting and self._free_slots:
            head = self.waiting[0]
            n = min(head.remaining_prefill, self.chunk_size, budget)
            if not self.kv.can_reserve(head, n):
                break
            self.waiting.popleft()
            self._admit(head, now, n)
            chunks.append(PrefillChunk(head, n))
            budget -= n
        if chunks:
            return StepPlan(prefills=chunks, decodes=decodes)
        return self._decode_plan(decodes, preempted)
