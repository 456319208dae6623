"""Decode graphs give the eager path's tokens on this device: the first stage of a GPU session.

A captured graph that replayed stale inputs or wrote the wrong slab would still report
plausible step times; only the tokens show it. One small seeded workload (long-tailed
lengths, requests finishing and joining mid-run) goes through static, continuous and
chunked-prefill schedules twice on the same model in float64, once with decode graphs and
once eagerly, and every request's tokens must be equal (float64: no argmax near-tie flips).
Writes a JSON report and exits 1 on any difference.

    python benchmarks/check_graphs.py --device cuda --out graphs-check.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np
import torch

from batching.models import get_model
from batching.real.executor import device_name, resolve_device, run_real
from batching.real.runner import ModelRunner
from batching.schedulers import make_scheduler
from batching.workload import Workload


def workload(n: int, max_len: int, seed: int = 0) -> Workload:
    """``n`` requests arriving close together, prompts and outputs long-tailed, each fitting ``max_len``."""
    rng = np.random.default_rng(seed)
    prompts = np.minimum(rng.lognormal(3.0, 0.8, n).astype(int) + 1, max_len // 2)
    outputs = np.minimum(rng.lognormal(2.5, 0.8, n).astype(int) + 1, max_len // 2)
    arrivals = np.cumsum(rng.exponential(0.002, n))
    return Workload.from_arrays(arrivals, prompts, outputs, name="graphs-check")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--slots", type=int, default=6)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    dev = resolve_device(a.device)
    w = workload(a.requests, a.max_len)
    runners = {
        g: ModelRunner.from_shape(
            get_model(a.model), a.slots, device=dev, dtype=torch.float64, max_len=a.max_len, graphs=g
        )
        for g in (False, True)
    }
    out: dict = {
        "check": "decode graphs vs eager steps, float64, same weights",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "device": str(dev),
        "device_name": device_name(dev),
        "torch": torch.__version__,
        "model": a.model,
        "requests": len(w),
        "slots": a.slots,
        "max_len": a.max_len,
        "schedulers": {},
    }
    ok = True
    for name in ("static", "continuous", "chunked"):
        toks = {}
        for g, runner in runners.items():
            sch = make_scheduler(
                name, max_context=a.max_len, slots=a.slots, token_budget=32, kv_capacity=a.slots * a.max_len
            )
            res = run_real(w, sch, None, runner=runner)
            toks[g] = {r.rid: r.token_ids for r in res.requests}
        diff = [rid for rid in toks[False] if toks[False][rid] != toks[True][rid]]
        first = None
        if diff:
            e, f = toks[False][diff[0]], toks[True][diff[0]]
            first = {"rid": diff[0], "position": next(i for i, (x, y) in enumerate(zip(e, f)) if x != y)}
        out["schedulers"][name] = {
            "requests_equal": len(toks[False]) - len(diff),
            "requests": len(toks[False]),
            "tokens": sum(map(len, toks[True].values())),
            "first_difference": first,
        }
        ok &= not diff
    out["graphs"] = runners[True].graphs_info()
    out["ok"] = ok and runners[True].graphs_error is None
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
