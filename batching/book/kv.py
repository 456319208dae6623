"""The KV page: the KV cache as the binding limit, slab against exact reservation, and KV
budget sweeps, simulated and on the real model."""

from __future__ import annotations

import enum
import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..costs import RooflineCost
from ..costs.base import CostModel
from ..costs.models import get_model
from ..engine import RunResult
from ..metrics import run_metrics
from ..simulate import simulate
from ..workloads import Workload
from .common import Claim, at, columns

POLICIES = ("slab", "exact")


def _life_mean(workload: Workload) -> float:
    """Mean KV tokens a request holds over its life: prompt + output / 2."""
    return float((workload.prompt_lens + workload.output_lens / 2).mean())


def _kv_share(cost: CostModel, rows: int, ctx: float) -> float:
    """The share of a decode step's bytes that is KV (``rows`` rows of ``ctx`` tokens), not weights."""
    kv = rows * ctx * cost.model.kv_bytes_per_token
    return float(kv / (kv + cost.model.weight_read_bytes))


def kv_over_time(result: RunResult) -> dict[str, np.ndarray]:
    """KV tokens reserved and used, and requests running, at the end of every logged step
    (a run of identical steps is one point): arrays ``t`` (s), ``reserved``, ``used``, ``running``."""
    C = result.log.cols
    t = np.asarray(C["t"], dtype=float) + np.asarray(C["dur"], dtype=float)
    return {
        "t": t,
        "reserved": np.asarray(C["kv_reserved"], dtype=float),
        "used": np.asarray(C["kv_used"], dtype=float),
        "running": np.asarray(C["running"], dtype=float),
    }


