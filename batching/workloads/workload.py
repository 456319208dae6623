"""Workloads: the requests a run serves, synthetic or replayed.

A :class:`Workload` is an immutable list of requests sorted by arrival, with a ``name`` and
an ``info`` dict recording where it came from (source, seed, scaling, capping). Synthetic
arrivals follow vLLM's ``bench serve`` (:func:`gamma_arrivals`); the named presets rebuild
the chapter's own examples.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Literal, overload

import numpy as np

from ..request import Request, RequestError
from ..validate import integer, number
from .errors import WorkloadError
from .lengths import LengthDist, LogNormal, _describe, as_length_dist, quantile_table, round_half_up

__all__ = [
    "WorkloadError",
    "Workload",
    "poisson_arrivals",
    "gamma_arrivals",
    "synthetic",
    "preset",
    "PRESETS",
]


class Workload:
    """Requests sorted by arrival, plus a ``name`` and provenance ``info``.

    A scheduler changes the requests it serves: give every run its own :meth:`fresh` list
    (built from the defining numbers, so pristine even after a run mutated :attr:`requests`).
    """

    __slots__ = ("_requests", "_rid", "_arrival", "_prompt", "_output", "_name", "_info")

    def __init__(
        self, requests: Iterable[Request], name: str = "workload", info: Mapping[str, object] | None = None
    ) -> None:
        reqs = list(requests)
        if not reqs:
            raise WorkloadError(f"empty workload {name!r}: it needs at least one request")
        seen: set[int] = set()
        prev = -math.inf
        for r in reqs:
            if not isinstance(r, Request):
                raise WorkloadError(f"workload {name!r}: {r!r} is not a Request")
            a = r.arrival
            # Request checks its arrival at construction, but fields are assignable.
            if not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
                raise WorkloadError(f"request {r.rid}: arrival={a!r} must be finite and >= 0")
            if a < prev:
                raise WorkloadError(
                    f"request {r.rid}: arrival={a!r} is earlier than the previous request's "
                    f"{prev!r}; a workload must be sorted by arrival"
                )
            prev = a
            if r.rid in seen:
                raise WorkloadError(f"request id {r.rid!r} appears twice in workload {name!r}")
            seen.add(r.rid)
        self._requests = tuple(reqs)
        self._rid = tuple(r.rid for r in reqs)
        self._arrival = np.array([r.arrival for r in reqs], dtype=np.float64)
        self._prompt = np.array([r.prompt_len for r in reqs], dtype=np.int64)
        self._output = np.array([r.output_len for r in reqs], dtype=np.int64)
        for arr in (self._arrival, self._prompt, self._output):
            arr.flags.writeable = False
        self._name = str(name)
        self._info = copy.deepcopy(dict(info or {}))

    @classmethod
    def from_arrays(
        cls,
        arrivals: Sequence[float] | np.ndarray,
        prompt_lens: Sequence[int] | np.ndarray,
        output_lens: Sequence[int] | np.ndarray,
        name: str = "workload",
        info: Mapping[str, object] | None = None,
        rids: Sequence[int] | None = None,
    ) -> Workload:
        """Build from parallel arrays; rids default to 0..n-1."""
        a = np.asarray(arrivals, dtype=np.float64)
        p = np.asarray(prompt_lens)
        o = np.asarray(output_lens)
        if not (len(a) == len(p) == len(o)):
            raise WorkloadError(
                f"arrays differ in length: arrivals {len(a)}, prompts {len(p)}, outputs {len(o)}"
            )
        ids = list(range(len(a))) if rids is None else list(rids)
        if len(ids) != len(a):
            raise WorkloadError(f"rids has {len(ids)} entries for {len(a)} requests")
        # tolist() gives Python ints/floats, which check_length requires (and is faster than .item()).
        reqs = [Request(*row) for row in zip(ids, a.tolist(), p.tolist(), o.tolist())]
        return cls(reqs, name=name, info=info)

    @property
    def name(self) -> str:
        return self._name

    @property
    def info(self) -> dict[str, object]:
        """Provenance; a copy, so that editing it cannot change the workload's record."""
        return copy.deepcopy(self._info)

    @property
    def requests(self) -> list[Request]:
        """The request objects (a new list each call). Runs should use :meth:`fresh`."""
        return list(self._requests)

    @property
    def rids(self) -> tuple[int, ...]:
        return self._rid

    @property
    def arrivals(self) -> np.ndarray:
        """Arrival times in seconds (read-only array)."""
        return self._arrival

    @property
    def prompt_lens(self) -> np.ndarray:
        return self._prompt

    @property
    def output_lens(self) -> np.ndarray:
        return self._output

    @property
    def total_prompt_tokens(self) -> int:
        return int(self._prompt.sum())

    @property
    def total_output_tokens(self) -> int:
        return int(self._output.sum())

    @property
    def duration(self) -> float:
        """Seconds from the first arrival to the last (0 when all arrive together)."""
        return float(self._arrival[-1] - self._arrival[0])

    def __len__(self) -> int:
        return len(self._requests)

    def __iter__(self) -> Iterator[Request]:
        return iter(self._requests)

    @overload
    def __getitem__(self, i: int) -> Request: ...
    @overload
    def __getitem__(self, i: slice) -> list[Request]: ...
    def __getitem__(self, i: int | slice) -> Request | list[Request]:
        if isinstance(i, slice):
            return list(self._requests[i])
        return self._requests[i]

    def __repr__(self) -> str:
        return (
            f"Workload({self._name!r}, {len(self)} requests, {self.duration:.1f} s, "
            f"{self.total_prompt_tokens} prompt + {self.total_output_tokens} output tokens)"
        )

    def fresh(self) -> list[Request]:
        """New Request objects with the same rid/arrival/lengths and no serving state."""
        return [
            Request(*row)
            for row in zip(self._rid, self._arrival.tolist(), self._prompt.tolist(), self._output.tolist())
        ]

    def _derive(
        self,
        arrivals: np.ndarray,
        prompts: np.ndarray,
        outputs: np.ndarray,
        info_update: Mapping[str, object],
    ) -> Workload:
        info = dict(self._info)
        info.update(info_update)
        return Workload.from_arrays(arrivals, prompts, outputs, name=self._name, info=info, rids=self._rid)

    def cap_to_context(
        self, max_context: int, mode: Literal["error", "cap"] = "error"
    ) -> tuple[Workload, int]:
        """Make every request fit ``prompt_len + output_len <= max_context``.

        ``mode="error"`` raises a :class:`RequestError` naming the first request that does
        not fit. ``mode="cap"`` shortens the prompt first (to >= 1 token), then the output;
        returns the workload and the number capped, also in ``info["capped"]``.
        """
        max_context = integer("max_context", max_context, 2, error=WorkloadError)
        if mode not in ("error", "cap"):
            raise WorkloadError(f"mode={mode!r}: must be 'error' or 'cap'")
        total = self._prompt + self._output
        over = np.flatnonzero(total > max_context)
        if mode == "error":
            if len(over):
                i = int(over[0])
                raise RequestError(
                    f"request {self._rid[i]}: prompt_len + output_len = {self._prompt[i]} + "
                    f"{self._output[i]} = {int(total[i])} exceeds max_context={max_context} "
                    f"({len(over)} request(s) too long; cap them: mode='cap', or --cap on the command line)"
                )
            return self, 0
        prompts = np.where(total > max_context, np.maximum(1, max_context - self._output), self._prompt)
        outputs = np.minimum(self._output, max_context - prompts)
        capped = {
            "max_context": max_context,
            "n_capped": int(len(over)),
            "n_output_capped": int((outputs < self._output).sum()),
            "prompt_tokens_removed": int((self._prompt - prompts).sum()),
            "output_tokens_removed": int((self._output - outputs).sum()),
            "rule": "prompt shortened first (>= 1 token), then output",
        }
        return self._derive(self._arrival, prompts, outputs, {"capped": capped}), int(len(over))

    def scale(self, lengths: float = 1, time: float = 1) -> Workload:
        """Divide token lengths by ``lengths`` (half-up, floor 1) and inter-arrival gaps by
        ``time``; the factors compose in ``info["scale_lengths"]`` / ``info["time_scale"]``."""
        k = number("lengths", lengths, above=True, error=WorkloadError)
        t = number("time", time, above=True, error=WorkloadError)
        a0 = self._arrival[0]
        arrivals = a0 + (self._arrival - a0) / t
        prompts = np.maximum(1, round_half_up(self._prompt / k))
        outputs = np.maximum(1, round_half_up(self._output / k))
        return self._derive(
            arrivals,
            prompts,
            outputs,
            {
                "scale_lengths": float(self._info.get("scale_lengths", 1.0)) * k,  # type: ignore[arg-type]
                "time_scale": float(self._info.get("time_scale", 1.0)) * t,  # type: ignore[arg-type]
            },
        )


