"""Continuous batching: the first finisher's freed slot, the iterations a short request lives
through, p99 latency and utilization at a given load, and the verdicts on the seed's claims."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..capacity import run_points, searches, slos
from ..costs.base import CostModel
from ..engine import RunResult
from ..metrics import iterations, request_record, run_metrics
from ..simulate import simulate
from ..workloads import Workload, preset
from .common import Claim, columns


def rate_sweep(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, Mapping[str, Any]],
    time_scales: Sequence[float],
) -> dict[str, dict[str, np.ndarray]]:
    """Each configuration (``{"scheduler": ..., **options}``) with the workload replayed ``k``
    times faster for each ``k`` in ``time_scales``: per config, arrays over the sweep of
    :func:`~batching.capacity.run_point`'s ``time_scale``, ``offered_rate`` (req/s),
    ``stable`` and every :func:`~batching.book.common.metrics` key."""
    points = run_points(workload, cost, configs, time_scales)
    return {name: columns(ps) for name, ps in points.items()}


def with_probes(workload: Workload, every: int = 10, output: int = 20) -> tuple[Workload, list[int]]:
    """The workload with every ``every``-th request made a probe that wants exactly ``output``
    tokens (same arrivals and prompts), and the probes' rids."""
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
    workload: Workload, cost: CostModel, configs: Mapping[str, Mapping[str, Any]], probes: Sequence[int]
) -> dict[str, dict[str, np.ndarray]]:
    """:func:`iterations` of the probe requests under each configuration
    (``{name: {"scheduler": ..., **options}}``)."""
    out = {}
    for name, cfg in configs.items():
        cfg = dict(cfg)
        out[name] = iterations(simulate(workload, cost, cfg.pop("scheduler"), **cfg), probes)
    return out


def subset_latency(result: RunResult, rids: Sequence[int]) -> dict[str, float]:
    """The mean end-to-end latency (s) of the requests ``rids`` (``e2e_mean``)."""
    want = set(rids)
    recs = [request_record(r) for r in result.requests if r.rid in want]
    if not recs:
        raise ValueError("subset_latency(): none of the rids is in the run")
    return {"e2e_mean": float(np.mean([x["e2e"] for x in recs]))}


def first_finisher_queue(extra: int = 64, gap: float = 0.05) -> Workload:
    """The ``first-finisher`` preset (32 requests at t=0, one wants 2,000 tokens, 31 want 20)
    followed by ``extra`` requests like the 31 (128-token prompts), one every ``gap`` s."""
    base = preset("first-finisher")
    a = np.concatenate([base.arrivals, gap * np.arange(1, extra + 1)])
    p = np.concatenate([base.prompt_lens, np.full(extra, 128)])
    o = np.concatenate([base.output_lens, np.full(extra, 20)])
    return Workload.from_arrays(
        a,
        p,
        o,
        name="first-finisher+queue",
        info={"source": "book.continuous.first_finisher_queue", "extra": extra, "gap": gap},
    )


def probe_summary(its: Mapping[str, np.ndarray], probe: int) -> dict[str, float]:
    """The share of probes that lived exactly ``probe`` iterations from admission
    (``exact_fraction``) and the median iterations from arrival (``arrival_p50``)."""
    return {
        "exact_fraction": float(np.mean(its["from_admission"] == probe)),
        "arrival_p50": float(np.median(its["from_arrival"])),
    }


def iterations_claim(summary: Mapping[str, float], probe: int) -> Claim:
    """The claim "a 20-token request finishes after about 20 iterations", on
    :func:`probe_summary`: holds if every probe took exactly ``probe`` iterations from
    admission and the median at most ``probe`` + 2 from arrival."""
    ok = summary["exact_fraction"] == 1.0 and summary["arrival_p50"] <= probe + 2
    return Claim.HOLDS if ok else Claim.DOES_NOT_HOLD


