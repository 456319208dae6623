"""Serving metrics per request and per run (definitions: ``shared/notes/conventions.md``).

Slot utilization = output tokens emitted / (slots x steps executed), the prefill step
included (it emits the first token): a static batch of 20- and 2,000-token outputs scores
(20 + 2000) / (2 x 2000). Hardware utilization is a different quantity; both are reported.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from .engine import RunResult
from .request import Request

PERCENTILES = (50, 90, 99)


@dataclass(frozen=True)
class SLO:
    """vLLM's ``--goodput ttft:<ms> tpot:<ms>``: a request counts when it meets every bound."""

    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2e_ms: float | None = None

    def __post_init__(self) -> None:
        for name in ("ttft_ms", "tpot_ms", "e2e_ms"):
            v = getattr(self, name)
            if v is not None and not (isinstance(v, (int, float)) and math.isfinite(v) and v > 0):
                raise ValueError(f"SLO {name}={v!r}: must be a positive number of milliseconds")

    @staticmethod
    def parse(spec: str) -> SLO:
        """Parse ``"ttft:500 tpot:50"`` (milliseconds), vLLM's goodput syntax."""
        kw: dict[str, float] = {}
        for part in spec.replace(",", " ").split():
            key, _, val = part.partition(":")
            if key not in ("ttft", "tpot", "e2e") or not val:
                raise ValueError(f"goodput SLO {part!r}: expected ttft:<ms>, tpot:<ms> or e2e:<ms>")
            try:
                kw[f"{key}_ms"] = float(val)
            except ValueError:
                raise ValueError(f"goodput SLO {part!r}: {val!r} is not a number of milliseconds") from None
        return SLO(**kw)

    def met(self, rec: dict[str, Any]) -> bool:
        ok = self.ttft_ms is None or rec["ttft"] * 1e3 <= self.ttft_ms
        ok &= self.tpot_ms is None or rec["tpot"] is None or rec["tpot"] * 1e3 <= self.tpot_ms
        ok &= self.e2e_ms is None or rec["e2e"] * 1e3 <= self.e2e_ms
        return bool(ok)


