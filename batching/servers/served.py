"""Results files of runs measured on a server (replayed traces, imported ``vllm bench serve``).

A client sees only when each streamed token arrived and the reported ``usage``: the step-log
fields are ``None`` (never 0: not measured), ``queue`` too; the rest is
:mod:`batching.results`' schema. A request that failed, timed out or does not match the
workload keeps its record with its ``status`` and ``error``; the summary counts it and leaves
it out of latencies and throughput (a shorter output would lower every latency).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..metrics import SLO, _dist, goodput
from ..results import SCHEMA, run_meta

# Request outcomes; every one but "ok" is counted in the summary and printed.
STATUSES = ("ok", "usage_mismatch", "stream_mismatch", "error", "timeout", "cancelled")

# Summary fields that need the server's step log: not measurable from a client.
_STEP_FIELDS = (
    "busy_s",
    "steps",
    "slot_utilization",
    "slot_utilization_time_weighted",
    "padding_fraction",
    "preemptions",
    "kv_reserved_peak",
    "kv_used_peak",
    "kv_reserved_mean",
    "kv_used_mean",
    "hw_compute_utilization",
    "hw_bandwidth_utilization",
)


@dataclass
class ServedRequest:
    """One request as a client saw it; times in seconds on the workload's clock."""

    rid: int
    arrival: float  # scheduled arrival
    prompt_len: int  # what the workload asked for
    output_len: int
    sent: float | None = None  # when the client actually sent it (None: never sent)
    token_times: list[float] = field(default_factory=list)  # one per output token
    usage_prompt: int | None = None  # what the server reported
    usage_output: int | None = None
    status: str = "cancelled"
    error: str | None = None

    def record(self, include_token_times: bool) -> dict[str, Any]:
        """:func:`batching.metrics.request_records`' fields, plus send time, usage, status."""
        t = self.token_times
        ok = self.status == "ok" and len(t) == self.output_len
        ttft = t[0] - self.arrival if ok else None
        e2e = t[-1] - self.arrival if ok else None
        n = self.output_len
        rec: dict[str, Any] = {
            "rid": self.rid,
            "arrival": self.arrival,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "queue": None,  # admission happens inside the server
            "ttft": ttft,
            "e2e": e2e,
            "tpot": (e2e - ttft) / (n - 1) if ok and n > 1 else None,  # type: ignore[operator]
            "itl_max": float(np.diff(t).max()) if ok and n > 1 else None,
            "finish": t[-1] if ok else None,
            "preemptions": None,
            "sent": self.sent,
            "lateness": None if self.sent is None else self.sent - self.arrival,
            "tokens_received": len(t),
            "usage_prompt": self.usage_prompt,
            "usage_output": self.usage_output,
            "status": self.status,
            "error": self.error,
        }
        if include_token_times:
            rec["token_times"] = list(t)
        return rec


def summarize(
    reqs: list[ServedRequest], slo: SLO | None = None, duration_s: float | None = None
) -> dict[str, Any]:
    """:func:`batching.metrics.summarize`'s fields over the requests that came back whole,
    the others counted; ``duration_s`` overrides the window (vLLM measures its own)."""
    ok = [r for r in reqs if r.status == "ok"]
    recs = [r.record(False) for r in ok]
    col = lambda k: np.array([x[k] for x in recs if x[k] is not None], dtype=float)
    itl = np.concatenate([np.diff(r.token_times) for r in ok]) if ok else np.array([], dtype=float)
    if duration_s is None and ok:
        duration_s = max(r.token_times[-1] for r in ok) - min(r.arrival for r in reqs)
    window = duration_s if duration_s and duration_s > 0 else None
    out_tokens = sum(r.output_len for r in ok)
    late = np.array([r.sent - r.arrival for r in reqs if r.sent is not None], dtype=float)
    counts = {s: sum(r.status == s for r in reqs) for s in STATUSES}
    s: dict[str, Any] = {
        "num_requests": len(reqs),
        "completed": counts["ok"],
        "failed": len(reqs) - counts["ok"],
        "status_counts": counts,
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_len for r in ok),
        "duration_s": duration_s,
        **{k: None for k in _STEP_FIELDS},
        "request_throughput": len(ok) / window if window else None,
        "output_throughput": out_tokens / window if window else None,
        "queue": _dist(np.array([], dtype=float)),
        "ttft": _dist(col("ttft")),
        "tpot": _dist(col("tpot")),
        "e2e": _dist(col("e2e")),
        "itl": _dist(itl),
        # The load generator's own delay: when it, not the server, set the latency.
        "dispatch_lateness": {
            "p50": float(np.percentile(late, 50)) if late.size else None,
            "p99": float(np.percentile(late, 99)) if late.size else None,
            "max": float(late.max()) if late.size else None,
        },
    }
    if slo is not None:
        s["goodput"] = goodput(slo, recs, len(reqs), window)
    return s


def build(
    reqs: list[ServedRequest],
    config: dict[str, Any],
    meta: dict[str, Any],
    *,
    slo: SLO | None = None,
    duration_s: float | None = None,
) -> dict[str, Any]:
    """The results document (schema of :func:`batching.results.build`, no ``steps``; every
    token's time in its request's record)."""
    return {
        "schema": SCHEMA,
        "meta": {**run_meta(), "fast_steps": 0, **meta},
        "config": config,
        "summary": summarize(reqs, slo, duration_s),
        "requests": [r.record(True) for r in reqs],
    }


def problems(doc: dict[str, Any]) -> list[str]:
    """One line per kind of request that did not come back whole (for the CLI to print)."""
    lines, show = [], 5
    for status in STATUSES[1:]:
        bad = [r for r in doc["requests"] if r["status"] == status]
        if bad:
            first = "; ".join(f"request {r['rid']}: {r['error']}" for r in bad[:show])
            more = f" (and {len(bad) - show} more)" if len(bad) > show else ""
            lines.append(f"{len(bad)} request(s) {status}: {first}{more}")
    return lines
