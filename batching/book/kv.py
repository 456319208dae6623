"""What 7.2 sets up: the KV cache as the binding limit, slab against exact reservation, and KV
budget sweeps.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

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
    """What chapter 7 sets up: continuous batching under each KV policy, every step logged.

    Returns ``series`` ({policy: :func:`kv_over_time`}) and ``numbers``: per policy
    (prefixed ``<policy>_``) the :func:`metrics` keys ``running_peak``, ``kv_reserved_mean``,
    ``kv_used_mean``, ``kv_reserved_peak``, ``throughput_tok``, ``e2e_p99``, ``ttft_p99``,
    ``queue_mean``, ``preemptions``, plus ``unused`` = 1 - used / reserved (time-weighted) and
    ``peak_share`` = kv_reserved_peak / the KV capacity the runs had.
    """
    series: dict[str, Any] = {}
    numbers: dict[str, float] = {}
    keys = (
        "running_peak",
        "kv_reserved_mean",
        "kv_used_mean",
        "kv_reserved_peak",
        "throughput_tok",
        "e2e_p99",
        "ttft_p99",
        "queue_mean",
        "preemptions",
    )
    for pol in policies:
        r = simulate(
            workload, cost, "continuous", slots=slots, kv_tokens=kv_tokens, kv_policy=pol, fast=False
        )
        m = metrics(r)
        series[pol] = kv_over_time(r)
        numbers.update({f"{pol}_{k}": m[k] for k in keys})
        numbers[f"{pol}_unused"] = 1.0 - m["kv_used_mean"] / m["kv_reserved_mean"]
        capacity = cost.kv_capacity() if kv_tokens == "device" else float(kv_tokens)
        numbers[f"{pol}_peak_share"] = m["kv_reserved_peak"] / capacity
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
    return {
        "capacity": float(C),
        "kv_bytes_per_token": float(cost.model.kv_bytes_per_token),
        "max_context": float(ctx),
        "slab": float(C // ctx),
        "exact_final": float(C / L.mean()),
        "exact_avg": float(C / life.mean()),
        "mean_final": float(L.mean()),
        "p50_final": float(np.percentile(L, 50)),
        "p99_final": float(np.percentile(L, 99)),
        "slab_waste": float(1 - L.mean() / ctx),
    }


def kv_budget_sweep(
    workload: Workload,
    cost: Any,
    budgets: Sequence[int],
    slots: int = 256,
    policies: Sequence[str] = ("slab", "exact"),
    scheduler: str = "continuous",
    static_timeout: float | None = 2.0,
) -> dict[str, dict[str, np.ndarray]]:
    """What chapter 7 sets up: continuous batching under a KV budget, per reservation policy,
    and static batching under the same budget (key ``static``, unless ``static_timeout`` is
    None): a dense batch reserves a slab per row, so it holds budget // max_context rows
    (at most ``slots``), sealed when full or after ``static_timeout`` seconds.

    Per series, arrays over ``budget`` (KV tokens): ``throughput_tok``, ``e2e_p99``,
    ``ttft_p99``, ``preemptions``, ``running_peak``, ``kv_used_mean``, ``kv_reserved_mean``,
    ``slot_util``, ``steps``. ``slots`` is set high so that memory, not slots, is the limit.
    """
    keys = (
        "throughput_tok",
        "e2e_p99",
        "ttft_p99",
        "preemptions",
        "running_peak",
        "kv_used_mean",
        "kv_reserved_mean",
        "slot_util",
        "steps",
    )
    runs: list[tuple[str, str, dict[str, Any]]] = [
        (pol, scheduler, {"slots": slots, "kv_policy": pol}) for pol in policies
    ]
    if static_timeout is not None:
        runs.append(("static", "static", {"timeout": static_timeout}))
    ctx = cost.model.max_context
    out: dict[str, dict[str, np.ndarray]] = {}
    for name, sched, opts in runs:
        acc: dict[str, list[float]] = {k: [] for k in keys}
        for b in budgets:
            if sched == "static":
                opts = {**opts, "slots": min(slots, int(b) // ctx)}
            m = metrics(simulate(workload, cost, sched, kv_tokens=int(b), **opts))
            for k in keys:
                acc[k].append(m[k])
        out[name] = {"budget": np.asarray(budgets, dtype=float), **{k: np.asarray(v) for k, v in acc.items()}}
    return out


def budget_numbers(sweep: Mapping[str, Mapping[str, np.ndarray]], budget: int) -> dict[str, float]:
    """What chapter 7 sets up: the :func:`kv_budget_sweep` numbers at one budget, prefixed
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
    """What chapter 7 sets up: the share of continuous batching's throughput gain over static
    batching (``exact_gain``, with exact reservations) that slab reservations keep
    (``slab_gain``): (slab_gain - 1) / (exact_gain - 1). Simulated (:func:`budget_numbers`)
    and measured (:func:`real_kv_text`) alike."""
    if not exact_gain > 1:
        raise ValueError(f"exact_gain={exact_gain}: no gain over static batching to keep a share of")
    return (slab_gain - 1) / (exact_gain - 1)


