"""7.3 Chunked prefill: a long prompt arriving among running decodes, the inter-token stalls it
causes, and the chunk size's trade-off; measured, the same long prompt on the real model and
the committed profiles' mixed steps (how big a chunk must be on real kernels).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..capacity import CONFIGS, SLO_BATCH, SLO_CONTEXT, capacity_table, slos
from ..costs import RooflineCost
from ..costs.base import CostModel
from ..costs.devices import machine_of, same_machine
from ..costs.models import canonical_dtype
from ..costs.unit import UnitStep
from ..engine import RunResult, SimExecutor, run
from ..metrics import run_metrics
from ..plan import StepWork
from ..results import load_average, machine_load
from ..schedulers import make_scheduler
from ..simulate import simulate
from ..workloads import Workload
from .common import at, columns, flat, machine_label, versus


def long_prompt_among_decodes(
    running: int = 30,
    prompt: int = 4000,
    at: float = 0.5,
    running_prompt: int = 128,
    running_output: int = 400,
    output: int = 50,
) -> Workload:
    """7.3: ``running`` requests start at t=0 and decode ``running_output`` tokens; at time
    ``at`` one request with a ``prompt``-token prompt arrives (its rid is ``running``)."""
    a = np.concatenate([np.zeros(running), [at]])
    p = np.concatenate([np.full(running, running_prompt), [prompt]])
    o = np.concatenate([np.full(running, running_output), [output]])
    return Workload.from_arrays(
        a,
        p,
        o,
        name=f"{prompt}-token prompt among {running} decodes",
        info={
            "source": "book.chunked.long_prompt_among_decodes",
            "running": running,
            "prompt": prompt,
            "at": at,
        },
    )


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
    the median), split into those that ended ``steps_over_2x_before`` the newcomer's
    arrival (they carry the running requests' own prompts: under chunked prefill those too
    go through the token budget in chunks while the requests admitted first already
    decode), ``steps_over_2x_during`` its prefill (up to its first token) and
    ``steps_over_2x_after`` it; ``prefill_itl_p50_ms``, the median ITL of the steps during
    that prefill (what one chunk step costs the running requests, robust to a noisy step);
    and the newcomer's ``ttft_ms``.
    """
    s = itl_series(result, running)
    new = next(r for r in result.requests if r.rid == newcomer)
    t, itl = s["t"], s["itl"]
    _, first = np.unique(t, return_index=True)
    step_itl, step_t = itl[first], t[first]
    med = float(np.median(step_itl))
    slow = step_itl > 2 * med
    during = (step_t > new.arrival) & (step_t <= new.token_times[0])
    return {
        "itl_max_ms": float(itl.max()) * 1e3,
        "itl_p50_ms": med * 1e3,
        "stall": float(itl.max() / med),
        "steps_over_2x": float(np.sum(slow)),
        "steps_over_2x_before": float(np.sum(slow & (step_t <= new.arrival))),
        "steps_over_2x_during": float(np.sum(slow & during)),
        "steps_over_2x_after": float(np.sum(slow & (step_t > new.token_times[0]))),
        "prefill_itl_p50_ms": float(np.median(step_itl[during])) * 1e3 if during.any() else math.nan,
        "ttft_ms": float(new.token_times[0] - new.arrival) * 1e3,
    }


def stall_summary(
    runs: Mapping[str, tuple[str, RunResult]],
    running: Sequence[int],
    newcomer: int,
    since_arrival: bool = False,
) -> dict[str, Any]:
    """7.3: ``{tag: (label, result)}`` of the long-prompt workload, reduced to ``series``
    ({label: :func:`itl_series` of the running requests}), ``first_token`` ({label: the
    newcomer's first-token time, s}) and ``numbers`` (each run's :func:`spike_summary`, keys
    prefixed ``<tag>_``).

    ``since_arrival``: times in ``series`` and ``first_token`` counted from each run's own
    arrival of the newcomer. Measured runs need it: the prompt is placed by step count, so on
    a measured clock it arrives at a different second in each run, and one time axis would
    misplace all runs but one."""
    series: dict[str, Any] = {}
    first: dict[str, float] = {}
    numbers: dict[str, float] = {}
    for tag, (label, res) in runs.items():
        new = next(r for r in res.requests if r.rid == newcomer)
        zero = new.arrival if since_arrival else 0.0
        s = itl_series(res, running)
        series[label] = {**s, "t": s["t"] - zero}
        first[label] = new.token_times[0] - zero
        numbers.update(flat(tag, spike_summary(res, running, newcomer)))
    return {"series": series, "first_token": first, "numbers": numbers}


