"""Command line: ``python -m batching simulate ...`` (the simulator behind 7.1-7.3's figures).

Example::

    python -m batching simulate --trace azure-conv --scheduler continuous \\
        --model llama-70b --device h200 --tp 2 --slots 64 --out results.json
"""
from __future__ import annotations

import argparse
import math
import sys
from pathlib import Path
from typing import Any, Sequence

from . import results
from .costs import get_cost_model
from .engine import SimExecutor, run
from .metrics import SLO
from .models import get_model
from .schedulers import SCHEDULERS, make_scheduler
from .traces import load_trace
from .workload import PRESETS, Workload, preset


def _window(text: str) -> tuple[float, float]:
    a, sep, b = text.partition(":")
    try:
        if not sep:
            raise ValueError
        return float(a), float(b)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected START:END in seconds") from None


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument("--trace", help="trace file (.csv Azure, .jsonl Mooncake) or name: azure-conv, azure-code, mooncake-conv")
    src.add_argument("--preset", help=f"synthetic preset: {', '.join(PRESETS)}")
    g.add_argument("--limit", type=int, help="first N requests of the trace")
    g.add_argument("--window", type=_window, help="START:END seconds of the trace")
    g.add_argument("--time-scale", type=float, default=1.0, help="replay k times faster")
    g.add_argument("--scale-lengths", type=float, default=1.0, help="divide prompt and output lengths by k")
    g.add_argument("--cap", action="store_true", help="cap requests longer than the model's context (counted, never silent)")
    g.add_argument("-n", "--num-requests", type=int, help="preset size")
    g.add_argument("--rate", type=float, help="preset arrival rate (req/s)")
    g.add_argument("--seed", type=int, default=0)


def add_scheduler_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduler")
    g.add_argument("--scheduler", choices=list(SCHEDULERS), required=True)
    g.add_argument("--slots", type=int, default=32, help="batch size (static, dynamic) or max running requests")
    g.add_argument("--timeout", type=float, default=0.0, help="static: seal timeout; dynamic: max wait (s)")
    g.add_argument("--prefill-mode", choices=["mixed", "separate"], default="mixed")
    g.add_argument("--token-budget", type=int, default=512, help="chunked: tokens per step")
    g.add_argument("--chunk-size", type=int, help="chunked: max prefill chunk (default: the budget)")
    g.add_argument("--kv-policy", choices=["slab", "exact"], default="slab")
    g.add_argument("--kv-tokens", type=int, help="KV capacity in tokens (default: what the device memory leaves)")


def load_workload(a: argparse.Namespace, max_context: int) -> Workload:
    if a.trace:
        w = load_trace(a.trace, limit=a.limit, window=a.window)
    else:
        w = preset(a.preset, seed=a.seed, n=a.num_requests, rate=a.rate)
    if a.scale_lengths != 1 or a.time_scale != 1:
        w = w.scale(lengths=a.scale_lengths, time=a.time_scale)
    w, capped = w.cap_to_context(max_context, "cap" if a.cap else "error")
    if capped:
        print(f"capped {capped} requests to the model's context of {max_context} tokens", file=sys.stderr)
    return w


def cmd_simulate(a: argparse.Namespace) -> int:
    cost = get_cost_model(a.model, a.device, tp=a.tp, profile=a.profile, dtype=a.dtype)
    max_ctx = get_model(a.model).max_context
    w = load_workload(a, max_ctx)
    kv_tokens = a.kv_tokens if a.kv_tokens is not None else cost.kv_capacity()
    sched = make_scheduler(a.scheduler, max_context=max_ctx, slots=a.slots, timeout=a.timeout,
                           prefill_mode=a.prefill_mode, token_budget=a.token_budget,
                           chunk_size=a.chunk_size, kv_capacity=kv_tokens, kv_policy=a.kv_policy)
    slo = SLO.parse(a.goodput) if a.goodput else None
    res = run(w.fresh(), sched, SimExecutor(cost), record_slots=a.slot_log,
              progress=not a.no_progress and sys.stderr.isatty())
    config = {"command": "simulate", "workload": {"name": w.name, "info": w.info, "requests": len(w)},
              "model": a.model, "device": a.device, "tp": a.tp, "dtype": a.dtype, "profile": a.profile,
              "seed": a.seed, "scale_lengths": a.scale_lengths, "time_scale": a.time_scale}
    doc = results.build(res, config, slo, include_steps=a.steps)
    print(summary_table(doc))
    if a.out:
        print(f"wrote {results.write_json(doc, a.out)}")
    if a.csv:
        print(f"wrote {results.write_requests_csv(doc, a.csv)}")
    return 0


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def summary_table(doc: dict[str, Any]) -> str:
    """The end-of-run table: throughput, utilization, latency percentiles."""
    s, c = doc["summary"], doc["config"]
    sch = c["scheduler"]
    lines = [f"{sch['scheduler']} | {c['workload']['name']} ({s['num_requests']} requests) | "
             f"{c.get('model')} on {c.get('device')} | {s['steps']:,} steps, "
             f"wall {doc['meta']['wall_s']:.2f} s",
             f"  duration {s['duration_s']:,.1f} s   throughput {s['request_throughput']:.2f} req/s, "
             f"{s['output_throughput']:,.0f} out tok/s",
             f"  slot utilization {s['slot_utilization']:.1%} (time-weighted {s['slot_utilization_time_weighted']:.1%})"
             f"   padding {s['padding_fraction']:.1%}   preemptions {s['preemptions']}"]
    if "hw_compute_utilization" in s:
        lines.append(f"  hardware utilization: compute {s['hw_compute_utilization']:.1%}, "
                     f"bandwidth {s['hw_bandwidth_utilization']:.1%}")
    lines.append(f"  {'ms':8}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    for k in ("queue", "ttft", "tpot", "itl", "e2e"):
        d = s[k]
        lines.append(f"  {k:8}" + "".join(f"{_ms(d[f]):>10}" for f in ("mean", "p50", "p90", "p99", "max")))
    if "goodput" in s:
        g = s["goodput"]
        lines.append(f"  goodput {g['request_goodput']:.2f} req/s ({g['fraction']:.1%} of requests meet {g['slo']})")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m batching", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("simulate", help="run a workload through a scheduler on a simulated clock")
    add_workload_args(s)
    add_scheduler_args(s)
    g = s.add_argument_group("cost model")
    g.add_argument("--model", default="llama-8b")
    g.add_argument("--device", default="h100")
    g.add_argument("--tp", type=int, default=1, help="tensor-parallel degree")
    g.add_argument("--dtype", help="weight dtype override, e.g. fp8")
    g.add_argument("--profile", help="measured profile JSON instead of the roofline")
    o = s.add_argument_group("output")
    o.add_argument("--out", help="results JSON")
    o.add_argument("--csv", help="per-request CSV")
    o.add_argument("--steps", action="store_true", help="include the per-step log in the JSON")
    o.add_argument("--slot-log", action="store_true", help="record each slot's occupant per step")
    o.add_argument("--goodput", help="SLOs in ms, vLLM style: 'ttft:500 tpot:50'")
    o.add_argument("--no-progress", action="store_true")
    s.set_defaults(func=cmd_simulate)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
