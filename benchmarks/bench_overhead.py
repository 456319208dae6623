"""Scheduler overhead of the real engine: wall time spent outside the forward pass (7.2).

A real run with ``--slots`` requests decoding together (all arrive at t=0, short prompts,
equal outputs, so the batch stays at ``--slots`` rows for most steps) through the same
engine loop as every chapter. The wall clock of the run is split three ways:

- forward: inside the model's forward pass (``ModelRunner._forward_packed``, timed here by
  wrapping it; on the CPU the pass is synchronous, so its wall time is its cost);
- runner: the rest of a step's execution (packing ids/positions/slots from the plan,
  argmax, handing tokens back);
- engine: everything outside the executor (scheduling, committing tokens, KV
  accounting, the step log).

Overhead = (runner + engine) / wall. Target <= 3% at batch 32. Writes
``benchmarks/results/overhead-<device>-<model>.json``.

    python benchmarks/bench_overhead.py --model cpu-m --slots 32
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import statistics
import time
from pathlib import Path

import batching.real  # noqa: F401  # before torch loads: the engine's thread and huge-page defaults

# isort: split
import torch

from batching.costs.models import get_model
from batching.engine import RunResult, run
from batching.real.executor import RealExecutor
from batching.real.hardware import device_entry, machine, resolve_device
from batching.real.runner import ModelRunner
from batching.results import load_average
from batching.schedulers import make_scheduler
from batching.workloads import Workload

ROOT = Path(__file__).resolve().parent.parent


def timed_run(runner: ModelRunner, scheduler_name: str, slots: int, prompt: int, output: int) -> dict:
    """One run; returns the wall-time split and the step counts."""
    forward_s = 0.0
    inner = runner._forward_packed

    def timed(*args, **kw):
        nonlocal forward_s
        t0 = time.perf_counter()
        out = inner(*args, **kw)
        forward_s += time.perf_counter() - t0
        return out

    runner._forward_packed = timed  # type: ignore[method-assign]
    try:
        wl = Workload.from_arrays([0.0] * slots, [prompt] * slots, [output] * slots, name="overhead")
        sched = make_scheduler(scheduler_name, max_context=runner.max_len, slots=slots)
        res: RunResult = run(wl.fresh(), sched, RealExecutor(runner, warmup=False))
    finally:
        del runner._forward_packed
    execute_s = float(sum(res.log.cols["dur"]))
    return {
        "wall_s": res.wall_s,
        "forward_s": forward_s,
        "runner_s": execute_s - forward_s,
        "engine_s": res.wall_s - execute_s,
        "steps": res.num_steps,
        "overhead_frac": (res.wall_s - forward_s) / res.wall_s,
        "engine_frac": (res.wall_s - execute_s) / res.wall_s,
        "runner_frac": (execute_s - forward_s) / res.wall_s,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cpu-m")
    p.add_argument("--device", default="auto")
    p.add_argument("--slots", type=int, default=32)
    p.add_argument("--prompt", type=int, default=16)
    p.add_argument("--output", type=int, default=64)
    p.add_argument("--schedulers", default="continuous,chunked,static")
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    dev = resolve_device(a.device)
    if dev.type != "cpu":
        raise SystemExit(
            "the forward pass is timed with the host clock: CPU only (on a GPU it is asynchronous)"
        )
    load0 = load_average()
    runner = ModelRunner.from_shape(get_model(a.model), a.slots, device=dev, max_len=a.prompt + a.output + 1)
    runner.warmup()
    names = a.schedulers.split(",")
    rounds: dict[str, list[dict]] = {n: [] for n in names}
    for i in range(a.rounds):
        for n in names if i % 2 == 0 else names[::-1]:  # alternate the order over rounds
            rounds[n].append(timed_run(runner, n, a.slots, a.prompt, a.output))
    summary = {
        n: {
            "overhead_frac_median": statistics.median(r["overhead_frac"] for r in rs),
            "engine_frac_median": statistics.median(r["engine_frac"] for r in rs),
            "runner_frac_median": statistics.median(r["runner_frac"] for r in rs),
            "ms_per_step_median": statistics.median(r["wall_s"] / r["steps"] * 1e3 for r in rs),
            "overhead_ms_per_step_median": statistics.median(
                (r["wall_s"] - r["forward_s"]) / r["steps"] * 1e3 for r in rs
            ),
        }
        for n, rs in rounds.items()
    }
    doc = {
        "benchmark": "scheduler overhead (wall time outside the forward pass)",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": device_entry(dev).name,
        "device_name": device_entry(dev).device_name,
        "machine": machine(dev).to_dict(),
        "model": a.model,
        "dtype": "fp32",
        "torch": torch.__version__,
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
        "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
        "workload": {
            "requests": a.slots,
            "slots": a.slots,
            "prompt": a.prompt,
            "output": a.output,
            "arrivals": "all at t=0",
        },
        "loadavg_before": load0,
        "loadavg_after": load_average(),
        "command": f"python benchmarks/bench_overhead.py --model {a.model} --slots {a.slots} "
        f"--prompt {a.prompt} --output {a.output} --rounds {a.rounds}",
        "target": {"overhead_frac": 0.03},
        "summary": summary,
        "rounds": rounds,
    }
    out = ROOT / "benchmarks" / "results" / f"overhead-{device_entry(dev).name}-{a.model}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
