"""7.1 Static batching: the cost of padding, the timelines of a static batch, its utilization
against batch size, and what a timeout (dynamic batching) changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

from ..costs import RooflineCost
from ..engine import RunResult
from ..results import load_average, machine_load
from ..workload import Workload
from .capacity import queue_growth
from .common import _OCC_KIND, Versus, columns, metrics, simulate, step_work, versus


def _check_pair(short: Any, long: Any) -> None:
    if isinstance(short, bool) or not (isinstance(short, int) and isinstance(long, int) and 0 < short < long):
        raise ValueError(f"short={short!r}, long={long!r}: need integers 0 < short < long")


def padding_cost(cost: RooflineCost, short: int = 50, long: int = 4000) -> dict[str, Any]:
    """7.1 (a): roofline prefill times (s) of a ``short`` prompt alone and padded to a ``long``
    one, of the pair packed and padded, their ratios, and the bound of the short and the
    padded prefill."""
    _check_pair(short, long)
    t = lambda *prompts: cost.step_time(step_work(prompts))
    out = {
        "short": float(short),
        "long": float(long),
        "token_ratio": long / short,
        "t_short": t(short),
        "t_short_padded": t(long),
        "t_batch_unpadded": t(short, long),
        "t_batch_padded": t(long, long),
    }
    out["time_ratio_short"] = out["t_short_padded"] / out["t_short"]
    bound = lambda p: cost.terms(step_work((p,)))["bound"]
    return {**out, "bound_short": bound(short), "bound_padded": bound(long)}


#: The long prompt of :func:`real_padding` per device type: as long as cpu-s's 2,048-token
#: context allows on a CPU, the page's 4,000 on a GPU.
REAL_PADDING_LONG: dict[str, int] = {"cpu": 2000, "cuda": 4000}


def real_padding(
    model: str | None = None,
    device: str = "auto",
    short: int = 50,
    long: int | None = None,
    reps: int = 3,
    threads: int | None = None,
) -> dict[str, Any]:
    """7.1 (a), measured: what padding a ``short`` prompt to a ``long`` one costs on the real model.

    Four workloads, each request wanting one token so that a run is its prefill step: the
    pair under static batching (B = 2: the short prompt padded to ``long`` and both
    prefilled in one step), the pair under continuous batching (the two prompts packed,
    ``short + long`` tokens, no padding), and each prompt alone. ``reps`` rounds, each
    running all four in turn (drift hits them alike); the medians are returned, in ms:
    ``padded_ms``, ``packed_ms``, ``short_ms``, ``long_ms``. A prompt padded to ``long``
    tokens costs what a ``long``-token prefill costs, so ``time_ratio_short`` =
    long_ms / short_ms is what padding multiplies the short prompt's prefill by (the
    positions multiply by ``token_ratio``); ``time_ratio_batch`` = padded_ms / packed_ms is
    what the batch pays, against ``positions_ratio`` = 2 long / (short + long) in
    positions. Also ``pad_tokens`` and ``padding_fraction`` from the static run's step log,
    ``executor`` (what ran), ``model``, and ``load``/``cpus``/``busy``
    (:func:`~batching.results.machine_load` around the runs: a busy machine inflates short
    steps most). ``model`` None and ``long`` None take the device's defaults
    (:data:`~batching.book.checks.REAL_MODELS`, :data:`REAL_PADDING_LONG`).
    """
    from .checks import real_kind, real_runner, serve_real

    long = REAL_PADDING_LONG[real_kind(device)] if long is None else long
    _check_pair(short, long)
    if not (isinstance(reps, int) and reps >= 1):
        raise ValueError(f"reps={reps!r}: must be an integer >= 1")
    runner = real_runner(model, device, slots=2, max_len=long + 1, threads=threads)
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
            res = serve_real(runner, w, sched, **opts)
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


def scaling(time_ratio: float, positions_ratio: float, tol: float = 0.25) -> Versus:
    """7.1 (a), the verdict on padding: how a step that computed ``positions_ratio`` times the
    positions of another grew in time (``time_ratio`` times), as the :class:`~.common.Versus`
    of its time per position within ``tol``. SAME: padding costs in full. LESS: the shorter
    step was bound by something other than its arithmetic (weight reads on a GPU), so padding
    it costs less than its positions. MORE: attention's quadratic part, cache effects."""
    if not positions_ratio > 0:
        raise ValueError(f"positions_ratio={positions_ratio}: must be positive")
    return versus(time_ratio / positions_ratio, tol)


