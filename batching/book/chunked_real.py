"""7.3, measured: the long prompt among running decodes on the real model, and the committed
profiles' mixed steps (how big a chunk must be on real kernels)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from ..costs.devices import machine_of, same_machine
from ..costs.models import canonical_dtype
from ..engine import RunResult, SimExecutor, run
from ..plan import StepWork
from ..results import load_average, machine_load
from ..schedulers import make_scheduler
from ..workloads import Workload
from .chunked import long_prompt_among_decodes, stall_configs, stall_summary
from .common import machine_label, versus
from .decode import live_numbers


class UnitStep:
    """A cost model in which every step takes one second: the schedule of the step clock."""

    peak_flops = bandwidth = 0.0
    model = None  # no FLOPs: no utilization

    def step_time(self, work: StepWork) -> float:
        return 1.0

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray:
        return np.ones(k)

    def describe(self) -> dict[str, Any]:
        return {"kind": "one second per step"}


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
    runner = real_runner(model, device, slots=slots, max_len=max_len, threads=threads)
    load0 = load_average()
    runs = {
        tag: (label, serve_real(runner, w, sched, slots=slots, step_clock=True, **opts))
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


def real_chunk_numbers(sweep: Mapping[str, Any], rs: Mapping[str, Any]) -> dict[str, Any]:
    """The real stall run's chunk (``rs``: :func:`real_stall`) against the B* of this build's
    live sweep (:func:`batching.real.sweep.decode_sweep`, whose probes give the why page its B*:
    one B* per device, from one source, not a committed profile of some other machine).
    ``same_machine``: the sweep ran on the stall run's machine (CPU model and threads);
    ``above_bstar``: the chunk exceeds B*, so a chunk step is compute-bound."""
    b = live_numbers(sweep)["bstar"]
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