def token_times(reqs: list[Request]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """First and last token time per request, every ITL, and the largest ITL per request
    (-inf for one token): one pass over a flat array (a trace run holds millions)."""
    lens = np.fromiter((len(r.token_times) for r in reqs), dtype=np.int64, count=len(reqs))
    assert (lens > 0).all(), "every request must have emitted its tokens"
    flat = np.fromiter(
        chain.from_iterable(r.token_times for r in reqs), dtype=np.float64, count=int(lens.sum())
    )
    ends = np.cumsum(lens)
    starts = ends - lens
    gaps = np.append(np.diff(flat), -np.inf)
    gaps[ends - 1] = -np.inf  # the gap from one request's last token to the next one's first
    itl_max = np.maximum.reduceat(gaps, starts)
    return flat[starts], flat[ends - 1], gaps[gaps > -np.inf], itl_max


def request_records(reqs: list[Request], times: tuple | None = None) -> list[dict[str, Any]]:
    """The per-request table; ``times``: ``token_times(reqs)`` if the caller has it."""
    for r in reqs:
        assert r.done and r.admit_time is not None, f"request {r.rid} has not finished"
    first, last, _, itl_max = times or token_times(reqs)
    out = []
    for r, f, end, m in zip(reqs, first.tolist(), last.tolist(), itl_max.tolist()):
        ttft, e2e = f - r.arrival, end - r.arrival
        out.append(
            {
                "rid": r.rid,
                "arrival": r.arrival,
                "prompt_len": r.prompt_len,
                "output_len": r.output_len,
                "queue": r.admit_time - r.arrival,  # type: ignore[operator]  # asserted above
                "ttft": ttft,
                "e2e": e2e,
                "tpot": (e2e - ttft) / (r.output_len - 1) if r.output_len > 1 else None,
                "itl_max": m if r.output_len > 1 else None,
                "finish": r.finish_time,
                "preemptions": r.preemptions,
            }
        )
    return out


def request_record(r: Request) -> dict[str, Any]:
    """One row of the per-request table."""
    return request_records([r])[0]


def _dist(x: np.ndarray) -> dict[str, float | None]:
    if x.size == 0:
        return {"mean": None, **{f"p{p}": None for p in PERCENTILES}, "max": None}
    q = np.percentile(x, PERCENTILES)
    return {
        "mean": float(x.mean()),
        **{f"p{p}": float(v) for p, v in zip(PERCENTILES, q)},
        "max": float(x.max()),
    }


def summarize(
    result: RunResult,
    records: list[dict[str, Any]] | None = None,
    slo: SLO | None = None,
    times: tuple | None = None,
) -> dict[str, Any]:
    """Aggregate metrics of one run (``records``/``times``: if the caller has them)."""
    reqs = result.requests
    times = times or token_times(reqs)
    records = records if records is not None else request_records(reqs, times)
    L = result.log.arrays()
    res_mean, res_peak, used_mean, used_peak = result.log.kv_series(result.scheduler["kv_policy"])
    n_steps, dur = L["n"], L["dur"]
    busy = float(dur.sum())
    start = min(r.arrival for r in reqs)
    window = max(float(r.finish_time) for r in reqs) - start  # type: ignore[arg-type]
    out_tokens = sum(r.output_len for r in reqs)
    slot_steps = float((L["slots"] * n_steps).sum())
    prefill_all = float(L["prefill"].sum() + L["pad"].sum())
    itl = times[2]
    col = lambda k: np.array([rec[k] for rec in records if rec[k] is not None], dtype=float)
    s: dict[str, Any] = {
        "num_requests": len(reqs),
        "output_tokens": out_tokens,
        "prompt_tokens": sum(r.prompt_len for r in reqs),
        "duration_s": window,
        "busy_s": busy,
        "steps": int(n_steps.sum()),
        "request_throughput": len(reqs) / window if window > 0 else None,
        "output_throughput": out_tokens / window if window > 0 else None,
        "slot_utilization": float((L["emitted"] * n_steps).sum() / slot_steps),
        "slot_utilization_time_weighted": float((L["emitted"] / L["slots"] * dur).sum() / busy),
        "padding_fraction": float(L["pad"].sum() / prefill_all) if prefill_all else 0.0,
        "preemptions": result.preemptions,
        "kv_reserved_peak": float(res_peak.max()),
        "kv_used_peak": float(used_peak.max()),
        "kv_reserved_mean": float((res_mean * dur).sum() / busy),  # time-weighted
        "kv_used_mean": float((used_mean * dur).sum() / busy),
        "queue": _dist(col("queue")),
        "ttft": _dist(col("ttft")),
        "tpot": _dist(col("tpot")),
        "e2e": _dist(col("e2e")),
        "itl": _dist(itl),
    }
    hw = result.hardware
    if hw is not None and hw.model is not None:
        flops, bytes_ = result.log.hardware(hw.model)
        s["hw_compute_utilization"] = float(flops.sum() / (busy * hw.peak_flops))
        s["hw_bandwidth_utilization"] = float(bytes_.sum() / (busy * hw.bandwidth))
    if slo is not None:
        s["goodput"] = goodput(slo, records, len(reqs), window)
    return s


def goodput(slo: SLO, records: list[dict[str, Any]], n: int, window: float | None) -> dict[str, Any]:
    """How many of ``n`` requests ``records`` meet ``slo``, and their rate over ``window`` seconds."""
    good = sum(slo.met(rec) for rec in records)
    return {
        "slo": {k: v for k, v in vars(slo).items() if v is not None},
        "requests_ok": good,
        "fraction": good / n,
        "request_goodput": good / window if window and window > 0 else None,
    }