def slab_growth(
    sweep: Mapping[str, Mapping[str, np.ndarray]], cost: Any, workload: Workload
) -> dict[str, float]:
    """What chapter 7 sets up (exercise 3): how slab throughput grows between the sweep's two
    largest budgets, and why less than the budget: ``budget_ratio``, ``tput_ratio``, the
    peak running rows at each (``rows_lo``, ``rows_hi``), and the roofline decode step at
    those rows with every row at the workload's mean length over a request's life
    (``step_lo_ms``, ``step_hi_ms``) and the share of the larger step spent reading KV
    rather than weights (``kv_share_hi``)."""
    d = sweep["slab"]
    if len(d["budget"]) < 2:
        raise ValueError("slab_growth needs a sweep of at least two budgets")
    i, j = -2, -1
    ctx = int(round(float((workload.prompt_lens + workload.output_lens / 2).mean())))
    lo, hi = int(d["running_peak"][i]), int(d["running_peak"][j])
    m = cost.model
    kv_read = hi * ctx * m.kv_bytes_per_token
    return {
        "budget_ratio": float(d["budget"][j] / d["budget"][i]),
        "tput_ratio": float(d["throughput_tok"][j] / d["throughput_tok"][i]),
        "rows_lo": float(lo),
        "rows_hi": float(hi),
        "ctx": float(ctx),
        "step_lo_ms": float(cost.decode_step(lo, ctx) * 1e3),
        "step_hi_ms": float(cost.decode_step(hi, ctx) * 1e3),
        "kv_share_hi": float(kv_read / (kv_read + m.weight_read_bytes)),
    }


# ------------------------------------------------------------------ measured
#: What the real-model table of the closing section shows, per run: (label, metrics key, format).
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


def real_kv_configs(
    budget: int, max_context: int, slots: int, static_timeout: float = 1.0
) -> dict[str, dict[str, Any]]:
    """What chapter 7 sets up, measured: the three ways to spend one KV budget of ``budget``
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
    """What chapter 7 sets up, measured on the real model: ``workload`` served under a KV
    budget of ``budget_slabs`` slabs of the model's context by :func:`real_kv_configs`'s
    three schedules (:func:`~batching.experiments.checks.real_schedulers`: one model for all
    runs, and the simulator beside them when a profile of this machine is committed).

    The runner holds a slab for each of its ``slots`` (it has no paged cache: chapter 8);
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


def real_kv_text(rs: Mapping[str, Any]) -> str:
    """What chapter 7 sets up: what :func:`real_kv` measured, and the simulator beside it (MyST)."""
    st, sl, ex = (rs["real"][k] for k in ("static", "continuous, slab", "continuous, exact"))
    unused = 1 - sl["kv_used_mean"] / sl["kv_reserved_mean"]
    gain_slab, gain_exact = (
        sl["throughput_tok"] / st["throughput_tok"],
        ex["throughput_tok"] / st["throughput_tok"],
    )
    limit = (
        f"every one of the {rs['slots']} slots: memory was no longer the limit"
        if ex["running_peak"] >= rs["slots"]
        else f"as many as the memory held, {ex['kv_reserved_peak']:,.0f} of {rs['budget']:,} tokens at the peak"
    )
    text = (
        f"With the same {rs['budget']:,} KV tokens ({rs['budget'] // rs['max_context']} slabs of "
        f"{rs['max_context']:,}), static batching ran {st['running_peak']:.0f} requests at a time and delivered "
        f"{st['throughput_tok']:.0f} output tokens/s. Continuous batching with slab reservations was held to "
        f"{sl['running_peak']:.0f} at a time as well, and {unused:.0%} of what it reserved stayed empty; "
        f"refilling freed slots at once still gave {gain_slab:.1f}x static's throughput. Reserving only what each "
        f"request held, the same memory ran up to {ex['running_peak']:.0f} requests at once ({limit}; "
        f"{_count(ex['preemptions'], 'preemption')}) and delivered {gain_exact:.1f}x static's throughput, "
        f"{ex['throughput_tok'] / sl['throughput_tok']:.1f}x slab reservations'."
    )
    if gain_exact > 1:
        text += (
            f" Slab reservations kept {gain_kept(gain_slab, gain_exact):.0%} of continuous batching's gain "
            "over static batching."
        )
    if "sim" not in rs:
        return (
            text
            + " No profile measured on this machine is committed, so no simulation is set beside these runs."
        )
    sim = rs["sim"]
    parts = [
        f"{REAL_KV_LABELS.get(n, n)} {_signed(sim[n]['throughput_tok'] / rs['real'][n]['throughput_tok'] - 1)}"
        for n in rs["real"]
    ]
    return text + (
        " In parentheses, the simulator on this machine's profile; its throughput differs from the "
        "measured one by " + "; ".join(parts) + "."
    )


#: How :func:`real_kv_text` names the three runs inside a sentence.
REAL_KV_LABELS: dict[str, str] = {
    "continuous, slab": "continuous with slab reservations",
    "continuous, exact": "continuous with exact reservations",
}


def _count(n: float, noun: str) -> str:
    """ "no preemptions", "1 preemption", "3 preemptions" (the closing section's sentences)."""
    k = int(round(n))
    return f"no {noun}s" if k == 0 else f"{k:,} {noun}" + ("" if k == 1 else "s")


def _signed(x: float) -> str:
    """A relative difference for a sentence: "within 1%" when it rounds to zero, else "+12%"."""
    return "within 1%" if abs(x) < 0.005 else f"{x:+.0%}"
