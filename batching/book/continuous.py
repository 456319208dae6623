"""7.2 Continuous batching: schedulers compared on real traffic, rate sweeps, how many
iterations a short request lives through, and the first finisher's freed slot.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..costs import MEM_RESERVE
from ..engine import RunResult
from ..metrics import request_record
from ..workload import Workload, preset
from .common import at, flat, metrics, simulate


# ------------------------------------------------------------------------------- 7.2
def compare_schedulers(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    """7.2: one run per named configuration on the same workload; returns :func:`metrics`
    per name. A config is ``{"scheduler": ..., "slots": ..., **options}`` (see :func:`simulate`)."""
    out = {}
    for name, cfg in configs.items():
        cfg = dict(cfg)
        out[name] = metrics(simulate(workload, cost, cfg.pop("scheduler"), **cfg))
    return out


def rate_sweep(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]], time_scales: Sequence[float]
) -> dict[str, dict[str, np.ndarray]]:
    """7.2 / 7.3: every configuration at every arrival rate.

    The workload is replayed ``k`` times faster for each ``k`` in ``time_scales`` (the same
    requests, arrivals compressed), so the offered rate is ``k`` x the trace's. Per config,
    arrays over the sweep: ``time_scale``, ``offered_rate`` (req/s) and every key of
    :func:`metrics`.
    """
    n = len(workload)
    span = workload.duration
    out: dict[str, dict[str, list[float]]] = {name: {} for name in configs}
    for k in time_scales:
        w = workload.scale(time=float(k))
        res = compare_schedulers(w, cost, configs)
        for name, m in res.items():
            d = out[name]
            d.setdefault("time_scale", []).append(float(k))
            d.setdefault("offered_rate", []).append(n / (span / float(k)) if span > 0 else math.inf)
            for key, v in m.items():
                d.setdefault(key, []).append(v)
    return {name: {k: np.asarray(v) for k, v in d.items()} for name, d in out.items()}


def sweep_numbers(
    sweep: Mapping[str, Mapping[str, np.ndarray]],
    points: Mapping[str, float],
    keys: Sequence[str],
    key: str = "time_scale",
) -> dict[str, float]:
    """7.2: glue-ready numbers of a :func:`rate_sweep`: ``<tag>_<config>_<metric>`` for each
    ``{tag: value of key}`` in ``points`` and each metric in ``keys``, plus
    ``sat_<config>_throughput_{req,tok}`` (:func:`saturation`)."""
    out: dict[str, float] = {}
    for name, d in sweep.items():
        for tag, value in points.items():
            out.update(flat(f"{tag}_{name}", at(d, key, value), keys))
    for name, sat in saturation(sweep).items():
        out.update(flat(f"sat_{name}", sat))
    return out


def saturation(sweep: Mapping[str, Mapping[str, np.ndarray]]) -> dict[str, dict[str, float]]:
    """7.2: the highest throughput each configuration reached over a rate sweep (its capacity,
    if the sweep went past it): ``throughput_req`` and ``throughput_tok``."""
    return {
        name: {
            "throughput_req": float(d["throughput_req"].max()),
            "throughput_tok": float(d["throughput_tok"].max()),
        }
        for name, d in sweep.items()
    }


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
    """7.2: latency of a subset of requests: ``n``, ``ttft_mean``, ``e2e_mean``, ``e2e_p50``,
    ``e2e_p99``, ``queue_mean`` (s), and ``last_finish`` (s after the first arrival)."""
    want = set(rids)
    recs = [request_record(r) for r in result.requests if r.rid in want]
    if not recs:
        raise ValueError("subset_latency(): none of the rids is in the run")
    e2e = np.array([x["e2e"] for x in recs])
    start = min(r.arrival for r in result.requests)
    return {
        "n": float(len(recs)),
        "ttft_mean": float(np.mean([x["ttft"] for x in recs])),
        "e2e_mean": float(e2e.mean()),
        "e2e_p50": float(np.median(e2e)),
        "e2e_p99": float(np.percentile(e2e, 99)),
        "queue_mean": float(np.mean([x["queue"] for x in recs])),
        "last_finish": float(max(x["finish"] for x in recs) - start),
    }


def decode_compute_share(cost: Any, rows: int) -> float:
    """7.2: the compute utilization a memory-bound decode step of ``rows`` rows reaches,
    about rows / B* (the batch at which decode turns compute-bound)."""
    return float(rows / cost.bstar())


def decode_step_ms(cost: Any, batch: int, ctx: int) -> float:
    """Roofline time (ms) of one decode step of ``batch`` rows holding ``ctx`` KV tokens each (7.2)."""
    return float(cost.decode_step(batch, ctx) * 1e3)


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
        info={"source": "experiments.first_finisher_queue", "extra": extra, "gap": gap},
    )


def probe_summary(its: Mapping[str, np.ndarray], probe: int) -> dict[str, float]:
    """7.2: how the probes' iterations and times are distributed (for the prose)."""
    fa, fr, sv = its["from_admission"], its["from_arrival"], its["service"]
    return {
        "n": float(len(fa)),
        "exact_fraction": float(np.mean(fa == probe)),
        "admission_p50": float(np.median(fa)),
        "admission_max": float(fa.max()),
        "arrival_p50": float(np.median(fr)),
        "arrival_p99": float(np.percentile(fr, 99)),
        "service_p50": float(np.median(sv)),
        "service_p99": float(np.percentile(sv, 99)),
        "e2e_p50": float(np.median(its["e2e"])),
        "e2e_p99": float(np.percentile(its["e2e"], 99)),
    }