def kv_runs(
    workload: Workload, cost: CostModel, slots: int = 256, kv_tokens: int | str = "device"
) -> dict[str, Any]:
    """Continuous batching under each KV policy, every step logged: ``series`` ({policy:
    :func:`kv_over_time`}) and ``numbers``, per policy ``<policy>_running_peak``, ``_ttft_p99``
    (s), ``_preemptions``, ``_unused`` (1 - used / reserved, time-weighted) and ``_peak_share``
    (reserved peak over the KV capacity); ``slab_count``, the slabs the capacity holds, and
    ``ttft_gain``, slab's p99 TTFT over exact's."""
    series: dict[str, Any] = {}
    capacity = cost.kv_capacity() if kv_tokens == "device" else float(kv_tokens)
    numbers: dict[str, float] = {"slab_count": float(int(capacity) // cost.model.max_context)}
    for pol in POLICIES:
        r = simulate(
            workload, cost, "continuous", slots=slots, kv_tokens=kv_tokens, kv_policy=pol, fast=False
        )
        m = run_metrics(r)
        series[pol] = kv_over_time(r)
        numbers.update({f"{pol}_{k}": m[k] for k in ("running_peak", "ttft_p99", "preemptions")})
        numbers[f"{pol}_unused"] = 1.0 - m["kv_used_mean"] / m["kv_reserved_mean"]
        numbers[f"{pol}_peak_share"] = m["kv_reserved_peak"] / capacity
    numbers["ttft_gain"] = numbers["slab_ttft_p99"] / numbers["exact_ttft_p99"]
    return {"series": series, "numbers": numbers}


#: Most of a reservation unwritten: over this share of it (:func:`reserved_verdict`).
UNUSED_MOST = 0.5
#: Requests queue for a slab where slab's p99 TTFT is at least this many times exact's.
QUEUE_FACTOR = 2.0


def reserved_verdict(
    n: Mapping[str, float], unused: float = UNUSED_MOST, factor: float = QUEUE_FACTOR
) -> Claim:
    """The claim "slab reservations fill the memory long before the cache contents do, and the
    batch stops at the slab count while requests queue; exact reservations run as many requests
    as arrive", on :func:`kv_runs`'s ``numbers``. Its first half: slabs ran ``slab_count`` at
    once with over ``unused`` of what they reserved never written. HOLDS where that half holds,
    exact ran more at once than slabs without a preemption, and slab's p99 TTFT is at least
    ``factor`` x exact's; PARTLY where only the first half holds; DOES_NOT_HOLD where it does
    not (the memory never filled with slabs, or what they reserved was mostly written)."""
    if not (0 < unused < 1 and factor > 1):
        raise ValueError(f"unused={unused}, factor={factor}: need 0 < unused < 1 and factor > 1")
    if not (n["slab_running_peak"] >= n["slab_count"] and n["slab_unused"] > unused):
        return Claim.DOES_NOT_HOLD
    exact_ran_all = n["exact_running_peak"] > n["slab_running_peak"] and n["exact_preemptions"] == 0
    return Claim.HOLDS if exact_ran_all and n["ttft_gain"] >= factor else Claim.PARTLY


def kv_fit(cost: RooflineCost, workload: Workload) -> dict[str, float]:
    """How many sequences the device's KV capacity (``capacity`` tokens) holds: as slabs of
    ``max_context`` (``slab``), or reserved exactly at each request's final length
    (``exact_final``, mean ``mean_final``) or at its mean over its life (``exact_avg``);
    ``slab_waste``, the share of a slab the mean final length leaves empty; and the device's
    ``bstar`` with ``slab_over_bstar`` and ``exact_over_bstar`` (``exact_final`` over it)."""
    C = int(cost.kv_capacity())
    L = (workload.prompt_lens + workload.output_lens).astype(float)
    ctx = cost.model.max_context
    bstar = float(cost.bstar())
    return {
        "capacity": float(C),
        "max_context": float(ctx),
        "slab": float(C // ctx),
        "exact_final": float(C / L.mean()),
        "exact_avg": C / _life_mean(workload),
        "mean_final": float(L.mean()),
        "slab_waste": float(1 - L.mean() / ctx),
        "bstar": bstar,
        "slab_over_bstar": (C // ctx) / bstar,
        "exact_over_bstar": float(C / L.mean()) / bstar,
    }


#: "Far below" B*: under this share of it (:func:`fit_verdict`).
FAR_BELOW = 0.5


def fit_verdict(fit: Mapping[str, float], far: float = FAR_BELOW) -> Claim:
    """The claim "one slab per request caps the batch far below B*; reserving what requests
    hold does not", on :func:`kv_fit`: HOLDS where slabs fit under ``far`` of B* and exact
    reservations (at final lengths) at least that share; PARTLY where both fit under it (the
    memory caps the batch far below B* whatever the layout); DOES_NOT_HOLD where slabs fit
    ``far`` of B* or more."""
    if not 0 < far < 1:
        raise ValueError(f"far={far}: need 0 < far < 1")
    if fit["slab_over_bstar"] >= far:
        return Claim.DOES_NOT_HOLD
    return Claim.HOLDS if fit["exact_over_bstar"] >= far else Claim.PARTLY


def policy_roofline(cost: RooflineCost, workload: Workload, budget: float, slots: int) -> dict[str, float]:
    """Roofline decode throughput (tokens/s) with the batch as full as a KV budget of
    ``budget`` tokens lets each policy keep it, every row at the workload's mean length over
    a request's life (``ctx``): ``rows_<policy>`` and ``tput_<policy>``, ``gain`` = exact over
    slab, and ``kv_share_exact``, the share of the exact step's bytes that is KV."""
    ctx = _life_mean(workload)
    m = cost.model
    rows = {"slab": min(slots, int(budget) // m.max_context), "exact": min(slots, int(budget // ctx))}
    out: dict[str, float] = {"budget": float(budget), "ctx": ctx}
    for pol, r in rows.items():
        if r < 1:
            raise ValueError(
                f"budget={budget:g} KV tokens holds no {pol} row (context {m.max_context}, mean {ctx:.0f})"
            )
        out[f"rows_{pol}"] = float(r)
        out[f"tput_{pol}"] = r / cost.decode_step(r, int(round(ctx)))
    out["kv_share_exact"] = _kv_share(cost, rows["exact"], ctx)
    out["gain"] = out["tput_exact"] / out["tput_slab"]
    return out


#: What :func:`kv_budget_sweep` records per budget (:func:`~batching.book.common.metrics` keys).
BUDGET_KEYS = ("throughput_tok", "preemptions", "running_peak")


def kv_budget_sweep(
    workload: Workload,
    cost: CostModel,
    budgets: Sequence[int],
    slots: int = 256,
    static_timeout: float | None = 2.0,
) -> dict[str, dict[str, np.ndarray]]:
    """Continuous batching under each KV budget, per policy, and static batching under the
    same budget (series ``static``, unless ``static_timeout`` is None): a dense batch reserves
    a slab per row, so it holds budget // max_context rows, sealed when full or after
    ``static_timeout`` s. Per series, arrays over ``budget`` of :data:`BUDGET_KEYS`; ``slots``
    is high so that memory, not slots, is the limit."""
    runs: list[tuple[str, str, dict[str, Any]]] = [
        (pol, "continuous", {"slots": slots, "kv_policy": pol}) for pol in POLICIES
    ]
    if static_timeout is not None:
        runs.append(("static", "static", {"max_wait": static_timeout}))
    ctx = cost.model.max_context
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, sched, opts in runs:
        ms = []
        for b in budgets:
            if sched == "static":
                opts = {**opts, "slots": min(slots, int(b) // ctx)}
            ms.append(run_metrics(simulate(workload, cost, sched, kv_tokens=int(b), **opts)))
        out[name] = {"budget": np.asarray(budgets, dtype=float), **columns(ms, BUDGET_KEYS)}
    return out


def budget_numbers(sweep: Mapping[str, Mapping[str, np.ndarray]], budget: int) -> dict[str, float]:
    """A :func:`kv_budget_sweep` at one budget: ``<series>_throughput_tok``, ``gain`` (exact over
    slab) and, with a static series, ``slab_kept`` (:func:`gain_kept` of each policy's gain over
    static; absent where exact reservations gained nothing)."""
    out: dict[str, float] = {"budget": float(budget)}
    for name, d in sweep.items():
        out[f"{name}_throughput_tok"] = at(d, "budget", budget)["throughput_tok"]
    out["gain"] = out["exact_throughput_tok"] / out["slab_throughput_tok"]
    if "static" in sweep:
        slab, exact = (out[f"{pol}_throughput_tok"] / out["static_throughput_tok"] for pol in POLICIES)
        if exact > 1:
            out["slab_kept"] = gain_kept(slab, exact)
    return out


def gain_kept(slab_gain: float, exact_gain: float) -> float:
    """The share of continuous batching's throughput gain over static batching with exact
    reservations (``exact_gain``) that slab reservations keep: (slab_gain - 1) / (exact_gain - 1)."""
    if not exact_gain > 1:
        raise ValueError(f"exact_gain={exact_gain}: no gain over static batching to keep a share of")
    return (slab_gain - 1) / (exact_gain - 1)


def slab_growth(
    sweep: Mapping[str, Mapping[str, np.ndarray]], cost: RooflineCost, workload: Workload
) -> dict[str, float]:
    """Why slab throughput grows less than the budget between the sweep's two largest budgets:
    ``budget_ratio``, ``tput_ratio``, the peak running rows at each (``rows_lo``, ``rows_hi``),
    the roofline decode step at those rows with every row at the mean length over a request's
    life ``ctx`` (``step_lo_ms``, ``step_hi_ms``), and the KV share of the larger step
    (``kv_share_hi``)."""
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


#: The measured page's table of the real-model runs: (label, metrics key, format).
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

#: The KV page's short table of the same runs.
REAL_KV_PAGE_ROWS = tuple(r for r in REAL_KV_ROWS if r[1] in ("running_peak", "throughput_tok"))


def real_kv_configs(budget: int, max_context: int, slots: int) -> dict[str, dict[str, Any]]:
    """Three ways to spend a KV budget of ``budget`` tokens: ``static``, one dense batch of
    budget // max_context slab rows (sealed after 1 s); ``continuous, slab``, up to ``slots``
    requests each reserving a slab; ``continuous, exact``, up to ``slots`` requests each
    reserving what it holds (preempted when full)."""
    rows = budget // max_context
    if rows < 1:
        raise ValueError(f"budget={budget} KV tokens holds no slab of max_context={max_context}")
    kv = {"kv_capacity": int(budget)}
    return {
        "static": {"scheduler": "static", "slots": min(rows, slots), "max_wait": 1.0, **kv},
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
    """:func:`real_kv_configs` on the real model, under a budget of ``budget_slabs`` slabs of
    its context (:func:`~batching.real.session.compare_schedulers`, with the simulator beside it
    where this machine has a profile), plus ``budget``, ``max_context`` and ``slots``. The
    runner holds a slab per slot; the budget is the schedulers' KV accounting, as in the
    simulator."""
    # The real engine imports torch: loaded only when a page measures (the pages import without it).
    from ..real.session import compare_schedulers, default_model

    name = default_model(model, device)
    ctx = get_model(name).max_context
    budget = budget_slabs * ctx
    rs = compare_schedulers(
        workload,
        real_kv_configs(budget, ctx, slots),
        model=name,
        device=device,
        threads=threads,
        profile=profile,
    )
    return {**rs, "budget": budget, "max_context": ctx, "slots": slots}


def slab_verdict(slab_kept: float) -> Claim:
    """The claim "one max-length slab per slot gives back most of batching's gain", on
    :func:`gain_kept`'s share: HOLDS under half (a negative share, slabs slower than static,
    gives back all of it), PARTLY under 80%, else DOES_NOT_HOLD."""
    if math.isnan(slab_kept):
        raise ValueError("slab_kept=nan: exact reservations gained nothing over static batching to share")
    return Claim.HOLDS if slab_kept < 0.5 else Claim.PARTLY if slab_kept < 0.8 else Claim.DOES_NOT_HOLD


def real_kv_numbers(rs: Mapping[str, Any]) -> dict[str, float]:
    """What :func:`real_kv` measured: throughput ratios between the runs, ``slab_kept``
    (:func:`gain_kept`; NaN where exact gained nothing over static), ``exact_slot_bound``
    (1.0 where exact ran every slot at once: slots, not memory, were the limit) and, with a
    simulation beside the runs, ``<run>_sim_tput_err`` (simulated over measured throughput, - 1)."""
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
    if "sim" in rs:
        for k, name in runs.items():
            out[f"{k}_sim_tput_err"] = (
                rs["sim"][name]["throughput_tok"] / rs["real"][name]["throughput_tok"] - 1
            )
    return out


def below_roofline(measured: Sequence[Mapping[str, float]], roofline: Sequence[Mapping[str, float]]) -> bool:
    """Whether every simulated exact-over-slab ``gain`` (:func:`budget_numbers`) stays below the
    roofline's at the same budget (:func:`policy_roofline`), pairwise."""
    return all(m["gain"] < r["gain"] for m, r in zip(measured, roofline, strict=True))


class Kept(str, enum.Enum):
    """What the live runs say slabs keep of the exact policy's gain (:func:`real_kv_numbers`'s
    ``slab_kept``): no gain to share, all of it, or a share (the notebook quotes it)."""

    NO_GAIN = "no-gain"
    ALL = "all"
    SHARE = "share"


def kept_kind(slab_kept: float) -> Kept:
    if math.isnan(slab_kept):
        return Kept.NO_GAIN
    return Kept.ALL if slab_kept >= 1 else Kept.SHARE