def stall_runs(
    workload: Workload,
    cost: CostModel,
    configs: Mapping[str, tuple[str, str, Mapping[str, Any]]],
    running: Sequence[int],
    newcomer: int,
    slots: int = 32,
) -> dict[str, Any]:
    """7.3: simulate the long-prompt workload under each ``{tag: (label, scheduler, options)}``;
    returns :func:`stall_summary`."""
    runs = {
        tag: (label, simulate(workload, cost, sched, slots=slots, **opts))
        for tag, (label, sched, opts) in configs.items()
    }
    return stall_summary(runs, running, newcomer)


def stall_configs(chunk: int, slots: int) -> dict[str, tuple[str, str, dict[str, Any]]]:
    """7.3: the three ways of serving the long prompt that the page compares, as
    ``{tag: (label, scheduler, options)}``: mixed and separate prefill under continuous
    batching, and chunked prefill with ``chunk``-token chunks (budget chunk + slots)."""
    return {
        "mix": ("continuous, mixed prefill", "continuous", {}),
        "sep": ("continuous, separate prefill", "continuous", {"prefill_mode": "separate"}),
        "chk": (
            f"chunked, {chunk}-token chunks",
            "chunked",
            {"token_budget": chunk + slots, "chunk_size": chunk},
        ),
    }


def stall_numbers(
    cost: RooflineCost,
    chunk: int,
    prompt: int,
    decodes: int = 30,
    ctx: int = 300,
    reference: Sequence[int] = (),
) -> dict[str, float]:
    """7.3: roofline times (ms) of a decode-only step of ``decodes`` rows, of the same step
    carrying a ``chunk``-token chunk, and carrying a whole ``prompt``; ``stall`` = the last
    over the first, ``chunks`` = how many chunks the prompt takes. With ``reference``
    chunk sizes, ``chunk_share`` = the chunk's prefill throughput over the best of them.

    The long step's derivation: ``tok_gflop`` (the layers' matrices per prompt token: the LM
    head runs for decode rows only), ``attn_tflop`` (causal attention over the prompt),
    ``long_tflop`` (the whole step) and ``overhead_ms`` (what the roofline adds per step)."""
    d = chunk_step_times(cost, [chunk, prompt], decodes=decodes, ctx=ctx)
    m = cost.model
    long_flops = m.flops(StepWork.fresh([prompt], decodes, ctx))
    out = {
        "decode_ms": d["decode_s"] * 1e3,
        "chunk_ms": float(d["step_s"][0]) * 1e3,
        "long_ms": float(d["step_s"][1]) * 1e3,
        "stall": float(d["step_s"][1] / d["decode_s"]),
        "chunks": float(math.ceil(prompt / chunk)),
        "tok_gflop": 2 * m.layers * m.layer_matmul_params / 1e9,
        "attn_tflop": m.attn_flops_per_pair * prompt * (prompt + 1) / 2 / 1e12,
        "long_tflop": long_flops / 1e12,
        "overhead_ms": float(cost.device.step_overhead_s) * 1e3,
    }
    if reference:
        out["chunk_share"] = _prefill_share(cost, chunk, reference, decodes, ctx)
    return out


def chunk_step_times(
    cost: RooflineCost, chunks: Sequence[int], decodes: int = 30, ctx: int = 256
) -> dict[str, Any]:
    """7.3: roofline time of one step carrying ``decodes`` running decodes (``ctx`` KV tokens
    each) plus one fresh prefill chunk of each size, and of the decode-only step.

    Returns ``chunk``, ``step_s`` (arrays), ``decode_s``, ``prefill_tps`` (chunk tokens per
    second of step time, array) and ``bstar``.
    """
    ch = np.asarray(chunks, dtype=float)
    steps = np.array([_step_s(cost, int(c), decodes, ctx) for c in chunks])
    return {
        "chunk": ch,
        "step_s": steps,
        "decode_s": _step_s(cost, 0, decodes, ctx),
        "prefill_tps": ch / steps,
        "bstar": float(cost.bstar()),
    }


def _step_s(cost: CostModel, chunk: int, decodes: int, ctx: int) -> float:
    """Roofline time of one step: a fresh ``chunk``-token prefill chunk (none if 0) beside
    ``decodes`` decodes of ``ctx`` KV tokens each."""
    return float(cost.step_time(StepWork.fresh([chunk] if chunk else [], decodes, ctx)))


def _prefill_share(cost: RooflineCost, chunk: int, reference: Sequence[int], decodes: int, ctx: int) -> float:
    """A chunk's prefill throughput (tokens per second of step) over the best of ``reference``
    chunk sizes and itself, on the roofline."""
    tps = chunk_step_times(cost, [chunk, *reference], decodes=decodes, ctx=ctx)["prefill_tps"]
    return float(tps[0] / tps.max())


