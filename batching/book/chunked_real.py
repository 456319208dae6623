"""7.3 measured: the long prompt among running decodes on the real model (the page's one live
figure, and the rest of that run on the measured page), and the committed profiles' mixed steps
(how big a chunk must be on real kernels). Numbers, verdicts and table rows only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..engine import RunResult
from ..results import load_average, machine_load
from ..workload import Workload
from .chunked import long_prompt_among_decodes, stall_configs, stall_summary

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


#: The real stall experiment's sizes per device type (:func:`real_stall`). On the CPU, 8
#: running requests and a 1,536-token prompt keep the runs to a few seconds. cpu-s turns
#: compute-bound within a few dozen tokens (B* ~ 13), but a chunk's prefill reaches its best
#: throughput only far above that (the committed profile: 59% of it at 64 tokens, 72% at
#: 128, 80% first at 256). Measured here with 8 decodes, chunks of 64 took 45-75 ms and the
#: whole prompt's first token came after 2.0 s against 0.7 s unchunked; chunks of 128 took
#: 85-125 ms, 1.2 s. The CPU uses 128: a TTFT cost the page can show, with chunk steps that
#: still stall the decodes several-fold (the page says so). On a GPU the page's own sizes
#: (30 running, 4,000 tokens, chunks of 512).
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
    """7.3, measured: the long prompt among running decodes on the real model.

    ``running`` requests (``running_prompt``-token prompts) start at t = 0; a short
    calibration run of the same requests (chunked, their slowest prefill) measures this
    device's decode step, and the long prompt is set to arrive ``lead_steps`` decode steps
    after their prefill ends. Each running request wants enough tokens to decode through twice
    the lead, the slowest (chunked) prefill and ``tail_steps`` more. The workload then runs
    under each of :func:`~batching.book.chunked.stall_configs` on one model.

    Returns :func:`~batching.book.chunked.stall_summary` plus ``at_s`` (the arrival),
    ``decode_ms`` (the calibration's median decode step), ``chunks`` (the long prompt's),
    ``budget``, ``labels`` ({tag: label}), ``results`` ({tag: RunResult}), ``model``,
    ``executor``, the sizes it ran with, and ``load``/``cpus``/``busy``
    (:func:`~batching.results.machine_load` around the runs). None arguments take the
    device's defaults (:data:`~batching.book.checks.REAL_MODELS`, :data:`REAL_STALL`).
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
    load0 = load_average()
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
        **machine_load(load0, load_average()),
    )
    return out


