"""What the commands share: the workload, scheduler and output options, the workload and
scheduler they build, and the end-of-run summary table with the files it writes."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .. import results
from ..metrics import SLO
from ..schedulers import SCHEDULERS, Scheduler, make_scheduler
from ..validate import colon_pair
from ..workloads import PRESETS, Workload, load_trace, preset


def _window(text: str) -> tuple[float, float]:
    try:
        return colon_pair(text, float)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--window {text!r}: expected START:END in seconds") from None


def add_workload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("workload")
    src = g.add_mutually_exclusive_group(required=True)
    src.add_argument(
        "--trace",
        help="trace file (.csv Azure, .jsonl Mooncake) or name: azure-conv, azure-code, mooncake-conv",
    )
    src.add_argument("--preset", help=f"synthetic preset: {', '.join(PRESETS)}")
    g.add_argument(
        "--download",
        action="store_true",
        help="a named trace no traces directory holds: fetch it into ~/.cache/batching/traces "
        "(kept only if its sha256 matches)",
    )
    g.add_argument("--limit", type=int, help="first N requests of the trace")
    g.add_argument("--window", type=_window, help="START:END seconds of the trace")
    g.add_argument("--time-scale", type=float, default=1.0, help="replay k times faster")
    g.add_argument("--scale-lengths", type=float, default=1.0, help="divide prompt and output lengths by k")
    g.add_argument(
        "--cap",
        action="store_true",
        help="cap requests longer than the model's context (counted, never silent)",
    )
    g.add_argument("-n", "--num-requests", type=int, help="preset size")
    g.add_argument("--rate", type=float, help="preset arrival rate (req/s)")
    g.add_argument("--seed", type=int, default=0)


def add_scheduler_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("scheduler")
    g.add_argument("--scheduler", choices=list(SCHEDULERS), required=True)
    g.add_argument(
        "--slots", type=int, default=32, help="batch size (static, dynamic) or max running requests"
    )
    g.add_argument(
        "--max-wait",
        "--timeout",
        dest="max_wait",
        type=float,
        default=0.0,
        help="static and dynamic: how long the oldest request waits for its batch to fill (s)",
    )
    g.add_argument("--prefill-mode", choices=["mixed", "separate"], default="mixed")
    g.add_argument("--token-budget", type=int, default=512, help="chunked: tokens per step")
    g.add_argument("--chunk-size", type=int, help="chunked: max prefill chunk (default: the budget)")
    g.add_argument("--kv-policy", choices=["slab", "exact"], default="slab")
    g.add_argument(
        "--kv-tokens", type=int, help="KV capacity in tokens (default: what the device memory leaves)"
    )


def add_output_args(p: argparse.ArgumentParser) -> None:
    o = p.add_argument_group("output")
    o.add_argument("--out", help="results JSON")
    o.add_argument("--csv", help="per-request CSV")
    o.add_argument("--steps", action="store_true", help="include the per-step log in the JSON")
    o.add_argument("--slot-log", action="store_true", help="record each slot's occupant per step")
    o.add_argument(
        "--token-times", action="store_true", help="every token's timestamp in each request record"
    )
    o.add_argument("--goodput", help="SLOs in ms, vLLM style: 'ttft:500 tpot:50'")
    o.add_argument("--no-progress", action="store_true")


def load_workload(a: argparse.Namespace, max_context: int) -> Workload:
    if a.trace:
        w = load_trace(a.trace, limit=a.limit, window=a.window, download=a.download)
    else:
        w = preset(a.preset, seed=a.seed, n=a.num_requests, rate=a.rate)
    if a.scale_lengths != 1 or a.time_scale != 1:
        w = w.scale(lengths=a.scale_lengths, time=a.time_scale)
    w, capped = w.cap_to_context(max_context, "cap" if a.cap else "error")
    if capped:
        print(f"capped {capped} requests to the model's context of {max_context} tokens", file=sys.stderr)
    return w


def progress(a: argparse.Namespace) -> bool:
    return not a.no_progress and sys.stderr.isatty()


def parse_slo(a: argparse.Namespace) -> SLO | None:
    return SLO.parse(a.goodput) if a.goodput else None


def scheduler(a: argparse.Namespace, max_ctx: int, kv_tokens: float) -> Scheduler:
    return make_scheduler(
        a.scheduler,
        max_context=max_ctx,
        slots=a.slots,
        max_wait=a.max_wait,
        prefill_mode=a.prefill_mode,
        token_budget=a.token_budget,
        chunk_size=a.chunk_size,
        kv_capacity=kv_tokens,
        kv_policy=a.kv_policy,
    )


def workload_config(a: argparse.Namespace, w: Workload) -> dict[str, Any]:
    return {
        "workload": {"name": w.name, "info": w.info, "requests": len(w)},
        "seed": a.seed,
        "scale_lengths": a.scale_lengths,
        "time_scale": a.time_scale,
    }


def write_outputs(a: argparse.Namespace, doc: dict[str, Any]) -> None:
    """Print the summary table; write ``--out`` (results JSON) and ``--csv`` when given."""
    print(summary_table(doc))
    if a.out:
        print(f"wrote {results.write_json(doc, a.out)}")
    if a.csv:
        print(f"wrote {results.write_requests_csv(doc, a.csv)}")


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.1f}"


def _num(x: float | None, f: str) -> str:
    return "-" if x is None else format(x, f)


def summary_table(doc: dict[str, Any]) -> str:
    """The end-of-run table: throughput, utilization (a server's: dispatch lateness), latencies."""
    s, c = doc["summary"], doc["config"]
    served = s["steps"] is None  # measured on a server (replay, import-vllm): no step log
    head = f"{c['scheduler']['scheduler']} | {c['workload']['name']} ({s['num_requests']} requests"
    if served:
        head += f", {s['completed']} complete) | {c.get('model')} at {c.get('url') or c.get('source')} | "
    else:
        head += f") | {c.get('model')} on {c.get('device')} | {s['steps']:,} steps, "
    lines = [
        head + f"wall {doc['meta']['wall_s']:.2f} s",
        f"  duration {_num(s['duration_s'], ',.1f')} s   throughput {_num(s['request_throughput'], '.2f')} "
        f"req/s, {_num(s['output_throughput'], ',.0f')} out tok/s",
    ]
    if served:
        late = s["dispatch_lateness"]
        lines.append(f"  client dispatch lateness p50 {_ms(late['p50'])} ms, p99 {_ms(late['p99'])} ms")
    else:
        lines.append(
            f"  slot utilization {s['slot_utilization']:.1%} (time-weighted {s['slot_utilization_time_weighted']:.1%})"
            f"   padding {s['padding_fraction']:.1%}   preemptions {s['preemptions']}"
        )
        if "hw_compute_utilization" in s:
            lines.append(
                f"  hardware utilization: compute {s['hw_compute_utilization']:.1%}, "
                f"bandwidth {s['hw_bandwidth_utilization']:.1%}"
            )
    rows: tuple[str, ...] = ("queue", "ttft", "tpot", "itl", "e2e")
    if served:  # also from the send, vLLM's origin, and vLLM's ITL (gaps between chunks)
        rows += tuple(k for k in ("ttft_from_send", "e2e_from_send", "itl_chunks") if k in s)
    wk = max(8, *(len(k) + 1 for k in rows))
    lines.append(f"  {'ms':{wk}}{'mean':>10}{'p50':>10}{'p90':>10}{'p99':>10}{'max':>10}")
    for k in rows:
        lines.append(
            f"  {k:{wk}}" + "".join(f"{_ms(s[k][f]):>10}" for f in ("mean", "p50", "p90", "p99", "max"))
        )
    if "goodput" in s:
        g = s["goodput"]
        lines.append(
            f"  goodput {_num(g['request_goodput'], '.2f')} req/s ({g['fraction']:.1%} of requests meet {g['slo']})"
        )
    return "\n".join(lines)