def chunk_within(cost: CostModel, limit_s: float, decodes: int = 30, ctx: int = 300) -> int:
    """The largest prefill chunk whose step, beside ``decodes`` decodes of ``ctx`` KV tokens,
    takes at most ``limit_s`` on the roofline (0 if even a 1-token chunk's step exceeds it)."""
    if _step_s(cost, 1, decodes, ctx) > limit_s:
        return 0
    lo, hi = 1, 1 << 20  # step time grows with the chunk: bisect on the largest that fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _step_s(cost, mid, decodes, ctx) <= limit_s:
            lo = mid
        else:
            hi = mid
    return lo


def slo_steps(
    cost: CostModel, slo_ms: float, budgets: Sequence[int], decodes: int = 32, ctx: int = 4096
) -> dict[str, float]:
    """7.3's capacity derivation on the roofline, for the decode batch the SLOs are taken at:
    ``slo_tokens``, the most prompt tokens one step can prefill beside ``decodes`` decodes of
    ``ctx`` tokens within ``slo_ms``; ``token_us``, the compute time of one prompt token at peak
    (matrices only); and ``budget_<b>_ms``, the step that fills each token budget ``b``
    (``b - decodes`` prompt tokens beside the decodes)."""
    m = cost.model
    out = {
        "slo_tokens": float(chunk_within(cost, slo_ms / 1e3, decodes=decodes, ctx=ctx)),
        "token_us": 2 * m.layers * m.layer_matmul_params / cost.peak_flops * 1e6,
    }
    for b in budgets:
        if b <= decodes:
            raise ValueError(f"budget={b}: must exceed the {decodes} decodes")
        out[f"budget_{b}_ms"] = _step_s(cost, b - decodes, decodes, ctx) * 1e3
    return out


def trace_contrast(workload: Workload, other: Workload) -> dict[str, float]:
    """7.3 (exercise on the code trace): how many times longer the mean prompt of ``workload``
    (this page's requests) is than ``other``'s (7.2's conversations) and shorter its mean output."""
    if len(workload) == 0 or len(other) == 0:
        raise ValueError("trace_contrast() needs two non-empty workloads")
    p, o = float(np.mean(workload.prompt_lens)), float(np.mean(workload.output_lens))
    po, oo = float(np.mean(other.prompt_lens)), float(np.mean(other.output_lens))
    return {"prompt_ratio": p / po, "output_shorter": oo / o}


def chunk_sweep(
    workload: Workload,
    cost: CostModel,
    chunk_sizes: Sequence[int],
    slots: int = 32,
    time_scales: Sequence[float] = (1.0,),
    kv_tokens: int | str | None = "device",
) -> dict[float, dict[str, np.ndarray]]:
    """7.3: chunked prefill at every chunk size, with token budget = chunk + slots.

    Per time scale: arrays over ``chunk`` of ``ttft_p99``, ``ttft_p50``, ``itl_p99``, ``itl_p50``,
    ``itl_max``, ``tpot_p99``, ``e2e_p99``, ``throughput_tok``, ``steps``; plus the
    unchunked reference (continuous batching, whole prompts mixed into the decode step)
    under the key ``"continuous"`` as one-element arrays.
    """
    keys: tuple[str, ...] = ("ttft_p99", "ttft_p50", "itl_p99", "itl_p50", "itl_max", "tpot_p99", "e2e_p99")
    keys += ("throughput_tok", "steps")
    out: dict[float, dict[str, np.ndarray]] = {}
    for k in time_scales:
        w = workload.scale(time=float(k)) if k != 1 else workload
        opts: dict[str, Any] = {"slots": slots, "kv_tokens": kv_tokens}
        runs = [
            run_metrics(simulate(w, cost, "chunked", token_budget=int(c) + slots, chunk_size=int(c), **opts))
            for c in chunk_sizes
        ]
        ref = run_metrics(simulate(w, cost, "continuous", **opts))
        out[float(k)] = {
            "chunk": np.asarray(chunk_sizes, dtype=float),
            **columns(runs, keys),
            **{f"continuous_{key}": np.asarray([ref[key]]) for key in keys},
        }
    return out


#: Columns of the page's table of the three ways to serve the long prompt (:func:`stall_rows`).
STALL_HEADER = ("configuration", "running requests' worst ITL (ms)", "newcomer's TTFT (ms)")