def per_position_ms(rp: Mapping[str, Any]) -> dict[str, float]:
    """7.1 (a), measured: milliseconds per computed position of each run of :func:`real_padding`
    (``short``, ``long``, ``packed``, ``padded``): what the measured page compares."""
    s, lg = float(rp["short"]), float(rp["long"])
    return {
        "short": rp["short_ms"] / s,
        "long": rp["long_ms"] / lg,
        "packed": rp["packed_ms"] / (s + lg),
        "padded": rp["padded_ms"] / (2 * lg),
    }


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
            if (last.rid, last.kind) == (rid, kind) and math.isclose(
                last.t1, t0, rel_tol=1e-12, abs_tol=1e-12
            ):
                segs[-1] = last._replace(t1=t1, steps=last.steps + steps)
                return
        segs.append(Segment(slot, rid, kind, t0, t1, steps))

    prev_end = C["t"][0] if len(log) else 0.0
    for i in range(len(log)):
        t0, dur, n = C["t"][i], C["dur"][i], int(C["n"][i])
        t1 = t0 + dur
        if t0 > prev_end and not math.isclose(t0, prev_end, rel_tol=1e-12, abs_tol=1e-12):
            for s in range(nslots):  # the engine waited for an arrival: every slot idle
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


def static_batch_sizes(
    prompts: Sequence[int] | np.ndarray, outputs: Sequence[int] | np.ndarray, batch: int, max_context: int
) -> list[int]:
    """7.1 (c): sizes of the consecutive batches the static scheduler forms from a queue
    that holds every request at once.

    A batch closes when it holds ``batch`` requests, or early, before a request that cannot
    be padded beside it: every row of a dense batch holds the longest prompt plus the
    longest output, which must fit ``max_context`` (``DenseBatchScheduler.fits_beside``).
    """
    p, o = np.asarray(prompts, dtype=np.int64), np.asarray(outputs, dtype=np.int64)
    if batch < 1 or p.shape != o.shape or p.size == 0:
        raise ValueError(
            f"batch={batch}, {p.size} prompts, {o.size} outputs: need batch >= 1 and "
            "as many prompts as outputs, at least one"
        )
    sizes: list[int] = []
    n, longest, most = 0, 0, 0
    for pi, oi in zip(p.tolist(), o.tolist()):
        if n and max(longest, pi) + max(most, oi) > max_context:
            sizes.append(n)
            n, longest, most = 0, 0, 0
        n, longest, most = n + 1, max(longest, pi), max(most, oi)
        if n == batch:
            sizes.append(n)
            n, longest, most = 0, 0, 0
    return sizes + ([n] if n else [])


def analytic_static_utilization(
    outputs: Sequence[int] | np.ndarray, batch: int, sizes: Sequence[int] | None = None
) -> float:
    """7.1 (c): slot utilization of static batches of consecutive requests.

    Batch j holds the next ``sizes[j]`` requests (default: ``batch`` each, full batches)
    and runs for its longest output; every member emits its own tokens: utilization =
    sum(outputs) / (B x sum_j max(outputs in batch j)). A batch of fewer members (the last
    one, or one closed early: :func:`static_batch_sizes`) still occupies B slots.
    """
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


def static_batch_sweep(workload: Workload, cost: Any, batch_sizes: Sequence[int]) -> dict[str, np.ndarray]:
    """7.1 (c): static batching at every batch size, every request queued at t=0 (so every
    batch is full), KV unlimited. Arrays over ``batch``: ``slot_util``, ``padding_fraction``,
    ``analytic`` (the formula over full batches) and ``analytic_formed`` (over the batches the
    scheduler forms, some closed early at the model's context: :func:`static_batch_sizes`)."""
    w = Workload.from_arrays(
        np.zeros(len(workload)),
        workload.prompt_lens,
        workload.output_lens,
        name=workload.name,
        info=workload.info,
    )
    rows = []
    for b in map(int, batch_sizes):
        m = metrics(simulate(w, cost, "static", slots=b, kv_tokens=None, timeout=0.0))
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


