"""Static batching: what padding costs, the timeline of a static batch, its slot
utilization against batch size, and what a timeout (dynamic batching) changes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..costs import RooflineCost
from ..costs.base import CostModel
from ..costs.models import get_model
from ..engine import RunResult
from ..metrics import queue_growth, run_metrics
from ..plan import StepWork
from ..request import Request
from ..results import load_average, machine_load
from ..schedulers import StaticScheduler
from ..simulate import simulate
from ..workloads import Workload
from .common import Claim, Versus, columns, versus


def _check_pair(short: Any, long: Any) -> None:
    if isinstance(short, bool) or not (isinstance(short, int) and isinstance(long, int) and 0 < short < long):
        raise ValueError(f"short={short!r}, long={long!r}: need integers 0 < short < long")


def padding_cost(cost: RooflineCost, short: int = 50, long: int = 4000) -> dict[str, Any]:
    """Roofline prefill times (s) of a ``short`` prompt alone and padded to a ``long`` one and
    of the pair packed and padded, the short prompt's padded over unpadded time, and what
    bounds the short and the padded prefill (``"memory"`` or ``"compute"``)."""
    _check_pair(short, long)
    t = lambda *prompts: cost.step_time(StepWork.fresh(prompts))
    out = {
        "short": float(short),
        "long": float(long),
        "t_short": t(short),
        "t_short_padded": t(long),
        "t_batch_unpadded": t(short, long),
        "t_batch_padded": t(long, long),
    }
    out["time_ratio_short"] = out["t_short_padded"] / out["t_short"]
    bound = lambda p: cost.terms(StepWork.fresh((p,)))["bound"]
    return {**out, "bound_short": bound(short), "bound_padded": bound(long)}


#: The long prompt of :func:`real_padding` per device type: what cpu-s's 2,048-token context
#: allows on a CPU (the page says so, with :func:`real_context`), the page's 4,000 on a GPU.
REAL_PADDING_LONG: dict[str, int] = {"cpu": 2000, "cuda": 4000}


def real_padding(
    model: str | None = None,
    device: str = "auto",
    short: int = 50,
    long: int | None = None,
    reps: int = 3,
    threads: int | None = None,
) -> dict[str, Any]:
    """What padding a ``short`` prompt to a ``long`` one costs on the real model.

    One-token requests, so a run is its prefill step: the pair padded (static, B = 2), the
    pair packed (continuous), and each prompt alone; medians (ms) of ``reps`` rounds that
    run all four in turn, so drift hits them alike: ``padded_ms``, ``packed_ms``,
    ``short_ms``, ``long_ms``. Padded, the short prompt costs a ``long`` prefill:
    ``time_ratio_short`` = long_ms / short_ms against ``token_ratio`` in positions;
    ``time_ratio_batch`` = padded_ms / packed_ms against ``positions_ratio``. Also the static
    run's ``pad_tokens`` and ``padding_fraction``, ``executor``, ``model`` and
    :func:`~batching.results.machine_load` around the runs (a busy machine inflates short
    steps most). ``model`` and ``long`` None take the device's defaults.
    """
    # The real engine imports torch: loaded only when a page measures (the pages import without it).
    from ..real.session import device_kind, serve, session

    long = REAL_PADDING_LONG[device_kind(device)] if long is None else long
    _check_pair(short, long)
    if not (isinstance(reps, int) and reps >= 1):
        raise ValueError(f"reps={reps!r}: must be an integer >= 1")
    runner = session(model, device, slots=2, max_len=long + 1, threads=threads)
    pair = Workload.from_arrays([0.0, 0.0], [short, long], [1, 1], name="padding-pair, one token each")
    alone = {
        n: Workload.from_arrays([0.0], [p], [1], name=f"{n} prompt alone")
        for n, p in (("short", short), ("long", long))
    }
    runs = {
        "padded": (pair, "static", {"slots": 2}),
        "packed": (pair, "continuous", {"slots": 2}),
        "short": (alone["short"], "continuous", {"slots": 1}),
        "long": (alone["long"], "continuous", {"slots": 1}),
    }
    times: dict[str, list[float]] = {k: [] for k in runs}
    load0 = load_average()
    for _ in range(reps):
        for key, (w, sched, opts) in runs.items():
            res = serve(runner, w, sched, slots=opts["slots"])
            L = res.log.cols
            if len(L["dur"]) != 1:  # one token each: the prefill step is the whole run
                raise RuntimeError(f"{key}: expected one step, the engine ran {len(L['dur'])}")
            times[key].append(float(L["dur"][0]))
            if key == "padded":
                pad, needed = float(L["pad"][0]), float(L["prefill"][0])
                executor = res.executor
    out: dict[str, Any] = {f"{k}_ms": float(np.median(v)) * 1e3 for k, v in times.items()}
    out.update(
        short=float(short),
        long=float(long),
        token_ratio=long / short,
        pad_tokens=pad,
        positions_ratio=2 * long / (short + long),
        padding_fraction=pad / (needed + pad),
        reps=float(reps),
        time_ratio_short=out["long_ms"] / out["short_ms"],
        time_ratio_batch=out["padded_ms"] / out["packed_ms"],
        model=executor["model"],
        executor=executor,
        **machine_load(load0, load_average()),
    )
    return out


def real_context(rp: Mapping[str, Any]) -> int:
    """The context (tokens) of the model a :func:`real_padding` run used, from the registry:
    what caps its long prompt on a CPU (cpu-s: 2,048, hence 2,000 rather than 4,000)."""

    return int(get_model(str(rp["model"])).max_context)


def scaling(time_ratio: float, positions_ratio: float, tol: float = 0.25) -> Versus:
    """The :class:`~.common.Versus` of time per position, within ``tol``, of a step that
    computed ``positions_ratio`` times another's positions in ``time_ratio`` times its time.
    SAME: padding costs in full; LESS: the shorter step was bound by something else (weight
    reads on a GPU); MORE: attention's quadratic part, cache effects."""
    if not positions_ratio > 0:
        raise ValueError(f"positions_ratio={positions_ratio}: must be positive")
    return versus(time_ratio / positions_ratio, tol)