def stall_rows(st: Mapping[str, Any], labels: Mapping[str, str]) -> list[list[Any]]:
    """One row per ``{tag: label}`` of a :func:`stall_summary` result ``st`` (columns
    :data:`STALL_HEADER`): the running requests' worst ITL and the newcomer's TTFT."""
    n = st["numbers"]
    return [
        [label, f"{n[f'{t}_itl_max_ms']:.1f}", f"{n[f'{t}_ttft_ms']:,.0f}"] for t, label in labels.items()
    ]


#: Two p99 TTFTs within this fraction of each other match (:func:`nochunk_verdict`).
MATCH_TOL = 0.05


def nochunk_verdict(load: Mapping[str, np.ndarray], tol: float = MATCH_TOL) -> dict[str, Any]:
    """Continuous batching without chunks against the chunk size with the lowest p99 TTFT, at
    one load of a :func:`chunk_sweep`: that ``chunk``, its ``ttft`` and ``itl`` (p99, s), the
    unchunked ``ttft_whole`` and ``itl_whole``, and ``ttft_vs`` / ``itl_vs``, the
    :class:`~.common.Versus` of the chunked over the unchunked within ``tol`` (LESS: the
    chunks beat it; SAME: they match it; MORE: it is better)."""
    i = int(np.argmin(load["ttft_p99"]))
    ttft, itl = float(load["ttft_p99"][i]), float(load["itl_p99"][i])
    ttft_whole, itl_whole = float(load["continuous_ttft_p99"][0]), float(load["continuous_itl_p99"][0])
    return {
        "chunk": float(load["chunk"][i]),
        "ttft": ttft,
        "itl": itl,
        "ttft_whole": ttft_whole,
        "itl_whole": itl_whole,
        "ttft_vs": versus(ttft / ttft_whole, tol),
        "itl_vs": versus(itl / itl_whole, tol),
    }


#: A p99 TTFT within this fraction of another is flat (:func:`past_chunk`).
FLAT_TOL = 0.10


def past_chunk(
    sweep: Mapping[float, Mapping[str, np.ndarray]], chunk: int, tol: float = FLAT_TOL
) -> dict[str, Any]:
    """What chunks larger than ``chunk`` buy at every load of a :func:`chunk_sweep`: from
    ``chunk`` to the largest chunk size (``largest``), the p99 TTFT's ratio at each load,
    ``ttft_ratio`` the one furthest from 1 (at ``ttft_load``) and ``ttft_vs`` its
    :class:`~.common.Versus` within ``tol`` (SAME: flat at every load; LESS: falls; MORE:
    rises); and the p99 ITL's ratio, ``itl_ratio_min`` and ``itl_ratio_max`` over the loads."""
    ttft: dict[float, float] = {}
    itl: list[float] = []
    largest = None
    for k, d in sweep.items():
        c = np.asarray(d["chunk"], dtype=float)
        if chunk not in c or c.max() <= chunk:
            raise ValueError(f"chunk={chunk}: must be a chunk size of the sweep, below its largest")
        j, last = int(np.flatnonzero(c == chunk)[0]), int(np.argmax(c))
        largest = float(c[last])
        ttft[k] = float(d["ttft_p99"][last] / d["ttft_p99"][j])
        itl.append(float(d["itl_p99"][last] / d["itl_p99"][j]))
    if largest is None:
        raise ValueError("past_chunk() needs a sweep with at least one load")
    worst = max(ttft, key=lambda k: abs(ttft[k] - 1.0))
    return {
        "chunk": float(chunk),
        "largest": largest,
        "ttft_ratio": ttft[worst],
        "ttft_load": worst,
        "ttft_vs": versus(ttft[worst], tol),
        "tol": tol,
        "itl_ratio_min": min(itl),
        "itl_ratio_max": max(itl),
    }


def tradeoff_rows(
    sweep: Mapping[float, Mapping[str, np.ndarray]], chunks: Sequence[int], load: float
) -> tuple[list[list[str]], list[str]]:
    """The page's table of a :func:`chunk_sweep` at one (high) ``load``: per chunk size, the
    median ITL (ms) and the p99 TTFT (s). Returns ``(rows, header)``."""
    header = ["chunk (tokens)", f"median ITL, {load:g}x (ms)", f"p99 TTFT, {load:g}x (s)"]
    rows = []
    for c in chunks:
        hi = at(sweep[float(load)], "chunk", c)
        rows.append([f"{c:,.0f}", f"{hi['itl_p50'] * 1e3:.1f}", f"{hi['ttft_p99']:.1f}"])
    return rows, header


#: The configurations of capacity.CONFIGS this page compares, with their glue tags.
CAPACITY_TAGS: dict[str, str] = {
    "continuous, separate prefill": "sep",
    "continuous, mixed prefill": "mix",
    "chunked, budget 2048": "b2048",
    "chunked, budget 512": "b512",
}