def profile_chunk_steps(profiles: Sequence[Mapping[str, Any]], decodes: int = 8) -> list[dict[str, Any]]:
    """7.3, measured: how a step with ``decodes`` running decodes grows with the prefill chunk
    it carries, read straight from each committed profile's measured mixed steps (no
    interpolation; a profile without mixed steps at ``decodes`` rows is left out).
    ``profiles``: :func:`~batching.book.profiles.load_profiles` entries.

    Each entry: ``label``, ``short`` (model, dtype, device for a legend), ``device``, ``date``,
    ``decodes``, ``ctx`` (KV tokens per decode row), ``bstar`` (the profile's), and over
    ``chunk``: ``step_ms`` (measured), ``over_decode`` (over ``decode_ms``, the decode-only step
    of the same rows and context from the profile's decode grid: the running requests' ITL
    multiplier), ``prefill_tps`` (chunk tokens per second of step) and its ``share`` of the best.
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


def chunk_efficiency(curve: Mapping[str, Any], share: float = 0.8) -> dict[str, float] | None:
    """The smallest measured chunk of a :func:`profile_chunk_steps` curve whose prefill runs at
    ``share`` or more of the best measured throughput: ``chunk`` (tokens), ``times_bstar`` (that
    chunk over the profile's B*), ``over_decode`` (its step over the decode-only one) and
    ``bstar``. None when no measured chunk reaches ``share``."""
    ch, sh = np.asarray(curve["chunk"], dtype=float), np.asarray(curve["share"], dtype=float)
    ok = np.flatnonzero(sh >= share)
    if not ok.size:
        return None
    i = int(ok[0])
    b = float(curve["bstar"])
    return {
        "chunk": float(ch[i]),
        "times_bstar": float(ch[i] / b),
        "over_decode": float(np.asarray(curve["over_decode"], dtype=float)[i]),
        "bstar": b,
    }


#: What chunks did to a measured stall (:func:`stall_verdict`).
StallVerdict = Literal["removed", "spread", "not cut"]


def stall_verdict(numbers: Mapping[str, float], factor: float = 2.0, margin: float = 0.05) -> dict[str, Any]:
    """7.3's claim tested on one stall run's ``numbers`` (:func:`~batching.book.chunked.stall_summary`,
    tags ``mix`` and ``chk``): ``verdict`` is "removed" when chunks lowered the running requests'
    worst inter-token latency and the median chunk step holds them at most ``factor`` x their
    median ITL, "spread" when the worst ITL fell but the chunk steps still exceed that (the stall
    cut into the prompt's chunks, not gone), "not cut" when chunks did not lower the worst ITL.
    Also ``whole_stall`` (unchunked worst ITL over the median), ``chunk_step_stall`` (median chunk
    step over the median ITL), ``worst_cut`` (unchunked worst ITL over chunked), ``ttft_ratio``
    (chunked TTFT over unchunked) and ``ttft_delayed`` (that ratio above 1 + ``margin``: a shared
    machine's run-to-run noise is about that)."""
    mix_max, chk_max = float(numbers["mix_itl_max_ms"]), float(numbers["chk_itl_max_ms"])
    step = float(numbers["chk_prefill_itl_p50_ms"]) / float(numbers["chk_itl_p50_ms"])
    v: StallVerdict = "not cut" if chk_max >= mix_max else ("removed" if step <= factor else "spread")
    ttft = float(numbers["chk_ttft_ms"]) / float(numbers["mix_ttft_ms"])
    return {
        "verdict": v,
        "whole_stall": float(numbers["mix_stall"]),
        "chunk_step_stall": step,
        "worst_cut": mix_max / chk_max,
        "ttft_ratio": ttft,
        "ttft_delayed": ttft > 1 + margin,
    }


def real_chunk_numbers(
    curves: Sequence[Mapping[str, Any]], rs: Mapping[str, Any], share: float = 0.8
) -> dict[str, float] | None:
    """The real stall run's chunk (``rs``: :func:`real_stall`) on the device it ran on, read
    from that device's :func:`profile_chunk_steps` curve: ``bstar`` (the profile's),
    ``chunk_over_bstar``, ``chunk_share`` (the chunk's share of the best measured prefill
    throughput; NaN when the profile did not measure that chunk) and ``chunk_good`` (the
    smallest chunk reaching ``share``; NaN if none). None when no profile of that device has
    mixed steps."""
    hw = rs["executor"].get("hardware")
    curve = next((c for c in curves if c["device"] == hw), None)
    if curve is None:
        return None
    chunk, b = float(rs["chunk"]), float(curve["bstar"])
    ch, sh = np.asarray(curve["chunk"], dtype=float), np.asarray(curve["share"], dtype=float)
    eff = chunk_efficiency(curve, share)
    return {
        "bstar": b,
        "chunk_over_bstar": chunk / b,
        "chunk_share": float(sh[ch == chunk][0]) if chunk in ch else math.nan,
        "chunk_good": eff["chunk"] if eff else math.nan,
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


def live_stall_rows(rs: Mapping[str, Any]) -> list[list[Any]]:
    """One row per configuration of a :func:`real_stall` run for the measured page (columns
    :data:`LIVE_STALL_HEADER`): the slow steps (over twice the median ITL) split by when they
    came (before the long prompt arrived, during its prefill, after its first token)."""
    n = rs["numbers"]
    rows = []
    for tag, label in rs["labels"].items():
        split = " / ".join(f"{n[f'{tag}_steps_over_2x_{k}']:.0f}" for k in ("before", "during", "after"))
        rows.append(
            [
                label,
                f"{n[f'{tag}_itl_max_ms']:.0f}",
                f"{n[f'{tag}_itl_p50_ms']:.1f}",
                f"{n[f'{tag}_prefill_itl_p50_ms']:.0f}",
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
    """One row per committed ``bench_stall.py`` result
    (:func:`~batching.book.checks.committed_real_runs`), columns :data:`COMMITTED_STALL_HEADER`.
    The median ITL is the unchunked run's own (the stall's denominator), not the calibration's."""
    rows = []
    for d in docs:
        s, n = d["stall"], d["stall"]["numbers"]
        rows.append(
            [
                f"{d['model']} {d['dtype']}, {d['device_name']}",
                d["date"][:10],
                f"{s['running']} x {s['prompt']:,}, {s['chunk']}",
                f"{n['mix_itl_max_ms'] / n['mix_stall']:.1f}",
                f"{n['mix_itl_max_ms']:,.0f} / {n['chk_itl_max_ms']:,.0f}",
                f"{n['mix_ttft_ms']:,.0f} / {n['chk_ttft_ms']:,.0f}",
            ]
        )
    return rows
