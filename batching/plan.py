"""What one engine step does: the contract between a scheduler and an executor.

A scheduler returns a :class:`StepPlan`; an executor (simulated clock or real model)
carries it out as *one* forward pass and reports how long it took. Nothing here touches
torch. :class:`StepWork` is the plan reduced to the numbers a cost model needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .request import Request


@dataclass(frozen=True)
class PrefillChunk:
    """``n`` prompt tokens of ``req`` at positions ``req.num_computed .. +n-1``.

    ``pad`` padding tokens are computed beside them (static batching pads every prompt
    to the batch's longest): real work, thrown away.
    """

    req: Request
    n: int
    pad: int = 0
    # Whether this chunk finishes the prefill (and so emits a token); fixed when the plan
    # is made, since committing the step moves the request's counters.
    completes: bool = field(init=False)

    def __post_init__(self) -> None:
        assert 0 < self.n <= self.req.remaining_prefill and self.pad >= 0, (self.req.rid, self.n, self.pad)
        object.__setattr__(self, "completes", self.n == self.req.remaining_prefill)


@dataclass
class StepPlan:
    """One forward pass.

    ``decodes`` each process their newest token and emit one more. ``dead`` are rows of a
    static batch whose request has already finished: the dense batch still computes them
    and the tokens are discarded. ``slots`` is the batch capacity the step is measured
    against (slot utilization). ``steady`` is how many identical decode-only steps the
    scheduler could run back to back before its own state changes (a member finishes);
    ``arrival_sensitive`` says whether a new arrival could change the next plan.
    """

    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    dead: list[Request] = field(default_factory=list)
    slots: int = 1
    steady: int = 1
    arrival_sensitive: bool = True
    _work: StepWork | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def is_decode_only(self) -> bool:
        return not self.prefills

    @property
    def num_tokens(self) -> int:
        """Tokens in the forward pass (the token budget's unit): padding and dead rows included."""
        return sum(c.n + c.pad for c in self.prefills) + len(self.decodes) + len(self.dead)

    @property
    def emitting(self) -> list[Request]:
        """Requests that get a token from this step."""
        return [c.req for c in self.prefills if c.completes] + list(self.decodes)

    def work(self) -> StepWork:
        """The step's cost inputs, computed once (before the step is committed)."""
        if self._work is None:
            self._work = StepWork.of(self)
        return self._work


@dataclass(frozen=True)
class StepWork:
    """A step reduced to what its cost depends on (see ``costs.py``).

    ``prefill_attn`` counts (query, key) pairs of causal attention over the prefill
    chunks; ``decode_ctx`` is the number of cached KV tokens the decode rows read
    (including the token each writes).
    """

    prefill_tokens: int = 0
    prefill_attn: int = 0
    decode_rows: int = 0
    decode_ctx: int = 0

    @staticmethod
    def of(plan: StepPlan) -> StepWork:
        p_tok = p_attn = 0
        for c in plan.prefills:
            n = c.n + c.pad
            start = c.req.kv_tokens
            p_tok += n
            p_attn += n * start + n * (n + 1) // 2
        rows = plan.decodes + plan.dead
        return StepWork(p_tok, p_attn, len(rows), sum(r.kv_tokens + 1 for r in rows))

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_rows
