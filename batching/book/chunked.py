"""7.3 Chunked prefill: a long prompt arriving among running decodes, the inter-token stalls it
causes, and the chunk size's trade-off.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..engine import RunResult
from ..plan import StepWork
from ..workload import Workload
from .common import at, flat, metrics, simulate


# ------------------------------------------------------------------------------- 7.3
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
            "source": "experiments.long_prompt_among_decodes",
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
    runs: Mapping[str, tuple[str, RunResult]], running: Sequence[int], newcomer: int
) -> dict[str, Any]:
    """7.3: ``{tag: (label, result)}`` of the long-prompt workload, reduced to ``series``
    ({label: :func:`itl_series` of the running requests}), ``first_token`` ({label: the
    newcomer's first-token time, s}) and ``numbers`` (each run's :func:`spike_summary`,
    keys prefixed ``<tag>_``)."""
    series: dict[str, Any] = {}
    first: dict[str, float] = {}
    numbers: dict[str, float] = {}
    for tag, (label, res) in runs.items():
        series[label] = itl_series(res, running)
        first[label] = next(r for r in res.requests if r.rid == newcomer).token_times[0]
        numbers.update(flat(tag, spike_summary(res, running, newcomer)))
    return {"series": series, "first_token": first, "numbers": numbers}


def stall_runs(
    workload: Workload,
    cost: Any,
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


#: The real stall experiment's sizes per device type (:func:`real_stall`). On the CPU, 8
#: running requests and a 1,536-token prompt keep the runs to a few seconds. cpu-s turns
#: compute-bound within a few dozen tokens (B* ~ 13), but a chunk's prefill reaches its best
#: throughput only far above that (the committed profile: 59% of it at 64 tokens, 72% at
#: 128, 80% first at 256). Measured here with 8 decodes, chunks of 64 took 45-75 ms and the
#: whole prompt's first token came after 2.0 s against 0.7 s unchunked; chunks of 128 took
#: 85-125 ms, 1.2 s. The CPU uses 128: a TTFT cost the page can show, with chunk steps that
#: still stall the decodes several-fold (the page says so). On a GPU the page's own sizes
#: (30 running, 4,000 tokens, chunks of 512).
#: How many times :func:`real_stall` calibrates and runs before it gives up (see :func:`stall_overlaps`).
STALL_ATTEMPTS = 3


def stall_overlaps(result: RunResult, running: Sequence[int], newcomer: int) -> bool:
    """7.3, measured: whether every running request was still decoding when the newcomer's
    first token came out, so that its prefill fell among their steps (the stall a run is
    there to show). A real run places the long prompt's arrival by a calibrated step time;
    on a machine that ran several times faster during the run than during calibration the
    running requests can finish first, and :func:`spike_summary` would see no stall."""
    first = next(r for r in result.requests if r.rid == newcomer).token_times[0]
    ids = set(running)
    return all(r.token_times[-1] > first for r in result.requests if r.rid in ids)


REAL_STALL: dict[str, dict[str, int]] = {
    "cpu": {"running": 8, "prompt": 1536, "chunk": 128},
    "cuda": {"running": 30, "prompt": 4000, "chunk": 512},
}


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
    """7.3, measured: the long prompt among running decodes on the real model.

    ``running`` requests (``running_prompt``-token prompts) start at t = 0; a short
    calibration run of the same requests (chunked, their slowest prefill) measures this
    device's decode step, and the long prompt is set to arrive ``lead_steps`` decode steps
    after their prefill ends. Each
    running request wants enough tokens to decode through twice the lead, the slowest
    (chunked) prefill and ``tail_steps`` more. The workload then runs under each of :func:`stall_configs` on one
    model. Returns :func:`stall_summary` plus ``at_s`` (the arrival), ``decode_ms`` (the
    calibration's median decode step), ``lead_steps``, ``running``, ``prompt``, ``chunk``, ``chunks`` (the
    long prompt's), ``running_prompt``, ``budget``,
    ``labels`` ({tag: label}), ``results`` ({tag: RunResult}), ``model`` and ``executor``. None arguments take the device's
    defaults (:data:`~batching.experiments.checks.REAL_MODELS`, :data:`REAL_STALL`).
    """
    from .checks import real_kind, real_runner, serve_real

    d = REAL_STALL[real_kind(device)]
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
    # Twice the lead: a fresh model's first steps run slow (the calibration's median can
    # overstate the step), and a running request that ran out of tokens early would miss
    # the very stall it is here to show.
    output = 2 * lead_steps + math.ceil(prompt / chunk) + tail_steps
    slots = running + 1
    runner = real_runner(
        model, device, slots=slots, max_len=max(prompt + 8, running_prompt + output), threads=threads
    )
    configs = stall_configs(chunk, slots)
    # Calibrate under chunked prefill, the slowest to prefill the running prompts, so that
    # in every configuration they are all decoding when the long prompt arrives.
    _, sched, opts = configs["chk"]
    calib = Workload.from_arrays(
        np.zeros(running),
        np.full(running, running_prompt),
        np.full(running, 16),
        name="decode-step calibration",
    )
    for _attempt in range(STALL_ATTEMPTS):
        cal = serve_real(runner, calib, sched, slots=slots, **opts)
        L = cal.log.cols
        dec = np.asarray(L["dur"])[np.asarray(L["prefill"]) == 0]
        if dec.size < 2:
            raise RuntimeError("the calibration run had fewer than two decode-only steps")
        step = float(np.median(dec[dec.size // 2 :]))  # the later half: past the first steps' warm-up
        at = max(r.token_times[0] for r in cal.requests) + lead_steps * step
        w = long_prompt_among_decodes(
            running=running,
            prompt=prompt,
            at=at,
            running_prompt=running_prompt,
            running_output=output,
            output=8,
        )
        runs = {}
        for tag, (label, sched, opts_t) in configs.items():
            runs[tag] = (label, serve_real(runner, w, sched, slots=slots, **opts_t))
        missed = [tag for tag, (_, res) in runs.items() if not stall_overlaps(res, range(running), running)]
        if not missed:
            break
    else:
        # A machine whose speed changed several-fold between calibration and run (a busy
        # shared CPU, a tiny model's sub-millisecond steps): say so rather than report a
        # stall that no running request saw.
        raise RuntimeError(
            f"after {STALL_ATTEMPTS} calibrations the running requests had finished before the "
            f"long prompt's first token in {', '.join(missed)}: the decode step measured "
            f"{step * 1e3:.2f} ms in calibration and ran much faster in the runs"
        )
    out = stall_summary(runs, range(running), running)
    res = runs[next(reversed(runs))][1]  # the last configuration's run names the executor
    out.update(
        at_s=at,
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
        model=res.executor["model"],
        executor=res.executor,
    )
    return out


def stall_numbers(
    cost: Any, chunk: int, prompt: int, decodes: int = 30, ctx: int = 300, reference: Sequence[int] = ()
) -> dict[str, float]:
    """7.3: roofline times (ms) of a decode-only step of ``decodes`` rows, of the same step
    carrying a ``chunk``-token chunk, and carrying a whole ``prompt``; ``stall`` = the last
    over the first, ``chunks`` = how many chunks the prompt takes. With ``reference``
    chunk sizes, ``chunk_share`` = the chunk's prefill throughput over the best of them.

    The derivation of the long step's time, as the cost model counts it: ``layer_params_b``
    (billions of parameters in the layers' matrices), ``tok_gflop`` (2 x those per prompt
    token: the LM head runs for decode rows only), ``attn_tflop`` (causal attention over
    the prompt), ``long_tflop`` (the whole step, decodes included), ``long_compute_ms``
    (that at peak) and ``overhead_ms`` (the step overhead the roofline adds)."""
    d = chunk_step_times(cost, [chunk, prompt], decodes=decodes, ctx=ctx)
    m = cost.model
    long_flops = m.flops(
        StepWork(
            prefill_tokens=prompt,
            prefill_attn=prompt * (prompt + 1) // 2,
            decode_rows=decodes,
            decode_ctx=decodes * ctx,
        )
    )
    out = {
        "decode_ms": d["decode_s"] * 1e3,
        "chunk_ms": float(d["step_s"][0]) * 1e3,
        "long_ms": float(d["step_s"][1]) * 1e3,
        "stall": float(d["step_s"][1] / d["decode_s"]),
        "chunks": float(math.ceil(prompt / chunk)),
        "layer_params_b": m.layers * m.layer_matmul_params / 1e9,
        "tok_gflop": 2 * m.layers * m.layer_matmul_params / 1e9,
        "attn_tflop": m.attn_flops_per_pair * prompt * (prompt + 1) / 2 / 1e12,
        "long_tflop": long_flops / 1e12,
        "long_compute_ms": long_flops / cost.peak_flops * 1e3,
        "overhead_ms": float(cost.device.step_overhead_s) * 1e3,
    }
    if reference:
        best = chunk_step_times(cost, list(reference) + [chunk], decodes=decodes, ctx=ctx)[
            "prefill_tps"
        ].max()
        out["chunk_share"] = float(d["prefill_tps"][0] / best)
    return out


def tradeoff_numbers(
    sweep: Mapping[float, Mapping[str, np.ndarray]], chunks: Mapping[str, int], loads: Mapping[str, float]
) -> dict[str, Any]:
    """7.3: glue-ready numbers of a :func:`chunk_sweep`: for each ``loads`` tag and each
    ``chunks`` tag, ``<load><chunk>_{itl_p99_ms,itl_p50_ms,ttft_p99,ttft_p50}``, and for
    continuous batching without chunks ``<load>_continuous_{itl_p99_ms,itl_p50_ms,ttft_p99,ttft_p50}``;
    plus ``loads_text`` ("1, 2, 4")."""
    out: dict[str, Any] = {"loads_text": ", ".join(f"{k:g}" for k in sweep)}
    for lt, load in loads.items():
        d = sweep[float(load)]
        out.update(
            {
                f"{lt}_continuous_itl_p99_ms": float(d["continuous_itl_p99"][0]) * 1e3,
                f"{lt}_continuous_itl_p50_ms": float(d["continuous_itl_p50"][0]) * 1e3,
                f"{lt}_continuous_ttft_p99": float(d["continuous_ttft_p99"][0]),
                f"{lt}_continuous_ttft_p50": float(d["continuous_ttft_p50"][0]),
            }
        )
        for ct, c in chunks.items():
            v = at(d, "chunk", c)
            out.update(
                {
                    f"{lt}{ct}_itl_p99_ms": v["itl_p99"] * 1e3,
                    f"{lt}{ct}_itl_p50_ms": v["itl_p50"] * 1e3,
                    f"{lt}{ct}_ttft_p99": v["ttft_p99"],
                    f"{lt}{ct}_ttft_p50": v["ttft_p50"],
                }
            )
    return out


def nochunk_text(sweep: Mapping[float, Mapping[str, np.ndarray]]) -> str:
    """7.3: where continuous batching without chunks sits among a :func:`chunk_sweep`'s
    chunk sizes: at which loads its p99 ITL is the worst, and at which some chunk sizes beat
    it on p99 TTFT as well (then no chunk size trades against it: it is off the curve)."""

    def listed(xs: Sequence[str]) -> str:
        return xs[0] if len(xs) == 1 else ", ".join(xs[:-1]) + " and " + xs[-1]

    worst = [f"{k:g}x" for k, d in sweep.items() if d["continuous_itl_p99"][0] >= d["itl_p99"].max()]
    where = "every load" if len(worst) == len(sweep) else listed(worst) if worst else ""
    text = (
        f"Without chunks, continuous batching has the worst p99 ITL at {where}"
        if worst
        else "Without chunks, continuous batching never has the worst p99 ITL here"
    )
    beaten: dict[float, list[str]] = {}  # smallest chunk that beats it on TTFT -> loads
    last = None
    for k, d in sweep.items():
        better = d["chunk"][d["ttft_p99"] < d["continuous_ttft_p99"][0]]
        if better.size:
            beaten.setdefault(float(better.min()), []).append(f"{k:g}x")
            b = int(np.argmin(d["ttft_p99"]))
            last = (k, float(d["ttft_p99"][b]), float(d["chunk"][b]), float(d["continuous_ttft_p99"][0]))
    if last is None:
        return text + ", and the best p99 TTFT: the far end of the curve."
    biggest = max(float(d["chunk"].max()) for d in sweep.values())
    groups = [
        (f"chunks of {c:,.0f} tokens" if c == biggest else f"{c:,.0f}-token chunks and larger")
        + f" ({listed(loads)})"
        for c, loads in beaten.items()
    ]
    k, t_chunk, c_big, t_none = last
    return (
        text
        + ", and it does not buy the best TTFT either: "
        + "; ".join(groups)
        + f" have a lower p99 TTFT (at {k:g}x, {t_chunk:.2f} s with {c_big:,.0f}-token chunks against "
        f"{t_none:.2f} s). Whole long prompts arriving in bursts hold up the newcomers behind them too."
    )


def chunk_step_times(cost: Any, chunks: Sequence[int], decodes: int = 30, ctx: int = 256) -> dict[str, Any]:
    """7.3: roofline time of one step carrying ``decodes`` running decodes (``ctx`` KV tokens
    each) plus one fresh prefill chunk of each size, and of the decode-only step.

    Returns ``chunk``, ``step_s`` (arrays), ``decode_s``, ``prefill_tps`` (chunk tokens per
    second of step time, array) and ``bstar``.
    """
    ch = np.asarray(chunks, dtype=float)
    steps = np.array(
        [
            cost.step_time(
                StepWork(
                    prefill_tokens=int(c),
                    prefill_attn=int(c) * (int(c) + 1) // 2,
                    decode_rows=decodes,
                    decode_ctx=decodes * ctx,
                )
            )
            for c in chunks
        ]
    )
    dec = cost.step_time(StepWork(decode_rows=decodes, decode_ctx=decodes * ctx))
    return {
        "chunk": ch,
        "step_s": steps,
        "decode_s": float(dec),
        "prefill_tps": ch / steps,
        "bstar": float(cost.bstar()),
    }


def committed_stall_text(docs: Sequence[Mapping[str, Any]]) -> str:
    """7.3: one sentence per committed ``bench_stall.py`` result
    (:func:`~batching.experiments.checks.committed_real_runs`) on the stall measured there."""
    from .checks import committed_text

    def sentence(d: Mapping[str, Any]) -> str:
        s, n = d["stall"], d["stall"]["numbers"]
        # The stall is a multiple of the run's median ITL, not of the calibration's step:
        # both are quoted, each named, so that neither is divided by the other's number.
        med = n["mix_itl_max_ms"] / n["mix_stall"]
        return (
            f"with {s['running']} requests decoding at a median inter-token latency of {med:.1f} ms (a "
            f"calibration run had timed their decode-only step at {s['decode_ms']:.1f} ms), a "
            f"{s['prompt']:,}-token prompt prefilled whole held their next token for "
            f"{n['mix_itl_max_ms']:.0f} ms ({n['mix_stall']:.0f}x that median), in {s['chunk']}-token chunks "
            f"for at most {n['chk_itl_max_ms']:.0f} ms; its own first token came after "
            f"{n['mix_ttft_ms']:.0f} and {n['chk_ttft_ms']:.0f} ms"
        )

    return committed_text(docs, "the same experiment", sentence)


def profile_chunk_steps(profiles: Sequence[Mapping[str, Any]], decodes: int = 8) -> list[dict[str, Any]]:
    """7.3, measured: how a step with ``decodes`` running decodes grows with the prefill chunk
    it carries, read straight from each committed profile's measured mixed steps (no
    interpolation). ``profiles``: :func:`~batching.experiments.load_profiles` entries; a
    profile without mixed steps at ``decodes`` rows is left out.

    Each entry: ``label``, ``short`` (model, dtype, device for a legend), ``device``, ``ctx`` (KV tokens per decode row), ``chunk``,
    ``step_ms`` (measured), ``decode_ms`` (the decode-only step of the same rows and
    context, from the profile's decode grid), ``over_decode`` (step / decode-only step: the
    running requests' ITL multiplier), ``prefill_tps`` (chunk tokens per second of step
    time), ``share`` (of the best measured), ``bstar`` (the profile's, from its measured
    bandwidth and peak) and ``date``.
    """
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
        short = f"{p['meta']['model']} {p['shape'].dtype} on {p['meta'].get('device_name') or p['device']}"
        out.append(
            {
                "label": p["label"],
                "short": short,
                "device": p["device"],
                "ctx": ctx,
                "chunk": chunk,
                "step_ms": ms,
                "decode_ms": dec,
                "over_decode": ms / dec,
                "prefill_tps": tps,
                "share": tps / tps.max(),
                "bstar": float(p["bstar"]),
                "date": p["meta"]["date"][:10],
                "decodes": decodes,
            }
        )
    return out


def profile_chunk_text(curves: Sequence[Mapping[str, Any]], chunks: Sequence[int] = (32, 128)) -> str:
    """7.3: one sentence per :func:`profile_chunk_steps` curve for the prose: the decode-only
    step, and for each of ``chunks`` (where measured) the step it becomes and the share of
    the best prefill throughput the chunk gets; the smallest chunk reaching 80% of it."""
    if not curves:
        return "No committed profile has measured mixed steps to show here."
    parts = []
    for c in curves:
        ch = np.asarray(c["chunk"])
        at = [
            f"a {n}-token chunk makes it {c['step_ms'][i]:.1f} ms ({c['over_decode'][i]:.1f}x) at "
            f"{c['share'][i]:.0%} of the best prefill throughput measured"
            for n in chunks
            for i in np.flatnonzero(ch == n)
        ]
        reach = ch[np.asarray(c["share"]) >= 0.8]
        tail = (
            f"; reaching 80% of it takes {reach[0]:.0f}-token chunks, {reach[0] / c['bstar']:.0f} times B* "
            f"(= {c['bstar']:.0f})"
            if reach.size
            else ""
        )
        parts.append(
            f"On {c['label']}, the decode-only step of {c['decodes']} rows at {c['ctx']:.0f} tokens "
            f"each takes {c['decode_ms']:.1f} ms; " + "; ".join(at) + tail + "."
        )
    return " ".join(parts)


def real_chunk_text(curves: Sequence[Mapping[str, Any]], rs: Mapping[str, Any]) -> str:
    """7.3, measured: what the real stall run's chunk size (:func:`real_stall` result ``rs``)
    means on the device it ran on, read from that device's :func:`profile_chunk_steps` curve:
    the chunk against the profile's B*, whether the chunk steps still stall the decodes
    (over twice their median ITL: chunks then spread the stall over the prompt's chunks
    rather than remove it), and the share of the best prefill throughput the chunk keeps,
    with the smallest measured chunk that keeps 80%."""
    hw = rs["executor"].get("hardware")
    chunk, n = int(rs["chunk"]), rs["numbers"]
    curve = next((c for c in curves if c["device"] == hw), None)
    if curve is None:
        return (
            f"No committed profile of this device ({hw}) measures mixed steps, so its B* and how "
            f"much prefill throughput a {chunk}-token chunk gives up are not known here."
        )
    bstar = float(curve["bstar"])
    stall = float(n["chk_prefill_itl_p50_ms"] / n["chk_itl_p50_ms"])
    verdict = (
        "so each chunk step is compute-bound and the running requests still wait "
        f"{stall:.1f}x their median inter-token latency on it (the median chunk step): here chunks "
        f"spread the stall over the prompt's {rs['chunks']} chunks rather than remove it"
        if stall > 2
        else f"and the median chunk step holds the running requests for only {stall:.1f}x their median "
        "inter-token latency"
    )
    out = (
        f"A {chunk}-token chunk is {chunk / bstar:.0f} times this machine's B* (= {bstar:.0f}, from its "
        f"profile), {verdict}."
    )
    ch, share = np.asarray(curve["chunk"]), np.asarray(curve["share"])
    if chunk in ch:
        reach = ch[share >= 0.8]
        out += (
            f" Smaller chunks would shorten those steps but waste prefill throughput: in the profile a "
            f"{chunk}-token chunk already runs at {share[ch == chunk][0]:.0%} of the best prefill "
            f"throughput measured"
            + (f", and reaching 80% of it takes {reach[0]:.0f}-token chunks." if reach.size else ".")
        )
    return out


def calibration_text(rs: Mapping[str, Any], tol: float = 0.10) -> str:
    """7.3, measured: what the calibration of a :func:`real_stall` run measured and what it is
    for (placing the long prompt's arrival), beside the median inter-token latency the runs
    themselves measured (``<tag>_itl_p50_ms``), which the table quotes and every stall ratio
    divides by. Within ``tol`` of the calibration's step they are said to agree; otherwise
    both are given, each named, and the page says which one the ratios use."""
    dec, n = float(rs["decode_ms"]), rs["numbers"]
    meds = [float(n[f"{t}_itl_p50_ms"]) for t in ("mix", "sep", "chk") if f"{t}_itl_p50_ms" in n]
    head = (
        f"A calibration run first times the running batch's decode-only step, {dec:.1f} ms here (the "
        f"median of its later steps), only to place the long prompt: it arrives {rs['lead_steps']} such steps "
        f"after their prefill ends, at t = {rs['at_s']:.2f} s."
    )
    if not meds:
        return head
    lo, hi = min(meds), max(meds)
    span = f"{lo:.1f} ms" if f"{lo:.1f}" == f"{hi:.1f}" else f"{lo:.1f} to {hi:.1f} ms"
    if all(abs(m / dec - 1) <= tol for m in meds):
        return (
            head
            + f" In the runs themselves the running requests' median inter-token latency was {span}, close to it."
        )
    return head + (
        f" In the runs themselves the running requests' median inter-token latency was {span}, not "
        f"the calibration's {dec:.1f} ms: the table quotes the runs' own median, and every stall below "
        f"is a multiple of it."
    )


def slow_steps_text(rs: Mapping[str, Any], tag: str = "chk") -> str:
    """7.3, measured: where the slow steps of a :func:`real_stall` run (configuration ``tag``)
    came from, from :func:`spike_summary`'s split: before the long prompt arrived (the
    running requests' own prompts), during its prefill, and after its first token (none is
    expected there: any is noise on the machine)."""
    n = rs["numbers"]
    before, during, after = (int(n[f"{tag}_steps_over_2x_{k}"]) for k in ("before", "during", "after"))
    parts = [
        f"{during} came while the long prompt was prefilled (it takes {rs['chunks']} chunks of "
        f"{rs['chunk']} tokens)"
    ]
    if before:
        parts.append(
            f"{before} came before it arrived: the running requests' own {rs['running_prompt']}-token prompts "
            f"also went through the {rs['budget']}-token budget in chunks, slowing the steps of the "
            "requests admitted first, which were already decoding"
        )
    if after:
        parts.append(
            f"{after} came after its first token, with nothing left to prefill: run-to-run noise on this "
            "machine"
        )
    total = before + during + after
    if total == 0:
        return "No step took more than twice the median."
    return f"Of the {total} steps that took more than twice the median, " + "; ".join(parts) + "."


def ttft_cost_text(numbers: Mapping[str, float], margin: float = 0.05) -> str:
    """7.3, measured: what chunking cost the newcomer's first token in a :func:`real_stall`
    run (its ``numbers``), chunked against mixed prefill; a difference within ``margin`` of
    the unchunked TTFT is reported as none (run-to-run noise on a shared machine is larger)."""
    chk, mix = float(numbers["chk_ttft_ms"]), float(numbers["mix_ttft_ms"])
    if chk > mix * (1 + margin):
        return (
            f"The newcomer paid for the chunks: its first token came {chk:,.0f} ms after arrival instead of "
            f"{mix:,.0f} ms, {chk / mix - 1:.0%} later."
        )
    return (
        f"The newcomer's first token came {chk:,.0f} ms after arrival, against {mix:,.0f} ms unchunked: "
        f"in this run its chunks did not delay it measurably."
    )


def chunk_for_itl(
    cost: Any, factor: float = 2.0, decodes: int = 30, ctx: int = 300, reference: Sequence[int] = ()
) -> dict[str, float]:
    """7.3 (exercise): the largest chunk whose step, carrying ``decodes`` decodes of ``ctx``
    KV tokens, stays within ``factor`` x the decode-only step on the roofline. Returns
    ``chunk`` (tokens), ``step_ms``, ``decode_ms`` and ``share``: its prefill throughput
    over the best of ``reference`` chunk sizes and itself (the figure's right panel)."""
    base = chunk_step_times(cost, [1], decodes=decodes, ctx=ctx)["decode_s"]
    if chunk_step_times(cost, [1], decodes=decodes, ctx=ctx)["step_s"][0] > factor * base:
        raise ValueError(f"factor={factor}: even a 1-token chunk exceeds it")
    lo, hi = 1, 1 << 20  # step time grows with the chunk: bisect on the largest that fits
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if chunk_step_times(cost, [mid], decodes=decodes, ctx=ctx)["step_s"][0] <= factor * base:
            lo = mid
        else:
            hi = mid
    d = chunk_step_times(cost, [lo] + list(reference), decodes=decodes, ctx=ctx)
    return {
        "chunk": float(lo),
        "step_ms": float(d["step_s"][0]) * 1e3,
        "decode_ms": base * 1e3,
        "share": float(d["prefill_tps"][0] / d["prefill_tps"].max()),
    }


def trace_contrast(workload: Workload, other: Workload) -> dict[str, float]:
    """7.3 (exercise on the code trace): mean prompt and output lengths of ``workload`` (this
    page's requests) and ``other`` (7.2's conversation requests, as many), as ``prompt_mean``,
    ``output_mean``, ``other_prompt_mean``, ``other_output_mean``; ``prompt_ratio`` (how many
    times longer this page's prompts are) and ``output_shorter`` (how many times shorter its
    outputs are)."""
    if len(workload) == 0 or len(other) == 0:
        raise ValueError("trace_contrast() needs two non-empty workloads")
    p, o = float(np.mean(workload.prompt_lens)), float(np.mean(workload.output_lens))
    po, oo = float(np.mean(other.prompt_lens)), float(np.mean(other.output_lens))
    return {
        "prompt_mean": p,
        "output_mean": o,
        "other_prompt_mean": po,
        "other_output_mean": oo,
        "prompt_ratio": p / po,
        "output_shorter": oo / o,
    }


def chunk_sweep(
    workload: Workload,
    cost: Any,
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
    keys = (
        "ttft_p99",
        "ttft_p50",
        "itl_p99",
        "itl_p50",
        "itl_max",
        "tpot_p99",
        "e2e_p99",
        "throughput_tok",
        "steps",
    )
    out: dict[float, dict[str, np.ndarray]] = {}
    for k in time_scales:
        w = workload.scale(time=float(k)) if k != 1 else workload
        acc: dict[str, list[float]] = {key: [] for key in keys}
        for c in chunk_sizes:
            m = metrics(
                simulate(
                    w,
                    cost,
                    "chunked",
                    slots=slots,
                    kv_tokens=kv_tokens,
                    token_budget=int(c) + slots,
                    chunk_size=int(c),
                )
            )
            for key in keys:
                acc[key].append(m[key])
        ref = metrics(simulate(w, cost, "continuous", slots=slots, kv_tokens=kv_tokens))
        res = {
            "chunk": np.asarray(chunk_sizes, dtype=float),
            **{key: np.asarray(v) for key, v in acc.items()},
        }
        for key in keys:
            res[f"continuous_{key}"] = np.asarray([ref[key]])
        out[float(k)] = res
    return out