def dense_batches(result: RunResult) -> dict[str, float]:
    """7.2: how full a dense batcher's (static or dynamic) batches were. Every member of a
    dense batch is admitted by the batch's one prefill step, so requests admitted at the same
    instant form one batch. Returns ``n`` (batches), ``mean`` and ``p50`` members per batch,
    and ``full_share``, the share of batches with ``max_slots`` members."""
    if result.scheduler.get("scheduler") not in ("static", "dynamic"):
        raise ValueError(f"dense_batches(): {result.scheduler.get('scheduler')!r} does not run dense batches")
    adm = np.array([r.admit_time for r in result.requests], dtype=float)
    _, members = np.unique(adm, return_counts=True)
    return {
        "n": float(len(members)),
        "mean": float(members.mean()),
        "p50": float(np.median(members)),
        "full_share": float(np.mean(members == int(result.scheduler["max_slots"]))),
    }


def batch_fill(
    workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]]
) -> dict[str, dict[str, float]]:
    """7.2: :func:`dense_batches` of every static or dynamic configuration (configs as
    :func:`compare_schedulers`; the others are skipped), each run once on ``workload``. Static
    configurations also get ``timeout_expect``: 1 + offered rate x timeout, the members a
    batch sealed by its timeout holds when requests arrive at the mean rate."""
    out = {}
    rate = len(workload) / workload.duration if workload.duration > 0 else math.inf
    for name, cfg in configs.items():
        cfg = dict(cfg)
        kind = cfg.pop("scheduler")
        if kind not in ("static", "dynamic"):
            continue
        out[name] = dense_batches(simulate(workload, cost, kind, **cfg))
        if kind == "static":
            out[name]["timeout_expect"] = float(1 + rate * cfg.get("timeout", 0.0))
    return out


def metric_range(
    sweep: Mapping[str, Mapping[str, np.ndarray]], metric: str, value: float, key: str = "time_scale"
) -> dict[str, Any]:
    """7.2: the lowest and highest ``metric`` over the configurations of a :func:`rate_sweep`
    where ``sweep[key] == value``: ``lo``, ``hi`` and the configurations ``lo_name``, ``hi_name``."""
    vals = {name: at(d, key, value)[metric] for name, d in sweep.items()}
    lo, hi = min(vals, key=vals.__getitem__), max(vals, key=vals.__getitem__)
    return {"lo": vals[lo], "hi": vals[hi], "lo_name": lo, "hi_name": hi}


