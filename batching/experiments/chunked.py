"""7.3 Chunked prefill: a long prompt arriving among running decodes, the inter-token stalls it
causes, and the chunk size's trade-off.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from ..engine import RunResult
from ..plan import StepWork
from ..workload import Workload
from .common import at, flat, metrics, simulate


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
