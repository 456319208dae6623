"""7.1's padding and 7.3's stall on the real model, as a results file (a GPU session's last stage).

The notebooks measure both live on the machine that builds the book (a CPU in CI); this
script records them on any device so that a page can also quote a committed measurement
from hardware the build machine does not have (an H200 lent for a few minutes):

* padding (``batching.book.static.real_padding``): a 50-token prompt padded to a long one
  (2,000 tokens on a CPU, 4,000 on a GPU) under static batching against the same two packed
  under continuous batching, and each alone, one token each, medians of ``--reps`` rounds;
* stall (``batching.book.chunked.real_stall``): a long prompt arriving among running
  decodes (8 running and 1,536 tokens on a CPU, 30 and 4,000 on a GPU), served whole in
  the decode step, in a separate step, and in chunks (128 tokens on a CPU, 512 on a GPU).

    python benchmarks/bench_stall.py --out benchmarks/results/stall-cpu-here-cpu-s.json
    python benchmarks/bench_stall.py --device cuda --out stall-h200-llama-1b.json   # llama-1b

Needs only torch and numpy (the GPU machine has no jupyter).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching.book import chunked, static  # noqa: E402
from batching.real.hardware import device_entry, resolve_device  # noqa: E402
from batching.results import load_average, write_json  # noqa: E402


def series_near(series: dict, t0: float, t1: float) -> dict:
    """Each configuration's step-by-step ITL (one value per step, ms) between ``t0`` and ``t1``."""
    out = {}
    for label, d in series.items():
        t, itl = np.asarray(d["t"]), np.asarray(d["itl"])
        u, idx = np.unique(t, return_index=True)
        keep = (u >= t0) & (u <= t1)
        out[label] = {"t": u[keep].round(6).tolist(), "itl_ms": (itl[idx][keep] * 1e3).round(4).tolist()}
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto", help="auto, cpu or cuda")
    p.add_argument("--model", default=None, help="default: cpu-s on a CPU, llama-1b on a GPU")
    p.add_argument("--reps", type=int, default=3, help="rounds of the padding runs (medians)")
    p.add_argument("--short", type=int, default=50, help="the short prompt of the padding pair")
    p.add_argument("--long", type=int, default=None, help="its long prompt (default: 2,000 CPU, 4,000 GPU)")
    p.add_argument("--running", type=int, default=None, help="running decodes (default: 8 CPU, 30 GPU)")
    p.add_argument(
        "--prompt",
        type=int,
        default=None,
        help="the long prompt arriving among them (default: 1,536 CPU, 4,000 GPU)",
    )
    p.add_argument("--chunk", type=int, default=None, help="chunk size (default: 128 CPU, 512 GPU)")
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dev = resolve_device(a.device)
    t0, load0 = time.perf_counter(), load_average()
    pad = static.real_padding(
        model=a.model, device=a.device, short=a.short, long=a.long, reps=a.reps, threads=a.threads
    )
    # The padding result first: a stage cut by its time limit during the stall keeps it.
    floats = {k: v for k, v in pad.items() if isinstance(v, float)}
    write_json(
        {"benchmark": "7.1 padding (7.3 stall not finished)", "partial": True, "padding": floats},
        a.out,
        allow_nan=True,
    )
    st = chunked.real_stall(
        model=a.model, device=a.device, running=a.running, prompt=a.prompt, chunk=a.chunk, threads=a.threads
    )
    ex = st["executor"]
    last = max(st["first_token"].values())
    step = st["decode_ms"] / 1e3
    out = {
        "benchmark": "7.1 padding and 7.3 stall on the real model",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": "python " + " ".join([os.path.relpath(sys.argv[0], ROOT)] + sys.argv[1:]),
        "host": platform.node(),
        "device": device_entry(dev).name,
        "device_name": ex["device_name"],
        "machine": ex["machine"],
        "model": ex["model"],
        "dtype": ex["dtype"],
        "torch": ex["torch"],
        "threads": ex["threads"],
        "executor": ex,
        "loadavg_before": load0,
        "padding": floats,
        "stall": {
            "numbers": st["numbers"],
            "at_s": st["at_s"],
            "decode_ms": st["decode_ms"],
            "running": st["running"],
            "prompt": st["prompt"],
            "chunk": st["chunk"],
            "budget": st["budget"],
            "labels": st["labels"],
            "first_token": st["first_token"],
            "series": series_near(st["series"], st["at_s"] - 8 * step, last + 8 * step),
        },
        "loadavg_after": load_average(),
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    write_json(out, a.out, allow_nan=True)
    n = st["numbers"]
    print(
        json.dumps(
            {
                "padding_time_ratio_short": pad["time_ratio_short"],
                "padding_time_ratio_batch": pad["time_ratio_batch"],
                "stall_mixed_ms": n["mix_itl_max_ms"],
                "stall_chunked_ms": n["chk_itl_max_ms"],
                "ttft_mixed_ms": n["mix_ttft_ms"],
                "ttft_chunked_ms": n["chk_ttft_ms"],
                "decode_ms": st["decode_ms"],
                "wall_s": out["wall_s"],
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