def hw_compute_text(
    hw: Mapping[str, float], static_batch: float, slots: int, timeout: float, tol: float = 0.10
) -> str:
    """7.2, the verdict on hardware utilization: all-FLOP compute utilization of dynamic
    batching against continuous batching (``hw``: {"static", "dynamic", "continuous": share
    of peak} at one load), within ``tol`` (relative) said to be "about as busy", and where
    static batching sits: below continuous batching, because its ``timeout`` seals batches
    of ``static_batch`` requests on average out of ``slots`` (a decode step of few rows does
    few FLOPs); otherwise its share alone. One or two sentences, MyST."""
    dy, co, st = (float(hw[k]) for k in ("dynamic", "continuous", "static"))
    if abs(dy - co) <= tol * co:
        how = "about as busy as"
    else:
        how = "busier than" if dy > co else "less busy than"
    text = (
        f"Counting every FLOP, dynamic batching keeps the device {how} continuous batching ({dy:.0%} "
        f"against {co:.0%})"
    )
    text += (
        ", because padding and dead rows are real FLOPs."
        if dy >= co * (1 - tol)
        else ", even with its padding and dead rows counted as the real FLOPs they are."
    )
    if st < co * (1 - tol):
        return text + (
            f" Static batching's {st:.0%} is lower because its batches are small: its {timeout:g} s "
            f"timeout seals them at {static_batch:.1f} requests on average, of {slots} slots, and a "
            f"decode step of few rows does few FLOPs."
        )
    return text + f" Static batching keeps it at {st:.0%}."


def slab_text(cost: Any, slots: int) -> str:
    """7.2: the KV reservation every simulation of the page uses, in one sentence: each
    admitted request reserves a slab of the model's full context (``kv_policy="slab"``, the
    :func:`simulate` default) out of what the devices' memory leaves after the weights, and
    whether that many slabs or the ``slots`` limit how many requests run at once."""
    cap, ctx = int(cost.kv_capacity()), int(cost.model.max_context)
    slabs = cap // ctx
    limit = (
        f"{slabs} slabs, more than the {slots} slots, so memory never limits these runs"
        if slabs >= slots
        else f"only {slabs} slabs for {slots} slots, so memory, not the slots, limits how many requests run at once"
    )
    return (
        f"Each simulated request reserves its KV cache as one slab of the model's full context "
        f'({ctx:,} tokens) when it is admitted (`kv_policy="slab"`; the KV page compares it with '
        f"exact reservations), out of the {cap:,} KV tokens that fit in the devices' memory after "
        f"the weights and a {MEM_RESERVE:.0%} reserve: {limit}."
    )


def bend_text(
    sweep: Mapping[str, Mapping[str, np.ndarray]], name: str, timeout: float, metric: str = "e2e_p99"
) -> str:
    """7.2: one sentence on whether configuration ``name`` of a :func:`rate_sweep` (a static
    batcher with ``timeout``) bends back on the throughput-latency plot: its ``metric``
    peaks at some replay speed and then falls while the load keeps rising."""
    d = sweep[name]
    k, y = np.asarray(d["time_scale"], dtype=float), np.asarray(d[metric], dtype=float)
    i = int(np.argmax(y))
    if i == len(y) - 1:
        return f"The {name} curve rises with the load over the whole sweep."
    return (
        f"The {name} curve bends back: past {k[i]:g}x its latency falls as the load rises "
        f"({y[i]:,.0f} s to {y[-1]:,.0f} s at {metric.split('_')[-1]} by {k[-1]:g}x), because faster "
        f"arrivals fill more of each batch before its {timeout:g} s timeout seals it."
    )
