"""Capacity-search speed: what 7.2's capacity figure costs the book's build, one process.

The search for the highest sustainable rate (batching.capacity) replays the first 2,000
Azure conversations at each probed rate; near capacity no step is a pure decode run, so the
engine's fast path rarely applies and every step's per-row bookkeeping counts. Times three
of the figure's configurations (static, continuous with mixed prefill, chunked with a
512-token budget) on llama-8b and the H100 roofline, each its strict and relaxed SLO, and
writes the seconds and the rates found to ``benchmarks/results/capacity_speed.json``.

    python benchmarks/bench_capacity.py [--limit 2000] [--iters 6] [--out PATH]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching import capacity  # noqa: E402
from batching.costs import get_cost_model  # noqa: E402
from batching.results import load_average  # noqa: E402
from batching.workloads import trace_workload  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "capacity_speed.json"
CONFIGS = ("static", "continuous, mixed prefill", "chunked, budget 512")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--limit", type=int, default=2000)
    ap.add_argument("--iters", type=int, default=6)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    cost = get_cost_model("llama-8b", "h100")
    w = trace_workload("azure-conv", limit=a.limit, max_context=cost.model.max_context)
    load0, per = load_average(), {}
    for name in CONFIGS:
        t0 = time.perf_counter()
        rows = capacity.capacity_table(w, cost, {name: capacity.CONFIGS[name]}, iters=a.iters, workers=1)
        per[name] = {"seconds": time.perf_counter() - t0, "rates": {r["slo"]: r["rate"] for r in rows}}
        print(f"{name}: {per[name]['seconds']:.1f} s", flush=True)
    doc = {
        "what": "capacity_table of three configurations, one process",
        "requests": len(w),
        "iters": a.iters,
        "total_s": sum(p["seconds"] for p in per.values()),
        "configs": per,
        "machine": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "load_before": load0,
        "load_after": load_average(),
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python benchmarks/bench_capacity.py " + " ".join(argv or sys.argv[1:]),
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"total {doc['total_s']:.1f} s -> {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