def per_position_ms(rp: Mapping[str, Any]) -> dict[str, float]:
    """Milliseconds per computed position of each run of :func:`real_padding` (``short``,
    ``long``, ``packed``, ``padded``)."""
    s, lg = float(rp["short"]), float(rp["long"])
    return {
        "short": rp["short_ms"] / s,
        "long": rp["long_ms"] / lg,
        "packed": rp["packed_ms"] / (s + lg),
        "padded": rp["padded_ms"] / (2 * lg),
    }


def static_batch_sizes(
    prompts: Sequence[int] | np.ndarray, outputs: Sequence[int] | np.ndarray, batch: int, max_context: int
) -> list[int]:
    """Sizes of the consecutive batches the static scheduler forms from a queue holding every
    request: the scheduler itself is handed every request at t = 0 and its sealed batches
    counted (a batch closes at ``batch`` requests, or early before a request that cannot be
    padded beside it: :meth:`~batching.schedulers.static.DenseBatchScheduler.fits_beside`)."""
    p, o = np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
    if batch < 1 or p.shape != o.shape or p.size == 0:
        raise ValueError(
            f"batch={batch}, {p.size} prompts, {o.size} outputs: need batch >= 1 and "
            "as many prompts as outputs, at least one"
        )
    sched = StaticScheduler(batch, max_context)
    for rid, (pi, oi) in enumerate(zip(p.tolist(), o.tolist())):
        sched.on_arrival(Request(rid, 0.0, pi, oi))
    return [len(b) for b in sched.sealed] + ([len(sched.forming)] if sched.forming else [])


def analytic_static_utilization(
    outputs: Sequence[int] | np.ndarray, batch: int, sizes: Sequence[int] | None = None
) -> float:
    """Slot utilization of static batches of consecutive requests: sum(outputs) / (B x sum over
    batches of their longest output). Batch j holds the next ``sizes[j]`` requests (default:
    ``batch`` each); a batch of fewer still occupies B slots."""
    o = np.asarray(outputs, dtype=np.int64)
    if batch < 1 or o.size == 0:
        raise ValueError(f"batch={batch}, {o.size} outputs: need batch >= 1 and some outputs")
    if sizes is None:
        sizes = [min(batch, o.size - j) for j in range(0, o.size, batch)]
    if sum(sizes) != o.size or any(not 1 <= k <= batch for k in sizes):
        raise ValueError(
            f"sizes must be 1..{batch} each and cover the {o.size} outputs, got sum {sum(sizes)}"
        )
    ends = np.cumsum(sizes)
    maxes = [int(o[e - k : e].max()) for k, e in zip(sizes, ends.tolist())]
    return float(o.sum() / (batch * sum(maxes)))


