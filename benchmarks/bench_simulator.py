"""Simulator speed: the whole Azure conversation trace under continuous batching.

Target (issue: engine core): at most 5 s on the 2-core development machine for 19,366
requests (~4.1M output tokens) with the H100 roofline cost model. Vidur needs 77 s for
this trace on the same machine with a warm cache. Writes
``benchmarks/results/simulator_speed.json``.

    python benchmarks/bench_simulator.py [--trace PATH] [--repeats 3]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import statistics
import time
from pathlib import Path

from batching.costs import get_cost_model
from batching.engine import SimExecutor, run
from batching.metrics import summarize
from batching.results import load_average
from batching.schedulers import make_scheduler
from batching.workloads.traces import load_trace

OUT = Path(__file__).resolve().parent / "results" / "simulator_speed.json"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--model", default="llama-8b")
    p.add_argument("--device", default="h100")
    p.add_argument("--slots", type=int, default=256, help="vLLM's default max_num_seqs")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default=str(OUT))
    a = p.parse_args()

    t = time.perf_counter()
    w, capped = load_trace(a.trace).cap_to_context(8192, "cap")
    load_s = time.perf_counter() - t
    cost = get_cost_model(a.model, a.device)
    runs = []
    for _ in range(a.repeats):
        load0 = load_average()
        sched = make_scheduler("continuous", max_context=8192, slots=a.slots, kv_capacity=cost.kv_capacity())
        reqs = w.fresh()
        t0 = time.perf_counter()
        res = run(reqs, sched, SimExecutor(cost))
        t1 = time.perf_counter()
        s = summarize(res)
        t2 = time.perf_counter()
        runs.append(
            {
                "run_s": t1 - t0,
                "summary_s": t2 - t1,
                "loadavg_before": load0,
                "steps": s["steps"],
                "engine_iterations": len(res.log),
            }
        )
    # The fast path against stepping one at a time, side by side on the first 2,000 requests.
    part = type(w)(w.requests[:2000], name="first-2000")
    side = {}
    for fast in (True, False):
        sched = make_scheduler("continuous", max_context=8192, slots=a.slots, kv_capacity=cost.kv_capacity())
        t0 = time.perf_counter()
        r = run(part.fresh(), sched, SimExecutor(cost), fast=fast)
        side["fast" if fast else "stepwise"] = {"run_s": time.perf_counter() - t0, "steps": r.num_steps}
    doc = {
        "benchmark": "simulator speed, whole trace, continuous batching",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "trace": a.trace,
        "requests": len(w),
        "output_tokens": w.total_output_tokens,
        "capped_to_8192": capped,
        "model": a.model,
        "device": a.device,
        "slots": a.slots,
        "trace_load_s": load_s,
        "runs": runs,
        "median_run_s": statistics.median(r["run_s"] for r in runs),
        "median_run_plus_summary_s": statistics.median(r["run_s"] + r["summary_s"] for r in runs),
        "target_s": 5.0,
        "fast_vs_stepwise_first_2000": side,
        "speedup_first_2000": side["stepwise"]["run_s"] / side["fast"]["run_s"],
    }
    Path(a.out).parent.mkdir(parents=True, exist_ok=True)
    Path(a.out).write_text(json.dumps(doc, indent=1) + "\n")
    print(
        json.dumps(
            {
                k: doc[k]
                for k in (
                    "requests",
                    "output_tokens",
                    "median_run_s",
                    "median_run_plus_summary_s",
                    "speedup_first_2000",
                )
            },
            indent=1,
        )
    )


if __name__ == "__main__":
    main()
