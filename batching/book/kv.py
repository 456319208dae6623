"""The KV page: the KV cache as the binding limit, slab against exact reservation, and KV
budget sweeps.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..engine import RunResult
from ..workload import Workload
from .common import Claim, at, columns, flat, metrics, simulate


def _life_mean(workload: Workload) -> float:
    """Mean KV tokens a request holds over its life: prompt + output / 2."""
    return float((workload.prompt_lens + workload.output_lens / 2).mean())


def _kv_share(cost: Any, rows: int, ctx: float) -> float:
    """The share of a decode step's bytes that is KV (``rows`` rows of ``ctx`` tokens), not weights."""
    kv = rows * ctx * cost.model.kv_bytes_per_token
    return float(kv / (kv + cost.model.weight_read_bytes))


def kv_over_time(result: RunResult) -> dict[str, np.ndarray]:
    """The KV page: KV tokens reserved and used, and running requests, at the
    end of every logged step (a run of identical steps gives one point). Arrays ``t``
    (s), ``reserved``, ``used``, ``running``."""
    C = result.log.cols
    t = np.asarray(C["t"], dtype=float) + np.asarray(C["dur"], dtype=float)
    return {
        "t": t,
        "reserved": np.asarray(C["kv_reserved"], dtype=float),
        "used": np.asarray(C["kv_used"], dtype=float),
        "running": np.asarray(C["running"], dtype=float),
    }


def kv_runs(
    workload: Workload,
    cost: Any,
    slots: int = 256,
    policies: Sequence[str] = ("slab", "exact"),
    kv_tokens: int | str = "device",
) -> dict[str, Any]:
    """The KV page: continuous batching under each KV policy, every step logged.

    Returns ``series`` ({policy: :func:`kv_over_time`}) and ``numbers``: per policy (prefixed
    ``<policy>_``) ``running_peak``, ``ttft_p99``, ``preemptions``, ``unused`` = 1 - used /
    reserved (time-weighted) and ``peak_share`` = the reserved peak / the KV capacity the runs had.
    """
    series: dict[str, Any] = {}
    numbers: dict[str, float] = {}
    keys = ("running_peak", "ttft_p99", "preemptions")
    capacity = cost.kv_capacity() if kv_tokens == "device" else float(kv_tokens)
    for pol in policies:
        r = simulate(
            workload, cost, "continuous", slots=slots, kv_tokens=kv_tokens, kv_policy=pol, fast=False
        )
        m = metrics(r)
        series[pol] = kv_over_time(r)
        numbers.update({f"{pol}_{k}": m[k] for k in keys})
        numbers[f"{pol}_unused"] = 1.0 - m["kv_used_mean"] / m["kv_reserved_mean"]
        numbers[f"{pol}_peak_share"] = m["kv_reserved_peak"] / capacity
    return {"series": series, "numbers": numbers}


