"""Serving metrics per request and per run (README, "Semantics", gives the same at length).

Every token is timestamped at the end of the step that produced it. Per request: TTFT =
first token - arrival, E2E = last token - arrival, TPOT = (E2E - TTFT) / (N - 1) for N output
tokens (None when N = 1), ITL = the gaps between consecutive tokens, queue = admission -
arrival. Per run: percentiles by linear interpolation (numpy's default), throughput over the
window from the first arrival to the last finish.

Slot utilization = output tokens emitted / (slots x steps executed), the prefill step
included (it emits the first token): a static batch of 20- and 2,000-token outputs scores
(20 + 2000) / (2 x 2000). Hardware utilization is a different quantity; both are reported.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Any

import numpy as np

from .engine import RunResult
from .request import Request
from .steplog import Accounting

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


def distribution(x: np.ndarray) -> dict[str, float | None]:
    """Mean, :data:`PERCENTILES` and max of a sample (each None for an empty one): every
    latency statistic of a run's summary, simulated, real or measured by a client."""
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
        "queue": distribution(col("queue")),
        "ttft": distribution(col("ttft")),
        "tpot": distribution(col("tpot")),
        "e2e": distribution(col("e2e")),
        "itl": distribution(itl),
    }
    hw = result.utilization_basis
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


def useful_flops(requests: Iterable[Request], model: Accounting) -> float:
    """FLOPs an ideal engine spends on these requests, by the cost model's formulas: each
    prompt prefilled once and each later token decoded once over its context; no padding,
    dead rows or recomputation after a preemption."""
    p = np.array([r.prompt_len for r in requests], dtype=np.float64)
    n = np.array([r.output_len for r in requests], dtype=np.float64)
    pt = p.sum()
    pa = (p * (p + 1) / 2).sum()
    rows = (n - 1).sum()
    ctx = ((n - 1) * p + n * (n - 1) / 2).sum()
    return float(model.flops_arrays(float(pt), float(pa), float(rows), float(ctx)))


class _DecodeOnly:
    """A model's FLOPs and bytes of a step's decode rows alone (dead rows included): its
    prefill tokens, padding and attention pairs counted as zero."""

    def __init__(self, model: Accounting) -> None:
        self.model = model

    def flops_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        return self.model.flops_arrays(0.0 * pt, 0.0 * pa, rows, ctx)

    def bytes_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        return self.model.bytes_arrays(0.0 * pt, 0.0 * pa, rows, ctx)


def run_metrics(result: RunResult) -> dict[str, float]:
    """One run's :func:`summarize` as flat floats (times in s; a latency statistic with no
    value is NaN): what the pages sweep, tabulate and glue. With a cost model beside the run
    also ``hw_compute`` and ``hw_bandwidth`` (all FLOPs and bytes performed),
    ``decode_compute`` (the FLOPs of its decode rows alone, dead rows included: ``hw_compute``
    less prefill's, padding's and their attention's) and ``useful_compute``
    (:func:`useful_flops`), each over busy time at peak."""
    s = summarize(result)
    out: dict[str, float] = {
        "slot_util": s["slot_utilization"],
        "slot_util_tw": s["slot_utilization_time_weighted"],
        "padding_fraction": s["padding_fraction"],
        "throughput_req": s["request_throughput"] or 0.0,
        "throughput_tok": s["output_throughput"] or 0.0,
        "preemptions": float(s["preemptions"]),
        "steps": float(s["steps"]),
        "busy_s": s["busy_s"],
        "duration_s": s["duration_s"],
        "kv_reserved_peak": s["kv_reserved_peak"],
        "kv_used_peak": s["kv_used_peak"],
        "kv_reserved_mean": s["kv_reserved_mean"],
        "kv_used_mean": s["kv_used_mean"],
        "running_peak": float(max(result.log.cols["running"])),
    }
    for k in ("queue", "ttft", "e2e", "itl", "tpot"):
        for stat, v in s[k].items():
            out[f"{k}_{stat}"] = float("nan") if v is None else float(v)
    hw = result.utilization_basis
    if hw is not None and hw.model is not None:
        out["hw_compute"] = s["hw_compute_utilization"]
        out["hw_bandwidth"] = s["hw_bandwidth_utilization"]
        decode = result.log.hardware(_DecodeOnly(hw.model))[0].sum()
        out["decode_compute"] = decode / (s["busy_s"] * hw.peak_flops)
        out["useful_compute"] = useful_flops(result.requests, hw.model) / (s["busy_s"] * hw.peak_flops)
    return {k: float(v) for k, v in out.items()}


def steps_ended_by(result: RunResult, times: np.ndarray) -> np.ndarray:
    """Steps that ended at or before each time (a step inside a run of n identical steps is
    counted pro rata: exact at step boundaries, which is where admissions and finishes fall)."""
    C = result.log.cols
    t0 = np.asarray(C["t"], dtype=float)
    dur = np.asarray(C["dur"], dtype=float)
    n = np.asarray(C["n"], dtype=float)
    end = t0 + dur
    cum = np.concatenate([[0.0], np.cumsum(n)])
    eps = 1e-9 * max(1.0, float(end[-1]))
    i = np.searchsorted(end, times + eps, side="right")  # rows fully ended
    out = cum[i].copy()
    inside = (i < len(end)) & (times > t0[np.minimum(i, len(end) - 1)] + eps)
    j = i[inside]
    out[inside] += np.floor(n[j] * (times[inside] - t0[j]) / dur[j] + 1e-9)
    return out


def iterations(result: RunResult, rids: Sequence[int] | None = None) -> dict[str, np.ndarray]:
    """How many engine iterations each request (or each of ``rids``) lives through: arrays
    ``rid``, ``output_len``, ``from_admission`` (steps from admission to last token, both
    ends' steps included), ``from_arrival`` (steps that ended between arrival and last token),
    ``e2e`` and ``service`` (s, admission to last token)."""
    want = None if rids is None else set(rids)
    reqs = [r for r in result.requests if want is None or r.rid in want]
    fin = np.array([r.finish_time for r in reqs], dtype=float)
    adm = np.array([r.admit_time for r in reqs], dtype=float)
    arr = np.array([r.arrival for r in reqs], dtype=float)
    done = steps_ended_by(result, fin)
    return {
        "rid": np.array([r.rid for r in reqs]),
        "output_len": np.array([r.output_len for r in reqs]),
        "from_admission": done - steps_ended_by(result, adm),
        "from_arrival": done - steps_ended_by(result, arr),
        "e2e": fin - arr,
        "service": fin - adm,
    }


#: A queue "grows" when the last fifth of the arrivals waits this much longer (median, s)...
GROWTH_S = 2.0
#: ...and at least this many times as long as the first fifth.
GROWTH_X = 2.0


def queue_growth(result: RunResult) -> dict[str, float]:
    """Median queueing delay (s) of the first and the last fifth of the requests by arrival,
    and whether the queue grew between them (``growing``: 1.0 or 0.0): a run whose queue
    grows is unstable, its percentiles set by the replay's length."""
    reqs = sorted(result.requests, key=lambda r: (r.arrival, r.rid))
    q = np.array(
        [(math.nan if r.admit_time is None else r.admit_time) - r.arrival for r in reqs], dtype=float
    )
    k = max(1, len(q) // 5)
    first, last = float(np.median(q[:k])), float(np.median(q[-k:]))
    growing = last > first + GROWTH_S and last > GROWTH_X * first
    return {"queue_first_p50": first, "queue_last_p50": last, "growing": float(growing)}
