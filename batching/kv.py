"""KV-cache capacity accounting in tokens: ``slab`` reserves the model's whole context per
admitted request, ``exact`` only the tokens it holds, growing step by step. Check-then-act:
``can_reserve`` before ``reserve``. Only counts; the real engine's tensors live elsewhere.
"""

from __future__ import annotations

import math

from .request import Request
from .validate import ConfigError, integer

POLICIES = ("slab", "exact")


class KVCache:
    def __init__(self, capacity: float, policy: str, max_context: int) -> None:
        if policy not in POLICIES:
            raise ConfigError(f"kv policy={policy!r}: must be one of {', '.join(POLICIES)}")
        max_context = integer("max_context", max_context)
        if not (capacity == math.inf or (isinstance(capacity, int) and capacity >= 1)):
            raise ConfigError(f"kv capacity={capacity!r}: must be an integer number of tokens >= 1 (or inf)")
        if policy == "slab" and capacity < max_context:
            raise ConfigError(
                f"kv capacity={capacity} tokens cannot hold one slab of max_context={max_context}"
            )
        self.capacity = capacity
        self.policy = policy
        self.max_context = max_context
        self.reserved = 0
        self._held: dict[int, int] = {}  # rid -> tokens reserved
        self._reqs: dict[int, Request] = {}

    @property
    def free(self) -> float:
        return self.capacity - self.reserved

    @property
    def used(self) -> int:
        """KV tokens actually written by the holders (what ``exact`` would need)."""
        return sum(r.kv_tokens for r in self._reqs.values())

    @property
    def num_holders(self) -> int:
        return len(self._held)

    def need(self, req: Request, new_tokens: int) -> int:
        """Extra tokens to reserve so that ``req`` can add ``new_tokens`` KV entries."""
        if self.policy == "slab":
            return 0 if req.rid in self._held else self.max_context
        return new_tokens

    def fits_alone(self, total_tokens: int) -> bool:
        """Whether a request needing ``total_tokens`` could ever run (empty cache)."""
        return (self.max_context if self.policy == "slab" else total_tokens) <= self.capacity

    def can_reserve(self, req: Request, new_tokens: int) -> bool:
        return self.need(req, new_tokens) <= self.free

    def reserve(self, req: Request, new_tokens: int) -> None:
        n = self.need(req, new_tokens)
        assert n <= self.free, f"KV overflow: request {req.rid} needs {n}, free {self.free}"
        assert req.kv_tokens + new_tokens <= self.max_context, (req.rid, req.kv_tokens, new_tokens)
        self._held[req.rid] = self._held.get(req.rid, 0) + n
        self._reqs[req.rid] = req
        self.reserved += n

    def reserve_each(self, reqs: list[Request], new_tokens: int) -> bool:
        """``reserve(r, new_tokens)`` for every one of ``reqs``, if all of them fit at once;
        else nothing, and False (the caller then goes one by one, preempting). One check for
        the batch instead of one per row: a scheduler reserves every running decode each step."""
        held, slab = self._held, self.policy == "slab"
        fresh = [r for r in reqs if r.rid not in held] if slab else reqs
        per_row = self.max_context if slab else new_tokens
        need = per_row * len(fresh)
        if need > self.free:
            return False
        limit = self.max_context - new_tokens
        for r in reqs:
            assert r.kv_tokens <= limit, (r.rid, r.kv_tokens, new_tokens)
        for r in fresh:  # a slab already held needs nothing more
            held[r.rid] = held.get(r.rid, 0) + per_row
            self._reqs[r.rid] = r
        self.reserved += need
        return True

    def free_request(self, req: Request) -> None:
        self.reserved -= self._held.pop(req.rid)
        del self._reqs[req.rid]

    def check_empty(self) -> None:
        """Leak check: after a run nothing may stay reserved."""
        assert self.reserved == 0 and not self._held, (
            f"KV leak: {self.reserved} tokens held by {list(self._held)}"
        )
