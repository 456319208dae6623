"""Capacity at a latency target: the highest request rate a scheduler configuration sustains.

Sarathi-Serve's measure (Agrawal et al., OSDI 2024, section 5.1): the largest request rate at
which a configuration keeps its p99 inter-token latency under an SLO and its median queueing
delay under 2 s; strict = 5x and relaxed = 25x one decode step of 32 rows at 4,096 tokens of
context. The rate is swept by replaying the same requests faster (:meth:`Workload.scale`),
keeping the trace's burstiness and length mix. A run whose queue grows over the replay is
*unstable* (:func:`~batching.metrics.queue_growth`): its percentiles depend on the replay's
length, so :func:`meets` never accepts it.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from .costs.base import CostModel
from .metrics import queue_growth, run_metrics
from .parallel import pmap
from .plan import StepWork
from .simulate import offered_rate, simulate
from .workloads import Workload

#: SLO multipliers of the decode step time (Sarathi-Serve, section 5.1).
STRICT_X = 5.0
RELAXED_X = 25.0
#: The decode step the SLOs are multiples of: 32 rows of 4,096 context tokens, no prefill.
SLO_BATCH = 32
SLO_CONTEXT = 4096
#: Median queueing delay a configuration may have at its capacity (s).
QUEUE_P50_MAX_S = 2.0

#: The six configurations of the capacity figure. Continuous and chunked batching run up to 256
#: sequences (vLLM's default) with exact KV, so memory, not a slot cap, limits them; static and
#: dynamic keep a batch of 32 and wait up to 2 s or not at all. Static's queue sets its capacity
#: either way (Azure conversations, llama-8b on an H100: a 2 s timeout sustained 1.6 req/s, 1 s
#: 0.95, 0.25 s 0.64). Chunked prefill at Sarathi-Serve's two token budgets, 512 and 2,048.
CONFIGS: dict[str, dict[str, Any]] = {
    "static": {"scheduler": "static", "slots": 32, "max_wait": 2.0, "kv_policy": "exact"},
    "dynamic": {"scheduler": "dynamic", "slots": 32, "max_wait": 0.0, "kv_policy": "exact"},
    "continuous, separate prefill": {
        "scheduler": "continuous",
        "slots": 256,
        "prefill_mode": "separate",
        "kv_policy": "exact",
    },
    "continuous, mixed prefill": {
        "scheduler": "continuous",
        "slots": 256,
        "prefill_mode": "mixed",
        "kv_policy": "exact",
    },
    "chunked, budget 2048": {
        "scheduler": "chunked",
        "slots": 256,
        "token_budget": 2048,
        "kv_policy": "exact",
    },
    "chunked, budget 512": {"scheduler": "chunked", "slots": 256, "token_budget": 512, "kv_policy": "exact"},
}


def slos(cost: CostModel, batch: int = SLO_BATCH, ctx: int = SLO_CONTEXT) -> dict[str, float]:
    """The strict and relaxed p99 ITL SLOs (ms) for ``cost``'s model and device, and the decode
    step (ms) they are multiples of: ``batch`` rows of ``ctx`` KV tokens each, timed by the cost
    model's own ``step_time`` (a roofline's formula, or a measured profile's decode grid)."""
    d = float(cost.step_time(StepWork(decode_rows=batch, decode_ctx=batch * ctx))) * 1e3
    return {"decode_ms": d, "strict_ms": STRICT_X * d, "relaxed_ms": RELAXED_X * d}


def run_point(
    workload: Workload, cost: CostModel, config: Mapping[str, Any], time_scale: float
) -> dict[str, Any]:
    """One run of ``config`` on ``workload`` replayed ``time_scale`` times faster: its
    :func:`~batching.metrics.run_metrics`, ``time_scale``, ``offered_rate`` and ``stable``."""
    if not (isinstance(time_scale, (int, float)) and math.isfinite(time_scale) and time_scale > 0):
        raise ValueError(f"time_scale={time_scale!r}: must be a positive number")
    w = workload.scale(time=float(time_scale))
    cfg = dict(config)
    result = simulate(w, cost, cfg.pop("scheduler"), **cfg)
    return {
        **run_metrics(result),
        "time_scale": float(time_scale),
        "offered_rate": offered_rate(w),
        "stable": not queue_growth(result)["growing"],
    }


def meets(point: Mapping[str, Any], itl_slo_ms: float, queue_p50_max_s: float = QUEUE_P50_MAX_S) -> bool:
    """Whether a run sustains its load within the SLO: stable, p99 ITL at most ``itl_slo_ms``
    and median queueing delay at most ``queue_p50_max_s``."""
    return (
        bool(point["stable"])
        and point["itl_p99"] * 1e3 <= itl_slo_ms
        and point["queue_p50"] <= queue_p50_max_s
    )