def static_batch_sweep(
    workload: Workload, cost: CostModel, batch_sizes: Sequence[int]
) -> dict[str, np.ndarray]:
    """Static batching at each batch size, every request queued at t=0, KV unlimited. Arrays
    over ``batch``: ``slot_util``, ``padding_fraction``, ``analytic`` (the formula over full
    batches) and ``analytic_formed`` (over the batches formed: :func:`static_batch_sizes`)."""
    w = Workload.from_arrays(
        np.zeros(len(workload)),
        workload.prompt_lens,
        workload.output_lens,
        name=workload.name,
        info=workload.info,
    )
    rows = []
    for b in map(int, batch_sizes):
        m = run_metrics(simulate(w, cost, "static", slots=b, kv_tokens=None, max_wait=0.0))
        sizes = static_batch_sizes(w.prompt_lens, w.output_lens, b, cost.model.max_context)
        rows.append(
            {
                "slot_util": m["slot_util"],
                "padding_fraction": m["padding_fraction"],
                "analytic": analytic_static_utilization(w.output_lens, b),
                "analytic_formed": analytic_static_utilization(w.output_lens, b, sizes),
            }
        )
    return {"batch": np.asarray(batch_sizes, dtype=float), **columns(rows)}


def sweep_agreement(sweep: Mapping[str, np.ndarray]) -> dict[str, float | bool]:
    """Whether the simulated slot utilization of :func:`static_batch_sweep` equals the formula
    at every B (``equal``; over the batches formed: ``formed_equal``), to within 1e-9, and the
    largest gap to the full-batch formula (``max_gap``, a fraction)."""
    gap = np.abs(sweep["slot_util"] - sweep["analytic"])
    return {
        "equal": bool(np.all(gap <= 1e-9)),
        "max_gap": float(gap.max()),
        "formed_equal": bool(np.all(np.abs(sweep["slot_util"] - sweep["analytic_formed"]) <= 1e-9)),
    }


def wait_sweep(
    workload: Workload, cost: CostModel, waits: Sequence[float], slots: int = 32
) -> dict[str, dict[str, np.ndarray]]:
    """Static and dynamic batching at each timeout (s), KV unlimited. Per scheduler, arrays over
    ``wait`` of ``queue_mean``, ``slot_util``, ``e2e_p99``, ``ttft_p99``, ``throughput_req``,
    ``padding_fraction``, ``mean_batch`` (requests per batch) and ``stable`` (0.0 where the
    queue grew over the replay, :func:`~batching.metrics.queue_growth`: its delay is then
    a lower bound, not a value)."""
    res: dict[str, dict[str, np.ndarray]] = {}
    keys = ("queue_mean", "slot_util", "e2e_p99", "ttft_p99", "throughput_req", "padding_fraction")
    for name in ("static", "dynamic"):
        rows = []
        for T in waits:
            r = simulate(workload, cost, name, slots=slots, kv_tokens=None, max_wait=float(T))
            m = run_metrics(r)
            batches = sum(1 for p in r.log.cols["prefill"] if p > 0)
            rows.append(
                {
                    **{k: m[k] for k in keys},
                    "mean_batch": len(workload) / batches,
                    "stable": 1.0 - queue_growth(r)["growing"],
                }
            )
        res[name] = {"wait": np.asarray(waits, dtype=float), **columns(rows)}
    return res


#: Static and dynamic batching "agree" where both their mean queueing delay and their slot
#: utilization are within this fraction of each other (:func:`wait_summary`).
AGREE_TOL = 0.10


