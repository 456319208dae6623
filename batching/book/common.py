"""What every page's experiments share: the roofline numbers of a cost model, a trace fitted
to a model's context, a simulated run and its metrics, verdict enums, and the helpers that
turn results into glue values."""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs.devices import machine_of, same_machine
from ..engine import RunResult, SimExecutor, run
from ..metrics import summarize
from ..plan import StepWork
from ..request import Request
from ..schedulers import make_scheduler
from ..steplog import Accounting
from ..workloads import Workload
from ..workloads.traces import load_trace

#: The repository root: committed results (``benchmarks/results``) and profiles
#: (``data/profiles``) are read relative to it.
ROOT = Path(__file__).resolve().parents[2]

#: What a batch row does during a step (the timelines), in drawing order.
KINDS = ("prefill", "padding", "decode", "dead", "idle")


def roofline_numbers(cost: Any) -> dict[str, float]:
    """The device and model numbers the pages derive from (TFLOP/s, TB/s, GB, kB, ms); peak and
    bandwidth count all devices together; ``bstar`` is the batch where decode turns
    compute-bound."""
    m = cost.model
    return {
        "peak_tflops": cost.peak_flops / 1e12,
        "bandwidth_tbs": cost.bandwidth / 1e12,
        "weight_gb": m.weight_bytes / 1e9,
        "weight_read_gb": m.weight_read_bytes / 1e9,
        "params_b": m.params / 1e9,
        "bstar": float(cost.bstar()),
        "kv_kb_per_token": m.kv_bytes_per_token / 1e3,
        "kv_capacity": float(cost.kv_capacity()),
        "max_context": float(m.max_context),
        "overhead_ms": cost.device.step_overhead_s * 1e3,
    }


def machine_label(record: Mapping[str, Any]) -> str:
    """How tables, legends and glue name the machine of a profile's or a run's record
    (:func:`~batching.costs.devices.machine_of`): ``AMD EPYC (2 threads)``; the registry
    entry where the record names no machine."""
    m = machine_of(record)
    return m.label if m is not None else str(record.get("device", "?"))


def same_machine_as(record: Mapping[str, Any], here: Mapping[str, Any] | None) -> bool:
    """Whether a committed file's record (a profile's ``meta``, a result) is of the machine of
    ``here``, a live run's record of this build (a sweep's ``meta``, an executor record): only
    then may a page call it this machine's. Unrecorded on either side: False."""
    return here is not None and same_machine(machine_of(record), machine_of(here))


def offered_rate(workload: Workload) -> float:
    """Requests per second of a workload: count / span of its arrivals."""
    return len(workload) / workload.duration if workload.duration > 0 else math.inf


def trace_workload(name: str, limit: int | None = None, max_context: int = 8192) -> Workload:
    """The first ``limit`` requests of a named trace, each capped to ``max_context``; how many
    were capped is in ``info["capped"]``."""
    return load_trace(name, limit=limit).cap_to_context(max_context, mode="cap")[0]


