"""Results files of runs measured on a server (replayed traces, imported ``vllm bench serve``).

A client sees when each streamed chunk arrived, how many tokens the server said it carried
(``token_ids`` where the server returns them) and the reported ``usage``: the step-log fields
are ``None`` (never 0: not measured), ``queue`` too; the rest is :mod:`batching.results`'
schema. Every token is timed only where the stream allows it: one chunk per token, or chunks
whose token counts add up to the usage (several tokens of one chunk share its time). A stream
that bundles an unknown number of tokens per chunk (speculative decoding, a server without
``token_ids``) keeps its TTFT, E2E and TPOT; only its per-token gaps are unknown.

Two time origins: ``ttft`` and ``e2e`` from the scheduled arrival (what the trace asked, the
client's own lateness included), ``ttft_from_send`` and ``e2e_from_send`` from the moment the
request left the client (what ``vllm bench serve`` reports).

A request that failed, timed out or does not match the workload keeps its record with its
``status`` and ``error``; the summary leaves it out of latencies and throughput (a shorter
output would lower every latency) and counts, per statistic, every request it leaves out and
why (``summary.excluded``); :func:`problems` prints them.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ..metrics import SLO, distribution, goodput
from ..results import SCHEMA, run_meta

# Request outcomes; every one but "ok" is counted in the summary and printed.
STATUSES = ("ok", "usage_mismatch", "error", "timeout", "cancelled")

# The per-request statistics of a summary, each with what it leaves out.
STATS = ("ttft", "tpot", "itl", "e2e", "ttft_from_send", "e2e_from_send")

# Why a statistic leaves out a request that came back whole (key: sentence for the CLI).
BUNDLED = "bundled"
DISAGREE = "stream_vs_usage"
ONE_TOKEN = "one_output_token"
NOT_SENT = "no_send_time"
REASONS = {
    BUNDLED: "several tokens per streamed chunk, so per-token times are unknown "
    "(TTFT, E2E and TPOT kept; the chunk gaps are in itl_chunks)",
    DISAGREE: "the token_ids streamed do not add up to the usage the server reported",
    ONE_TOKEN: "one output token: no inter-token time (TPOT null by convention)",
    NOT_SENT: "no send time recorded",
}

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


def last_line(text: object, n: int = 200) -> str:
    """An error text's last non-empty line (a traceback's exception), at most ``n`` characters."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    line = " ".join(lines[-1].split()) if lines else ""
    return line if len(line) <= n else line[:n] + "..."


@dataclass
class ServedRequest:
    """One request as a client saw it; times in seconds on the workload's clock."""

    rid: int
    arrival: float  # scheduled arrival
    prompt_len: int  # what the workload asked for
    output_len: int
    sent: float | None = None  # when the client actually sent it (None: never sent)
    chunk_times: list[float] = field(default_factory=list)  # one per streamed chunk with choices
    chunk_tokens: list[int | None] = field(default_factory=list)  # its token_ids' count (None: not said)
    usage_prompt: int | None = None  # what the server reported
    usage_output: int | None = None
    status: str = "cancelled"
    error: str | None = None

    def add_chunk(self, t: float, tokens: int | None) -> None:
        self.chunk_times.append(t)
        self.chunk_tokens.append(tokens)

    @property
    def tokens_streamed(self) -> int:
        """Tokens as the stream counted them: the token_ids where given, one per chunk where not
        (vLLM's benchmark counts so)."""
        return sum(1 if k is None else k for k in self.chunk_tokens)

    @property
    def n_tokens(self) -> int:
        """The output tokens the server produced: its usage, else what the stream counted."""
        return self.usage_output if self.usage_output is not None else self.tokens_streamed

    def token_times_reason(self) -> str | None:
        """Why every token cannot be timed (a key of :data:`REASONS`), None when it can."""
        n = self.n_tokens
        if all(k is not None for k in self.chunk_tokens):
            return None if self.tokens_streamed == n else DISAGREE
        if any(k is not None for k in self.chunk_tokens) or len(self.chunk_times) > n:
            return DISAGREE
        return None if len(self.chunk_times) == n else BUNDLED

    @property
    def token_times(self) -> list[float] | None:
        """Each output token's time (tokens of one chunk share its time), or None when the
        stream does not say which chunk carried which token."""
        if self.token_times_reason() is not None:
            return None
        out: list[float] = []
        for t, k in zip(self.chunk_times, self.chunk_tokens):
            out.extend([t] * (1 if k is None else k))
        return out

    def record(self, include_token_times: bool) -> dict[str, Any]:
        """:func:`batching.metrics.request_records`' fields, plus send time, both time origins,
        the stream's shape, usage and status."""
        c = self.chunk_times
        finished = bool(c) and self.status in ("ok", "usage_mismatch")  # the stream ended whole
        first = c[0] if c else None
        last = c[-1] if finished else None
        sent = self.sent
        ttft = None if first is None else first - self.arrival
        e2e = None if last is None else last - self.arrival
        n = self.n_tokens
        t = self.token_times if finished else None
        rec: dict[str, Any] = {
            "rid": self.rid,
            "arrival": self.arrival,
            "prompt_len": self.prompt_len,
            "output_len": self.output_len,
            "queue": None,  # admission happens inside the server
            "ttft": ttft,
            "e2e": e2e,
            "tpot": (e2e - ttft) / (n - 1) if e2e is not None and ttft is not None and n > 1 else None,
            "itl_max": float(np.diff(t).max()) if t is not None and len(t) > 1 else None,
            "finish": last,
            "preemptions": None,
            "sent": sent,
            "lateness": None if sent is None else sent - self.arrival,
            "ttft_from_send": None if first is None or sent is None else first - sent,
            "e2e_from_send": None if last is None or sent is None else last - sent,
            "chunks": len(c),
            "tokens_received": self.tokens_streamed,
            "token_times_exact": t is not None,
            "usage_prompt": self.usage_prompt,
            "usage_output": self.usage_output,
            "status": self.status,
            "error": self.error,
        }
        if include_token_times:
            rec["token_times"] = t
            rec["chunk_times"] = list(c)
            rec["chunk_tokens"] = list(self.chunk_tokens)
        return rec


