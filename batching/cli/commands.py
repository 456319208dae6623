"""The engine's commands: ``simulate`` (the schedulers on a simulated clock), ``run`` (on a
real torch model) and ``measure`` (a device's step costs into a profile)."""

from __future__ import annotations

import argparse
from typing import Any

from .. import results
from ..costs import get_cost_model, get_model
from ..engine import RunResult, SimExecutor, run
from ..workloads import Workload
from .options import (
    add_output_args,
    add_scheduler_args,
    add_workload_args,
    load_workload,
    parse_slo,
    progress,
    scheduler,
    workload_config,
    write_outputs,
)


def _report(a: argparse.Namespace, res: RunResult, w: Workload, config: dict[str, Any]) -> int:
    config = {**config, **workload_config(a, w), "model": a.model, "device": a.device, "dtype": a.dtype}
    write_outputs(
        a, results.build(res, config, parse_slo(a), include_steps=a.steps, include_token_times=a.token_times)
    )
    return 0


def cmd_simulate(a: argparse.Namespace) -> int:
    parse_slo(a)  # bad SLO text fails before the run, not after
    cost = get_cost_model(a.model, a.device, tp=a.tp, profile=a.profile, dtype=a.dtype)
    max_ctx = get_model(a.model).max_context
    w = load_workload(a, max_ctx)
    kv_tokens = cost.kv_capacity()
    if a.kv_tokens is not None:
        if a.kv_tokens > kv_tokens:  # the devices' memory decides, not the flag
            raise ValueError(
                f"--kv-tokens={a.kv_tokens}: {a.model} on {a.tp} x {a.device} leaves room "
                f"for {kv_tokens} KV tokens after the weights"
            )
        kv_tokens = a.kv_tokens
    sched = scheduler(a, max_ctx, kv_tokens)
    res = run(
        w.fresh(),
        sched,
        SimExecutor(cost),
        record_slots=a.slot_log,
        progress=progress(a),
    )
    return _report(a, res, w, {"command": "simulate", "tp": a.tp, "profile": a.profile})


def cmd_run(a: argparse.Namespace) -> int:
    parse_slo(a)
    from ..real.executor import run_real  # torch is needed here only
    from ..real.hardware import DeviceMemoryError, resolve_device

    resolve_device(a.device)  # no usable GPU is said first, in one line (a ValueError)
    if a.checkpoint:
        from ..real.checkpoint import read_config

        ckpt = read_config(a.checkpoint)
        a.model = ckpt.name  # the checkpoint's shape replaces --model's
        max_ctx = a.max_len or ckpt.max_context
    else:
        max_ctx = a.max_len or get_model(a.model).max_context
    w = load_workload(a, max_ctx)
    # The runner allocates one slab per slot, so the slab layout's capacity is what it holds.
    kv_tokens = a.kv_tokens if a.kv_tokens is not None else a.slots * max_ctx
    sched = scheduler(a, max_ctx, kv_tokens)
    try:
        res = run_real(
            w,
            sched,
            a.model,
            device=a.device,
            dtype=a.dtype,
            seed=a.seed,
            threads=a.threads,
            max_len=a.max_len,
            checkpoint=a.checkpoint,
            graphs=False if a.no_graphs else None,
            record_slots=a.slot_log,
            progress=progress(a),
        )
    except DeviceMemoryError as e:  # bad input (too big for this device): one line, exit 2
        raise ValueError(str(e)) from None
    return _report(
        a,
        res,
        w,
        {"command": "run", **{k: getattr(a, k) for k in ("max_len", "threads", "checkpoint", "no_graphs")}},
    )