def utilization_at_capacity(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, Mapping[str, Any]],
    itl_slo_ms: float,
    **options: Any,
) -> dict[str, dict[str, float]]:
    """Each configuration's run at its own capacity under ``itl_slo_ms``
    (:func:`~batching.capacity.capacity`, which gets ``options``): its ``rate`` (req/s
    offered), ``slot_util``, ``hw_compute`` (all FLOPs), ``decode_compute`` (its decode
    rows' FLOPs alone) and ``prefill_share``, the share of its FLOPs that is not decode's
    (prefill, with its attention); NaN where no rate met the SLO (``rate`` 0)."""
    out = {}
    keys = ("slot_util", "hw_compute", "decode_compute")
    found = searches(workload, cost, configs, {"slo": itl_slo_ms}, **options)
    for name in configs:
        c = found[name]["slo"]
        p = c["point"]
        u = {k: float(p[k]) if p else math.nan for k in keys}
        hw = u["hw_compute"]
        u["prefill_share"] = 1.0 - u["decode_compute"] / hw if hw > 0 else math.nan
        out[name] = {"rate": float(c["rate"]), **u}
    return out


#: The claim's bound on utilization ("rises to 60-80%"): its lower end.
UTIL_CLAIM = 0.60


def utilization_claim(slot_capped: float, hw_capped: float, hw_wide: float) -> Claim:
    """The claim "utilization rises to 60-80% with continuous batching", at capacity:
    ``slot_capped`` and ``hw_capped`` (all-FLOP hardware compute utilization) with the usual
    slot cap, ``hw_wide`` with the slots the KV allows. HOLDS if the capped run reaches 60% in
    both; NEEDS_WIDE_BATCH if only the wide run reaches it in FLOPs; SLOT_LEVEL_ONLY if neither
    does; DOES_NOT_HOLD if not even the slots reach it. NaN (no rate met the SLO) never
    reaches it."""
    if not slot_capped >= UTIL_CLAIM:
        return Claim.DOES_NOT_HOLD
    if hw_capped >= UTIL_CLAIM:
        return Claim.HOLDS
    return Claim.NEEDS_WIDE_BATCH if hw_wide >= UTIL_CLAIM else Claim.SLOT_LEVEL_ONLY


def utilization_case(
    workload: Workload, cost: CostModel, narrow: Mapping[str, Any], wide: Mapping[str, Any], **options: Any
) -> dict[str, Any]:
    """The utilization claim on one setup (a roofline or a measured profile): the relaxed
    SLO (ms, :func:`~batching.capacity.slos` of ``cost``), :func:`kv_rows` at the
    workload's mean request length (``kv_slabs``, ``kv_exact``), ``kv_limited`` (fewer
    requests fit exactly than ``narrow``'s slots: memory, not the slot cap, bounds the batch),
    :func:`utilization_at_capacity` of the ``narrow`` (slot-capped) and ``wide`` configurations
    (``options`` go there) and the ``claim`` (:func:`utilization_claim`)."""
    slo = slos(cost)["relaxed_ms"]
    u = utilization_at_capacity(workload, cost, {"narrow": narrow, "wide": wide}, slo, **options)
    kv = kv_rows(cost, float((workload.prompt_lens + workload.output_lens).mean()))
    n, w = u["narrow"], u["wide"]
    return {
        "relaxed_ms": slo,
        "kv_slabs": kv["slabs"],
        "kv_exact": kv["exact"],
        "kv_limited": kv["exact"] < int(narrow["slots"]),
        "narrow": n,
        "wide": w,
        "claim": utilization_claim(n["slot_util"], n["hw_compute"], w["hw_compute"]),
    }


def utilization_marks(case: Mapping[str, Any], narrow: str, wide: str) -> list[tuple[str, str, float, float]]:
    """The three numbers :func:`utilization_claim` reads, as points to mark on the utilization
    figure: ``(configuration, metric, rate, value)``, the ``narrow`` configuration's slot and
    hardware compute utilization and the ``wide`` one's hardware compute, each at its
    capacity (a configuration with no capacity is left out)."""
    n, w = case["narrow"], case["wide"]
    pts = [
        (narrow, "slot_util", n["rate"], n["slot_util"]),
        (narrow, "hw_compute", n["rate"], n["hw_compute"]),
        (wide, "hw_compute", w["rate"], w["hw_compute"]),
    ]
    return [p for p in pts if p[2] > 0]


def token_ratio(workload: Workload) -> float:
    """Prompt tokens over output tokens of a workload (what prefill computes against decode)."""
    out = float(workload.output_lens.sum())
    if out <= 0:
        raise ValueError("token_ratio(): the workload has no output tokens")
    return float(workload.prompt_lens.sum()) / out