def step_work(prompts: Sequence[int] = (), decodes: int = 0, ctx: int = 0) -> StepWork:
    """One step that prefills each of ``prompts`` from scratch (causal attention over itself)
    beside ``decodes`` decode rows holding ``ctx`` KV tokens each."""
    return StepWork(
        prefill_tokens=sum(prompts),
        prefill_attn=sum(p * (p + 1) // 2 for p in prompts),
        decode_rows=decodes,
        decode_ctx=decodes * ctx,
    )


def simulate(
    workload: Workload | Sequence[Request],
    cost: Any,
    scheduler: str,
    *,
    slots: int = 32,
    kv_tokens: int | float | str | None = "device",
    kv_policy: str = "slab",
    record_slots: bool = False,
    fast: bool = True,
    **options: Any,
) -> RunResult:
    """One simulated run. ``kv_tokens="device"`` takes the KV capacity the devices leave after
    the weights, ``None`` none; ``options`` go to :func:`make_scheduler`. ``fast=False`` logs
    every step on its own row (the fast path logs a run of identical decode steps as one,
    with the KV and queue columns as they stand after its last step)."""
    if kv_tokens == "device":
        kv: float = cost.kv_capacity()
    elif kv_tokens is None:
        kv = math.inf
    else:
        kv = kv_tokens  # type: ignore[assignment]
    sched = make_scheduler(
        scheduler,
        max_context=cost.model.max_context,
        slots=slots,
        kv_capacity=kv,
        kv_policy=kv_policy,
        **options,
    )
    reqs = workload.fresh() if isinstance(workload, Workload) else list(workload)
    return run(reqs, sched, SimExecutor(cost), record_slots=record_slots, fast=fast)


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


def metrics(result: RunResult) -> dict[str, float]:
    """One run's :func:`~batching.metrics.summarize` as flat floats (times in s; a latency
    statistic with no value is NaN). With a cost model beside the run also ``hw_compute`` and
    ``hw_bandwidth`` (all FLOPs and bytes performed), ``decode_compute`` (the FLOPs of its
    decode rows alone, dead rows included: ``hw_compute`` less prefill's, padding's and
    their attention's) and ``useful_compute`` (:func:`useful_flops`), each over busy time at
    peak."""
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
    hw = result.hardware
    if hw is not None and hw.model is not None:
        out["hw_compute"] = s["hw_compute_utilization"]
        out["hw_bandwidth"] = s["hw_bandwidth_utilization"]
        decode = result.log.hardware(_DecodeOnly(hw.model))[0].sum()
        out["decode_compute"] = decode / (s["busy_s"] * hw.peak_flops)
        out["useful_compute"] = useful_flops(result.requests, hw.model) / (s["busy_s"] * hw.peak_flops)
    return {k: float(v) for k, v in out.items()}


class Claim(str, enum.Enum):
    """How a claim fares against the numbers that test it; the notebook words each one."""

    HOLDS = "holds"
    #: True in part; the numbers say which part.
    PARTLY = "partly"
    #: Holds counted in slots, not in hardware FLOPs at any slot count tried.
    SLOT_LEVEL_ONLY = "slot-level-only"
    #: Holds in slots, and in hardware FLOPs only once the slot cap is lifted.
    NEEDS_WIDE_BATCH = "needs-wide-batch"
    DOES_NOT_HOLD = "does not hold"


class Versus(str, enum.Enum):
    """How a measured ratio compares with 1 (one step's time over another's, or over its
    positions): within a tolerance, more, or less."""

    LESS = "less"
    SAME = "same"
    MORE = "more"


def versus(ratio: float, tol: float = 0.05) -> Versus:
    """:class:`Versus` of ``ratio``: SAME within ``tol`` of 1, else LESS or MORE."""
    if not (ratio > 0 and 0 <= tol < 1):
        raise ValueError(f"ratio={ratio}, tol={tol}: need a positive ratio and 0 <= tol < 1")
    if abs(ratio - 1.0) <= tol:
        return Versus.SAME
    return Versus.MORE if ratio > 1 else Versus.LESS


def choose(smoke: bool, full: Any, small: Any) -> Any:
    """``small`` in smoke runs (the tests), ``full`` for the book: one rule for every notebook."""
    return small if smoke else full


def columns(rows: Sequence[Mapping[str, Any]], keys: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """A sweep's runs (one mapping of scalars per run) as one array per key, in run order."""
    return {k: np.asarray([r[k] for r in rows]) for k in (rows[0] if keys is None else keys)}


def at(sweep: Mapping[str, np.ndarray], key: str, value: float) -> dict[str, float]:
    """The scalars of a sweep (arrays over one swept variable) where ``sweep[key] == value``."""
    idx = np.flatnonzero(np.isclose(np.asarray(sweep[key], dtype=float), value))
    if idx.size == 0:
        raise KeyError(f"{key}={value} is not in the sweep ({list(np.asarray(sweep[key]))})")
    i, shape = int(idx[0]), np.asarray(sweep[key]).shape
    return {k: float(np.asarray(v)[i]) for k, v in sweep.items() if np.asarray(v).shape[:1] == shape}


def flat(prefix: str, values: Mapping[str, Any], keys: Sequence[str] | None = None) -> dict[str, Any]:
    """``{f"{prefix}_{k}": v}`` for the chosen keys (glue keys; ``plots.glue_values`` makes
    numpy scalars plain)."""
    return {f"{prefix}_{k}": values[k] for k in (values if keys is None else keys)}
