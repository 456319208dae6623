"""What one engine step does: a scheduler's :class:`StepPlan`, which an executor runs as one
forward pass; :class:`StepWork` is the plan reduced to what a cost model needs."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from .request import Request


@dataclass(frozen=True)
class PrefillChunk:
    """``n`` prompt tokens of ``req`` from position ``req.num_computed``, and ``pad`` padding
    tokens computed beside them (static batching): real work, thrown away."""

    req: Request
    n: int
    pad: int = 0
    # Whether this chunk finishes the prefill (and so emits a token); fixed when the plan
    # is made, since committing the step moves the request's counters.
    completes: bool = field(init=False)

    def __post_init__(self) -> None:
        assert 0 < self.n <= self.req.remaining_prefill and self.pad >= 0, (self.req.rid, self.n, self.pad)
        object.__setattr__(self, "completes", self.n == self.req.remaining_prefill)


@dataclass(frozen=True)
class StepPlan:
    """One forward pass. ``decodes`` each emit one token; ``dead`` are a static batch's
    finished rows, still computed, tokens discarded; ``steady`` how many identical
    decode-only steps could run before the scheduler's state changes; ``arrival_sensitive``:
    an arrival could change it.

    The plan carries its cost inputs (:meth:`work`), taken from its requests when it is
    made: committing the step moves those requests' counters, so reading them later would
    give the next step's. A plan is built whole and not changed afterwards.
    """

    prefills: list[PrefillChunk] = field(default_factory=list)
    decodes: list[Request] = field(default_factory=list)
    dead: list[Request] = field(default_factory=list)
    steady: int = 1
    arrival_sensitive: bool = True
    _work: StepWork = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_work", StepWork.of(self))

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
        """The step's cost inputs, as they were when the plan was made (the same before and
        after the step is committed)."""
        return self._work


@dataclass(frozen=True)
class StepWork:
    """A step reduced to what its cost depends on: ``prefill_attn`` (query, key) pairs of the
    prefill chunks' causal attention; ``decode_ctx`` KV tokens the decode rows read (each
    including the one it writes)."""

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

    @staticmethod
    def fresh(prompts: Sequence[int] = (), decodes: int = 0, ctx: int = 0) -> StepWork:
        """A step that prefills each of ``prompts`` from scratch (causal attention over
        itself) beside ``decodes`` decode rows holding ``ctx`` KV tokens each: the steps the
        pages price without a scheduler (a padded prefill, a decode batch at one context)."""
        return StepWork(
            prefill_tokens=sum(prompts),
            prefill_attn=sum(p * (p + 1) // 2 for p in prompts),
            decode_rows=decodes,
            decode_ctx=decodes * ctx,
        )

    @property
    def tokens(self) -> int:
        return self.prefill_tokens + self.decode_rows
