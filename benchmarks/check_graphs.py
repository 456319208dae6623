"""Decode graphs give the eager path's tokens on this device: the first stage of a GPU session.

A captured graph that replayed stale inputs or wrote the wrong slab would still report
plausible step times; only the tokens show it. One small seeded workload (long-tailed
lengths, requests finishing and joining mid-run) goes through static, continuous and
chunked-prefill schedules twice on the same model in float64, once with decode graphs and
once eagerly, and every request's tokens must be equal (float64: no argmax near-tie flips).

In float64 every path runs SDPA's math kernel, so a second check runs the served dtype:
``--bf16-model`` (``llama-1b`` on a GPU) in bf16, one decode step at each of
``--bf16-buckets`` (rows x context) through graphs and eagerly on the same weights and the
same (random) KV: the logits must agree within ``--bf16-tol`` of their largest magnitude,
and the greedy tokens must be equal wherever the eager logits' top-two margin exceeds twice
the largest difference (a nearer tie may flip in bf16). On a GPU it also fails if an
attention path of the bf16 runner selects the math kernel (``attention_backends``). On a
CPU the same check runs with the fixed-shape step eager (nothing to capture): the stand-in
the tests run.

Writes a JSON report and exits 1 on any difference.

    python benchmarks/check_graphs.py --device cuda --bf16-model llama-1b --out graphs-check.json
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
from pathlib import Path

import numpy as np

import batching.real  # noqa: F401  # before torch loads: the engine's thread and huge-page defaults

# isort: split
import torch

from batching.costs.models import get_model
from batching.plan import StepPlan
from batching.real.executor import device_name, resolve_device, run_real
from batching.real.hardware import machine
from batching.real.model import Llama, ModelConfig
from batching.real.runner import ModelRunner
from batching.request import Request
from batching.schedulers import make_scheduler
from batching.workloads import Workload


def workload(n: int, max_len: int, seed: int = 0) -> Workload:
    """``n`` requests arriving close together, prompts and outputs long-tailed, each fitting ``max_len``."""
    rng = np.random.default_rng(seed)
    prompts = np.minimum(rng.lognormal(3.0, 0.8, n).astype(int) + 1, max_len // 2)
    outputs = np.minimum(rng.lognormal(2.5, 0.8, n).astype(int) + 1, max_len // 2)
    arrivals = np.cumsum(rng.exponential(0.002, n))
    return Workload.from_arrays(arrivals, prompts, outputs, name="graphs-check")


def buckets_arg(text: str) -> list[tuple[int, int]]:
    """``ROWSxCTX,...`` -> [(rows, ctx), ...]; one clear line on bad input."""
    try:
        out = [(int(r), int(c)) for r, c in (x.split("x") for x in text.split(",") if x)]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected comma-separated ROWSxCTX, e.g. 1x128,8x512"
        ) from None
    if not out or any(r < 1 or c < 2 for r, c in out):
        raise argparse.ArgumentTypeError(f"{text!r}: need rows >= 1 and context >= 2 in every bucket")
    return out


def _decoding(rid: int, slot: int, ctx: int) -> Request:
    """A request in ``slot`` with ``ctx`` positions cached, decoding next (its newest id: 1 + rid)."""
    req = Request(rid, 0.0, ctx, 1 << 30)
    req.on_admit(slot, 0.0)
    req.on_prefill(ctx)
    req.on_token(0.0, 1 + rid)
    return req


def bf16_check(
    model: str, dev: torch.device, buckets: list[tuple[int, int]], tol: float, seed: int = 0
) -> dict:
    """Graphed against eager decode steps in bf16 (module doc): per bucket the largest logit
    difference relative to the largest logit, the rows compared and those whose tokens differ
    although their margin was wide; ``ok`` when every bucket passes."""
    shape = get_model(model)
    rows_max, ctx_max = max(r for r, _ in buckets), max(c for _, c in buckets)
    if ctx_max + 1 > shape.max_context:
        raise SystemExit(
            f"--bf16-buckets: context {ctx_max} exceeds {model}'s context of {shape.max_context}"
        )
    weights = Llama(ModelConfig.from_shape(shape), dev, torch.bfloat16, seed=seed)
    runners = {g: ModelRunner(weights, rows_max, ctx_max + 1, seed, graphs=g) for g in (False, True)}
    gen = torch.Generator(device=dev).manual_seed(seed)
    for part in ("k", "v"):  # the same random KV in both caches (the scratch slab stays zero)
        kv = torch.randn(runners[False].cache.k.shape, generator=gen, device=dev, dtype=torch.float32)
        for r in runners.values():
            getattr(r.cache, part)[:, :rows_max].copy_(kv)
    out: dict = {"model": model, "dtype": "bf16", "tolerance": tol, "buckets": []}
    ok = True
    for rows, ctx in buckets:
        # Contexts spread over ctx/2 .. ctx, as in a live batch: the mask matters.
        reqs = [_decoding(i, i, max(1, ctx - (ctx // 2) * i // max(rows - 1, 1))) for i in range(rows)]
        logits = {g: r.forward(StepPlan(decodes=reqs)).logits for g, r in runners.items()}
        e = torch.stack([logits[False][q.rid] for q in reqs]).float()
        f = torch.stack([logits[True][q.rid] for q in reqs]).float()
        diff = float((f - e).abs().max())
        rel = diff / float(e.abs().max())
        top2 = e.topk(2, dim=-1).values
        wide = (top2[:, 0] - top2[:, 1]) > 2 * diff
        flipped = int(((e.argmax(-1) != f.argmax(-1)) & wide).sum())
        passed = rel <= tol and flipped == 0
        ok &= passed
        out["buckets"].append(
            {
                "rows": rows,
                "ctx": ctx,
                "max_abs_diff": diff,
                "rel_diff": rel,
                "rows_compared": int(wide.sum()),
                "tokens_differing_at_wide_margin": flipped,
                "ok": passed,
            }
        )
    backends = runners[False].attention_backends()
    out["attention"] = backends
    out["graphs"] = runners[True].graphs_info()
    math = [p for p, b in backends.items() if b == "math"]
    out["attention_on_math"] = math
    if dev.type == "cuda" and math:  # bf16 attention on the math kernel is no server's kernel
        ok = False
    out["ok"] = ok and not (out["graphs"] or {}).get("failed")
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--device", default="auto")
    p.add_argument("--model", default="tiny")
    p.add_argument("--requests", type=int, default=24)
    p.add_argument("--slots", type=int, default=6)
    p.add_argument("--max-len", type=int, default=256)
    p.add_argument(
        "--bf16-model", help="also compare graphs with eager in bf16 on this model (llama-1b on a GPU)"
    )
    p.add_argument(
        "--bf16-buckets",
        type=buckets_arg,
        default=buckets_arg("1x128,8x512,32x1536"),
        help="ROWSxCTX decode steps of the bf16 check",
    )
    p.add_argument("--bf16-tol", type=float, default=0.02, help="largest logit difference / largest logit")
    p.add_argument("--out", type=Path, required=True)
    a = p.parse_args()
    if not 0 < a.bf16_tol < 1:
        p.error(f"--bf16-tol={a.bf16_tol}: must be in (0, 1)")
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
        "machine": machine(dev).to_dict(),
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
    out["ok"] = ok and not out["graphs"]["failed"]
    if a.bf16_model:
        del runners  # the float64 model's memory, before the bf16 one is built
        out["bf16"] = bf16_check(a.bf16_model, dev, a.bf16_buckets, a.bf16_tol)
        out["ok"] = out["ok"] and out["bf16"]["ok"]
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(out, indent=1) + "\n")
    print(json.dumps(out, indent=1))
    return 0 if out["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
