"""Decode efficiency and the knee, measured side by side in one run ("Why batching").

Decode efficiency at batch 1 = (weight + KV bytes read) / step time, as a fraction of the
best read bandwidth a single matrix-vector product reaches over the same number of weight
bytes in the same run (and of copy bandwidth). Target: >= 0.70 on the CPU for the CPU-demo
model, >= 0.80 on an H200 for the 8B shape. The knee: the largest batch whose decode step
stays within 1.25x (and 2x) of batch 1, beside the roofline
B* = peak FLOP/s x bytes per weight / (2 x bandwidth) measured on the same device.
Writes ``benchmarks/results/decode-<device>-<model>.json``.

    python benchmarks/bench_decode.py --model cpu-m
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
from pathlib import Path

import batching.real  # noqa: F401  # before torch loads: the engine's thread and huge-page defaults

# isort: split
import torch

from batching.costs.models import get_model
from batching.real.executor import resolve_dtype
from batching.real.hardware import device_entry, machine, resolve_device
from batching.real.kernels import dtype_name
from batching.real.measure import StepTimer, bandwidth, matmul_peak, time_fn
from batching.real.measure import matvec as matvec_op
from batching.real.runner import ModelRunner
from batching.results import load_average

ROOT = Path(__file__).resolve().parent.parent


def numpy_matvec(nbytes: int, reps: int = 7) -> list[float]:
    """GB/s of numpy's matrix-vector product over ``nbytes`` of fp32 weights, one per rep.

    The best matrix-vector product on a CPU is not necessarily torch's: measured here,
    numpy's OpenBLAS streamed 26-29 GB/s against MKL's 22-23 (MKL reads no faster with two
    threads than with one on this AMD EPYC; OpenBLAS uses both cores; so does MKL when the
    product is split into one ``bmm`` piece per thread, ``matvec_split``: 33-35 GB/s, which
    is how the model's one-token steps now multiply). The model keeps MKL:
    inside a step, OpenBLAS's threads and torch's OpenMP threads fight over the two cores
    (a cpu-m batch-1 step 104 ms against 26 with MKL; 24 against 26.5 with torch on one
    thread for the step, but in a live mix a batch-4 step right after such a step took 110
    ms against 43, OpenBLAS's idle threads still spinning). So this is reported as the
    machine's ceiling beside torch's own."""
    import time

    import numpy as np

    n = nbytes // 4 // 4096 * 4096
    w = np.random.default_rng(0).random(n, dtype=np.float32).reshape(-1, 4096)
    x = np.ones(4096, dtype=np.float32)
    w @ x
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        w @ x
        out.append(w.nbytes / (time.perf_counter() - t0) / 1e9)
    return out


#: The aten kernels that multiply by a weight matrix in a CPU decode step (``Llama.linear``).
MATMUL_OPS = ("aten::bmm", "aten::mm", "aten::addmm", "aten::mv", "aten::addmv", "aten::addmv_")


def batch1_breakdown(runner: ModelRunner, ctx: int, weight_bytes: int, reps: int = 10) -> dict:
    """Where a CPU batch-1 step's time goes: the self CPU time of the matrix products
    (:data:`MATMUL_OPS`) against every other op, per step, from ``torch.profiler`` over
    ``reps`` timed steps (plus the timer's warm-ups). The profiler adds a few microseconds
    to every op, so ``other_ms`` is an upper bound and the matrix products' share a lower
    one. ``matmul_GBps`` is the weight bytes over the products' time: the rate the step's
    weight stream reaches, against which the step's efficiency loses the rest to
    ``other_ms``."""
    from torch.profiler import ProfilerActivity, profile

    timer = StepTimer(runner, reps=reps)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        timer.decode(1, ctx + 2)  # a context of its own: no repetition of an earlier step
    steps = reps + timer.warmup
    ev = prof.key_averages()
    mm = sum(e.self_cpu_time_total for e in ev if e.key in MATMUL_OPS) / 1e3 / steps  # ms per step
    total = sum(e.self_cpu_time_total for e in ev) / 1e3 / steps
    calls = sum(e.count for e in ev) / steps
    mm_calls = sum(e.count for e in ev if e.key in MATMUL_OPS) / steps
    top = sorted((e for e in ev if e.key not in MATMUL_OPS), key=lambda e: -e.self_cpu_time_total)[:8]
    return {
        "steps": steps,
        "matmul_ms": mm,
        "other_ms": total - mm,
        "profiled_step_ms": total,
        "matmul_share": mm / total,
        "matmul_GBps": weight_bytes / (mm / 1e3) / 1e9,
        "ops_per_step": calls,
        "matmul_calls_per_step": mm_calls,
        "top_other_ops": {
            e.key: {"ms_per_step": e.self_cpu_time_total / 1e3 / steps, "calls_per_step": e.count / steps}
            for e in top
        },
        "how": "torch.profiler self CPU time per step; profiler overhead inflates every op a little",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cpu-m")
    p.add_argument("--device", default="auto")
    p.add_argument("--ctx", type=int, default=128)
    p.add_argument("--batches", default="1,2,4,8,16,32,64")
    p.add_argument("--reps", type=int, default=7, help="repetitions per batch size and round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument(
        "--pairs",
        type=int,
        default=40,
        help="batch-1 steps alternated with matrix-vector products for the paired ratio",
    )
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="results file (default benchmarks/results/decode-<device>-<model>.json)",
    )
    a = p.parse_args()
    dev = resolve_device(a.device)
    dtype = resolve_dtype(None, dev)
    shape = get_model(a.model).with_dtype(dtype_name(dtype))
    batches = [int(x) for x in a.batches.split(",")]
    load0 = load_average()
    runner = ModelRunner.from_shape(
        get_model(a.model), max(batches), device=dev, dtype=dtype, max_len=a.ctx * 3 // 2 + 2
    )
    runner.warmup()
    timer = StepTimer(runner, a.reps, pool=True)
    # Rounds interleave the step sweep with the bandwidth references, so that a slow
    # stretch of this shared machine hits both sides of the ratio alike; each batch's
    # figure pools its repetitions over all rounds, the bandwidths take their best round.
    steps: dict[int, dict] = {}
    # On CUDA the same steps again without graphs, interleaved: what replaying a captured
    # step saves over launching its ~20 kernels per layer from Python (graphs.py).
    graphs = runner.graphs if runner.graphs is not None and runner.graphs.capture else None
    eager_timer = StepTimer(runner, a.reps, pool=True) if graphs is not None else None
    eager: dict[int, dict] = {}
    bws = []
    np_mv: list[float] = []  # GB/s of numpy's matvec (OpenBLAS) over the same bytes, every rep
    for _ in range(a.rounds):
        for b in batches:
            steps[b] = timer.decode(b, a.ctx)  # statistics over every round so far
        if eager_timer is not None and runner.graphs is not None:  # (None: a capture failed)
            runner.graphs = None
            try:
                for b in batches:
                    eager[b] = eager_timer.decode(b, a.ctx)
            finally:
                runner.graphs = graphs
        bws.append(bandwidth(dev, dtype, shape.weight_read_bytes))
        if dev.type == "cpu":
            np_mv.extend(numpy_matvec(shape.weight_read_bytes))
    bw = {
        k: (
            max((x[k] for x in bws), key=lambda v: v["GBps_best"])
            if isinstance(bws[0][k], dict)
            else bws[0][k]
        )
        for k in bws[0]
    }
    peak = matmul_peak(dev, dtype, 2048 if dev.type == "cpu" else 8192)
    t1 = steps[1]["median_ms"] / 1e3
    read = shape.weight_read_bytes + shape.kv_bytes_per_token * (a.ctx + 1)
    # Paired: one batch-1 step, then one matrix-vector product over the same weight bytes,
    # alternating; each pair's ratio sees the machine at one moment, so a drift of its speed
    # over minutes (20-30% on this project's VM) cancels instead of widening the gap
    # between a median step and a best product measured at different times.
    mv, mv_bytes = matvec_op(dev, dtype, shape.weight_read_bytes, bw["matvec"]["layout"])
    single = StepTimer(runner, reps=1, warmup=0)
    single.decode(1, a.ctx), time_fn(mv, dev, reps=1, warmup=0)  # an untimed first pair (cold buffers)
    paired = []
    for _ in range(a.pairs):
        t_step = single.decode(1, a.ctx)["median_ms"] / 1e3
        t_mv = time_fn(mv, dev, reps=1, warmup=0)[0]
        paired.append((read / t_step) / (mv_bytes / t_mv))
    del mv
    matvec = bw["matvec"]["GBps_best"] * 1e9
    copy = bw["copy"]["GBps_best"] * 1e9
    knee = {
        f"{x}x": max(b for b in batches if steps[b]["median_ms"] <= x * steps[1]["median_ms"])
        for x in (1.25, 2.0)
    }
    bstar = peak["TFLOPs_best"] * 1e12 * shape.bytes_per_param / (2 * matvec)
    doc = {
        "benchmark": "decode efficiency and knee",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_entry(dev).name,
        "device_name": device_entry(dev).device_name,
        "datasheet": device_entry(dev).datasheet,
        "machine": machine(dev).to_dict(),
        "model": a.model,
        "dtype": shape.dtype,
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "ctx": a.ctx,
        "rounds": a.rounds,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "linear": runner.model.linear_form,
        "command": f"python benchmarks/bench_decode.py --model {a.model} --device {a.device} --ctx {a.ctx} --reps {a.reps} --rounds {a.rounds} --pairs {a.pairs}",
        "loadavg_before": load0,
        "loadavg_after": load_average(),
        "step_ms": {b: steps[b] for b in batches},
        "bytes_read_batch1": read,
        "achieved_GBps_batch1": read / t1 / 1e9,
        "efficiency_vs_matvec": read / t1 / matvec,
        "efficiency_vs_copy": read / t1 / copy,
        "efficiency_best_vs_best": read / (steps[1]["min_ms"] / 1e3) / matvec,
        "efficiency_median_vs_median": read / t1 / (bw["matvec"]["GBps_median"] * 1e9),
        "efficiency_paired_median": statistics.median(paired) if paired else None,
        "numpy_matvec_GBps": ({"best": max(np_mv), "median": statistics.median(np_mv)} if np_mv else None),
        "efficiency_vs_numpy_matvec": (read / t1 / (max(np_mv) * 1e9)) if np_mv else None,
        "efficiency_paired": paired,
        "efficiency_note": (
            "efficiency_vs_matvec: median step against the run's best matvec (the most "
            "conservative); best_vs_best and median_vs_median compare like with like; "
            "paired_median: the median over alternating (step, matvec) pairs of each "
            "pair's ratio, which a slow drift of the machine's speed cancels out of"
        ),
        "bandwidth": bw,
        "matmul_peak": peak,
        "knee": knee,
        "bstar_roofline": bstar,
        "targets": {"efficiency_vs_matvec": 0.70 if dev.type == "cpu" else 0.80},
        "decode_graphs": runner.graphs is not None,
        "decode_graphs_info": runner.graphs_info(),
        "attention": runner.attention_backends(),
    }
    if dev.type == "cpu":
        doc["batch1_breakdown"] = batch1_breakdown(runner, a.ctx, shape.weight_read_bytes)
    if eager:
        doc["eager_step_ms"] = {b: eager[b] for b in batches}
        doc["efficiency_vs_matvec_eager"] = read / (eager[1]["median_ms"] / 1e3) / matvec
        doc["graphs_speedup"] = {b: eager[b]["median_ms"] / steps[b]["median_ms"] for b in batches}
    out = a.out or ROOT / "benchmarks" / "results" / f"decode-{device_entry(dev).name}-{a.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: doc[k]
                for k in (
                    "achieved_GBps_batch1",
                    "efficiency_vs_matvec",
                    "efficiency_vs_copy",
                    "efficiency_best_vs_best",
                    "efficiency_median_vs_median",
                    "efficiency_paired_median",
                    "efficiency_vs_numpy_matvec",
                    "efficiency_vs_matvec_eager",
                    "graphs_speedup",
                    "knee",
                    "bstar_roofline",
                )
                if k in doc
            },
            indent=1,
        )
    )
    if "batch1_breakdown" in doc:
        bd = doc["batch1_breakdown"]
        print(
            f"batch 1 (profiled): matrix products {bd['matmul_ms']:.1f} ms at {bd['matmul_GBps']:.1f} GB/s, "
            f"other ops {bd['other_ms']:.1f} ms ({bd['ops_per_step']:.0f} ops per step)"
        )
    print({b: round(steps[b]["median_ms"], 1) for b in batches})


if __name__ == "__main__":
    main()