def _ints(text: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from None


def _pairs(text: str) -> list[tuple[int, int]]:
    try:
        return [(int(r), int(t)) for r, t in (x.split("x") for x in text.split(",") if x)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated ROWSxTOKENS pairs") from None


# ``measure``'s default grids, (GPU, CPU). Batch 1 to 256 on every device; on the CPU every
# batch is padded to a bucket (model.padded_tokens): the grid holds the buckets a step of up
# to 64 rows lands on. Small prefills densely: on a CPU a step's cost rises steeply from 1 to
# ~8 tokens and then flattens (cpu-s: 2 tokens 12.8 ms, 8: 19.5, 32: 26.9), which coarse
# linear interpolation under-predicts by 20-30% in between. Chunk sizes x decode rows, so
# that the profile interpolates mixed steps rather than adding a prefill and a decode step.
# Equal prompts side by side (ROWSxTOKENS) at totals the single-prompt grid measured: the
# difference is attention (ProfileCost prices a padded static batch with it); on a CPU also
# past the longest prompt cpu-s takes (a padded static batch can hold 8,000 positions).
_MEASURE_GRIDS: dict[str, tuple[list[Any], list[Any]]] = {
    "batches": ([1, 2, 4, 8, 16, 32, 64, 128, 256], [1, 2, 4, 8, 16, 24, 32, 48, 64, 128, 256]),
    "ctxs": ([128, 1024, 4096], [8, 32, 128, 512, 1024]),
    "prefill": ([64, 256, 1024, 2048, 8192], [1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 256, 512, 1024, 2048]),
    "mixed_chunks": ([256, 512, 2048], [2, 4, 8, 16, 32, 64, 128, 256, 512]),
    "mixed_rows": ([1, 32, 128], [1, 2, 4, 8, 16]),
    "prefill_rows": (
        [(4, 512), (16, 128), (4, 2048)],
        [(2, 512), (8, 128), (4, 512), (16, 128), (4, 1024), (16, 512)],
    ),
}


def cmd_measure(a: argparse.Namespace) -> int:
    from ..real.hardware import DeviceMemoryError, resolve_device
    from ..real.measure import measure  # torch is needed here only

    # The device first: the GPU grid's lengths would otherwise be refused before "no GPU".
    col = 0 if resolve_device(a.device).type == "cuda" else 1
    # A flag given replaces its grid; --prefill-rows '' means none.
    g = {
        k: v if (v := getattr(a, k)) or (k == "prefill_rows" and v is not None) else grids[col]
        for k, grids in _MEASURE_GRIDS.items()
    }
    try:
        doc = measure(
            a.model,
            a.device,
            a.dtype,
            batches=g["batches"],
            ctxs=g["ctxs"],
            prefill_tokens=g["prefill"],
            mixed=[(t, r, a.mixed_ctx) for t in g["mixed_chunks"] for r in g["mixed_rows"]],
            prefill_rows=g["prefill_rows"],
            reps=a.reps,
            rounds=a.rounds,
            seed=a.seed,
            graphs=False if a.no_graphs else None,
            progress=progress(a),
            # A run cut short (a time limit, ^C) keeps what it measured: meta.partial says so.
            partial=(lambda doc: results.write_json(doc, a.out, allow_nan=True)) if a.out else None,
        )
    except DeviceMemoryError as e:  # bad input (too big for this device): one line, exit 2
        raise ValueError(str(e)) from None
    d, m = doc["device"], doc["meta"]
    print(
        f"{m['model']} {m['dtype']} on {m['device_name']} ({m['device']}), torch {m['torch']}, "
        f"{m['threads']} threads, {m['wall_s']:.0f} s"
    )
    print(
        f"  bandwidth GB/s: copy {d['bandwidth']['copy']['GBps_best']:.1f}, read "
        f"{d['bandwidth']['read']['GBps_best']:.1f}, matvec {d['bandwidth']['matvec']['GBps_best']:.1f};"
        f"  matmul {d['matmul_peak']['TFLOPs_best'] * 1e3:,.0f} GFLOP/s"
    )
    print(
        "  decode ms (rows x ctx): "
        + "  ".join(
            f"B={b}: " + "/".join(f"{x:.1f}" for x in row)
            for b, row in zip(doc["decode"]["batch"], doc["decode"]["ms"])
        )
    )
    print(
        "  prefill ms: "
        + "  ".join(f"{t}: {x:.1f}" for t, x in zip(doc["prefill"]["tokens"], doc["prefill"]["ms"]))
    )
    if a.out:
        print(f"wrote {results.write_json(doc, a.out, allow_nan=True)}")
    return 0


def cmd_kernels(a: argparse.Namespace) -> int:
    from ..real import kernels  # torch is needed here only
    from ..real.executor import kernel_plan
    from ..real.hardware import resolve_device

    shape = get_model(a.model)
    if a.probe:  # a fresh probe replaces this machine's cached one
        kernels.forget(shape)
    plan = kernel_plan(shape, resolve_device("cpu"), a.dtype)
    print(f"{shape.name} on this CPU ({plan.source}): {plan.describe()}")
    print(f"  dtype {plan.dtype}: {plan.dtype_reason}")
    for d, per in (plan.ms or {}).items():
        rows = sorted({r for t in per.values() for r in t})
        print(f"  {d} ms per pass over the linear layers, by rows: " + ", ".join(map(str, rows)))
        for path, t in per.items():
            print(f"    {path:6}" + "".join(f"{t[r]:8.2f}" if r in t else " " * 8 for r in rows))
    return 0


def add_parsers(sub: Any) -> None:
    """Register ``simulate``, ``run``, ``measure`` and ``kernels`` on ``sub``."""
    s = sub.add_parser("simulate", help="run a workload through a scheduler on a simulated clock")
    add_workload_args(s)
    add_scheduler_args(s)
    g = s.add_argument_group("cost model")
    g.add_argument("--model", default="llama-8b")
    g.add_argument("--device", default="h100")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    g.add_argument("--dtype", help="weight dtype override, e.g. fp8")
    g.add_argument("--profile", help="measured profile JSON instead of the roofline")
    add_output_args(s)
    s.set_defaults(func=cmd_simulate)

    r = sub.add_parser("run", help="run a workload through a scheduler on a real torch model")
    add_workload_args(r)
    add_scheduler_args(r)
    g = r.add_argument_group("model")
    g.add_argument("--model", default="cpu-s")
    g.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    g.add_argument(
        "--dtype",
        default="auto",
        help="auto (default: bf16 on CUDA; on a CPU the faster of fp32 and bf16 here, probed once "
        "and cached), fp32 or bf16",
    )
    g.add_argument("--max-len", type=int, help="slab length per slot (default: the model's context)")
    g.add_argument("--threads", type=int, help="torch intra-op threads")
    g.add_argument(
        "--no-graphs",
        action="store_true",
        help="run decode steps eagerly on CUDA instead of replaying CUDA graphs",
    )
    g.add_argument(
        "--checkpoint",
        metavar="DIR",
        help="Hugging Face Llama checkpoint (config.json + model.safetensors) to load instead of "
        "--model's seeded random weights; needs the bench extra",
    )
    add_output_args(r)
    r.set_defaults(func=cmd_run)

    m = sub.add_parser("measure", help="measure step costs of a model on this device into a profile")
    m.add_argument("--model", default="cpu-m")
    m.add_argument("--device", choices=["auto", "cpu", "cuda"], default="auto")
    m.add_argument(
        "--dtype",
        default="auto",
        help="auto (default: bf16 on CUDA; on a CPU the faster of fp32 and bf16 here), fp32 or bf16",
    )
    m.add_argument("--batches", type=_ints, help="decode batch sizes, e.g. 1,2,4,8")
    m.add_argument("--ctxs", type=_ints, help="decode context lengths per row")
    m.add_argument("--prefill", type=_ints, help="prefill lengths")
    m.add_argument("--mixed-rows", type=_ints, help="decode rows beside a prefill chunk")
    m.add_argument("--mixed-chunks", type=_ints, help="prefill chunk sizes of the mixed grid")
    m.add_argument("--mixed-ctx", type=int, default=128, help="decode context of the mixed grid")
    m.add_argument(
        "--prefill-rows",
        type=_pairs,
        help="equal prompts in one pass as ROWSxTOKENS, e.g. 8x128,4x512 (none: '')",
    )
    m.add_argument("--reps", type=int, default=3, help="repetitions of each step per round")
    m.add_argument("--rounds", type=int, default=3, help="sweeps of the whole grid, pooled per point")
    m.add_argument("--seed", type=int, default=0)
    m.add_argument(
        "--no-graphs",
        action="store_true",
        help="time decode steps eagerly on CUDA instead of replaying CUDA graphs",
    )
    m.add_argument("--out", help="profile JSON, e.g. data/profiles/cpu-here-cpu-m.json")
    m.add_argument("--no-progress", action="store_true")
    m.set_defaults(func=cmd_measure)

    k = sub.add_parser(
        "kernels",
        help="the CPU kernels and dtype this machine's probe chose for a model (probed once, cached)",
    )
    k.add_argument("--model", default="cpu-s")
    k.add_argument("--dtype", default="auto", help="auto (default), fp32 or bf16")
    k.add_argument("--probe", action="store_true", help="probe again (e.g. after a run on a busy machine)")
    k.set_defaults(func=cmd_kernels)