def capacity_numbers(
    rows: Sequence[Mapping[str, Any]], tags: Mapping[str, str] = CAPACITY_TAGS
) -> dict[str, float]:
    """Glue-ready numbers of :func:`~batching.capacity.capacity_table` rows for the
    configurations in ``tags``: ``<tag>_<slo>`` (capacity, req/s) and ``<tag>_<slo>_itl_ms``
    (p99 ITL at capacity; left out where no rate met the SLO)."""
    out: dict[str, float] = {}
    for r in rows:
        if r["config"] not in tags:
            continue
        k = f"{tags[r['config']]}_{r['slo']}"
        out[k] = float(r["rate"])
        if math.isfinite(r["itl_p99_ms"]):
            out[f"{k}_itl_ms"] = float(r["itl_p99_ms"])
    return out


def capacity_limits(cap: Mapping[str, float], strict_ms: float) -> dict[str, bool]:
    """Which limit binds, from :func:`capacity_numbers`: ``mix_itl_bound``, continuous batching
    with mixed prefill fails the strict SLO on its p99 ITL (within 10% of ``strict_ms`` at
    capacity), not on its queue; ``budget_same``, chunked prefill with a 2,048-token budget
    sustains the same rate (within 2%) under both SLOs."""
    return {
        "mix_itl_bound": cap.get("mix_strict_itl_ms", 0.0) > 0.9 * strict_ms,
        "budget_same": abs(cap["b2048_relaxed"] / max(cap["b2048_strict"], 1e-9) - 1) < 0.02,
    }


#: Sarathi-Serve's published capacity gain over vLLM (which paused decodes for each prefill:
#: separate prefill here) for Mistral-7B on one A100 at its strict SLO, with a 512-token
#: budget (Agrawal et al., "Taming Throughput-Latency Tradeoff in LLM Inference with
#: Sarathi-Serve", OSDI 2024).
SARATHI_SERVE_RATIO = 2.6
#: The two configurations that ratio compares, in :data:`CAPACITY_TAGS`' names: chunked
#: prefill at Sarathi-Serve's strict-SLO budget over separate prefill.
RATIO_CONFIGS: tuple[str, str] = ("chunked, budget 512", "continuous, separate prefill")


def strict_slo_ms(cost: CostModel, batch: int = SLO_BATCH, ctx: int = SLO_CONTEXT) -> float:
    """The strict p99 ITL SLO (ms) of :func:`~batching.capacity.slos` for any cost model
    with a ``step_time`` (a roofline or a measured profile): 5 x a decode step of ``batch``
    rows at ``ctx`` KV tokens each."""
    return slos(cost, batch, ctx)["strict_ms"]


def ratio_capacity(workload: Workload, cost: CostModel, **options: Any) -> dict[str, float]:
    """Capacity (req/s) of the two :data:`RATIO_CONFIGS` at the strict SLO only (the ratio's
    runs, no more): :func:`capacity_numbers` of them, ``strict_ms`` and ``ratio`` (see
    :func:`capacity_ratio`). ``options`` go to :func:`~batching.capacity.capacity_table`."""
    slo = strict_slo_ms(cost)
    configs = {k: CONFIGS[k] for k in RATIO_CONFIGS}
    cap = capacity_numbers(capacity_table(workload, cost, configs, {"strict": slo}, **options))
    return {**cap, "strict_ms": slo, "ratio": capacity_ratio(cap)}


def capacity_ratio(cap: Mapping[str, float], slo: str = "strict") -> float:
    """Chunked prefill's capacity over separate prefill's (:data:`RATIO_CONFIGS`) at ``slo``,
    from :func:`capacity_numbers`; ``math.inf`` where separate prefill met no rate."""
    num, den = (f"{CAPACITY_TAGS[c]}_{slo}" for c in RATIO_CONFIGS)
    return cap[num] / cap[den] if cap[den] > 0 else math.inf


#: Row labels of the page's capacity comparison (:func:`ratio_rows`), by glue key.
RATIO_ROWS: dict[str, str] = {
    "sep_strict": "continuous, separate prefill (req/s)",
    "b512_strict": "chunked, budget 512 (req/s)",
}


def ratio_rows(columns: Mapping[str, Mapping[str, float]]) -> tuple[list[list[str]], list[str]]:
    """The page's table of :func:`ratio_capacity` results at the strict SLO, one column per
    ``{label: numbers}`` and one row per :data:`RATIO_ROWS`. Returns ``(rows, header)``."""
    rows = [[label, *(f"{c[k]:.1f}" for c in columns.values())] for k, label in RATIO_ROWS.items()]
    return rows, ["", *columns]