def sweep_agreement(sweep: Mapping[str, np.ndarray], tol: float = 1e-9) -> dict[str, float | bool]:
    """7.1 (c): ``equal`` (the simulated slot utilization of :func:`static_batch_sweep` equals the
    formula of full batches at every B, within ``tol``), ``max_gap`` (the largest difference, a
    fraction) and ``formed_equal`` (it equals the formula over the batches actually formed)."""
    gap = np.abs(sweep["slot_util"] - sweep["analytic"])
    return {
        "equal": bool(np.all(gap <= tol)),
        "max_gap": float(gap.max()),
        "formed_equal": bool(np.all(np.abs(sweep["slot_util"] - sweep["analytic_formed"]) <= tol)),
    }


def wait_sweep(
    workload: Workload,
    cost: Any,
    waits: Sequence[float],
    slots: int = 32,
    schedulers: Sequence[str] = ("static", "dynamic"),
) -> dict[str, dict[str, np.ndarray]]:
    """7.1 (d): the collection timeout trade-off of static (``timeout``) and dynamic
    (``max_wait``) batching. Per scheduler, arrays over ``wait``: ``queue_mean``,
    ``slot_util``, ``e2e_p99``, ``ttft_p99``, ``throughput_req``, ``padding_fraction``,
    ``mean_batch`` (requests per dispatched batch) and ``stable`` (1.0 where the queue did not
    grow over the replay, :func:`~batching.book.capacity.queue_growth`; 0.0 where it did: its
    queueing delay is then no value, only a lower bound). KV memory not limited."""
    res: dict[str, dict[str, np.ndarray]] = {}
    keys = ("queue_mean", "slot_util", "e2e_p99", "ttft_p99", "throughput_req", "padding_fraction")
    for name in schedulers:
        rows = []
        for T in waits:
            r = simulate(workload, cost, name, slots=slots, kv_tokens=None, timeout=float(T))
            m = metrics(r)
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


def wait_summary(
    sweep: Mapping[str, Mapping[str, np.ndarray]],
    rate: float,
    batch: int,
    ceiling: float | None = None,
    rel_tol: float = 0.10,
) -> dict[str, float | bool]:
    """7.1 (d): the numbers and verdicts the timeout section quotes from a :func:`wait_sweep`
    of ``static`` and ``dynamic``.

    ``fill_s``: B / rate, the timeout a static batch needs to fill at that rate.
    ``converge_wait``: the smallest timeout from which on the two agree within ``rel_tol``
    in both mean queueing delay and slot utilization (-1 if they never do), with
    ``converge_i`` its index (-1 likewise). ``ahead``: at the shortest timeout dynamic
    batching queues less and uses its slots at least as well as static. ``best_util``: the
    highest slot utilization of any point; with a ``ceiling`` (the full-batch utilization),
    ``below_ceiling``: no point of either sweep gets above it (to within ``1e-9``).
    """
    if not (rate > 0 and batch >= 1):
        raise ValueError(f"rate={rate}, batch={batch}: need a positive rate and batch >= 1")
    st, dy = sweep["static"], sweep["dynamic"]
    close = np.ones(len(st["wait"]), dtype=bool)
    for key in ("queue_mean", "slot_util"):
        a, b = np.asarray(st[key], dtype=float), np.asarray(dy[key], dtype=float)
        close &= np.abs(a - b) <= rel_tol * np.maximum(np.abs(a), np.abs(b))
    # From some timeout on: every later point must agree too.
    tail = np.flip(np.logical_and.accumulate(np.flip(close)))
    idx = int(np.argmax(tail)) if tail.any() else -1
    best = max(float(np.max(st["slot_util"])), float(np.max(dy["slot_util"])))
    out: dict[str, float | bool] = {
        "fill_s": batch / rate,
        "converge_i": float(idx),
        "converge_wait": float(st["wait"][idx]) if idx >= 0 else -1.0,
        "rel_tol": rel_tol,
        "ahead": bool(dy["queue_mean"][0] < st["queue_mean"][0] and dy["slot_util"][0] >= st["slot_util"][0]),
        "best_util": best,
    }
    if ceiling is not None:
        out["below_ceiling"] = bool(best <= ceiling + 1e-9)
    return out


def first_finisher_summary(result: RunResult) -> dict[str, float]:
    """7.1 (b): when the first request finished (``first_finish_s``) and the share of the run's
    time after it (``after_first_fraction``)."""
    fins = [float(r.finish_time) for r in result.requests if r.finish_time is not None]
    if len(fins) != len(result.requests):
        raise ValueError("first_finisher_summary() needs a run in which every request finished")
    start = min(r.arrival for r in result.requests)
    return {
        "first_finish_s": min(fins) - start,
        "after_first_fraction": (max(fins) - min(fins)) / (max(fins) - start),
    }
