"""What 7.2 sets up: the KV cache as the binding limit, slab against exact reservation, and KV
budget sweeps.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from ..engine import RunResult
from ..workload import Workload
from .common import at, flat, metrics, simulate


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
