"""7.2 Continuous batching: the first finisher's freed slot, how many iterations a short
request lives through, capacity at a latency target, and the seed's utilization claim.

Numbers, verdict labels and rows only: every sentence of the page lives in its notebook.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..engine import RunResult
from ..metrics import request_record
from ..workload import Workload, preset
from .capacity import capacity, run_point
from .common import Claim, columns, simulate


def rate_sweep(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]], time_scales: Sequence[float]
) -> dict[str, dict[str, np.ndarray]]:
    """7.2: every configuration at every arrival rate (:func:`~batching.book.capacity.run_point`).

    The workload is replayed ``k`` times faster for each ``k`` in ``time_scales`` (the same
    requests, arrivals compressed), so the offered rate is ``k`` x the trace's. Per config,
    arrays over the sweep: ``time_scale``, ``offered_rate`` (req/s), ``stable`` (bool: the
    queue did not grow over the replay) and every key of :func:`~batching.book.common.metrics`.
    A config is ``{"scheduler": ..., "slots": ..., **options}`` (see :func:`simulate`).
    """
    points: dict[str, list[dict[str, Any]]] = {name: [] for name in configs}
    for k in time_scales:
        for name, cfg in configs.items():
            points[name].append(run_point(workload, cost, cfg, float(k)))
    return {name: columns(ps) for name, ps in points.items()}


def with_probes(workload: Workload, every: int = 10, output: int = 20) -> tuple[Workload, list[int]]:
    """7.2: mark every ``every``-th request as a probe that wants exactly ``output`` tokens.

    Returns the new workload (same arrivals and prompts) and the probes' rids.
    """
    if every < 1:
        raise ValueError(f"every={every}: must be >= 1")
    outs = workload.output_lens.copy()
    idx = np.arange(0, len(workload), every)
    outs[idx] = output
    info = {**workload.info, "probes": {"every": every, "output": output}}
    w = Workload.from_arrays(
        workload.arrivals, workload.prompt_lens, outs, name=workload.name, info=info, rids=workload.rids
    )
    return w, [workload.rids[i] for i in idx]


def probe_runs(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]], probes: Sequence[int]
) -> dict[str, dict[str, np.ndarray]]:
    """7.2: :func:`iterations` of the probe requests under each configuration
    (``{name: {"scheduler": ..., **options}}``, as :func:`compare_schedulers`)."""
    out = {}
    for name, cfg in configs.items():
        cfg = dict(cfg)
        out[name] = iterations(simulate(workload, cost, cfg.pop("scheduler"), **cfg), probes)
    return out


def _steps_ended_by(result: RunResult, times: np.ndarray) -> np.ndarray:
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
    """7.2: how many engine iterations a request lives through.

    For each request (or the given rids): ``output_len``, ``from_admission`` (steps from
    its admission to its last token, inclusive of both ends' steps), ``from_arrival``
    (steps that ended between its arrival and its last token), ``e2e`` (s) and
    ``service`` (s, admission to last token).
    """
    want = None if rids is None else set(rids)
    reqs = [r for r in result.requests if want is None or r.rid in want]
    fin = np.array([r.finish_time for r in reqs], dtype=float)
    adm = np.array([r.admit_time for r in reqs], dtype=float)
    arr = np.array([r.arrival for r in reqs], dtype=float)
    done = _steps_ended_by(result, fin)
    return {
        "rid": np.array([r.rid for r in reqs]),
        "output_len": np.array([r.output_len for r in reqs]),
        "from_admission": done - _steps_ended_by(result, adm),
        "from_arrival": done - _steps_ended_by(result, arr),
        "e2e": fin - arr,
        "service": fin - adm,
    }


def subset_latency(result: RunResult, rids: Sequence[int]) -> dict[str, float]:
    """7.2: the mean end-to-end latency (s) of a subset of requests (``e2e_mean``)."""
    want = set(rids)
    recs = [request_record(r) for r in result.requests if r.rid in want]
    if not recs:
        raise ValueError("subset_latency(): none of the rids is in the run")
    return {"e2e_mean": float(np.mean([x["e2e"] for x in recs]))}


def first_finisher_queue(extra: int = 64, gap: float = 0.05, prompt: int = 128, output: int = 20) -> Workload:
    """7.2: the ``first-finisher`` preset (32 requests at t=0, one wants 2,000 tokens, 31
    want 20) followed by ``extra`` short requests like the 31, one every ``gap`` seconds."""
    base = preset("first-finisher")
    a = np.concatenate([base.arrivals, gap * np.arange(1, extra + 1)])
    p = np.concatenate([base.prompt_lens, np.full(extra, prompt)])
    o = np.concatenate([base.output_lens, np.full(extra, output)])
    return Workload.from_arrays(
        a,
        p,
        o,
        name="first-finisher+queue",
        info={"source": "book.continuous.first_finisher_queue", "extra": extra, "gap": gap},
    )


def probe_summary(its: Mapping[str, np.ndarray], probe: int) -> dict[str, float]:
    """7.2: the share of probes that lived exactly ``probe`` iterations from admission
    (``exact_fraction``) and the median iterations from arrival (``arrival_p50``)."""
    return {
        "exact_fraction": float(np.mean(its["from_admission"] == probe)),
        "arrival_p50": float(np.median(its["from_arrival"])),
    }


def iterations_claim(summary: Mapping[str, float], probe: int, slack: float = 2.0) -> Claim:
    """The seed's "a 20-token request finishes after about 20 iterations" on :func:`probe_summary`:
    holds if every probe took exactly ``probe`` iterations from admission and the median
    probe at most ``probe + slack`` from arrival."""
    ok = summary["exact_fraction"] == 1.0 and summary["arrival_p50"] <= probe + slack
    return Claim.HOLDS if ok else Claim.DOES_NOT_HOLD


def utilization_at_capacity(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]], itl_slo_ms: float, **options: Any
) -> dict[str, dict[str, float]]:
    """7.2 (70B): each configuration at its own capacity under ``itl_slo_ms``
    (:func:`~batching.book.capacity.capacity`; ``options`` go to it): ``slot_util`` and
    ``hw_compute`` of the run at that rate (NaN where no rate met the SLO)."""
    out = {}
    for name, cfg in configs.items():
        p = capacity(workload, cost, cfg, itl_slo_ms, **options)["point"]
        out[name] = {k: float(p[k]) if p else math.nan for k in ("slot_util", "hw_compute")}
    return out


def utilization_claim(slot_capped: float, hw_capped: float, hw_wide: float, target: float = 0.60) -> Claim:
    """The seed's "utilization rises to 60-80% with continuous batching" at capacity:
    ``slot_capped`` and ``hw_capped`` (all-FLOP hardware compute utilization) with the usual
    slot cap, ``hw_wide`` with the slots the devices' KV allows. Holds if the capped run
    reaches ``target`` in both measures; :attr:`Claim.NEEDS_WIDE_BATCH` if only the wide run
    reaches it in FLOPs; :attr:`Claim.SLOT_LEVEL_ONLY` if neither does."""
    if slot_capped < target:
        return Claim.DOES_NOT_HOLD
    if hw_capped >= target:
        return Claim.HOLDS
    return Claim.NEEDS_WIDE_BATCH if hw_wide >= target else Claim.SLOT_LEVEL_ONLY


def kv_rows(cost: Any, mean_tokens: float, cap: int = 256) -> dict[str, int]:
    """How many requests the devices' KV memory holds at once: ``slabs`` (one full-context
    slab each, at most ``cap``) and ``exact`` (``mean_tokens`` each, at most ``cap``), plus
    ``capacity`` (KV tokens that fit after the weights)."""
    kv = float(cost.kv_capacity())
    if mean_tokens <= 0:
        raise ValueError(f"mean_tokens={mean_tokens}: must be positive")
    return {
        "capacity": int(kv),
        "slabs": int(min(cap, kv // cost.model.max_context)),
        "exact": int(min(cap, kv // mean_tokens)),
    }


def p99_at(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]], time_scale: float
) -> dict[str, dict[str, Any]]:
    """7.2: every configuration at one replay speed: ``stable``, ``offered_rate``,
    ``throughput_req`` and, for stable runs only, ``e2e_p99`` and ``ttft_p99`` (s; NaN for an
    unstable run, whose percentiles grow with the replay's length and are not values)."""
    out = {}
    for name, cfg in configs.items():
        p = run_point(workload, cost, cfg, time_scale)
        ok = bool(p["stable"])
        out[name] = {
            "stable": ok,
            "offered_rate": float(p["offered_rate"]),
            "throughput_req": float(p["throughput_req"]),
            "e2e_p99": float(p["e2e_p99"]) if ok else math.nan,
            "ttft_p99": float(p["ttft_p99"]) if ok else math.nan,
        }
    return out


def p99_claim(p99: Mapping[str, Mapping[str, Any]], dense: str, cont: str, factor: float = 2.0) -> Claim:
    """The seed's "p99 latency shrinks sharply" at one load (:func:`p99_at`): holds if the
    continuous configuration is stable and its p99 end-to-end latency is at most 1/``factor``
    of the dense one's, or the dense one is unstable there."""
    c, d = p99[cont], p99[dense]
    if not c["stable"]:
        return Claim.DOES_NOT_HOLD
    if not d["stable"] or c["e2e_p99"] * factor <= d["e2e_p99"]:
        return Claim.HOLDS
    return Claim.DOES_NOT_HOLD