def wait_summary(
    sweep: Mapping[str, Mapping[str, np.ndarray]], rate: float, batch: int, ceiling: float | None = None
) -> dict[str, float | bool]:
    """The timeout section's numbers from a :func:`wait_sweep`: ``fill_s`` = B / rate, the
    timeout a static batch needs to fill; ``converge_wait``, the smallest timeout from which on
    the two schedulers agree within ``rel_tol`` (:data:`AGREE_TOL`; -1 if they never do);
    ``ahead``, dynamic batching queues less and fills its slots at least as well at the
    shortest timeout; with a ``ceiling`` (the full-batch utilization), ``below_ceiling``: no
    point of either sweep rises above it."""
    if not (rate > 0 and batch >= 1):
        raise ValueError(f"rate={rate}, batch={batch}: need a positive rate and batch >= 1")
    st, dy = sweep["static"], sweep["dynamic"]
    close = np.ones(len(st["wait"]), dtype=bool)
    for key in ("queue_mean", "slot_util"):
        a, b = np.asarray(st[key], dtype=float), np.asarray(dy[key], dtype=float)
        close &= np.abs(a - b) <= AGREE_TOL * np.maximum(np.abs(a), np.abs(b))
    # From some timeout on: every later point must agree too.
    tail = np.flip(np.logical_and.accumulate(np.flip(close)))
    idx = int(np.argmax(tail)) if tail.any() else -1
    out: dict[str, float | bool] = {
        "fill_s": batch / rate,
        "converge_wait": float(st["wait"][idx]) if idx >= 0 else -1.0,
        "rel_tol": AGREE_TOL,
        "ahead": bool(dy["queue_mean"][0] < st["queue_mean"][0] and dy["slot_util"][0] >= st["slot_util"][0]),
    }
    if ceiling is not None:
        best = max(float(np.max(st["slot_util"])), float(np.max(dy["slot_util"])))
        out["below_ceiling"] = bool(best <= ceiling + 1e-9)
    return out


def first_finisher_summary(result: RunResult) -> dict[str, float]:
    """When the first request finished (``first_finish_s``, s from the first arrival) and the
    share of the run's time after it (``after_first_fraction``)."""
    fins = [float(r.finish_time) for r in result.requests if r.finish_time is not None]
    if len(fins) != len(result.requests):
        raise ValueError("first_finisher_summary() needs a run in which every request finished")
    start = min(r.arrival for r in result.requests)
    return {
        "first_finish_s": min(fins) - start,
        "after_first_fraction": (max(fins) - min(fins)) / (max(fins) - start),
    }


#: "Most of its slots": a static batch wastes more than this share of them (:func:`slot_waste`).
MOST_WASTED = 0.5


def slot_waste(
    sweep: Mapping[str, np.ndarray], small: int = 16, large: int = 128, most: float = MOST_WASTED
) -> dict[str, Any]:
    """The claim "static batching wastes most of its slots at any useful batch size, and more
    as B grows" on a :func:`static_batch_sweep`. Waste = 1 - simulated slot utilization:
    ``waste_small`` and ``waste_large`` at B = ``small`` and ``large`` (both in the sweep);
    ``from_batch``, the smallest B of the sweep from which on every B wastes more than ``most``
    (-1.0 if the largest does not); ``verdict`` (:class:`~.common.Claim`): HOLDS where both
    waste more than ``most`` and the larger wastes more, PARTLY where only the larger wastes
    more than ``most`` (or waste does not grow), DOES_NOT_HOLD where the larger does not."""
    b = np.asarray(sweep["batch"], dtype=float)
    waste = 1.0 - np.asarray(sweep["slot_util"], dtype=float)
    if not (0 < most < 1 and small < large and small in b and large in b):
        raise ValueError(
            f"small={small}, large={large}, most={most}: need both in the sweep's B, small < large"
        )
    order = np.argsort(b)
    b, waste = b[order], waste[order]
    ws, wl = float(waste[b == small][0]), float(waste[b == large][0])
    over = waste > most
    tail = np.flip(np.logical_and.accumulate(np.flip(over)))  # every larger B wastes most too
    if wl <= most:
        verdict = Claim.DOES_NOT_HOLD
    elif ws > most and wl > ws:
        verdict = Claim.HOLDS
    else:
        verdict = Claim.PARTLY
    return {
        "waste_small": ws,
        "waste_large": wl,
        "small": float(small),
        "large": float(large),
        "most": most,
        "from_batch": float(b[int(np.argmax(tail))]) if tail.any() else -1.0,
        "verdict": verdict,
    }