def capacity(
    workload: Workload,
    cost: CostModel,
    config: Mapping[str, Any],
    itl_slo_ms: float,
    *,
    queue_p50_max_s: float = QUEUE_P50_MAX_S,
    start: float = 1.0,
    lo: float = 1 / 64,
    hi: float = 256.0,
    iters: int = 6,
    cache: dict[float, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """The highest replay speed (and so request rate) at which ``config`` meets the SLO.

    Brackets the boundary by doubling or halving from ``start`` (within ``lo``..``hi``), then
    bisects ``iters`` times in log space (6: within 1.1%). Assumes a configuration that meets
    the SLO at some rate meets it at every lower one, as queueing does on average; ``cache``
    (time scale -> point) shares runs between SLOs. ``rate`` is 0.0 and ``point`` None if
    even ``lo`` fails; ``bracket``'s upper end is ``math.inf`` if ``hi`` still met."""
    if not (lo <= start <= hi):
        raise ValueError(f"start={start}: must lie between lo={lo} and hi={hi}")
    runs = cache if cache is not None else {}

    def point(s: float) -> dict[str, Any]:
        if s not in runs:
            runs[s] = run_point(workload, cost, config, s)
        return runs[s]

    ok = lambda s: meets(point(s), itl_slo_ms, queue_p50_max_s)
    s = start
    if ok(s):
        good, bad = s, math.inf
        while s * 2 <= hi:
            s *= 2
            if not ok(s):
                bad = s
                break
            good = s
    else:
        good, bad = 0.0, s
        while s / 2 >= lo:
            s /= 2
            if ok(s):
                good = s
                break
            bad = s
    if good > 0 and math.isfinite(bad):
        for _ in range(iters):
            mid = math.sqrt(good * bad)
            if ok(mid):
                good = mid
            else:
                bad = mid
    best = runs[good] if good > 0 else None
    return {
        "rate": best["offered_rate"] if best else 0.0,
        "time_scale": good,
        "point": best,
        "bracket": (good, bad),
    }


def _search(
    job: tuple[Workload, CostModel, Mapping[str, Any], Mapping[str, float], dict[str, Any]],
) -> dict[str, Any]:
    """One configuration's :func:`capacity` under each SLO, sharing its runs (a
    :func:`searches` job; top-level, so that a worker process can run it)."""
    workload, cost, config, slo_ms, options = job
    cache: dict[float, dict[str, Any]] = {}
    return {slo: capacity(workload, cost, config, ms, cache=cache, **options) for slo, ms in slo_ms.items()}


def searches(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, Mapping[str, Any]],
    slo_ms: Mapping[str, float],
    *,
    workers: int | None = None,
    **options: Any,
) -> dict[str, dict[str, dict[str, Any]]]:
    """``{config: {slo: capacity(...)}}``: every configuration's :func:`capacity` under every
    SLO, one configuration per worker process (:func:`~batching.parallel.pmap`; the same
    results whatever ``workers``). ``options`` go to :func:`capacity`."""
    jobs = [(workload, cost, cfg, dict(slo_ms), dict(options)) for cfg in configs.values()]
    return dict(zip(configs, pmap(_search, jobs, workers)))


def capacity_table(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, Mapping[str, Any]] = CONFIGS,
    slo_ms: Mapping[str, float] | None = None,
    *,
    workers: int | None = None,
    **options: Any,
) -> list[dict[str, Any]]:
    """Capacity of every configuration under every SLO (default: :func:`slos`' strict and
    relaxed), one row each, with the p99 ITL and median queueing delay at capacity (NaN where
    no rate met the SLO). ``workers`` and ``options`` go to :func:`searches`."""
    if slo_ms is None:
        s = slos(cost)
        slo_ms = {"strict": s["strict_ms"], "relaxed": s["relaxed_ms"]}
    found = searches(workload, cost, configs, slo_ms, workers=workers, **options)
    rows = []
    for name in configs:
        for slo, ms in slo_ms.items():
            c = found[name][slo]
            p = c["point"] or {"itl_p99": math.nan, "queue_p50": math.nan}
            rows.append(
                {
                    "config": name,
                    "slo": slo,
                    "slo_ms": float(ms),
                    "rate": c["rate"],
                    "time_scale": c["time_scale"],
                    "itl_p99_ms": p["itl_p99"] * 1e3,
                    "queue_p50_s": p["queue_p50"],
                }
            )
    return rows


def _point(job: tuple[Workload, CostModel, Mapping[str, Any], float]) -> dict[str, Any]:
    return run_point(*job)


def run_points(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, Mapping[str, Any]],
    time_scales: Sequence[float],
    *,
    workers: int | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """:func:`run_point` of every configuration at every time scale, ``{config: [point per
    scale]}``, the runs spread over ``workers`` processes (:func:`~batching.parallel.pmap`)."""
    jobs = [(workload, cost, cfg, float(k)) for cfg in configs.values() for k in time_scales]
    points = pmap(_point, jobs, workers)
    n = len(time_scales)
    return {name: points[i * n : (i + 1) * n] for i, name in enumerate(configs)}


def capacity_by_config(rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """:func:`capacity_table`'s rows as ``{config: {slo: rate}}`` (for figures and glue)."""
    out: dict[str, dict[str, float]] = {}
    for r in rows:
        out.setdefault(r["config"], {})[r["slo"]] = r["rate"]
    return out