def kv_fit(cost: Any, workload: Workload) -> dict[str, float]:
    """The KV page: how many sequences fit the device's KV capacity (``capacity`` tokens): as
    slabs of ``max_context``, or reserved exactly at each request's final length (prompt +
    output) or at its mean length over its life (prompt + output / 2)."""
    C = int(cost.kv_capacity())
    L = (workload.prompt_lens + workload.output_lens).astype(float)
    ctx = cost.model.max_context
    return {
        "capacity": float(C),
        "max_context": float(ctx),
        "slab": float(C // ctx),
        "exact_final": float(C / L.mean()),
        "exact_avg": C / _life_mean(workload),
        "mean_final": float(L.mean()),
        "slab_waste": float(1 - L.mean() / ctx),
    }


def policy_roofline(cost: Any, workload: Workload, budget: float, slots: int) -> dict[str, float]:
    """The KV page's derivation: roofline decode throughput with the batch as full as a KV
    budget of ``budget`` tokens lets each policy keep it, every row at the workload's mean
    length over a request's life (prompt + output / 2, ``ctx``).

    ``rows_slab`` = min(slots, budget // max_context), ``rows_exact`` = min(slots, budget // ctx);
    per policy ``tput_<pol>`` (rows / :meth:`decode_step`, tokens/s) and ``kv_share_<pol>`` (the
    share of a step's bytes that is KV, not weights); ``gain`` = tput_exact / tput_slab."""
    ctx = _life_mean(workload)
    m = cost.model
    rows = {
        "slab": min(slots, int(budget) // m.max_context),
        "exact": min(slots, int(budget // ctx)),
    }
    out: dict[str, float] = {"budget": float(budget), "ctx": ctx}
    for pol, r in rows.items():
        if r < 1:
            raise ValueError(
                f"budget={budget:g} KV tokens holds no {pol} row (context {m.max_context}, mean {ctx:.0f})"
            )
        out[f"rows_{pol}"] = float(r)
        out[f"tput_{pol}"] = r / cost.decode_step(r, int(round(ctx)))
        out[f"kv_share_{pol}"] = _kv_share(cost, r, ctx)
    out["gain"] = out["tput_exact"] / out["tput_slab"]
    return out


#: What :func:`kv_budget_sweep` records per budget (:func:`~batching.book.common.metrics` keys).
BUDGET_KEYS = ("throughput_tok", "preemptions", "running_peak")


def kv_budget_sweep(
    workload: Workload,
    cost: Any,
    budgets: Sequence[int],
    slots: int = 256,
    policies: Sequence[str] = ("slab", "exact"),
    scheduler: str = "continuous",
    static_timeout: float | None = 2.0,
) -> dict[str, dict[str, np.ndarray]]:
    """The KV page: continuous batching under a KV budget, per reservation policy,
    and static batching under the same budget (key ``static``, unless ``static_timeout`` is
    None): a dense batch reserves a slab per row, so it holds budget // max_context rows
    (at most ``slots``), sealed when full or after ``static_timeout`` seconds.

    Per series, arrays over ``budget`` (KV tokens) of :data:`BUDGET_KEYS`. ``slots`` is set
    high so that memory, not slots, is the limit.
    """
    runs: list[tuple[str, str, dict[str, Any]]] = [
        (pol, scheduler, {"slots": slots, "kv_policy": pol}) for pol in policies
    ]
    if static_timeout is not None:
        runs.append(("static", "static", {"timeout": static_timeout}))
    ctx = cost.model.max_context
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, sched, opts in runs:
        ms = []
        for b in budgets:
            if sched == "static":
                opts = {**opts, "slots": min(slots, int(b) // ctx)}
            ms.append(metrics(simulate(workload, cost, sched, kv_tokens=int(b), **opts)))
        out[name] = {"budget": np.asarray(budgets, dtype=float), **columns(ms, BUDGET_KEYS)}
    return out


def budget_numbers(sweep: Mapping[str, Mapping[str, np.ndarray]], budget: int) -> dict[str, float]:
    """The KV page: the :func:`kv_budget_sweep` numbers at one budget, prefixed
    by series, plus ``gain`` = exact over slab throughput (if both policies ran) and, with
    a static series, ``slab_over_static`` and ``exact_over_static`` (continuous batching's
    gain over static batching under each policy) and ``slab_kept`` = (slab_over_static - 1)
    / (exact_over_static - 1): the share of the exact policy's gain that slabs keep."""
    out: dict[str, float] = {"budget": float(budget)}
    for pol, d in sweep.items():
        out.update(flat(pol, at(d, "budget", budget)))
    if "slab" in sweep and "exact" in sweep:
        out["gain"] = out["exact_throughput_tok"] / out["slab_throughput_tok"]
    if "static" in sweep:
        for pol in ("slab", "exact"):
            if pol in sweep:
                out[f"{pol}_over_static"] = out[f"{pol}_throughput_tok"] / out["static_throughput_tok"]
        if "slab" in sweep and "exact" in sweep and out["exact_over_static"] > 1:
            out["slab_kept"] = gain_kept(out["slab_over_static"], out["exact_over_static"])
    return out


def gain_kept(slab_gain: float, exact_gain: float) -> float:
    """The KV page: the share of continuous batching's throughput gain over static
    batching (``exact_gain``, with exact reservations) that slab reservations keep
    (``slab_gain``): (slab_gain - 1) / (exact_gain - 1). Simulated (:func:`budget_numbers`)
    and measured (:func:`real_kv_numbers`) alike."""
    if not exact_gain > 1:
        raise ValueError(f"exact_gain={exact_gain}: no gain over static batching to keep a share of")
    return (slab_gain - 1) / (exact_gain - 1)


def slab_growth(
    sweep: Mapping[str, Mapping[str, np.ndarray]], cost: Any, workload: Workload
) -> dict[str, float]:
    """The KV page (exercise 3): how slab throughput grows between the sweep's two
    largest budgets, and why less than the budget: ``budget_ratio``, ``tput_ratio``, the
    peak running rows at each (``rows_lo``, ``rows_hi``), and the roofline decode step at
    those rows with every row at the workload's mean length over a request's life
    (``step_lo_ms``, ``step_hi_ms``) and the share of the larger step spent reading KV
    rather than weights (``kv_share_hi``)."""
    d = sweep["slab"]
    if len(d["budget"]) < 2:
        raise ValueError("slab_growth needs a sweep of at least two budgets")
    i, j = -2, -1
    ctx = int(round(_life_mean(workload)))
    lo, hi = int(d["running_peak"][i]), int(d["running_peak"][j])
    return {
        "budget_ratio": float(d["budget"][j] / d["budget"][i]),
        "tput_ratio": float(d["throughput_tok"][j] / d["throughput_tok"][i]),
        "rows_lo": float(lo),
        "rows_hi": float(hi),
        "ctx": float(ctx),
        "step_lo_ms": float(cost.decode_step(lo, ctx) * 1e3),
        "step_hi_ms": float(cost.decode_step(hi, ctx) * 1e3),
        "kv_share_hi": _kv_share(cost, hi, ctx),
    }


# ------------------------------------------------------------------ measured
#: The measured section's table of the real-model runs, per run: (label, metrics key, format).
REAL_KV_ROWS: tuple[tuple[str, str, str], ...] = (
    ("most requests running at once", "running_peak", "{:.0f}"),
    ("KV reserved, mean (tokens)", "kv_reserved_mean", "{:,.0f}"),
    ("KV written, mean (tokens)", "kv_used_mean", "{:,.0f}"),
    ("output tokens/s", "throughput_tok", "{:.0f}"),
    ("p99 time to first token (s)", "ttft_p99", "{:.2f}"),
    ("p99 end-to-end (s)", "e2e_p99", "{:.2f}"),
    ("preemptions", "preemptions", "{:.0f}"),
    ("steps", "steps", "{:.0f}"),
    ("busy (s)", "busy_s", "{:.1f}"),
)

#: The page's short table of the same runs: how many ran at once, and what they delivered.
REAL_KV_PAGE_ROWS = tuple(r for r in REAL_KV_ROWS if r[1] in ("running_peak", "throughput_tok"))


def real_kv_configs(
    budget: int, max_context: int, slots: int, static_timeout: float = 1.0
) -> dict[str, dict[str, Any]]:
    """The KV page, measured: the three ways to spend one KV budget of ``budget``
    tokens. ``static``: one dense batch of budget // max_context rows (each row a slab);
    ``continuous, slab``: up to ``slots`` requests, each reserving a slab; ``continuous,
    exact``: up to ``slots`` requests, each reserving what it holds (preempted when full)."""
    rows = budget // max_context
    if rows < 1:
        raise ValueError(f"budget={budget} KV tokens holds no slab of max_context={max_context}")
    kv = {"kv_capacity": int(budget)}
    return {
        "static": {"scheduler": "static", "slots": min(rows, slots), "timeout": static_timeout, **kv},
        "continuous, slab": {"scheduler": "continuous", "slots": slots, "kv_policy": "slab", **kv},
        "continuous, exact": {"scheduler": "continuous", "slots": slots, "kv_policy": "exact", **kv},
    }


def real_kv(
    workload: Workload,
    budget_slabs: int = 4,
    slots: int = 32,
    model: str | None = None,
    device: str = "auto",
    threads: int | None = None,
    profile: str | None = "auto",
) -> dict[str, Any]:
    """The KV page, measured on the real model: ``workload`` served under a KV
    budget of ``budget_slabs`` slabs of the model's context by :func:`real_kv_configs`'s
    three schedules (:func:`~batching.book.checks.real_schedulers`: one model for all
    runs, and the simulator beside them when a profile of this machine is committed).

    The runner holds a slab for each of its ``slots`` (it has no paged cache);
    the budget is enforced by the schedulers' KV accounting, as the simulator enforces it.
    Adds ``budget``, ``max_context`` and ``slots`` to real_schedulers' result."""
    from ..models import get_model
    from .checks import real_model, real_schedulers

    name = real_model(model, device)
    ctx = get_model(name).max_context
    budget = budget_slabs * ctx
    rs = real_schedulers(
        workload,
        real_kv_configs(budget, ctx, slots),
        model=name,
        device=device,
        threads=threads,
        profile=profile,
    )
    return {**rs, "budget": budget, "max_context": ctx, "slots": slots}


def slab_verdict(slab_kept: float) -> Claim:
    """The seed claim "one max-length slab per slot gives back most of batching's gain",
    judged on :func:`gain_kept`'s share: slabs keep under half the gain ("holds"; a negative
    share, slabs slower than static batching, gives back all of it), under 80% ("partly":
    much of the gain goes, not most), or more ("does not hold"; above 1, measured noise or
    slots rather than memory binding exact reservations, slabs kept it all)."""
    if math.isnan(slab_kept):
        raise ValueError("slab_kept=nan: exact reservations gained nothing over static batching to share")
    return Claim.HOLDS if slab_kept < 0.5 else Claim.PARTLY if slab_kept < 0.8 else Claim.DOES_NOT_HOLD


def real_kv_numbers(rs: Mapping[str, Any]) -> dict[str, float]:
    """What :func:`real_kv` measured, as the numbers the page and the measured section quote:
    throughput ratios, ``slab_kept`` (:func:`gain_kept`, NaN when exact reservations gained
    nothing over static), ``exact_slot_bound`` (1.0 when exact ran every slot at once: the
    slots, not the memory, were the limit) and, with a simulation beside the runs,
    ``<run>_sim_tput_err`` (simulated over measured throughput, minus 1)."""
    runs = {"static": "static", "slab": "continuous, slab", "exact": "continuous, exact"}
    st, sl, ex = (rs["real"][runs[k]] for k in ("static", "slab", "exact"))
    out: dict[str, float] = {
        "slab_over_static": sl["throughput_tok"] / st["throughput_tok"],
        "exact_over_static": ex["throughput_tok"] / st["throughput_tok"],
        "exact_over_slab": ex["throughput_tok"] / sl["throughput_tok"],
        "slab_unused": 1 - sl["kv_used_mean"] / sl["kv_reserved_mean"],
        "exact_peak_share": ex["kv_reserved_peak"] / rs["budget"],
        "exact_slot_bound": float(ex["running_peak"] >= rs["slots"]),
        "exact_preemptions": float(ex["preemptions"]),
        "exact_running_peak": float(ex["running_peak"]),
    }
    out["slab_kept"] = (
        gain_kept(out["slab_over_static"], out["exact_over_static"])
        if out["exact_over_static"] > 1
        else float("nan")
    )
    for k, name in runs.items():
        if "sim" in rs:
            out[f"{k}_sim_tput_err"] = (
                rs["sim"][name]["throughput_tok"] / rs["real"][name]["throughput_tok"] - 1
            )
    return out