# --- 7.3, measured: the long prompt on the real model, and the profiles' mixed steps ---


def stall_overlaps(result: RunResult, running: Sequence[int], newcomer: int) -> bool:
    """Whether every running request was still decoding at the newcomer's first token (else
    no running request saw the stall)."""
    first = next(r for r in result.requests if r.rid == newcomer).token_times[0]
    ids = set(running)
    return all(r.token_times[-1] > first for r in result.requests if r.rid in ids)


#: The real stall experiment's sizes per device type (:func:`real_stall`). The CPU's runs take
#: a few seconds; its chunk is 128 because cpu-s's prefill reaches its best throughput only far
#: above B* (~13): chunks of 64 stretched the newcomer's TTFT to 2.0 s (0.7 s whole), 128 to
#: 1.2 s, while still stalling the decodes several-fold. A GPU runs the page's own sizes.
REAL_STALL: dict[str, dict[str, int]] = {
    "cpu": {"running": 8, "prompt": 1536, "chunk": 128},
    "cuda": {"running": 30, "prompt": 4000, "chunk": 512},
}


def real_stall(
    model: str | None = None,
    device: str = "auto",
    running: int | None = None,
    prompt: int | None = None,
    chunk: int | None = None,
    lead_steps: int = 10,
    tail_steps: int = 30,
    running_prompt: int = 128,
    threads: int | None = None,
) -> dict[str, Any]:
    """7.3, measured: ``running`` requests decode on the real model when a ``prompt``-token
    prompt arrives ``lead_steps`` decode steps after their prefill (counted in steps, so the
    same on any machine); one run per :func:`~batching.book.chunked.stall_configs`. Returns
    :func:`~batching.book.chunked.stall_summary` (series and first tokens from each run's
    arrival of the prompt) plus the sizes, the arrival (``at_s``
    measured, ``at_step`` on the step clock), the median decode step before it (chunked run),
    runs, executor and machine load. None sizes take :data:`REAL_STALL`'s for the device."""
    # The real engine imports torch: loaded only when a page measures (the pages import without it).
    from ..real.session import device_kind, serve, session

    d = REAL_STALL[device_kind(device)]
    running = d["running"] if running is None else running
    prompt = d["prompt"] if prompt is None else prompt
    chunk = d["chunk"] if chunk is None else chunk
    for name, v, lo in (
        ("running", running, 1),
        ("prompt", prompt, 1),
        ("chunk", chunk, 1),
        ("lead_steps", lead_steps, 1),
        ("tail_steps", tail_steps, 1),
        ("running_prompt", running_prompt, 1),
    ):
        if isinstance(v, bool) or not (isinstance(v, int) and v >= lo):
            raise ValueError(f"{name}={v!r}: must be an integer >= {lo}")
    # The long prompt is placed by step count, on the engine's step clock (run_real's
    # step_clock): the same place on any machine at any speed, busy or quiet. Where that is
    # depends only on the schedulers' decisions, not on how long a step takes, so a run of
    # the running requests alone at one second per step finds it: their last prefill step.
    output = lead_steps + math.ceil(prompt / chunk) + tail_steps
    slots = running + 1
    configs = stall_configs(chunk, slots)
    max_len = max(prompt + 8, running_prompt + output)
    alone = Workload.from_arrays(
        np.zeros(running), np.full(running, running_prompt), np.full(running, output), name="running alone"
    )
    prefilled = 0.0
    for _, sched, o in configs.values():
        res = run(
            alone.fresh(),
            make_scheduler(sched, max_context=max_len, slots=slots, **o),
            SimExecutor(UnitStep()),
        )
        prefilled = max(prefilled, max(r.token_times[0] for r in res.requests))
    at = prefilled + lead_steps  # in steps: lead_steps decode steps after the last prefill
    w = long_prompt_among_decodes(
        running=running, prompt=prompt, at=at, running_prompt=running_prompt, running_output=output, output=8
    )
    runner = session(model, device, slots=slots, max_len=max_len, threads=threads)
    load0 = load_average()
    runs = {
        tag: (label, serve(runner, w, sched, slots=slots, step_clock=True, **opts))
        for tag, (label, sched, opts) in configs.items()
    }
    # By construction every running request still decodes at the newcomer's first token
    # (it arrives with more than its prefill's steps of their output left): check it.
    missed = [tag for tag, (_, res) in runs.items() if not stall_overlaps(res, range(running), running)]
    if missed:
        raise RuntimeError(f"the running requests finished before the long prompt's first token in {missed}")
    res = runs["chk"][1]
    newcomer = next(r for r in res.requests if r.rid == running)
    L = res.log.cols
    before = [s for t, s, pre in zip(L["t"], L["dur"], L["prefill"]) if pre == 0 and t < newcomer.arrival]
    step = float(np.median(before[len(before) // 2 :]))  # the later half: past the first steps' warm-up
    # Each run on its own clock from the prompt's arrival: the runs' steps take different
    # seconds, so the step-placed prompt arrives at a different second in each.
    out = stall_summary(runs, range(running), running, since_arrival=True)
    out.update(
        at_s=newcomer.arrival,  # measured: when the lead_steps-th decode step after the prefill ended
        at_step=at,
        decode_ms=step * 1e3,
        lead_steps=lead_steps,
        running=running,
        prompt=prompt,
        chunk=chunk,
        chunks=math.ceil(prompt / chunk),
        running_prompt=running_prompt,
        budget=chunk + slots,
        labels={t: c[0] for t, c in configs.items()},
        results={t: r for t, (_, r) in runs.items()},
        executor=res.executor,
        **machine_load(load0, load_average()),
    )
    return out


def profile_chunk_steps(profiles: Sequence[Mapping[str, Any]], decodes: int = 8) -> list[dict[str, Any]]:
    """7.3, measured: per committed profile with mixed steps at ``decodes`` rows, the step
    carrying one prefill chunk over the decode-only step (``over_decode``) and the chunk's share
    of the best measured prefill throughput (``share``), over ``chunk``; no interpolation."""
    out = []
    for p in profiles:
        mixed = p["mixed"]
        if mixed is None:
            continue
        sel = mixed["decode_rows"] == decodes
        ctxs = set(mixed["decode_ctx"][sel].tolist())
        if not sel.any() or len(ctxs) != 1:
            continue
        ctx = ctxs.pop()
        chunk, ms = mixed["prefill_tokens"][sel], mixed["ms"][sel] * 1e3
        order = np.argsort(chunk)
        chunk, ms = chunk[order], ms[order]
        b, cs = np.asarray(p["batch"], dtype=float), np.asarray(p["ctxs"], dtype=float)
        if decodes not in b or ctx not in cs:
            continue
        dec = float(p["ms"][int(np.flatnonzero(b == decodes)[0]), int(np.flatnonzero(cs == ctx)[0])])
        tps = chunk / (ms / 1e3)
        short = f"{p['meta']['model']} {p['shape'].dtype} on {p['machine']}"
        out.append(
            {
                "short": short,
                "device": p["device"],
                "chunk": chunk,
                "over_decode": ms / dec,
                "share": tps / tps.max(),
                "bstar": float(p["bstar"]),
                "date": p["meta"]["date"][:10],
                "decodes": decodes,
            }
        )
    return out


def chunk_efficiency(curve: Mapping[str, Any], share: float = 0.8) -> dict[str, float] | None:
    """The smallest chunk of a :func:`profile_chunk_steps` curve at ``share`` or more of the
    best prefill throughput: the chunk, over B*, and its step over decode-only; None if none."""
    ch, sh = np.asarray(curve["chunk"], dtype=float), np.asarray(curve["share"], dtype=float)
    ok = np.flatnonzero(sh >= share)
    if not ok.size:
        return None
    i = int(ok[0])
    return {
        "chunk": float(ch[i]),
        "times_bstar": float(ch[i] / float(curve["bstar"])),
        "over_decode": float(np.asarray(curve["over_decode"], dtype=float)[i]),
    }


#: What chunks did to a measured stall (:func:`stall_verdict`).
StallVerdict = Literal["removed", "spread", "not cut"]


def stall_verdict(numbers: Mapping[str, float], factor: float = 2.0) -> StallVerdict:
    """7.3's claim on one stall run's ``numbers`` (tags ``mix``, ``chk``): "not cut" when chunks
    did not lower the worst ITL, else "removed" when the median chunk step is at most ``factor``
    x the median ITL, else "spread" (the stall cut into the chunks, not gone)."""
    if float(numbers["chk_itl_max_ms"]) >= float(numbers["mix_itl_max_ms"]):
        return "not cut"
    step = float(numbers["chk_prefill_itl_p50_ms"]) / float(numbers["chk_itl_p50_ms"])
    return "removed" if step <= factor else "spread"


#: Measured TTFTs within this fraction of each other are the same: a CPU's timings are noisy
#: (:func:`newcomer_ttft`).
NEWCOMER_TOL = 0.10


def newcomer_ttft(numbers: Mapping[str, float], tol: float = NEWCOMER_TOL) -> dict[str, Any]:
    """What chunks did to the newcomer's time to first token in one stall run's ``numbers``
    (tags ``mix``, ``chk``): ``whole_ms`` and ``chunked_ms``, ``change`` = chunked / whole - 1,
    and ``verdict``, the :class:`~.common.Versus` of chunked over whole within ``tol`` (MORE:
    chunks made it later; SAME: no change beyond the noise; LESS: sooner)."""
    whole, chunked = float(numbers["mix_ttft_ms"]), float(numbers["chk_ttft_ms"])
    if not (whole > 0 and chunked > 0):
        raise ValueError(f"TTFTs {whole} and {chunked} ms: must be positive")
    return {
        "whole_ms": whole,
        "chunked_ms": chunked,
        "change": chunked / whole - 1.0,
        "verdict": versus(chunked / whole, tol),
    }


def sweep_in_run_dtype(sweeps: Sequence[Mapping[str, Any]], rs: Mapping[str, Any]) -> Mapping[str, Any]:
    """Of this build's live sweeps (one per dtype), the one in the real run's dtype: B* depends
    on the dtype (bytes per weight, peak), not on the model; the first where none matches."""
    dt = canonical_dtype(str(rs["executor"]["dtype"]))
    return next((s for s in sweeps if canonical_dtype(str(s["meta"]["dtype"])) == dt), sweeps[0])


def real_chunk_numbers(sweep: Mapping[str, Any], rs: Mapping[str, Any], bstar: float) -> dict[str, Any]:
    """The real stall run's chunk (``rs``: :func:`real_stall`) against ``bstar``, the B* of
    this build's live sweep (:func:`batching.real.sweep.decode_sweep`, whose probes give the
    why page its B*: one B* per device, from one source, not a committed profile of some
    other machine). ``same_machine``: the sweep ran on the stall run's machine (CPU model and
    threads); ``above_bstar``: the chunk exceeds B*, so a chunk step is compute-bound."""
    b = float(bstar)
    return {
        "bstar": b,
        "chunk_over_bstar": float(rs["chunk"]) / b,
        "above_bstar": float(rs["chunk"]) > b,
        "same_machine": same_machine(machine_of(sweep["meta"]), machine_of(rs["executor"])),
    }


#: Columns of the measured page's table of a live stall run (:func:`live_stall_rows`).
LIVE_STALL_HEADER = (
    "configuration",
    "worst ITL (ms)",
    "median ITL (ms)",
    "median step in its prefill (ms)",
    "newcomer's TTFT (ms)",
    "slow steps before / during / after",
)


def _ms(v: float) -> str:
    # NaN: no step of this configuration fell inside the prefill (a short prompt on a fast device).
    return f"{v:.0f}" if v == v else "-"


def live_stall_rows(rs: Mapping[str, Any]) -> list[list[Any]]:
    """Rows of :data:`LIVE_STALL_HEADER` per configuration of a :func:`real_stall` run; slow
    steps (over twice the median ITL) split before / during / after the long prompt's prefill."""
    n = rs["numbers"]
    rows = []
    for tag, label in rs["labels"].items():
        split = " / ".join(f"{n[f'{tag}_steps_over_2x_{k}']:.0f}" for k in ("before", "during", "after"))
        rows.append(
            [
                label,
                f"{n[f'{tag}_itl_max_ms']:.0f}",
                f"{n[f'{tag}_itl_p50_ms']:.1f}",
                _ms(n[f"{tag}_prefill_itl_p50_ms"]),
                f"{n[f'{tag}_ttft_ms']:,.0f}",
                split,
            ]
        )
    return rows


#: Columns of the measured page's table of committed stall runs (:func:`committed_stall_rows`).
COMMITTED_STALL_HEADER = (
    "measured on",
    "date",
    "running x prompt, chunk",
    "median ITL (ms)",
    "worst ITL whole / chunked (ms)",
    "newcomer's TTFT whole / chunked (ms)",
)


def committed_stall_rows(docs: Sequence[Mapping[str, Any]]) -> list[list[Any]]:
    """Rows of :data:`COMMITTED_STALL_HEADER` per committed ``bench_stall.py`` result; the
    median ITL is the unchunked run's own (the stall's denominator)."""
    rows = []
    for d in docs:
        s, n = d["stall"], d["stall"]["numbers"]
        rows.append(
            [
                f"{d['model']} {d['dtype']}, {machine_label(d)}",
                d["date"][:10],
                f"{s['running']} x {s['prompt']:,}, {s['chunk']}",
                f"{n['mix_itl_max_ms'] / n['mix_stall']:.1f}",
                f"{n['mix_itl_max_ms']:,.0f} / {n['chk_itl_max_ms']:,.0f}",
                f"{n['mix_ttft_ms']:,.0f} / {n['chk_ttft_ms']:,.0f}",
            ]
        )
    return rows