#: "Several times the traffic": continuous batching's capacity at least this many times
#: dynamic batching's.
SEVERAL_X = 3.0


def capacity_gain(cap: Mapping[str, Mapping[str, float]], cont: str, dense: str, slo: str) -> dict[str, Any]:
    """The claim "continuous batching serves several times the traffic within the same latency
    target" on :func:`~batching.capacity.capacity_by_config`: ``gain``, ``cont``'s
    capacity over ``dense``'s at ``slo`` (``math.inf`` where ``dense`` met no rate), and
    ``claim``: HOLDS at :data:`SEVERAL_X` or more, PARTLY above 1 (more, not several times),
    else DOES_NOT_HOLD."""
    c, d = float(cap[cont][slo]), float(cap[dense][slo])
    gain = c / d if d > 0 else (math.inf if c > 0 else math.nan)
    if gain >= SEVERAL_X:
        claim = Claim.HOLDS
    elif gain > 1.0:
        claim = Claim.PARTLY
    else:
        claim = Claim.DOES_NOT_HOLD
    return {"gain": gain, "claim": claim}


def kv_rows(cost: CostModel, mean_tokens: float) -> dict[str, int]:
    """How many requests the devices' KV memory holds at once, at most 256: as full-context
    slabs (``slabs``) or at ``mean_tokens`` each (``exact``)."""
    kv = float(cost.kv_capacity())
    if mean_tokens <= 0:
        raise ValueError(f"mean_tokens={mean_tokens}: must be positive")
    return {"slabs": int(min(256, kv // cost.model.max_context)), "exact": int(min(256, kv // mean_tokens))}


def p99_at(
    workload: Workload, cost: CostModel, configs: Mapping[str, Mapping[str, Any]], time_scale: float
) -> dict[str, dict[str, Any]]:
    """Each configuration at one replay speed: ``stable``, ``offered_rate``, ``throughput_req``
    and ``e2e_p99``, ``ttft_p99`` (s; NaN for an unstable run, whose percentiles grow with the
    replay's length)."""
    out = {}
    points = run_points(workload, cost, configs, [time_scale])
    for name in configs:
        p = points[name][0]
        ok = bool(p["stable"])
        out[name] = {
            "stable": ok,
            "offered_rate": float(p["offered_rate"]),
            "throughput_req": float(p["throughput_req"]),
            "e2e_p99": float(p["e2e_p99"]) if ok else math.nan,
            "ttft_p99": float(p["ttft_p99"]) if ok else math.nan,
        }
    return out


def p99_claim(p99: Mapping[str, Mapping[str, Any]], dense: str, cont: str) -> Claim:
    """The claim "p99 latency shrinks sharply", at one load (:func:`p99_at`): holds if the
    continuous configuration is stable and its p99 end-to-end latency at most half the dense
    one's, or the dense one is unstable there."""
    c, d = p99[cont], p99[dense]
    if not c["stable"]:
        return Claim.DOES_NOT_HOLD
    if not d["stable"] or c["e2e_p99"] * 2 <= d["e2e_p99"]:
        return Claim.HOLDS
    return Claim.DOES_NOT_HOLD


def queue_wait_bound(workload: Workload, rids: Sequence[int], blocked_s: float) -> dict[str, float]:
    """A lower bound on how long the requests ``rids`` of ``workload`` wait when none is
    admitted before ``blocked_s`` (s after t = 0, e.g. the long request's decode steps under
    static batching): ``from_start`` (``blocked_s``), ``mean_arrival`` (s after t = 0) and
    ``from_arrival``, the mean of max(0, ``blocked_s`` - arrival), the origin a request's
    latency is measured from."""
    want = set(rids)
    arr = np.array([a for a, r in zip(workload.arrivals, workload.rids) if r in want], dtype=float)
    if len(arr) == 0:
        raise ValueError("queue_wait_bound(): none of the rids is in the workload")
    return {
        "from_start": float(blocked_s),
        "mean_arrival": float(arr.mean()),
        "from_arrival": float(np.maximum(0.0, blocked_s - arr).mean()),
    }


def step_gap(static: RunResult, cont: RunResult) -> dict[str, float]:
    """How much sooner continuous batching ends the same batch than static batching, and why:
    each run's mean step (``static_step_ms``, ``cont_step_ms``: busy time over steps, ms), its
    end (``static_end_s``, ``cont_end_s``) and ``gap``, 1 - continuous end / static end."""
    out = {}
    for tag, res in (("static", static), ("cont", cont)):
        m = run_metrics(res)
        out[f"{tag}_step_ms"] = 1e3 * m["busy_s"] / m["steps"]
        out[f"{tag}_end_s"] = max(float(r.finish_time) for r in res.requests if r.finish_time is not None)
    out["gap"] = 1.0 - out["cont_end_s"] / out["static_end_s"]
    return out


class Tail(str, enum.Enum):
    """7.2's measured check of "p99 shrinks": which of the static and continuous runs kept up
    with their arrivals (:func:`~batching.metrics.queue_growth`), and, where both did,
    which p99 end-to-end latency is the lower. An unstable run's p99 only measures how long
    the replay lasted, so no ratio is taken from it."""

    #: Both stable; continuous batching's p99 is the lower.
    LOWER = "lower"
    #: Both stable; continuous batching's p99 is not the lower.
    NOT_LOWER = "not lower"
    #: Static batching's queue grew over the replay; continuous batching kept up.
    STATIC_UNSTABLE = "static unstable"
    #: Continuous batching's queue grew while static batching kept up.
    CONT_UNSTABLE = "continuous unstable"
    #: Both queues grew: at this load neither p99 counts, and the check cannot judge the claim.
    BOTH_UNSTABLE = "both unstable"


#: What each :class:`Tail` says of "p99 shrinks" (None: the check cannot judge it).
TAIL_CLAIM: dict[Tail, Claim | None] = {
    Tail.LOWER: Claim.HOLDS,
    Tail.NOT_LOWER: Claim.DOES_NOT_HOLD,
    Tail.STATIC_UNSTABLE: Claim.HOLDS,
    Tail.CONT_UNSTABLE: Claim.DOES_NOT_HOLD,
    Tail.BOTH_UNSTABLE: None,
}


def real_tail(
    static: Mapping[str, Any], cont: Mapping[str, Any], workload: Workload | None = None
) -> dict[str, Any]:
    """7.2's live check of "p99 shrinks" from the real static and continuous runs' numbers
    (``checks.real_schedulers``, whose ``stable`` each run has; a run without it counts as
    stable): ``tail``, the :class:`Tail`; ``claim``, HOLDS for LOWER and STATIC_UNSTABLE (as in
    :func:`p99_claim`, a dense run that falls behind has no p99 to beat), None for
    BOTH_UNSTABLE (untested), else DOES_NOT_HOLD; ``p99_ratio``, the
    larger p99 over the smaller where both runs are stable, else NaN; ``slot_lower``: its slot
    utilization is below static batching's (below saturation its free slots sit empty between
    requests); with ``workload``, ``offered_tok`` (output tokens per second its arrivals ask
    for) beside each run's ``static_tok`` and ``cont_tok`` served."""
    s, c = static["e2e_p99"], cont["e2e_p99"]
    s_ok, c_ok = bool(static.get("stable", True)), bool(cont.get("stable", True))
    if not c_ok:
        tail = Tail.CONT_UNSTABLE if s_ok else Tail.BOTH_UNSTABLE
    elif not s_ok:
        tail = Tail.STATIC_UNSTABLE
    else:
        tail = Tail.LOWER if c < s else Tail.NOT_LOWER
    out: dict[str, Any] = {
        "tail": tail,
        "claim": TAIL_CLAIM[tail],
        "p99_ratio": max(s, c) / min(s, c) if s_ok and c_ok else math.nan,
        "slot_lower": bool(cont["slot_util"] < static["slot_util"]),
        "static_tok": float(static["throughput_tok"]) if "throughput_tok" in static else math.nan,
        "cont_tok": float(cont["throughput_tok"]) if "throughput_tok" in cont else math.nan,
    }
    if workload is not None:
        span = workload.duration
        out["offered_tok"] = float(workload.output_lens.sum()) / span if span > 0 else math.inf
    return out