def batch_durations(result: RunResult) -> np.ndarray:
    """Seconds each batch of a static or dynamic run lasted, from its prefill step's start to
    the end of the step before the next batch's prefill (or the run's last step), in order."""
    C = result.log.cols
    t, dur, pre = (np.asarray(C[k], dtype=float) for k in ("t", "dur", "prefill"))
    starts = np.flatnonzero(pre > 0)
    ends = np.r_[starts[1:], len(t)] - 1
    return t[ends] + dur[ends] - t[starts]


def tail_numbers(
    workload: Workload, cost: CostModel, slots: int = 32, max_wait: float = 0.0
) -> dict[str, float]:
    """Dynamic batching (``max_wait``) beside continuous batching with as many slots, KV
    unlimited: per scheduler (prefix ``dy_`` and ``cm_``) ``throughput_tok`` (output tokens/s),
    ``ttft_p50``, ``ttft_p99`` (s) and ``stable`` (1.0 unless the queue grew over the replay,
    :func:`~batching.metrics.queue_growth`); and dynamic batching's batches:
    ``batch_p50_s``, ``batch_p99_s``, ``batch_max_s`` (:func:`batch_durations`)."""
    out: dict[str, float] = {}
    runs: tuple[tuple[str, str, dict[str, Any]], ...] = (
        ("dy", "dynamic", {"max_wait": float(max_wait)}),
        ("cm", "continuous", {}),
    )
    for tag, name, opts in runs:
        r = simulate(workload, cost, name, slots=slots, kv_tokens=None, **opts)
        m = run_metrics(r)
        out.update({f"{tag}_{k}": m[k] for k in ("throughput_tok", "ttft_p50", "ttft_p99")})
        out[f"{tag}_stable"] = 1.0 - queue_growth(r)["growing"]
        if tag == "dy":
            d = batch_durations(r)
            out.update(
                batch_p50_s=float(np.median(d)),
                batch_p99_s=float(np.percentile(d, 99)),
                batch_max_s=float(d.max()),
            )
    return out


#: Throughputs within this fraction of each other look "the same" to a mean (:func:`tail_verdict`).
TAIL_THROUGHPUT_TOL = 0.05
#: A p99 TTFT this many times another's is "far apart" (:func:`tail_verdict`).
TAIL_FACTOR = 3.0


def tail_verdict(
    n: Mapping[str, float], tol: float = TAIL_THROUGHPUT_TOL, factor: float = TAIL_FACTOR
) -> Claim | None:
    """The claim "mean throughput looks acceptable while the tail is set by the batch's longest
    request" on :func:`tail_numbers`: HOLDS where the two throughputs are within ``tol`` and
    dynamic batching's p99 TTFT is at least ``factor`` x continuous batching's; PARTLY where
    the tails are that far apart but the throughputs are not close; DOES_NOT_HOLD where the
    tails are not; None where either queue grew over the replay (no latency to judge)."""
    if not (0 <= tol < 1 and factor > 1):
        raise ValueError(f"tol={tol}, factor={factor}: need 0 <= tol < 1 and factor > 1")
    if not (n["dy_stable"] and n["cm_stable"]):
        return None
    if n["dy_ttft_p99"] < factor * n["cm_ttft_p99"]:
        return Claim.DOES_NOT_HOLD
    same = abs(n["dy_throughput_tok"] / n["cm_throughput_tok"] - 1.0) <= tol
    return Claim.HOLDS if same else Claim.PARTLY


#: Columns of the page's table of :func:`tail_numbers` (:func:`tail_rows`).
TAIL_HEADER = ("scheduler", "output tokens/s", "p99 TTFT (s)")


def tail_rows(n: Mapping[str, float], max_wait: float = 0.0) -> list[list[str]]:
    """One row per scheduler of :func:`tail_numbers` (columns :data:`TAIL_HEADER`)."""
    rows = []
    for tag, label in (("dy", f"dynamic, max_wait {max_wait:g} s"), ("cm", "continuous")):
        rows.append(
            [
                label,
                f"{n[f'{tag}_throughput_tok']:,.0f}",
                f"{n[f'{tag}_ttft_p99']:.3g}",
            ]
        )
    return rows
