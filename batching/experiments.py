"""The experiments behind chapter 7's notebooks: small functions that run a comparison or a
sweep through the simulator (or, for cross-checks, the real engine) and return tidy dicts
of plain Python numbers and numpy arrays.

Notebooks call these and plot the results with :mod:`batching.plots`; nothing else in a
notebook computes. Each function names the section it serves. All simulations use the
roofline cost model (``batching.costs``): their numbers are predictions for the named
model, dtype and device, not measurements.

Utilization means two different things here (``shared/notes/conventions.md``):

* **slot utilization**: output tokens kept / (slots x steps), the fraction of the batch's
  token slots that produced a token the user keeps (``metrics.summarize``);
* **hardware utilization**: achieved FLOP/s / peak (compute) and bytes/s / bandwidth
  (memory), counting every FLOP and byte the steps perform, padding and dead rows included.
  :func:`useful_flops` adds a third view used in 7.2: only the FLOPs an ideal engine must
  do for the workload (each prompt prefilled once, each output token decoded once).
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

import numpy as np

from .costs import RooflineCost
from .engine import RunResult, SimExecutor, run
from .metrics import request_record, summarize
from .models import ModelShape
from .plan import StepWork
from .request import Request
from .schedulers import make_scheduler
from .traces import load_trace
from .workload import Workload, preset

__all__ = [
    "KINDS", "Segment", "describe_cost", "fit_context", "trace_workload", "simulate", "metrics",
    "useful_flops", "padding_cost", "timeline", "slot_steps", "analytic_static_utilization",
    "static_batch_sweep", "wait_sweep", "compare_schedulers", "rate_sweep", "with_probes",
    "iterations", "first_finisher_queue", "long_prompt_among_decodes", "itl_series",
    "chunk_sweep", "kv_over_time", "kv_runs", "kv_fit", "kv_budget_sweep", "budget_numbers",
    "real_available", "real_crosscheck", "roofline_numbers", "offered_rate", "choose", "at",
    "flat", "first_finisher_summary", "probe_summary", "saturation", "sweep_numbers",
    "decode_compute_share", "spike_summary", "stall_runs", "probe_runs", "chunk_step_times",
    "stall_numbers", "tradeoff_numbers", "subset_latency", "decode_step_ms", "crosscheck_text",
    "crosscheck_rows", "fidelity_summary",
]

#: What a batch row does during a step (the timelines of 7.1 and 7.2), in drawing order.
KINDS = ("prefill", "padding", "decode", "dead", "idle")
_OCC_KIND = {"P": "prefill", "D": "decode", "X": "dead"}


# ----------------------------------------------------------------------------- basics
def describe_cost(cost: Any) -> str:
    """One line naming model, dtype and device of a cost model, for captions (every section).

    >>> describe_cost(get_cost_model("llama-70b", "h200", tp=2))
    'llama-70b (bf16 weights, bf16 KV cache) on 2 x H200-SXM, tensor parallel'
    """
    d = cost.describe()
    m = f"{d['model']} ({d['dtype']} weights, {d.get('kv_dtype', d['dtype'])} KV cache)"
    tp = int(d.get("tp", 1))
    dev = f"{tp} x {d['device']}, tensor parallel" if tp > 1 else f"one {d['device']}"
    return f"{m} on {dev}"


def roofline_numbers(cost: Any) -> dict[str, float]:
    """The device and model numbers the prose derives from (every section): ``peak_tflops``
    and ``bandwidth_tbs`` (all devices together), ``weight_gb`` (stored), ``weight_read_gb``
    (streamed per step), ``params_b`` (billions), ``bstar`` (batch where decode turns
    compute-bound), ``decode_ms`` (one decode step of one sequence at context 1), ``tp``,
    ``kv_kb_per_token``, ``kv_capacity`` (tokens) and ``max_context``."""
    m = cost.model
    return {"peak_tflops": cost.peak_flops / 1e12, "bandwidth_tbs": cost.bandwidth / 1e12,
            "weight_gb": m.weight_bytes / 1e9, "weight_read_gb": m.weight_read_bytes / 1e9,
            "params_b": m.params / 1e9, "bstar": float(cost.bstar()), "decode_ms": cost.decode_step(1, 1) * 1e3,
            "tp": float(cost.tp), "kv_kb_per_token": m.kv_bytes_per_token / 1e3,
            "kv_capacity": float(cost.kv_capacity()), "max_context": float(m.max_context)}


def offered_rate(workload: Workload) -> float:
    """Requests per second of a workload: count / span of its arrivals (every section)."""
    return len(workload) / workload.duration if workload.duration > 0 else math.inf


def fit_context(workload: Workload, max_context: int) -> tuple[Workload, int]:
    """Cap requests to the model's context; returns the workload and how many were capped
    (recorded in ``info["capped"]``: never silent). Dense batches need nothing more: the
    static and dynamic schedulers never pad a batch past the context."""
    return workload.cap_to_context(max_context, mode="cap")


def trace_workload(name: str, limit: int | None = None, max_context: int = 8192,
                   time_scale: float = 1.0, window: tuple[float, float] | None = None) -> Workload:
    """The first ``limit`` requests of a named trace, capped to the context (see
    :func:`fit_context`) and replayed ``time_scale`` times faster (every section)."""
    w = load_trace(name, limit=limit, window=window)
    w, _ = fit_context(w, max_context)
    return w.scale(time=time_scale) if time_scale != 1 else w


def simulate(workload: Workload | Sequence[Request], cost: Any, scheduler: str, *, slots: int = 32,
             kv_tokens: int | float | str | None = "device", kv_policy: str = "slab",
             record_slots: bool = False, fast: bool = True, **options: Any) -> RunResult:
    """One simulated run (every section).

    ``kv_tokens="device"`` takes the KV capacity the cost model's devices leave after the
    weights; ``None`` means unlimited. ``options`` go to :func:`make_scheduler` (``timeout``,
    ``prefill_mode``, ``token_budget``, ``chunk_size``). ``fast=False`` logs every step on
    its own row (the engine's fast path logs a run of identical decode steps as one row,
    with the KV and queue columns as they stand after its last step).
    """
    if kv_tokens == "device":
        kv: float = cost.kv_capacity()
    elif kv_tokens is None:
        kv = math.inf
    else:
        kv = kv_tokens  # type: ignore[assignment]
    sched = make_scheduler(scheduler, max_context=cost.model.max_context, slots=slots,
                           kv_capacity=kv, kv_policy=kv_policy, **options)
    reqs = workload.fresh() if isinstance(workload, Workload) else list(workload)
    return run(reqs, sched, SimExecutor(cost), record_slots=record_slots, fast=fast)


def useful_flops(requests: Iterable[Request], model: ModelShape) -> float:
    """FLOPs an ideal engine must spend on these requests (7.2's "useful" compute).

    Each prompt prefilled once (causal attention over itself) and each later output token
    decoded once over its context; no padding, no dead rows, no recomputation after a
    preemption. Uses the same FLOP formulas as the cost model (``ModelShape.flops_arrays``).
    """
    p = np.array([r.prompt_len for r in requests], dtype=np.float64)
    n = np.array([r.output_len for r in requests], dtype=np.float64)
    pt = p.sum()
    pa = (p * (p + 1) / 2).sum()
    rows = (n - 1).sum()
    ctx = ((n - 1) * p + n * (n - 1) / 2).sum()
    return float(model.flops_arrays(float(pt), float(pa), float(rows), float(ctx)))


def metrics(result: RunResult) -> dict[str, float]:
    """The flat, tidy metrics of one run (every section); times in seconds.

    Keys: ``slot_util`` (step-weighted), ``slot_util_tw`` (time-weighted), ``hw_compute``,
    ``hw_bandwidth`` (all FLOPs / bytes performed), ``useful_compute`` (:func:`useful_flops`
    over busy time and peak), ``padding_fraction``, ``throughput_req``, ``throughput_tok``
    (output tokens/s over the run's window), ``{queue,ttft,e2e,itl,tpot}_{mean,p50,p90,p99,max}``,
    ``preemptions``, ``steps``, ``busy_s``, ``duration_s``, ``kv_reserved_peak``,
    ``kv_used_peak``, ``kv_reserved_mean``, ``kv_used_mean``, ``running_peak``.
    """
    s = summarize(result)
    out: dict[str, float] = {
        "slot_util": s["slot_utilization"], "slot_util_tw": s["slot_utilization_time_weighted"],
        "padding_fraction": s["padding_fraction"], "throughput_req": s["request_throughput"] or 0.0,
        "throughput_tok": s["output_throughput"] or 0.0, "preemptions": float(s["preemptions"]),
        "steps": float(s["steps"]), "busy_s": s["busy_s"], "duration_s": s["duration_s"],
        "kv_reserved_peak": s["kv_reserved_peak"], "kv_used_peak": s["kv_used_peak"],
        "kv_reserved_mean": s["kv_reserved_mean"], "kv_used_mean": s["kv_used_mean"],
        "running_peak": float(max(result.log.cols["running"])),
    }
    for k in ("queue", "ttft", "e2e", "itl", "tpot"):
        for stat, v in s[k].items():
            out[f"{k}_{stat}"] = float("nan") if v is None else float(v)
    cost = result.cost
    if "hw_compute_utilization" in s:
        out["hw_compute"] = s["hw_compute_utilization"]
        out["hw_bandwidth"] = s["hw_bandwidth_utilization"]
        out["useful_compute"] = useful_flops(result.requests, cost.model) / (s["busy_s"] * cost.peak_flops)
    return {k: float(v) for k, v in out.items()}


# ------------------------------------------------------------------------------- 7.1
def padding_cost(cost: RooflineCost, short: int = 50, long: int = 4000, output: int = 20) -> dict[str, float]:
    """7.1 (a): what padding a ``short`` prompt to a ``long`` one costs.

    Runs the ``padding-pair`` shape (one short and one long prompt at t=0) through the
    static scheduler, and prices single prefills with the roofline. Keys: ``pad_tokens``,
    ``prefill_computed`` and ``prefill_needed`` (tokens of the batch's prefill step),
    ``padding_fraction``, ``token_ratio`` (long / short), ``flop_ratio`` (FLOPs of the
    padded short prompt over the unpadded one, attention included), the roofline times in
    seconds ``t_short``, ``t_short_padded``, ``t_long``, ``t_batch_unpadded``,
    ``t_batch_padded`` and ``t_batch_sim`` (the simulator's prefill step), the same in
    milliseconds (``*_ms``), their ratios ``time_ratio_short`` and ``time_ratio_batch``,
    ``bstar``, and the bound (``memory``/``compute``) of the short and the padded prefill.
    """
    if isinstance(short, bool) or not (isinstance(short, int) and isinstance(long, int) and 0 < short < long):
        raise ValueError(f"short={short!r}, long={long!r}: need integers 0 < short < long")
    w = Workload.from_arrays([0.0, 0.0], [short, long], [output, output], name="padding-pair")
    res = simulate(w, cost, "static", slots=2, kv_tokens=None)
    s = summarize(res)
    L = res.log.cols

    def work(*prompts: int) -> StepWork:
        return StepWork(prefill_tokens=sum(prompts), prefill_attn=sum(p * (p + 1) // 2 for p in prompts))

    pad = long - short
    out = {
        "short": float(short), "long": float(long),
        "pad_tokens": float(L["pad"][0]), "prefill_needed": float(L["prefill"][0]),
        "prefill_computed": float(L["prefill"][0] + L["pad"][0]),
        "padding_fraction": s["padding_fraction"], "token_ratio": long / short,
        "flop_ratio": cost.flops(work(long)) / cost.flops(work(short)),
        "t_short": cost.step_time(work(short)), "t_short_padded": cost.step_time(work(long)),
        "t_long": cost.step_time(work(long)), "t_batch_unpadded": cost.step_time(work(short, long)),
        "t_batch_padded": cost.step_time(work(long, long)), "t_batch_sim": float(L["dur"][0]),
    }
    assert out["pad_tokens"] == pad, (out["pad_tokens"], pad)
    for k in ("t_short", "t_short_padded", "t_long", "t_batch_unpadded", "t_batch_padded", "t_batch_sim"):
        out[f"{k}_ms"] = out[k] * 1e3
    out["time_ratio_short"] = out["t_short_padded"] / out["t_short"]
    out["time_ratio_batch"] = out["t_batch_padded"] / out["t_batch_unpadded"]
    out["bstar"] = float(cost.bstar())
    terms = cost.terms(work(short)), cost.terms(work(long))
    return {**out, "bound_short": terms[0]["bound"], "bound_padded": terms[1]["bound"]}  # type: ignore[dict-item]


class Segment(NamedTuple):
    """One stretch of one batch row doing one thing (7.1 and 7.2 timelines).

    ``kind`` is one of :data:`KINDS`; ``rid`` is None for idle rows; ``steps`` counts the
    engine steps the segment spans (a prefill split into prefill + padding counts its step
    in both parts).
    """

    slot: int
    rid: int | None
    kind: str
    t0: float
    t1: float
    steps: int


def timeline(result: RunResult) -> list[Segment]:
    """Per-slot timeline of a run recorded with ``record_slots=True`` (7.1 (b), 7.2).

    Each step's rows come from ``log.occupancy``: a prefill chunk is drawn over the step,
    split in time between its real tokens and its padding in proportion to their counts;
    a decode row is ``decode``; a static batch's finished-but-computed row is ``dead``;
    a slot with nothing in the step (or any slot while the engine waits for arrivals) is
    ``idle``. Consecutive pieces of the same slot, request and kind are merged. Sorted by
    slot, then time.
    """
    log = result.log
    if not log.record_slots or len(log.occupancy) != len(log):
        raise ValueError("timeline() needs a run recorded with record_slots=True")
    C = log.cols
    nslots = int(max(C["slots"]))
    rows: dict[int, list[Segment]] = {s: [] for s in range(nslots)}

    def add(slot: int, rid: int | None, kind: str, t0: float, t1: float, steps: int) -> None:
        segs = rows.setdefault(slot, [])
        if segs:
            last = segs[-1]
            if (last.rid, last.kind) == (rid, kind) and math.isclose(last.t1, t0, rel_tol=1e-12, abs_tol=1e-12):
                segs[-1] = last._replace(t1=t1, steps=last.steps + steps)
                return
        segs.append(Segment(slot, rid, kind, t0, t1, steps))

    prev_end = C["t"][0] if len(log) else 0.0
    for i in range(len(log)):
        t0, dur, n = C["t"][i], C["dur"][i], int(C["n"][i])
        t1 = t0 + dur
        if t0 > prev_end and not math.isclose(t0, prev_end, rel_tol=1e-12, abs_tol=1e-12):
            for s in range(nslots):   # the engine waited for an arrival: every slot idle
                add(s, None, "idle", prev_end, t0, 0)
        busy = set()
        for slot, rid, k, tokens, pad in log.occupancy[i]:
            busy.add(slot)
            kind = _OCC_KIND[k]
            if kind == "prefill" and pad:
                tm = t0 + dur * tokens / (tokens + pad)
                add(slot, rid, "prefill", t0, tm, n)
                add(slot, rid, "padding", tm, t1, n)
            else:
                add(slot, rid, kind, t0, t1, n)
        for s in range(int(C["slots"][i])):
            if s not in busy:
                add(s, None, "idle", t0, t1, n)
        prev_end = t1
    return [seg for s in sorted(rows) for seg in rows[s]]


def slot_steps(result: RunResult) -> dict[str, int]:
    """Slot-steps of a recorded run by kind (7.1 (b), 7.2): ``prefill``, ``decode``, ``dead``,
    ``idle`` and ``total`` (= slots x steps). A padded prefill row counts once as ``prefill``;
    ``padded_rows`` counts how many prefill rows carried padding."""
    log = result.log
    if not log.record_slots:
        raise ValueError("slot_steps() needs a run recorded with record_slots=True")
    C = log.cols
    out = {"prefill": 0, "decode": 0, "dead": 0, "idle": 0, "total": 0, "padded_rows": 0}
    for i, occ in enumerate(log.occupancy):
        n, slots = int(C["n"][i]), int(C["slots"][i])
        out["total"] += n * slots
        for _, _, k, _, pad in occ:
            out[_OCC_KIND[k]] += n
            out["padded_rows"] += n if (k == "P" and pad) else 0
        out["idle"] += n * (slots - len(occ))
    return out


def analytic_static_utilization(outputs: Sequence[int] | np.ndarray, batch: int) -> float:
    """7.1 (c): slot utilization of full static batches of consecutive requests.

    Batch j holds requests jB..jB+B-1 and runs for its longest output; every member emits
    its own tokens: utilization = sum(outputs) / (B x sum_j max(outputs in batch j)).
    A last, partial batch still occupies B slots.
    """
    o = np.asarray(outputs, dtype=np.int64)
    if batch < 1 or o.size == 0:
        raise ValueError(f"batch={batch}, {o.size} outputs: need batch >= 1 and some outputs")
    maxes = [int(o[j:j + batch].max()) for j in range(0, o.size, batch)]
    return float(o.sum() / (batch * sum(maxes)))


def static_batch_sweep(workload: Workload, cost: Any, batch_sizes: Sequence[int]) -> dict[str, np.ndarray]:
    """7.1 (c): static batching at every batch size, all requests queued at t=0.

    Every request is present from the start (the trace's order kept, its arrival times
    dropped), so every batch is full and slot utilization measures the first-finisher and
    padding costs alone, not a shortage of traffic. KV memory is not limited here.
    Returns arrays over ``batch``: ``slot_util``, ``slot_util_tw``, ``analytic``
    (:func:`analytic_static_utilization`), ``padding_fraction``, ``hw_compute``,
    ``useful_compute``, ``throughput_tok``.
    """
    w = Workload.from_arrays(np.zeros(len(workload)), workload.prompt_lens, workload.output_lens,
                             name=workload.name, info=workload.info)
    keys = ("slot_util", "slot_util_tw", "padding_fraction", "hw_compute", "useful_compute", "throughput_tok")
    out: dict[str, list[float]] = {k: [] for k in (*keys, "analytic")}
    for b in batch_sizes:
        m = metrics(simulate(w, cost, "static", slots=int(b), kv_tokens=None, timeout=0.0))
        for k in keys:
            out[k].append(m[k])
        out["analytic"].append(analytic_static_utilization(w.output_lens, int(b)))
    return {"batch": np.asarray(batch_sizes, dtype=float), **{k: np.asarray(v) for k, v in out.items()}}


def wait_sweep(workload: Workload, cost: Any, waits: Sequence[float], slots: int = 32,
               schedulers: Sequence[str] = ("static", "dynamic")) -> dict[str, dict[str, np.ndarray]]:
    """7.1 (d): the collection timeout trade-off of static (``timeout``) and dynamic
    (``max_wait``) batching. Per scheduler, arrays over ``wait``: ``queue_mean``,
    ``slot_util``, ``e2e_p99``, ``ttft_p99``, ``throughput_req``, ``padding_fraction``,
    ``mean_batch`` (requests per dispatched batch). KV memory not limited."""
    res: dict[str, dict[str, np.ndarray]] = {}
    keys = ("queue_mean", "slot_util", "e2e_p99", "ttft_p99", "throughput_req", "padding_fraction")
    for name in schedulers:
        acc: dict[str, list[float]] = {k: [] for k in (*keys, "mean_batch")}
        for T in waits:
            r = simulate(workload, cost, name, slots=slots, kv_tokens=None, timeout=float(T))
            m = metrics(r)
            for k in keys:
                acc[k].append(m[k])
            L = r.log.cols
            batches = sum(1 for p, d in zip(L["prefill"], L["decode"]) if p > 0)
            acc["mean_batch"].append(len(workload) / batches)
        res[name] = {"wait": np.asarray(waits, dtype=float), **{k: np.asarray(v) for k, v in acc.items()}}
    return res


# ------------------------------------------------------------------------------- 7.2
def compare_schedulers(workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]]
                       ) -> dict[str, dict[str, float]]:
    """7.2: one run per named configuration on the same workload; returns :func:`metrics`
    per name. A config is ``{"scheduler": ..., "slots": ..., **options}`` (see :func:`simulate`)."""
    out = {}
    for name, cfg in configs.items():
        cfg = dict(cfg)
        out[name] = metrics(simulate(workload, cost, cfg.pop("scheduler"), **cfg))
    return out


def rate_sweep(workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]],
               time_scales: Sequence[float]) -> dict[str, dict[str, np.ndarray]]:
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


def sweep_numbers(sweep: Mapping[str, Mapping[str, np.ndarray]], points: Mapping[str, float],
                  keys: Sequence[str], key: str = "time_scale") -> dict[str, float]:
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
    return {name: {"throughput_req": float(d["throughput_req"].max()),
                   "throughput_tok": float(d["throughput_tok"].max())} for name, d in sweep.items()}


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
    w = Workload.from_arrays(workload.arrivals, workload.prompt_lens, outs, name=workload.name,
                             info=info, rids=workload.rids)
    return w, [workload.rids[i] for i in idx]


def probe_runs(workload: Workload, cost: Any, configs: Mapping[str, Mapping[str, Any]],
               probes: Sequence[int]) -> dict[str, dict[str, np.ndarray]]:
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
    i = np.searchsorted(end, times + eps, side="right")          # rows fully ended
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
        "rid": np.array([r.rid for r in reqs]), "output_len": np.array([r.output_len for r in reqs]),
        "from_admission": done - _steps_ended_by(result, adm),
        "from_arrival": done - _steps_ended_by(result, arr),
        "e2e": fin - arr, "service": fin - adm,
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
    return {"n": float(len(recs)), "ttft_mean": float(np.mean([x["ttft"] for x in recs])),
            "e2e_mean": float(e2e.mean()), "e2e_p50": float(np.median(e2e)), "e2e_p99": float(np.percentile(e2e, 99)),
            "queue_mean": float(np.mean([x["queue"] for x in recs])),
            "last_finish": float(max(x["finish"] for x in recs) - start)}


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
    return Workload.from_arrays(a, p, o, name="first-finisher+queue",
                                info={"source": "experiments.first_finisher_queue", "extra": extra, "gap": gap})


# ------------------------------------------------------------------------------- 7.3
def long_prompt_among_decodes(running: int = 30, prompt: int = 4000, at: float = 0.5,
                              running_prompt: int = 128, running_output: int = 400,
                              output: int = 50) -> Workload:
    """7.3: ``running`` requests start at t=0 and decode ``running_output`` tokens; at time
    ``at`` one request with a ``prompt``-token prompt arrives (its rid is ``running``)."""
    a = np.concatenate([np.zeros(running), [at]])
    p = np.concatenate([np.full(running, running_prompt), [prompt]])
    o = np.concatenate([np.full(running, running_output), [output]])
    return Workload.from_arrays(a, p, o, name=f"{prompt}-token prompt among {running} decodes",
                                info={"source": "experiments.long_prompt_among_decodes", "running": running,
                                      "prompt": prompt, "at": at})


def itl_series(result: RunResult, rids: Sequence[int]) -> dict[str, np.ndarray]:
    """7.3: the inter-token latency the given requests see over time.

    Returns ``t`` (time of each token after the first, s, all requests concatenated and
    sorted), ``itl`` (gap to that request's previous token, s) and ``rid``.
    """
    want = set(rids)
    ts, gaps, who = [], [], []
    for r in result.requests:
        if r.rid in want and len(r.token_times) > 1:
            tt = np.asarray(r.token_times)
            ts.append(tt[1:])
            gaps.append(np.diff(tt))
            who.append(np.full(len(tt) - 1, r.rid))
    if not ts:
        return {"t": np.zeros(0), "itl": np.zeros(0), "rid": np.zeros(0, dtype=int)}
    t, g, w = np.concatenate(ts), np.concatenate(gaps), np.concatenate(who)
    order = np.argsort(t, kind="stable")
    return {"t": t[order], "itl": g[order], "rid": w[order]}


def spike_summary(result: RunResult, running: Sequence[int], newcomer: int) -> dict[str, float]:
    """7.3: what the running requests and the newcomer see around a long prompt's arrival.

    ``itl_max_ms`` and ``itl_p50_ms`` of the running requests' steps, ``stall`` = the
    largest ITL over the median one, ``steps_over_2x`` (steps whose ITL is more than twice
    the median) and the newcomer's ``ttft_ms``.
    """
    s = itl_series(result, running)
    new = next(r for r in result.requests if r.rid == newcomer)
    t, itl = s["t"], s["itl"]
    _, first = np.unique(t, return_index=True)
    step_itl = itl[first]
    med = float(np.median(step_itl))
    return {"itl_max_ms": float(itl.max()) * 1e3, "itl_p50_ms": med * 1e3, "stall": float(itl.max() / med),
            "steps_over_2x": float(np.sum(step_itl > 2 * med)),
            "ttft_ms": float(new.token_times[0] - new.arrival) * 1e3}


def stall_runs(workload: Workload, cost: Any, configs: Mapping[str, tuple[str, str, Mapping[str, Any]]],
               running: Sequence[int], newcomer: int, slots: int = 32) -> dict[str, Any]:
    """7.3: run the long-prompt workload under each ``{tag: (label, scheduler, options)}``.

    Returns ``series`` ({label: :func:`itl_series` of the running requests}), ``first_token``
    ({label: the newcomer's first-token time, s}) and ``numbers`` (the
    :func:`spike_summary` of each run, keys prefixed ``<tag>_``).
    """
    series: dict[str, Any] = {}
    first: dict[str, float] = {}
    numbers: dict[str, float] = {}
    for tag, (label, sched, opts) in configs.items():
        run_ = simulate(workload, cost, sched, slots=slots, **opts)
        series[label] = itl_series(run_, running)
        first[label] = next(r for r in run_.requests if r.rid == newcomer).token_times[0]
        numbers.update(flat(tag, spike_summary(run_, running, newcomer)))
    return {"series": series, "first_token": first, "numbers": numbers}


def stall_numbers(cost: Any, chunk: int, prompt: int, decodes: int = 30, ctx: int = 300,
                  reference: Sequence[int] = ()) -> dict[str, float]:
    """7.3: roofline times (ms) of a decode-only step of ``decodes`` rows, of the same step
    carrying a ``chunk``-token chunk, and carrying a whole ``prompt``; ``stall`` = the last
    over the first, ``chunks`` = how many chunks the prompt takes. With ``reference``
    chunk sizes, ``chunk_share`` = the chunk's prefill throughput over the best of them."""
    d = chunk_step_times(cost, [chunk, prompt], decodes=decodes, ctx=ctx)
    out = {"decode_ms": d["decode_s"] * 1e3, "chunk_ms": float(d["step_s"][0]) * 1e3,
           "long_ms": float(d["step_s"][1]) * 1e3, "stall": float(d["step_s"][1] / d["decode_s"]),
           "chunks": float(math.ceil(prompt / chunk))}
    if reference:
        best = chunk_step_times(cost, list(reference) + [chunk], decodes=decodes, ctx=ctx)["prefill_tps"].max()
        out["chunk_share"] = float(d["prefill_tps"][0] / best)
    return out


def tradeoff_numbers(sweep: Mapping[float, Mapping[str, np.ndarray]], chunks: Mapping[str, int],
                     loads: Mapping[str, float]) -> dict[str, Any]:
    """7.3: glue-ready numbers of a :func:`chunk_sweep`: for each ``loads`` tag and each
    ``chunks`` tag, ``<load><chunk>_{itl_p99_ms,itl_p50_ms,ttft_p99,ttft_p50}``, and for
    continuous batching without chunks ``<load>_continuous_{itl_p99_ms,itl_p50_ms,ttft_p99,ttft_p50}``;
    plus ``loads_text`` ("1, 2, 4")."""
    out: dict[str, Any] = {"loads_text": ", ".join(f"{k:g}" for k in sweep)}
    for lt, load in loads.items():
        d = sweep[float(load)]
        out.update({f"{lt}_continuous_itl_p99_ms": float(d["continuous_itl_p99"][0]) * 1e3,
                    f"{lt}_continuous_itl_p50_ms": float(d["continuous_itl_p50"][0]) * 1e3,
                    f"{lt}_continuous_ttft_p99": float(d["continuous_ttft_p99"][0]),
                    f"{lt}_continuous_ttft_p50": float(d["continuous_ttft_p50"][0])})
        for ct, c in chunks.items():
            v = at(d, "chunk", c)
            out.update({f"{lt}{ct}_itl_p99_ms": v["itl_p99"] * 1e3, f"{lt}{ct}_itl_p50_ms": v["itl_p50"] * 1e3,
                        f"{lt}{ct}_ttft_p99": v["ttft_p99"], f"{lt}{ct}_ttft_p50": v["ttft_p50"]})
    return out


def chunk_step_times(cost: Any, chunks: Sequence[int], decodes: int = 30, ctx: int = 256) -> dict[str, Any]:
    """7.3: roofline time of one step carrying ``decodes`` running decodes (``ctx`` KV tokens
    each) plus one fresh prefill chunk of each size, and of the decode-only step.

    Returns ``chunk``, ``step_s`` (arrays), ``decode_s``, ``prefill_tps`` (chunk tokens per
    second of step time, array) and ``bstar``.
    """
    ch = np.asarray(chunks, dtype=float)
    steps = np.array([cost.step_time(StepWork(prefill_tokens=int(c), prefill_attn=int(c) * (int(c) + 1) // 2,
                                              decode_rows=decodes, decode_ctx=decodes * ctx)) for c in chunks])
    dec = cost.step_time(StepWork(decode_rows=decodes, decode_ctx=decodes * ctx))
    return {"chunk": ch, "step_s": steps, "decode_s": float(dec), "prefill_tps": ch / steps,
            "bstar": float(cost.bstar())}


def chunk_sweep(workload: Workload, cost: Any, chunk_sizes: Sequence[int], slots: int = 32,
                time_scales: Sequence[float] = (1.0,), kv_tokens: int | str | None = "device"
                ) -> dict[float, dict[str, np.ndarray]]:
    """7.3: chunked prefill at every chunk size, with token budget = chunk + slots.

    Per time scale: arrays over ``chunk`` of ``ttft_p99``, ``ttft_p50``, ``itl_p99``, ``itl_p50``,
    ``itl_max``, ``tpot_p99``, ``e2e_p99``, ``throughput_tok``, ``steps``; plus the
    unchunked reference (continuous batching, whole prompts mixed into the decode step)
    under the key ``"continuous"`` as one-element arrays.
    """
    keys = ("ttft_p99", "ttft_p50", "itl_p99", "itl_p50", "itl_max", "tpot_p99", "e2e_p99", "throughput_tok", "steps")
    out: dict[float, dict[str, np.ndarray]] = {}
    for k in time_scales:
        w = workload.scale(time=float(k)) if k != 1 else workload
        acc: dict[str, list[float]] = {key: [] for key in keys}
        for c in chunk_sizes:
            m = metrics(simulate(w, cost, "chunked", slots=slots, kv_tokens=kv_tokens,
                                 token_budget=int(c) + slots, chunk_size=int(c)))
            for key in keys:
                acc[key].append(m[key])
        ref = metrics(simulate(w, cost, "continuous", slots=slots, kv_tokens=kv_tokens))
        res = {"chunk": np.asarray(chunk_sizes, dtype=float), **{key: np.asarray(v) for key, v in acc.items()}}
        for key in keys:
            res[f"continuous_{key}"] = np.asarray([ref[key]])
        out[float(k)] = res
    return out


# ------------------------------------------------------------------------------ KV
def kv_over_time(result: RunResult) -> dict[str, np.ndarray]:
    """What chapter 7 sets up: KV tokens reserved and used, and running requests, at the
    end of every logged step (a run of identical steps gives one point). Arrays ``t``
    (s), ``reserved``, ``used``, ``running``."""
    C = result.log.cols
    t = np.asarray(C["t"], dtype=float) + np.asarray(C["dur"], dtype=float)
    return {"t": t, "reserved": np.asarray(C["kv_reserved"], dtype=float),
            "used": np.asarray(C["kv_used"], dtype=float), "running": np.asarray(C["running"], dtype=float)}


def kv_runs(workload: Workload, cost: Any, slots: int = 256, policies: Sequence[str] = ("slab", "exact"),
            kv_tokens: int | str = "device") -> dict[str, Any]:
    """What chapter 7 sets up: continuous batching under each KV policy, every step logged.

    Returns ``series`` ({policy: :func:`kv_over_time`}) and ``numbers``: per policy
    (prefixed ``<policy>_``) the :func:`metrics` keys ``running_peak``, ``kv_reserved_mean``,
    ``kv_used_mean``, ``kv_reserved_peak``, ``throughput_tok``, ``e2e_p99``, ``ttft_p99``,
    ``queue_mean``, ``preemptions``, plus ``unused`` = 1 - used / reserved (time-weighted).
    """
    series: dict[str, Any] = {}
    numbers: dict[str, float] = {}
    keys = ("running_peak", "kv_reserved_mean", "kv_used_mean", "kv_reserved_peak", "throughput_tok",
            "e2e_p99", "ttft_p99", "queue_mean", "preemptions")
    for pol in policies:
        r = simulate(workload, cost, "continuous", slots=slots, kv_tokens=kv_tokens, kv_policy=pol, fast=False)
        m = metrics(r)
        series[pol] = kv_over_time(r)
        numbers.update({f"{pol}_{k}": m[k] for k in keys})
        numbers[f"{pol}_unused"] = 1.0 - m["kv_used_mean"] / m["kv_reserved_mean"]
    return {"series": series, "numbers": numbers}


def kv_fit(cost: Any, workload: Workload) -> dict[str, float]:
    """What chapter 7 sets up: how many sequences fit the device's KV capacity.

    ``capacity`` (tokens), ``kv_bytes_per_token``, ``max_context`` (the slab), ``slab``
    (= capacity // max_context), ``exact_final`` (capacity / mean final length
    prompt + output), ``exact_avg`` (capacity / mean length over a request's life,
    prompt + output / 2), ``mean_final``, ``p50_final``, ``p99_final`` lengths, and
    ``slab_waste`` = 1 - mean final length / max_context.
    """
    C = int(cost.kv_capacity())
    L = (workload.prompt_lens + workload.output_lens).astype(float)
    life = (workload.prompt_lens + workload.output_lens / 2).astype(float)
    ctx = cost.model.max_context
    return {"capacity": float(C), "kv_bytes_per_token": float(cost.model.kv_bytes_per_token),
            "max_context": float(ctx), "slab": float(C // ctx),
            "exact_final": float(C / L.mean()), "exact_avg": float(C / life.mean()),
            "mean_final": float(L.mean()), "p50_final": float(np.percentile(L, 50)),
            "p99_final": float(np.percentile(L, 99)), "slab_waste": float(1 - L.mean() / ctx)}


def kv_budget_sweep(workload: Workload, cost: Any, budgets: Sequence[int], slots: int = 256,
                    policies: Sequence[str] = ("slab", "exact"), scheduler: str = "continuous"
                    ) -> dict[str, dict[str, np.ndarray]]:
    """What chapter 7 sets up: continuous batching under a KV budget, per reservation policy.

    Per policy, arrays over ``budget`` (KV tokens): ``throughput_tok``, ``e2e_p99``,
    ``ttft_p99``, ``preemptions``, ``running_peak``, ``kv_used_mean``, ``kv_reserved_mean``,
    ``slot_util``. ``slots`` is set high so that memory, not slots, is the limit.
    """
    keys = ("throughput_tok", "e2e_p99", "ttft_p99", "preemptions", "running_peak", "kv_used_mean",
            "kv_reserved_mean", "slot_util", "steps")
    out: dict[str, dict[str, np.ndarray]] = {}
    for pol in policies:
        acc: dict[str, list[float]] = {k: [] for k in keys}
        for b in budgets:
            m = metrics(simulate(workload, cost, scheduler, slots=slots, kv_tokens=int(b), kv_policy=pol))
            for k in keys:
                acc[k].append(m[k])
        out[pol] = {"budget": np.asarray(budgets, dtype=float), **{k: np.asarray(v) for k, v in acc.items()}}
    return out


def budget_numbers(sweep: Mapping[str, Mapping[str, np.ndarray]], budget: int) -> dict[str, float]:
    """What chapter 7 sets up: the :func:`kv_budget_sweep` numbers at one budget, prefixed
    by policy, plus ``gain`` = exact over slab throughput (if both policies ran)."""
    out: dict[str, float] = {"budget": float(budget)}
    for pol, d in sweep.items():
        out.update(flat(pol, at(d, "budget", budget)))
    if "slab" in sweep and "exact" in sweep:
        out["gain"] = out["exact_throughput_tok"] / out["slab_throughput_tok"]
    return out


# ------------------------------------------------------------------- real engine
def real_available() -> bool:
    """Whether the real torch engine (``batching.real.run_real``) imports here."""
    try:
        from .real import run_real  # noqa: F401
    except Exception:
        return False
    return True


def real_crosscheck(workload: Workload, model: str = "tiny", schedulers: Sequence[str] = ("static", "continuous"),
                    slots: int = 4, threads: int | None = None, probe_output: int | None = None
                    ) -> dict[str, Any]:
    """7.2: run a small workload on the real engine and in the simulator, same schedulers.

    The scheduler decides which rows each step computes, so step counts and per-request
    iterations must agree exactly; durations differ (measured vs the CPU roofline). Returns
    ``available`` (False, with ``reason``, if the real engine does not import or fails) and,
    per scheduler: ``steps_sim``, ``steps_real``, ``slot_util_sim``, ``slot_util_real``,
    ``iters_sim``/``iters_real`` (from admission, for requests wanting ``probe_output``
    tokens, default: the shortest output), ``busy_sim_s``, ``busy_real_s``,
    ``tokens_real`` (output tokens the model actually produced), and the real executor's
    description under ``executor``.
    """
    from .costs import get_cost_model
    out: dict[str, Any] = {"available": False, "model": model, "slots": slots, "workload": workload.name}
    try:
        from .real import run_real
    except Exception as e:  # the real engine is optional (torch, work in progress)
        out["reason"] = f"batching.real does not import: {type(e).__name__}: {e}"
        return out
    cost = get_cost_model(model, "cpu")
    probe = int(workload.output_lens.min()) if probe_output is None else probe_output
    probes = [rid for rid, o in zip(workload.rids, workload.output_lens) if o == probe]
    per: dict[str, dict[str, Any]] = {}
    try:
        for name in schedulers:
            sim = simulate(workload, cost, name, slots=slots, kv_tokens=None)
            sched = make_scheduler(name, max_context=cost.model.max_context, slots=slots)
            max_len = int((workload.prompt_lens + workload.output_lens).max()) + int(workload.prompt_lens.max())
            real = run_real(workload, sched, model, device="cpu", threads=threads,
                            max_len=min(cost.model.max_context, max_len))
            ms, mr = metrics(sim), summarize(real)
            per[name] = {
                "steps_sim": int(ms["steps"]), "steps_real": int(mr["steps"]),
                "slot_util_sim": ms["slot_util"], "slot_util_real": float(mr["slot_utilization"]),
                "iters_sim": iterations(sim, probes)["from_admission"].tolist(),
                "iters_real": iterations(real, probes)["from_admission"].tolist(),
                "arrival_iters_sim": iterations(sim, probes)["from_arrival"].tolist(),
                "arrival_iters_real": iterations(real, probes)["from_arrival"].tolist(),
                "busy_sim_s": ms["busy_s"], "busy_real_s": float(mr["busy_s"]),
                "tokens_real": int(sum(len(r.token_ids) for r in real.requests)),
            }
            out["executor"] = real.executor
    except Exception as e:
        out["reason"] = f"the real engine failed: {type(e).__name__}: {e}"
        return out
    out.update(available=True, probe_output=probe, per=per)
    return out


# ---------------------------------------------------------------- notebook glue
def choose(smoke: bool, full: Any, small: Any) -> Any:
    """``small`` in smoke runs (the tests), ``full`` for the book: one rule for every notebook."""
    return small if smoke else full


def at(sweep: Mapping[str, np.ndarray], key: str, value: float) -> dict[str, float]:
    """The scalars of a sweep (arrays over one swept variable) where ``sweep[key] == value``."""
    idx = np.flatnonzero(np.isclose(np.asarray(sweep[key], dtype=float), value))
    if idx.size == 0:
        raise KeyError(f"{key}={value} is not in the sweep ({list(np.asarray(sweep[key]))})")
    i, shape = int(idx[0]), np.asarray(sweep[key]).shape
    return {k: float(np.asarray(v)[i]) for k, v in sweep.items() if np.asarray(v).shape[:1] == shape}


def flat(prefix: str, values: Mapping[str, Any], keys: Sequence[str] | None = None) -> dict[str, Any]:
    """``{f"{prefix}_{k}": v}`` for the chosen keys, numpy scalars made plain (glue keys)."""
    out = {}
    for k in (keys if keys is not None else values.keys()):
        v = values[k]
        out[f"{prefix}_{k}"] = v.item() if isinstance(v, np.generic) else v
    return out


def first_finisher_summary(result: RunResult) -> dict[str, float]:
    """7.1 (b): where the slot-steps of a recorded run went, and when the first request finished.

    Keys: the counts of :func:`slot_steps`, ``useful_fraction`` ((prefill + decode) / total),
    ``dead_fraction``, ``idle_fraction``, ``first_finish_s``, ``makespan_s`` and
    ``after_first_fraction`` (share of the run's time after the first request finished).
    """
    ss = slot_steps(result)
    fins = [r.finish_time for r in result.requests]
    start = min(r.arrival for r in result.requests)
    span = max(fins) - start
    out: dict[str, float] = {k: float(v) for k, v in ss.items()}
    out.update(useful_fraction=(ss["prefill"] + ss["decode"]) / ss["total"], dead_fraction=ss["dead"] / ss["total"],
               idle_fraction=ss["idle"] / ss["total"], first_finish_s=min(fins) - start, makespan_s=span,
               after_first_fraction=(max(fins) - min(fins)) / span)
    return out


def probe_summary(its: Mapping[str, np.ndarray], probe: int) -> dict[str, float]:
    """7.2: how the probes' iterations and times are distributed (for the prose)."""
    fa, fr, sv = its["from_admission"], its["from_arrival"], its["service"]
    return {"n": float(len(fa)), "exact_fraction": float(np.mean(fa == probe)),
            "admission_p50": float(np.median(fa)), "admission_max": float(fa.max()),
            "arrival_p50": float(np.median(fr)), "arrival_p99": float(np.percentile(fr, 99)),
            "service_p50": float(np.median(sv)), "service_p99": float(np.percentile(sv, 99)),
            "e2e_p50": float(np.median(its["e2e"])), "e2e_p99": float(np.percentile(its["e2e"], 99))}


def crosscheck_text(cc: Mapping[str, Any]) -> str:
    """7.2: one paragraph (MyST) reporting :func:`real_crosscheck`, whether it ran or not."""
    if not cc.get("available"):
        return (f"The real engine could not be used when this page was built ({cc.get('reason', 'unknown')}), "
                "so this cross-check was skipped.")
    per = cc["per"]
    agree = all(p["steps_sim"] == p["steps_real"] and p["iters_sim"] == p["iters_real"] for p in per.values())
    ex = cc.get("executor", {})
    parts = []
    for name, p in per.items():
        parts.append(f"{name}: {p['steps_real']} steps, slot utilization {p['slot_util_real']:.1%}, "
                     f"{p['busy_real_s']:.2f} s measured")
    verdict = ("The step counts and every probe's iteration count agree exactly with the simulator"
               if agree else "The step counts or iteration counts DIFFER from the simulator")
    return (f"On the real engine ({cc['model']}, {ex.get('params', 0) / 1e6:.1f}M parameters, {ex.get('dtype', '?')}, "
            f"{ex.get('device_name', ex.get('device', '?'))}, {ex.get('threads', '?')} threads, torch "
            f"{ex.get('torch', '?')}): " + "; ".join(parts) + f". {verdict}.")


def crosscheck_rows(cc: Mapping[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """7.2: header and rows of the real-vs-simulated table (no rows if it did not run).
    Pairs are "simulated / real"; iterations are the probes' (see :func:`real_crosscheck`)."""
    header = ["scheduler", "steps sim/real", "slot util sim/real", "probe iters adm.",
              "probe iters arr. (mean)", "busy s sim/real"]
    rows: list[list[Any]] = []
    for name, p in (cc.get("per") or {}).items():
        its = sorted(set(int(x) for x in p["iters_real"]))
        rows.append([name, f"{p['steps_sim']}/{p['steps_real']}",
                     f"{p['slot_util_sim']:.3f}/{p['slot_util_real']:.3f}", "/".join(map(str, its)),
                     f"{np.mean(p['arrival_iters_real']):.1f}", f"{p['busy_sim_s']:.2f}/{p['busy_real_s']:.2f}"])
    return header, rows


# ------------------------------------------------------------------ fidelity
#: The simulator-vs-real-engine measurement (``benchmarks/bench_fidelity.py``), relative to
#: the repository root. Every simulated figure of 7.1-7.3 and the KV page quotes it.
FIDELITY_FILE = "benchmarks/results/fidelity.json"


def fidelity_summary(path: str | None = None, root: str | None = None) -> dict[str, Any]:
    """The simulator's measured error against the real engine (every simulated figure of 7.1-7.3).

    Reads the committed fidelity benchmark and returns, worst case over its schedulers:
    ``tput_err`` (output throughput), ``e2e_err`` (median absolute per-request E2E error),
    ``noise`` (the same median between two real runs, the floor no simulator can beat
    here), ``step_err`` (the cost model's median absolute error per step), plus ``model``,
    ``requests``, ``date``, ``schedulers`` and ``text``: one sentence for a caption.
    """
    base = Path(root) if root else Path(__file__).resolve().parent.parent
    f = Path(path) if path else base / FIDELITY_FILE
    doc = json.loads(f.read_text())
    res = doc["results"]
    if not res:
        raise ValueError(f"{f}: no results")
    worst = lambda k: max(float(r[k]) for r in res.values() if r.get(k) is not None)  # noqa: E731
    out: dict[str, Any] = {
        "model": doc["model"], "requests": int(doc["workload"]["requests"]), "date": doc["date"][:10],
        "schedulers": ", ".join(res), "tput_err": worst("throughput_rel_err"),
        "e2e_err": worst("e2e_median_abs_rel_err"), "step_err": worst("step_median_abs_rel_err"),
        "noise": (worst("real_vs_real_e2e_median_abs_rel_err")
                  if all("real_vs_real_e2e_median_abs_rel_err" in r for r in res.values()) else None),
    }
    noise = "" if out["noise"] is None else f" (two real runs differ by {out['noise']:.0%})"
    out["text"] = (f"Simulator error against the real engine, measured on the book's CPU ({out['model']}, "
                   f"{out['requests']} Azure requests, {out['schedulers']}): output throughput within "
                   f"{out['tput_err']:.1%}, median per-request latency {out['e2e_err']:.0%}{noise}.")
    return out


# ------------------------------------------------------------------ why batching
# "Why batching carries the load" (chapters/why.ipynb): one decode step streams every
# weight, so extra rows are nearly free until compute binds at B*. The roofline functions
# are torch-free; the live measurement imports torch (the ``model`` extra) when called.

#: Live decode sweep defaults per device type: the model that tells the weight-streaming
#: story there, and the batch sizes. On the CPU, cpu-m (117M parameters, 469 MB in fp32)
#: is bandwidth-bound while cpu-s is dominated by per-step overhead
#: (shared/notes/cpu-decode-measurements.md); on a GPU, the 8B shape the prose derives.
LIVE_DEFAULTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "cpu": ("cpu-m", (1, 2, 4, 8, 16, 32, 64, 128)),
    "cuda": ("llama-8b", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
}
#: Where committed profiles live (data/README.md); every ``*.json`` there is shown.
PROFILE_DIR = "data/profiles"


def bstar_of(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """Why batching: B* = peak x bytes per weight / (2 x bandwidth), the batch at which a
    decode step's 2 FLOPs per weight per row take as long as streaming the weights once."""
    if not (peak_flops > 0 and bandwidth > 0 and bytes_per_param > 0):
        raise ValueError(f"peak={peak_flops}, bandwidth={bandwidth}, bytes={bytes_per_param}: must be > 0")
    return float(peak_flops * bytes_per_param / (2.0 * bandwidth))


def knee(batch: Sequence[float], times: Sequence[float], factor: float) -> int:
    """Why batching: the largest batch up to which the step time *stays* within ``factor``
    times the first batch's (the first point above it ends the run; later points that dip
    back under do not count). ``batch`` must be increasing; ``factor`` >= 1."""
    b, t = np.asarray(batch, dtype=float), np.asarray(times, dtype=float)
    if b.ndim != 1 or b.shape != t.shape or len(b) == 0:
        raise ValueError(f"batch {b.shape} and times {t.shape}: need two 1-d arrays of the same length")
    if np.any(np.diff(b) <= 0) or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("batch must be increasing and times finite and > 0")
    if factor < 1:
        raise ValueError(f"factor={factor}: must be >= 1")
    ok = t <= factor * t[0]
    n = len(ok) if ok.all() else int(np.argmin(ok))
    return int(b[n - 1])


def roofline_curve(shape: ModelShape, batches: Sequence[float], ctx: int, bandwidth: float,
                   peak_flops: float, overhead_s: float = 0.0) -> dict[str, np.ndarray]:
    """Why batching: the roofline of one decode step of ``b`` rows, each holding ``ctx``
    KV tokens, for every ``b`` in ``batches``.

    Arrays: ``batch``; ``weights_s`` (weight bytes streamed / bandwidth, the same at every
    batch); ``memory_s`` (weights + KV read and written, ``ModelShape.bytes_arrays``, over
    bandwidth); ``compute_s`` (``ModelShape.flops_arrays`` over peak); ``time_s`` =
    max(memory, compute) + ``overhead_s`` (what ``RooflineCost.decode_step`` returns for a
    single device); ``tokens_per_s`` = batch / time; ``bound`` (1 where compute binds).
    """
    b = np.asarray(batches, dtype=np.float64)
    z = np.zeros_like(b)
    mem = shape.bytes_arrays(z, z, b, b * float(ctx)) / bandwidth
    cmp = shape.flops_arrays(z, z, b, b * float(ctx)) / peak_flops
    t = np.maximum(mem, cmp) + overhead_s
    return {"batch": b, "weights_s": np.full_like(b, shape.weight_read_bytes / bandwidth),
            "memory_s": mem, "compute_s": cmp, "time_s": t, "tokens_per_s": b / t,
            "bound": (cmp > mem).astype(float)}


def stream_numbers(cost: RooflineCost, ctx: int = 1, long_ctx: int = 2048, long_batch: int = 128) -> dict[str, float]:
    """Why batching: the batch-1 derivation for a roofline cost model (one device).

    :func:`roofline_numbers`, plus ``bandwidth_gbs``, ``peak_gflops``, ``weight_read_mb``,
    ``stream_ms`` (weight bytes / bandwidth: the step's floor), ``step_ms`` (the cost
    model's batch-1 step at ``ctx`` KV tokens, overhead included), ``overhead_ms``,
    ``tokens_s`` (1 / step), ``bytes_per_param``, ``ctx``; at B* (rounded down):
    ``bstar_floor``, ``step_bstar_ms`` and ``tokens_s_bstar``; and for ``long_batch`` rows
    of ``long_ctx`` tokens: ``kv_long_gb`` (KV bytes the step reads), ``kv_long_ratio``
    (over the weights), ``tokens_s_long`` and ``long_fit`` (rows of ``long_ctx`` tokens
    whose KV fits the device). For each other bandwidth reference in the device's notes
    (``<name>_bandwidth``, e.g. the CPU's copy and sum): ``<name>_gbs`` and ``bstar_<name>``.
    """
    if cost.tp != 1:
        raise ValueError("stream_numbers is the single-device derivation: tp must be 1")
    m = cost.model
    out = roofline_numbers(cost)
    bs = max(1, int(cost.bstar()))
    step = cost.decode_step(1, ctx)
    kv_long = long_batch * long_ctx * m.kv_bytes_per_token
    out.update(bandwidth_gbs=cost.bandwidth / 1e9, peak_gflops=cost.peak_flops / 1e9,
               weight_read_mb=m.weight_read_bytes / 1e6,
               stream_ms=m.weight_read_bytes / cost.bandwidth * 1e3, step_ms=step * 1e3,
               overhead_ms=cost.device.step_overhead_s * 1e3, tokens_s=1.0 / step,
               bytes_per_param=float(m.bytes_per_param), ctx=float(ctx), bstar_floor=float(bs),
               step_bstar_ms=cost.decode_step(bs, ctx) * 1e3, tokens_s_bstar=bs / cost.decode_step(bs, ctx),
               long_ctx=float(long_ctx), long_batch=float(long_batch), kv_long_gb=kv_long / 1e9,
               kv_long_ratio=kv_long / m.weight_read_bytes,
               tokens_s_long=long_batch / cost.decode_step(long_batch, long_ctx),
               long_fit=float(cost.kv_capacity() // long_ctx))
    for name, bw in cost.device.notes.items():  # other bandwidth references (cpu-here: copy, sum)
        if name.endswith("_bandwidth"):
            out[f"bstar_{name[:-len('_bandwidth')]}"] = bstar_of(cost.peak_flops, bw, m.bytes_per_param)
            out[f"{name[:-len('_bandwidth')]}_gbs"] = bw / 1e9
    return out


def gpu_rooflines(model: str = "llama-8b", devices: Sequence[str] = ("h100", "h200"),
                  batches: Sequence[int] = tuple(2 ** i for i in range(11)),
                  ctxs: Sequence[int] = (128, 2048)) -> dict[str, Any]:
    """Why batching: roofline predictions (datasheet constants, not measurements) of a
    decode step for ``model`` on each device, at each context per row.

    Returns ``{"model", "dtype", "devices": {device name: {"bstar", "kv_capacity",
    "ctx": {ctx: roofline_curve(...) + "fits"}}}}``; ``fits`` is 1 where batch x ctx KV
    tokens fit the device's KV capacity (``RooflineCost.kv_capacity``).
    """
    from .costs import get_cost_model
    out: dict[str, Any] = {"model": model, "devices": {}}
    for dev in devices:
        cost = get_cost_model(model, dev)
        out["dtype"] = cost.model.dtype
        per: dict[int, dict[str, np.ndarray]] = {}
        for c in ctxs:
            cur = roofline_curve(cost.model, batches, c, cost.bandwidth, cost.peak_flops,
                                 cost.device.step_overhead_s)
            cur["fits"] = (cur["batch"] * c <= cost.kv_capacity()).astype(float)
            per[int(c)] = cur
        out["devices"][cost.device.name] = {"bstar": float(cost.bstar()), "kv_capacity": float(cost.kv_capacity()),
                                            "ctx": per}
    return out


def live_defaults(device_type: str, model: str | None = None, batches: Sequence[int] | None = None,
                  free_bytes: float | None = None) -> tuple[str, list[int]]:
    """Why batching: the model and batch sizes of the live sweep (``None`` = the device
    type's :data:`LIVE_DEFAULTS`). On a GPU with under 40 GB free, the default model is
    llama-1b instead of llama-8b (16 GB of weights plus the bandwidth probe's buffers)."""
    kind = "cuda" if device_type == "cuda" else "cpu"
    name, bs = LIVE_DEFAULTS[kind]
    if model is None and kind == "cuda" and free_bytes is not None and free_bytes < 40e9:
        name = "llama-1b"
    out = [int(b) for b in (bs if batches is None else batches)]
    if not out or out[0] != 1 or any(b2 <= b1 for b1, b2 in zip(out, out[1:])):
        raise ValueError(f"batches={out}: must start at 1 and increase")
    return (name if model is None else model), out


def decode_paths() -> dict[str, dict[str, bool]]:
    """Why batching: the decode paths the live sweep times, as ``StepTimer.decode`` options.

    * ``uniform``: equal contexts, slots 0..B-1 (the slabs are read as one view): the pure
      weight-streaming step;
    * ``mixed``: contexts spread over ctx/2 .. 3ctx/2, slots 0..B-1 (measure's default, the
      schedulers' usual layout): attention reads every row's slab up to the longest
      context and masks the rest;
    * ``gathered``: the same mixed contexts in scattered slots, as a batch has them once
      requests have come and gone out of order: the slabs are gathered (copied) in every
      layer before attention.
    """
    return {"uniform": {"uniform": True}, "mixed": {}, "gathered": {"scattered": True}}


def live_decode_sweep(model: str | None = None, device: str = "auto", dtype: str | None = None,
                      batches: Sequence[int] | None = None, ctx: int = 128, reps: int = 5, seed: int = 0,
                      peak_n: int | None = None, bandwidth_bytes: int | None = None) -> dict[str, Any]:
    """Why batching: decode-step time against batch size, measured now on this device.

    Builds ``model`` (random weights) with a slab KV cache on ``device`` ("auto": CUDA if
    present, else the CPU; dtype fp32 on CPU, bf16 on CUDA unless given), measures the
    device's bandwidth (copy, read, matrix-vector over the model's weight bytes; capped at
    2 GiB on a GPU) and matmul peak in the same process, then times decode steps of every
    batch size at ``ctx`` KV tokens per row, every path at one batch size before the next,
    so that drift hits the paths alike (``batching.measure.StepTimer.decode``), along

    the paths of :func:`decode_paths` (uniform, mixed, gathered).

    Returns ``meta`` (what, where, when), ``batch``, ``ctx``, ``paths``, ``<path>_ms``
    (medians) with ``<path>_p25_ms``/``<path>_p75_ms``, and ``matvec_gbs``, ``copy_gbs``,
    ``read_gbs`` (best of the bandwidth probe; copy counts read + write), ``peak_tflops``.
    """
    import datetime as dt
    import os
    import time

    import torch

    from .measure import StepTimer, bandwidth, matmul_peak, registry_device
    from .measure import stats as time_stats
    from .models import get_model
    from .real import REGISTRY_DTYPE, device_name, resolve_device, resolve_dtype
    from .runner import ModelRunner

    dev = resolve_device(device)
    free = float(torch.cuda.mem_get_info(dev)[0]) if dev.type == "cuda" else None
    name, bs = live_defaults(dev.type, model, batches, free)
    tdt = resolve_dtype(dtype, dev)
    if tdt not in REGISTRY_DTYPE:
        raise ValueError(f"dtype={dtype!r}: the live sweep runs in fp32 or bf16")
    shape = get_model(name).with_dtype(REGISTRY_DTYPE[tdt])
    if not (isinstance(ctx, int) and 2 <= ctx and ctx * 3 // 2 + 2 <= shape.max_context):
        raise ValueError(f"ctx={ctx!r}: must be an integer >= 2 with 1.5 x ctx inside {name}'s context")
    load0, t0 = os.getloadavg()[0], time.perf_counter()
    runner = ModelRunner.from_shape(get_model(name), max(bs), device=dev, dtype=tdt, seed=seed,
                                    max_len=ctx * 3 // 2 + 2)
    runner.warmup()
    nbytes = bandwidth_bytes or (shape.weight_read_bytes if dev.type == "cpu"
                                 else min(shape.weight_read_bytes, 2 << 30))
    bw = bandwidth(dev, tdt, nbytes)
    n = peak_n or (2048 if dev.type == "cpu" else 8192)
    peak = matmul_peak(dev, tdt, n)
    # Round-robin: each of the ``reps`` rounds times every (batch, path) once, right after
    # one untimed step of the same shape; a slow spell of a shared machine then spreads
    # over all points instead of bending one stretch of the curve.
    timer = StepTimer(runner, 1, warmup=1)
    paths = decode_paths()
    samples: dict[tuple[str, int], list[float]] = {(p, b): [] for p in paths for b in bs}
    for _ in range(reps):
        for b in bs:
            for path, kwargs in paths.items():
                samples[(path, b)].append(timer.decode(b, ctx, **kwargs)["median_ms"] / 1e3)
    acc: dict[str, list[float]] = {f"{p}_{s}": [] for p in paths for s in ("ms", "p25_ms", "p75_ms")}
    for path in paths:
        for b in bs:
            st = time_stats(samples[(path, b)])
            acc[f"{path}_ms"].append(st["median_ms"])
            acc[f"{path}_p25_ms"].append(st["p25_ms"])
            acc[f"{path}_p75_ms"].append(st["p75_ms"])
    try:
        reg = registry_device(dev)
    except ValueError:
        reg = dev.type
    meta = {"device": reg, "device_type": dev.type, "device_name": device_name(dev), "model": name,
            "dtype": shape.dtype, "params": float(shape.params), "weight_read_bytes": float(shape.weight_read_bytes),
            "kv_bytes_per_token": float(shape.kv_bytes_per_token), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "reps": reps, "seed": seed, "bandwidth_bytes": float(nbytes),
            "peak_n": n, "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_before": load0, "loadavg_after": os.getloadavg()[0], "wall_s": time.perf_counter() - t0}
    del runner, timer
    return {"meta": meta, "batch": np.asarray(bs, dtype=float), "ctx": int(ctx), "paths": list(paths),
            **{k: np.asarray(v) for k, v in acc.items()},
            "matvec_gbs": bw["matvec"]["GBps_best"], "copy_gbs": bw["copy"]["GBps_best"],
            "read_gbs": bw["read"]["GBps_best"], "peak_tflops": peak["TFLOPs_best"]}


def _sweep_shape(sweep: Mapping[str, Any]) -> ModelShape:
    from .models import get_model
    return get_model(sweep["meta"]["model"]).with_dtype(sweep["meta"]["dtype"])


def _dense(batches: Sequence[float], points: int) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    return np.geomspace(b[0], b[-1], points) if points > 1 else b


def live_roofline(sweep: Mapping[str, Any], points: int = 0) -> dict[str, np.ndarray]:
    """Why batching: the roofline a live sweep predicts from the bandwidth (matrix-vector)
    and matmul peak it measured itself, no overhead (:func:`roofline_curve`), at the
    sweep's batch sizes, or at ``points`` batch sizes spread evenly in log between them."""
    return roofline_curve(_sweep_shape(sweep), _dense(sweep["batch"], points), sweep["ctx"],
                          sweep["matvec_gbs"] * 1e9, sweep["peak_tflops"] * 1e12)


def profile_roofline(profile: Mapping[str, Any], points: int = 60) -> dict[str, np.ndarray]:
    """Why batching: the roofline of a :func:`load_profiles` entry at its ``ref_ctx``, from
    its own bandwidth and peak (or the registry's), no overhead; ``points`` as in
    :func:`live_roofline`."""
    return roofline_curve(profile["shape"], _dense(profile["batch"], points), int(profile["ref_ctx"]),
                          profile["bandwidth_gbs"] * 1e9, profile["peak_tflops"] * 1e12)


def live_numbers(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Why batching: the numbers the prose quotes from a :func:`live_decode_sweep`.

    Sizes: ``params_m``, ``weight_mb`` (streamed per step), ``kv_kb_per_token``, ``ctx``,
    ``bmax``. Device, same run: ``matvec_gbs``, ``copy_gbs``, ``read_gbs``, ``peak_gflops``,
    ``bstar`` (:func:`bstar_of` on matvec bandwidth and peak). Batch 1 (uniform path):
    ``stream_ms`` (weights / matvec bandwidth), ``pred1_ms`` (roofline, KV included),
    ``t1_ms`` measured, ``over_pred`` (measured / predicted), ``achieved_gbs`` ((weight +
    KV bytes) / step time), ``efficiency`` (achieved / matvec bandwidth),
    ``efficiency_copy`` (achieved / copy bandwidth). Uniform path: ``knee125``, ``knee2``
    (:func:`knee`), at the largest batch ``tmax_ms``, ``ratio_max`` (over batch 1),
    ``tps1``, ``tps_max``, ``tps_gain`` (tokens/s and their ratio), ``per_token_max_ms``;
    ``pred_max_ms`` (roofline at the largest batch); ``reps``, ``threads``, ``wall_s``
    from the sweep's meta. Every other measured path ``p``
    (``gathered``, ``mixed``): ``p_t1_ms``, ``p_knee125``, ``p_knee2``, ``p_tmax_ms``,
    ``p_ratio_max``, ``p_tps_max`` and ``p_gap_max`` (its step over the uniform one at the
    largest batch).
    """
    from .plan import StepWork
    shape = _sweep_shape(sweep)
    b = np.asarray(sweep["batch"], dtype=float)
    if b[0] != 1:
        raise ValueError("the sweep must start at batch 1")
    u = np.asarray(sweep["uniform_ms"], dtype=float)
    roof = live_roofline(sweep)
    bw = sweep["matvec_gbs"] * 1e9
    moved1 = shape.bytes_moved(StepWork(decode_rows=1, decode_ctx=sweep["ctx"]))
    achieved = moved1 / (u[0] / 1e3)
    out = {
        "params_m": shape.params / 1e6, "weight_mb": shape.weight_read_bytes / 1e6,
        "kv_kb_per_token": shape.kv_bytes_per_token / 1e3, "ctx": float(sweep["ctx"]), "bmax": float(b[-1]),
        "matvec_gbs": float(sweep["matvec_gbs"]), "copy_gbs": float(sweep["copy_gbs"]),
        "read_gbs": float(sweep["read_gbs"]), "peak_gflops": float(sweep["peak_tflops"]) * 1e3,
        "bstar": bstar_of(sweep["peak_tflops"] * 1e12, bw, shape.bytes_per_param),
        "stream_ms": shape.weight_read_bytes / bw * 1e3, "pred1_ms": float(roof["time_s"][0]) * 1e3,
        "t1_ms": float(u[0]), "over_pred": float(u[0] / (roof["time_s"][0] * 1e3)),
        "achieved_gbs": achieved / 1e9, "efficiency": achieved / bw,
        "efficiency_copy": achieved / (sweep["copy_gbs"] * 1e9),
        "knee125": float(knee(b, u, 1.25)), "knee2": float(knee(b, u, 2.0)),
        "tmax_ms": float(u[-1]), "ratio_max": float(u[-1] / u[0]), "pred_max_ms": float(roof["time_s"][-1]) * 1e3,
        "tps1": float(1e3 / u[0]), "tps_max": float(b[-1] * 1e3 / u[-1]), "tps_gain": float(b[-1] * u[0] / u[-1]),
        "per_token_max_ms": float(u[-1] / b[-1]), "reps": float(sweep["meta"]["reps"]),
        "threads": float(sweep["meta"]["threads"]), "wall_s": float(sweep["meta"]["wall_s"]),
    }
    for path in sweep.get("paths", ["uniform"]):
        if path == "uniform":
            continue
        t = np.asarray(sweep[f"{path}_ms"], dtype=float)
        out.update({f"{path}_t1_ms": float(t[0]), f"{path}_knee125": float(knee(b, t, 1.25)),
                    f"{path}_knee2": float(knee(b, t, 2.0)), f"{path}_tmax_ms": float(t[-1]),
                    f"{path}_ratio_max": float(t[-1] / t[0]), f"{path}_tps_max": float(b[-1] * 1e3 / t[-1]),
                    f"{path}_gap_max": float(t[-1] / u[-1])})
    return {k: float(v) for k, v in out.items()}


def _relation(x: float, ref: float, tol: float = 0.25) -> str:
    """'below', 'above' or 'close to': how ``x`` sits against ``ref`` (within ``tol``)."""
    if abs(x - ref) <= tol * ref:
        return "close to"
    return "below" if x < ref else "above"


def live_text(sweep: Mapping[str, Any]) -> str:
    """Why batching: one paragraph (MyST) saying what the live measurement ran on, for the
    prose; it names the device the build found and never claims another."""
    m = sweep["meta"]
    what = (f"{m['model']} ({m['params'] / 1e6:,.1f}M parameters, {m['dtype']} weights and KV cache, "
            f"random weights)")
    if m["device_type"] == "cuda":
        where = f"the GPU this page was built on, {m['device_name']}"
        note = "This build found a GPU, so the live curves below are GPU measurements."
    else:
        where = f"this page's build machine, a CPU ({m['device_name']}, {m['threads']} threads)"
        note = ("No GPU was present when this page was built, so the live curves below are CPU "
                "measurements; the GPU numbers on this page are roofline predictions.")
    return (f"The measurement below ran {what} on {where}, torch {m['torch']}, on {m['date'][:10]}: "
            f"{sweep['ctx']} KV tokens per row, median of {m['reps']} timed steps per point, "
            f"{m['wall_s']:.0f} s in all (load average {m['loadavg_before']:.2f} before, "
            f"{m['loadavg_after']:.2f} after). {note}")


def live_labels(sweep: Mapping[str, Any]) -> dict[str, str]:
    """Why batching: caption strings of a live sweep: ``what`` (model, size, dtype),
    ``where`` (device name, registry name, threads on a CPU), ``kind`` ("CPU" or "GPU")."""
    m = sweep["meta"]
    gpu = m["device_type"] == "cuda"
    where = f"{m['device_name']} [{m['device']}]" + ("" if gpu else f", {m['threads']} threads")
    return {"what": f"{m['model']} ({m['params'] / 1e6:,.1f}M parameters, {m['dtype']})", "where": where,
            "kind": "GPU" if gpu else "CPU"}


def knee_text(numbers: Mapping[str, float]) -> str:
    """Why batching: how the measured knees sit against B* (a sentence for the prose)."""
    n = numbers
    return (f"The uniform step stays within 1.25x of batch 1 up to batch {n['knee125']:.0f} and within 2x up "
            f"to batch {n['knee2']:.0f}, {_relation(n['knee2'], n['bstar'])} the B* of "
            f"{n['bstar']:.1f} that this run's own bandwidth and peak give.")


def load_profiles(directory: str | Any = PROFILE_DIR, ctx: int = 128) -> list[dict[str, Any]]:
    """Why batching: every committed profile (``<directory>/*.json``, sorted by name),
    validated through ``ProfileCost`` and summarized for the page.

    Each entry: ``path``, ``meta``, ``label`` (model, dtype, device, date), ``gpu`` (not
    the CPU), ``device`` (registry name), ``batch``, ``ctxs``, ``ms`` (decode grid,
    ``ms[i, j]`` = batch i at context j), ``shape`` (the model in the profile's dtype),
    ``bandwidth_gbs``/``peak_tflops`` and ``roofs_from`` (the profile's own ``device``
    section if it has one, else the device registry's constants), ``bstar``; and at
    ``ref_ctx``, the profile's context nearest ``ctx``: ``ref_ms`` (the column), ``t1_ms``
    (batch 1), ``knee125``/``knee2`` (:func:`knee`).
    """
    from .costs import ProfileCost
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        cost = ProfileCost.from_dict(data, source=str(path))
        meta, dev = data["meta"], data.get("device") or {}
        try:
            bw = float(dev["bandwidth"]["matvec"]["GBps_best"])
            peak = float(dev["matmul_peak"]["TFLOPs_best"])
            roofs = "bandwidth and peak measured in the same run"
        except (KeyError, TypeError):
            bw, peak = cost.device.bandwidth / 1e9, cost.device.peak(cost.model.dtype) / 1e12
            roofs = "the device registry's bandwidth and peak"
        where = meta.get("device_name") or cost.device.name
        label = (f"{meta['model']} ({cost.model.dtype}) on {where} [{cost.device.name}], "
                 f"measured {meta['date'][:10]}")
        b, ms = cost.db, cost.ds * 1e3
        j = int(np.argmin(np.abs(np.log(np.maximum(cost.dc, 1.0) / max(ctx, 1)))))
        col = ms[:, j]
        out.append({"path": str(path), "meta": meta, "label": label, "gpu": cost.device.name != "cpu-here",
                    "device": cost.device.name, "batch": b, "ctxs": cost.dc, "ms": ms, "shape": cost.model,
                    "bandwidth_gbs": bw, "peak_tflops": peak, "roofs_from": roofs,
                    "bstar": bstar_of(peak * 1e12, bw * 1e9, cost.model.bytes_per_param),
                    "ref_ctx": float(cost.dc[j]), "ref_ms": col, "t1_ms": float(col[0]),
                    "knee125": float(knee(b, col, 1.25)), "knee2": float(knee(b, col, 2.0))})
    return out


def profiles_text(profiles: Sequence[Mapping[str, Any]]) -> str:
    """Why batching: which devices the committed profiles cover (a paragraph for the
    prose); it says plainly when no GPU measurement is there."""
    if not profiles:
        return ("No profile is committed in `data/profiles/` yet, so this section has only the live "
                "measurement above and the roofline predictions.")
    parts = [f"{p['label']}: at {p['ref_ctx']:,.0f} tokens per row, {p['t1_ms']:.1f} ms at batch 1, within 2x "
             f"of that up to batch {p['knee2']:.0f}, {p['ref_ms'][-1]:.0f} ms at batch {p['batch'][-1]:.0f} "
             f"(B* = {p['bstar']:.0f} from {p['roofs_from']})" for p in profiles]
    n = len(profiles)
    head = f"{n} profile{'s are' if n > 1 else ' is'} committed in `data/profiles/`. " + "; ".join(parts) + "."
    gpus = sorted({p["device"] for p in profiles if p["gpu"]})
    if gpus:
        tail = (f" GPU measurements are among them ({', '.join(gpus)}): for those devices the figure shows "
                "measured step times beside the roofline.")
    else:
        tail = (f" {'None of them was' if n > 1 else 'It was not'} measured on a GPU: every H100 and H200 "
                "number on this page is a roofline prediction from datasheet constants, not a measurement.")
    return head + tail


def profile_rows(profiles: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Why batching: header and rows of the committed-profiles table (one row per profile
    and context: batch-1 step, step at the largest batch, knees)."""
    header = ["device", "model", "dtype", "date", "ctx", "B=1 ms", "max B", "ms", "knee 1.25x", "knee 2x"]
    rows: list[list[Any]] = []
    for p in profiles:
        m = p["meta"]
        for j, c in enumerate(p["ctxs"]):
            col = p["ms"][:, j]
            rows.append([p["device"], m["model"], p["shape"].dtype, m["date"][:10], f"{c:.0f}", f"{col[0]:.1f}",
                         f"{p['batch'][-1]:.0f}", f"{col[-1]:.1f}", f"{knee(p['batch'], col, 1.25)}",
                         f"{knee(p['batch'], col, 2.0)}"])
    return header, rows


__all__ += ["LIVE_DEFAULTS", "PROFILE_DIR", "bstar_of", "knee", "roofline_curve", "stream_numbers",
            "gpu_rooflines", "live_defaults", "decode_paths", "live_decode_sweep", "live_roofline",
            "profile_roofline", "live_numbers", "live_text", "live_labels", "knee_text", "load_profiles",
            "profiles_text", "profile_rows"]