def gamma_arrivals(n: int, rate: float, burstiness: float, rng: np.random.Generator) -> np.ndarray:
    """``n`` arrival times (s) from 0 with Gamma(burstiness, 1/(rate*burstiness)) gaps, as
    vLLM bench serve: mean rate ``rate``, gap CV ``1/sqrt(burstiness)`` (1: Poisson).
    ``rate=inf`` sends everything at t=0."""
    n = integer("n", n, 0, error=WorkloadError)
    rate = number("rate", rate, above=True, finite=False, error=WorkloadError)
    burstiness = number("burstiness", burstiness, above=True, error=WorkloadError)
    if math.isinf(rate) or n == 0:
        return np.zeros(n)
    gaps = rng.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=n - 1)
    # The first request goes at t=0 (vLLM sends before its first sleep); n-1 gaps follow.
    return np.concatenate(([0.0], np.cumsum(gaps)))


def poisson_arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    """Poisson arrivals at ``rate`` req/s starting at t=0."""
    return gamma_arrivals(n, rate, 1.0, rng)


def synthetic(
    n: int,
    rate: float,
    prompt: int | LengthDist,
    output: int | LengthDist,
    burstiness: float = 1.0,
    seed: int = 0,
    name: str | None = None,
) -> Workload:
    """A seeded synthetic workload: arrivals, prompt lengths, output lengths drawn in this
    order from ``np.random.default_rng(seed)``."""
    n = integer("n", n, 1, error=WorkloadError)
    p, o = as_length_dist(prompt, "prompt"), as_length_dist(output, "output")
    rng = np.random.default_rng(seed)
    arrivals = gamma_arrivals(n, rate, burstiness, rng)
    prompts = p.sample(n, rng)
    outputs = o.sample(n, rng)
    info = {
        "source": "synthetic",
        "seed": seed,
        "n": n,
        "rate": float(rate),
        "burstiness": float(burstiness),
        "prompt": _describe(p),
        "output": _describe(o),
    }
    return Workload.from_arrays(arrivals, prompts, outputs, name=name or f"synthetic-{n}", info=info)


