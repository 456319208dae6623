"""A request that owns its serving state. The step completing its prefill emits its first
token, each decode step one more, so while it decodes the cache holds ``prompt + generated -
1`` tokens. Preempted (vLLM's recompute), it is prefilled again over prompt and generated
tokens (``prefill_target``), and completing that emits its next token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .validate import integer, number


class RequestError(ValueError):
    """A request (or a workload row) whose fields cannot be served."""


def check_length(name: str, value: object, rid: object = None) -> int:
    """``value`` as an int >= 1 (a whole float too), or raise naming the field and the value."""
    where = f" (request {rid})" if rid is not None else ""
    return integer(name, value, 1, error=RequestError, where=where, whole_floats=True)


@dataclass(eq=False)
class Request:
    """One request; ``arrival`` in seconds on the workload's clock. State changes only through
    the ``on_*`` methods, which re-check the invariants."""

    rid: int
    arrival: float
    prompt_len: int
    output_len: int
    # --- state, owned by the request and changed only by the on_* methods ---
    num_computed: int = field(default=0, init=False)  # tokens whose KV is in the cache
    generated: int = field(default=0, init=False)  # output tokens emitted so far
    prefill_target: int = field(default=0, init=False)  # tokens the current prefill must cover
    padding: int = field(default=0, init=False)  # static batching: pad tokens added to the prompt
    slot: int | None = field(default=None, init=False)  # batch row while admitted
    admit_time: float | None = field(default=None, init=False)  # first admission
    finish_time: float | None = field(default=None, init=False)
    preemptions: int = field(default=0, init=False)
    token_times: list[float] = field(default_factory=list, init=False, repr=False)
    token_ids: list[int] = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        self.prompt_len = check_length("prompt_len", self.prompt_len, self.rid)
        self.output_len = check_length("output_len", self.output_len, self.rid)
        self.arrival = number("arrival", self.arrival, 0, error=RequestError, where=f" (request {self.rid})")
        self.prefill_target = self.prompt_len
        self._check()

    @property
    def remaining_prefill(self) -> int:
        return self.prefill_target - self.num_computed

    @property
    def in_prefill(self) -> bool:
        return self.num_computed < self.prefill_target

    @property
    def remaining_output(self) -> int:
        return self.output_len - self.generated

    @property
    def done(self) -> bool:
        return self.generated == self.output_len

    @property
    def kv_tokens(self) -> int:
        """KV entries this request holds now (padding included)."""
        return self.num_computed + self.padding

    def on_admit(self, slot: int, now: float) -> None:
        assert self.slot is None, f"request {self.rid} admitted twice"
        assert now >= self.arrival, f"request {self.rid} admitted at {now} before arrival {self.arrival}"
        self.slot = slot
        if self.admit_time is None:
            self.admit_time = now

    def on_prefill(self, n: int, pad: int = 0) -> None:
        """Record ``n`` more prompt tokens computed (plus ``pad`` padding tokens beside them)."""
        assert 0 < n <= self.remaining_prefill, (self.rid, n, self.remaining_prefill)
        assert pad >= 0, (self.rid, pad)
        self.num_computed += n
        self.padding += pad

    def on_decode(self) -> None:
        """A decode step wrote the last emitted token's KV."""
        assert not self.in_prefill and not self.done, self.rid
        self.num_computed += 1

    def on_token(self, now: float, token_id: int | None = None) -> None:
        """Emit one output token at the end of the step that ends at ``now``."""
        assert not self.in_prefill and not self.done, self.rid
        assert not self.token_times or now >= self.token_times[-1], (self.rid, now)
        self.generated += 1
        self.token_times.append(now)
        if token_id is not None:
            self.token_ids.append(token_id)
        if self.done:
            self.finish_time = now
        self._check()

    def on_decode_run(self, times: list[float]) -> None:
        """``len(times)`` consecutive decode steps at once (the engine's fast path)."""
        k = len(times)
        # The invariants of _check, kept cheap: this is the simulator's hottest path.
        assert self.num_computed >= self.prefill_target and k <= self.output_len - self.generated, (
            self.rid,
            k,
        )
        assert times[0] >= self.token_times[-1], self.rid
        self.num_computed += k
        self.generated += k
        self.token_times.extend(times)
        if self.generated == self.output_len:
            self.finish_time = times[-1]

    def on_release(self) -> None:
        """Leave the batch (finished, or preempted)."""
        self.slot = None
        self.padding = 0

    def on_preempt(self) -> None:
        """Lose the KV cache; the next prefill recomputes prompt and generated tokens."""
        assert not self.done, self.rid
        self.on_release()
        self.num_computed = 0
        self.prefill_target = self.prompt_len + self.generated
        self.preemptions += 1
        self._check()

    def _check(self) -> None:
        assert (
            0 <= self.generated <= self.output_len
            and 0 <= self.num_computed <= self.prompt_len + self.output_len
            and self.prefill_target >= self.prompt_len
            and len(self.token_times) == self.generated
        ), self
        # While decoding, the cache holds everything but the newest token.
        assert (
            self.generated == 0
            or self.num_computed < self.prefill_target
            or self.num_computed == self.prompt_len + self.generated - 1
        ), self
