"""Continuous batching (Orca, vLLM, TGI): every step, waiting requests take the free slots
FCFS within the KV capacity, and a new prompt is prefilled whole, ``mixed`` into the decodes'
pass or ``separate`` in a prefill-only step that pauses them (early vLLM).
"""

from __future__ import annotations

import math

from ..plan import PrefillChunk, StepPlan
from ..validate import ConfigError
from .base import Scheduler

PREFILL_MODES = ("mixed", "separate")


class ContinuousScheduler(Scheduler):
    name = "continuous"

    def __init__(
        self,
        max_slots: int,
        max_context: int,
        prefill_mode: str = "mixed",
        kv_capacity: float = math.inf,
        kv_policy: str = "slab",
    ) -> None:
        super().__init__(max_slots, max_context, kv_capacity, kv_policy)
        if prefill_mode not in PREFILL_MODES:
            raise ConfigError(f"prefill_mode={prefill_mode!r}: must be one of {', '.join(PREFILL_MODES)}")
        self.prefill_mode = prefill_mode

    def config(self) -> dict:
        return {**super().config(), "prefill_mode": self.prefill_mode}

    def _admit_waiting(self, now: float) -> list[PrefillChunk]:
        """FCFS: admit from the head while a slot and the KV for the whole prompt are free."""
        new: list[PrefillChunk] = []
        while self.waiting and self._free_slots:
            head = self.waiting[0]
            if not self.kv.can_reserve(head, head.remaining_prefill):
                break  # no skipping ahead of the head: FCFS, so nobody starves
            self.waiting.popleft()
            self._admit(head, now, head.remaining_prefill)
            new.append(PrefillChunk(head, head.remaining_prefill))
        return new

    def schedule(self, now: float) -> StepPlan | None:
        decodes = [r for r in self.running if not r.in_prefill]
        if self.prefill_mode == "separate" and (new := self._admit_waiting(now)):
            return StepPlan(prefills=new)
        preempted = False
        if self.kv.policy == "exact":
            decodes, preempted = self._reserve_decodes(decodes)
        # A request preempted in this step is not re-admitted in the same step.
        if self.prefill_mode == "mixed" and not preempted and (new := self._admit_waiting(now)):
            return StepPlan(prefills=new, decodes=decodes)
        return self._decode_plan(decodes, preempted)