#: Named workloads from the chapter, with a one-line description each.
PRESETS: dict[str, str] = {
    "padding-pair": "7.1: a 50-token prompt beside a 4,000-token prompt, both at t=0, 20 output tokens each",
    "first-finisher": "7.1: 32 requests at t=0 with 128-token prompts; request 0 wants 2,000 output tokens, 31 want 20",
    "chat-rag": "7.2/7.3: 80% chat (prompt ~300, output ~100, lognormal) + 20% RAG (prompt ~3,000, output <= 1,000), Poisson 4 req/s, n=500",
    "azure-conv-like": "every section: lengths from the Azure 2023 conv trace's quantiles, Poisson at its mean 5.53 req/s, n=500",
    "azure-code-like": "every section: lengths from the Azure 2023 code trace's quantiles, Poisson at its mean 2.57 req/s, n=500",
}

# The chat-rag mix; lengths chosen to match the chapter's description, not a measured trace.
_CHAT_PROMPT = LogNormal(median=300, sigma=0.8, lo=16, hi=2048)
_CHAT_OUTPUT = LogNormal(median=100, sigma=0.7, lo=4, hi=1000)
_RAG_PROMPT = LogNormal(median=3000, sigma=0.25, lo=1024, hi=6000)
_RAG_OUTPUT = LogNormal(median=300, sigma=0.6, lo=16, hi=1000)
_RAG_FRACTION = 0.2
_AZURE_RATES = {"azure-conv-like": ("azure-conv", 5.53), "azure-code-like": ("azure-code", 2.57)}


def preset(name: str, seed: int = 0, *, n: int | None = None, rate: float | None = None) -> Workload:
    """A named workload from :data:`PRESETS`; ``n`` and ``rate`` override the random
    presets' defaults (the two fixed ones refuse them)."""
    if name not in PRESETS:
        raise WorkloadError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}")
    info: dict[str, object] = {"source": "preset", "preset": name, "description": PRESETS[name]}
    if name in ("padding-pair", "first-finisher"):
        if n is not None or rate is not None:
            raise WorkloadError(f"preset {name!r} has a fixed size and arrival time; n/rate cannot be set")
        if name == "padding-pair":
            return Workload.from_arrays([0.0, 0.0], [50, 4000], [20, 20], name=name, info=info)
        return Workload.from_arrays(np.zeros(32), np.full(32, 128), [2000] + [20] * 31, name=name, info=info)
    if name == "chat-rag":
        n = integer("n", 500 if n is None else n, 1, error=WorkloadError)
        rate = 4.0 if rate is None else rate
        rng = np.random.default_rng(seed)
        arrivals = poisson_arrivals(n, rate, rng)
        is_rag = rng.random(n) < _RAG_FRACTION
        prompts = np.where(is_rag, _RAG_PROMPT.sample(n, rng), _CHAT_PROMPT.sample(n, rng))
        outputs = np.where(is_rag, _RAG_OUTPUT.sample(n, rng), _CHAT_OUTPUT.sample(n, rng))
        info.update(
            seed=seed,
            n=n,
            rate=float(rate),
            burstiness=1.0,
            rag_fraction=_RAG_FRACTION,
            n_rag=int(is_rag.sum()),
            chat={"prompt": repr(_CHAT_PROMPT), "output": repr(_CHAT_OUTPUT)},
            rag={"prompt": repr(_RAG_PROMPT), "output": repr(_RAG_OUTPUT)},
        )
        return Workload.from_arrays(arrivals, prompts, outputs, name=name, info=info)
    table, default_rate = _AZURE_RATES[name]
    w = synthetic(
        500 if n is None else n,
        default_rate if rate is None else rate,
        quantile_table(table, "prompt"),
        quantile_table(table, "output"),
        seed=seed,
        name=name,
    )
    info.update(w.info)
    info["source"] = "preset"
    info["table"] = str(Path("data") / "length_quantiles" / f"{table}.csv")
    # Sampling prompt and output independently loses their correlation in the real trace.
    info["note"] = "prompt and output drawn independently from the trace's marginal quantiles"
    return Workload.from_arrays(w.arrivals, w.prompt_lens, w.output_lens, name=name, info=info)