def summarize(
    reqs: list[ServedRequest], slo: SLO | None = None, duration_s: float | None = None
) -> dict[str, Any]:
    """:func:`batching.metrics.summarize`'s fields over the requests that came back whole, the
    others counted, and per statistic what it leaves out (``excluded``: reason -> requests);
    ``duration_s`` overrides the window (vLLM measures its own)."""
    ok = [r for r in reqs if r.status == "ok"]
    recs = [r.record(False) for r in ok]
    excluded: dict[str, Counter[str]] = {k: Counter() for k in STATS}
    for r in reqs:
        if r.status != "ok":
            for k in STATS:
                excluded[k][r.status] += 1
    for r, rec in zip(ok, recs):
        if r.n_tokens <= 1:
            excluded["tpot"][ONE_TOKEN] += 1
            excluded["itl"][ONE_TOKEN] += 1
        elif (why := r.token_times_reason()) is not None:
            excluded["itl"][why] += 1
        if rec["ttft_from_send"] is None:
            excluded["ttft_from_send"][NOT_SENT] += 1
            excluded["e2e_from_send"][NOT_SENT] += 1
    col = lambda k: np.array([x[k] for x in recs if x[k] is not None], dtype=float)
    gaps = [np.diff(t) for r in ok if (t := r.token_times) is not None]
    itl = np.concatenate(gaps) if gaps else np.array([], dtype=float)
    chunk_gaps = [np.diff(r.chunk_times) for r in ok]
    itl_chunks = np.concatenate(chunk_gaps) if chunk_gaps else np.array([], dtype=float)
    if duration_s is None and ok:
        duration_s = max(r.chunk_times[-1] for r in ok) - min(r.arrival for r in reqs)
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
        "queue": distribution(np.array([], dtype=float)),
        "ttft": distribution(col("ttft")),
        "tpot": distribution(col("tpot")),
        "e2e": distribution(col("e2e")),
        "itl": distribution(itl),
        # From the send (vLLM's origin), and vLLM's ITL: the gaps between streamed chunks.
        "ttft_from_send": distribution(col("ttft_from_send")),
        "e2e_from_send": distribution(col("e2e_from_send")),
        "itl_chunks": distribution(itl_chunks),
        "excluded": {k: dict(sorted(v.items())) for k, v in excluded.items()},
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
    chunk's and, where known, every token's time in its request's record)."""
    return {
        "schema": SCHEMA,
        "meta": {**run_meta(), "fast_steps": 0, **meta},
        "config": config,
        "summary": summarize(reqs, slo, duration_s),
        "requests": [r.record(True) for r in reqs],
    }


def problems(doc: dict[str, Any]) -> list[str]:
    """One line per kind of request that did not come back whole, and one per reason a
    statistic leaves out requests that did (for the CLI to print)."""
    lines, show = [], 5
    for status in STATUSES[1:]:
        bad = [r for r in doc["requests"] if r["status"] == status]
        if bad:
            first = "; ".join(f"request {r['rid']}: {r['error']}" for r in bad[:show])
            more = f" (and {len(bad) - show} more)" if len(bad) > show else ""
            lines.append(f"{len(bad)} request(s) {status}: {first}{more} (left out of every statistic)")
    by_reason: dict[tuple[str, int], list[str]] = {}
    for stat, reasons in doc["summary"].get("excluded", {}).items():
        for why, n in reasons.items():
            if why in REASONS:
                by_reason.setdefault((why, n), []).append(stat)
    for (why, n), stats in by_reason.items():
        lines.append(f"{', '.join(stats)} leave(s) out {n} request(s): {REASONS[why]}")
    return lines
