"""Peer benchmark: this engine against Hugging Face transformers and vLLM, same weights, same workload.

One seeded random model of a registry shape is saved as a Hugging Face ``LlamaForCausalLM``
checkpoint (``batching.real.checkpoint``, with its tokenizer) and served by every engine: this
engine's continuous batching (mixed prefill) and chunked prefill, transformers' static
``generate`` (left-padded batches, greedy) and its continuous batching
(``init_continuous_batching``, per-request ``max_new_tokens``), and vLLM's offline engine
(``LLM.generate``: its scheduler chunks prefills within the same slots and token budget as
``ours-chunked``). The workload is one seeded batch of long-tailed requests, all arriving at
t=0 (prompt and output lengths lognormal); prompt ids are
``batching.real.runner.prompt_ids(seed, rid, prompt_len, vocab)`` in every engine; every request
stops at its own output length (EOS disabled: ``ignore_eos``).

vLLM runs in its own environment, ``.vllm-venv`` (``make vllm``: its pins conflict with the
project's), as the worker's interpreter; without it the ``vllm`` mode is skipped with a line
saying so. Its CPU build runs the engine in the worker's process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``: no separate scheduler process polling a core of two)
on ``--threads`` unpinned OpenMP threads (``VLLM_CPU_OMP_THREADS_BIND=nobind``, as this
engine's), with ``VLLM_CPU_KVCACHE_SPACE`` GB of KV cache; its model is compiled when it
loads (load excluded, as for every engine; the compiled graph is cached in ~/.cache/vllm).

Each mode runs in its own process (``--worker MODE``), the order of modes rotates from
round to round, and each mode reports tokens/s = output tokens / wall time from the first
request submitted to the last token (model loading and one small warm-up request
excluded, for both engines). Greedy tokens are compared request by request between the
engines. Writes ``benchmarks/results/peer-cpu-here-<model>.json`` (``--dtype bf16``:
``peer-cpu-here-<model>-bf16.json``; every engine casts the same fp32 checkpoint on load).

    flock /tmp/cpu.lock .venv/bin/python benchmarks/bench_peer.py
    .venv/bin/python benchmarks/bench_peer.py --quick      # smoke: tiny model, 8 requests, 1 round

Needs the ``bench`` extra (transformers, safetensors); transformers is never imported by
the ``batching`` package.
"""

from __future__ import annotations

import argparse
import datetime as dt
import hashlib
import json
import os
import platform
import resource
import shlex
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CACHE = ROOT / "_build" / "peer"
MODES = ("ours-continuous", "ours-chunked", "hf-static", "hf-continuous", "vllm")
VLLM_VENV = ROOT / ".vllm-venv"
VLLM_PY = VLLM_VENV / "bin" / "python"
VLLM_STAMP = VLLM_VENV / ".installed-vllm"  # written by `make vllm` once the environment works
VLLM_KV_GB = 1  # VLLM_CPU_KVCACHE_SPACE: cpu-s holds 8 KiB per token, so 1 GB is ~130k tokens
GOAL = 1.5  # this engine's tokens/s over transformers' continuous batching (issue 3)
#: --dtype: each engine's name for it (this engine and transformers take the torch dtype).
#: ``auto``, this engine only: the dtype and kernels its probe chose on this machine
#: (batching.real.kernels), which must be the faster of its fp32 and bf16 runs.
DTYPES = {"fp32": ("float32", "float32"), "bf16": ("bfloat16", "bfloat16")}
DTYPE_CHOICES = ("fp32", "bf16", "auto")
#: Issue 25's goal: this engine's tokens/s at its best dtype over vLLM's at vLLM's best.
VLLM_GOAL = 1.5


def torch_dtype(spec: dict[str, Any]) -> Any:
    import torch

    return getattr(torch, DTYPES[spec.get("dtype", "fp32")][0])


def variants(modes: list[str], dtypes: list[str]) -> list[str]:
    """``mode@dtype`` of every run: each mode in each dtype, ``auto`` for this engine only."""
    return [f"{m}@{d}" for d in dtypes for m in modes if d != "auto" or m.startswith("ours-")]


def engine(variant: str) -> str:
    """The engine of a ``mode@dtype`` variant: ``ours-chunked``, ``vllm``, ..."""
    return variant.split("@")[0]


def best_variants(per_variant: dict[str, dict[str, Any]]) -> dict[str, str]:
    """Each engine's fastest variant by median tokens/s (``auto`` counts as this engine's own
    choice, so it competes too)."""
    out: dict[str, str] = {}
    for v, st in per_variant.items():
        e = engine(v)
        if e not in out or st["tok_s_median"] > per_variant[out[e]]["tok_s_median"]:
            out[e] = v
    return out


# ---------------------------------------------------------------------------- workload
def build_workload(a: argparse.Namespace) -> list[tuple[int, int, int]]:
    """(rid, prompt_len, output_len) of every request, all arriving at t=0."""
    import numpy as np

    from batching.workloads import Workload
    from batching.workloads.lengths import LogNormal

    rng = np.random.default_rng(a.seed)
    prompts = LogNormal(a.prompt_median, a.prompt_sigma, a.prompt_lo, a.prompt_hi).sample(a.requests, rng)
    outputs = LogNormal(a.output_median, a.output_sigma, a.output_lo, a.output_hi).sample(a.requests, rng)
    w = Workload.from_arrays(np.zeros(a.requests), prompts, outputs, name="peer")
    return [(r.rid, r.prompt_len, r.output_len) for r in w]


def source_digest() -> str:
    """Hash of the ``batching`` package's sources as a worker imports them: a run whose
    workers saw different sources (someone edited the engine mid-run) is flagged."""
    import batching

    pkg = Path(batching.__file__).resolve().parent
    h = hashlib.sha256()
    for f in sorted(pkg.rglob("*.py")):
        h.update(f.relative_to(pkg).as_posix().encode() + b"\0" + f.read_bytes())
    return h.hexdigest()[:16]


def git_state() -> dict[str, Any]:
    """Commit of the tree and the files under batching/ that differ from it."""

    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD").strip(),
        "dirty": [ln[3:] for ln in git("status", "--porcelain", "--", "batching").splitlines()],
    }


def ids_digest(prompts: dict[int, list[int]]) -> str:
    """One hash of every request's prompt ids (both engines must have fed the same ones)."""
    h = hashlib.sha256()
    for rid in sorted(prompts):
        h.update(json.dumps([rid, prompts[rid]]).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------------------- workers
def _setup_torch(threads: int):
    import torch

    torch.set_num_threads(threads)
    return torch


def worker_ours(mode: str, spec: dict[str, Any]) -> dict[str, Any]:
    torch = _setup_torch(spec["threads"])
    from batching.engine import run
    from batching.real.checkpoint import load_hf_checkpoint, read_config
    from batching.real.executor import RealExecutor, kernel_plan
    from batching.real.kernels import DTYPES as TORCH_DTYPES
    from batching.real.measure import linear_replay
    from batching.real.runner import ModelRunner
    from batching.request import Request
    from batching.schedulers import ChunkedPrefillScheduler, ContinuousScheduler

    reqs = spec["requests"]
    max_len = max(p + o for _, p, o in reqs)
    t = time.perf_counter()
    # auto: the dtype and kernels this machine's probe chose (probed once, cached on disk).
    plan = kernel_plan(read_config(spec["checkpoint"]), torch.device("cpu"), spec.get("dtype", "fp32"))
    model = load_hf_checkpoint(spec["checkpoint"], "cpu", TORCH_DTYPES[plan.dtype])
    model.use_kernels(plan)
    runner = ModelRunner(model, spec["slots"], max_len=max_len, seed=spec["seed"])
    load_s = time.perf_counter() - t
    ex = RealExecutor(runner)  # one small untimed warm-up step
    if mode == "ours-continuous":
        sched = ContinuousScheduler(spec["slots"], max_len, prefill_mode="mixed")
    else:
        sched = ChunkedPrefillScheduler(spec["slots"], max_len, token_budget=spec["token_budget"])
    fresh = [Request(rid, 0.0, p, o) for rid, p, o in reqs]
    t0 = time.perf_counter()
    res = run(fresh, sched, ex)
    wall = time.perf_counter() - t0
    tokens = {r.rid: r.token_ids for r in res.requests}
    prompts = {r.rid: runner.prompt(r) for r in res.requests}
    # The floor the matrix products set: the run's steps again, their linear layers alone
    # (rows: every token computed; the head: the rows whose logits a step reads).
    c = res.log.cols
    steps = [
        (p + pad + d + x, e + x)
        for p, pad, d, x, e in zip(c["prefill"], c["pad"], c["decode"], c["dead"], c["emitted"])
    ]
    replay = linear_replay(model, steps, rounds=2)
    return {
        "wall_s": wall,
        "linear_floor_s": sum(replay),
        "tokens": tokens,
        "prompt_digest": ids_digest(prompts),
        "load_s": load_s,
        "warmup_s": ex.warmup_s,
        "steps": res.num_steps,
        "engine_busy_s": float(sum(res.log.cols["dur"])),
        "scheduler": res.scheduler,
        "executor": {k: v for k, v in res.executor.items() if k != "seed"},
        "max_len": max_len,
    }


def _hf_model(spec: dict[str, Any]):
    torch = _setup_torch(spec["threads"])
    import transformers

    transformers.logging.set_verbosity_error()
    t = time.perf_counter()
    model = transformers.LlamaForCausalLM.from_pretrained(spec["checkpoint"], dtype=torch_dtype(spec)).eval()
    return torch, transformers, model, time.perf_counter() - t


def _prompts(spec: dict[str, Any]) -> dict[int, list[int]]:
    from batching.real.runner import prompt_ids

    return {rid: prompt_ids(spec["seed"], rid, p, spec["vocab"]) for rid, p, _ in spec["requests"]}


def worker_hf_static(spec: dict[str, Any]) -> dict[str, Any]:
    """Left-padded ``generate`` in arrival order, ``static_batch`` requests per batch, each batch
    decoding to its longest output; each output is then trimmed to its request's length."""
    torch, transformers, model, load_s = _hf_model(spec)
    prompts = _prompts(spec)
    pad = 0  # prompt ids are 1..vocab-1 (batching.real.runner.PAD_ID)

    def generate(batch: list[tuple[int, int, int]]) -> tuple[dict[int, list[int]], int]:
        width = max(p for _, p, _ in batch)
        n = max(o for _, _, o in batch)
        ids = torch.tensor([[pad] * (width - p) + prompts[rid] for rid, p, _ in batch])
        mask = torch.tensor([[0] * (width - p) + [1] * p for _, p, _ in batch])
        cfg = transformers.GenerationConfig(
            do_sample=False,
            max_new_tokens=n,
            min_new_tokens=n,
            eos_token_id=None,
            pad_token_id=pad,
            bos_token_id=None,
        )
        with torch.inference_mode():
            out = model.generate(ids, attention_mask=mask, generation_config=cfg)
        assert out.shape[1] == width + n, (out.shape, width, n)
        return {rid: out[i, width : width + o].tolist() for i, (rid, _, o) in enumerate(batch)}, len(
            batch
        ) * n

    t = time.perf_counter()  # untimed warm-up: two short requests in one padded batch
    prompts.update({-1: [1, 2, 3, 4], -2: [5, 6, 7]})
    generate([(-1, 4, 2), (-2, 3, 2)])
    del prompts[-1], prompts[-2]
    warmup_s = time.perf_counter() - t

    reqs, b = spec["requests"], spec["static_batch"]
    tokens: dict[int, list[int]] = {}
    positions = 0
    t0 = time.perf_counter()
    for i in range(0, len(reqs), b):
        got, computed = generate(reqs[i : i + b])
        tokens.update(got)
        positions += computed
    wall = time.perf_counter() - t0
    useful = sum(o for _, _, o in reqs)
    return {
        "wall_s": wall,
        "tokens": tokens,
        "prompt_digest": ids_digest(prompts),
        "load_s": load_s,
        "warmup_s": warmup_s,
        "batch": b,
        "decode_positions": positions,
        "useful_fraction": useful / positions,
        "attn_implementation": model.config._attn_implementation,
    }


def worker_hf_continuous(spec: dict[str, Any]) -> dict[str, Any]:
    """transformers' continuous batching with an explicit CPU configuration (``--hf-*``:
    pages of 64 tokens, 256 blocks, 512 tokens and 64 requests per batch; its defaults are
    ~4x slower here), one request per workload request, each with its own ``max_new_tokens``."""
    torch, transformers, model, load_s = _hf_model(spec)
    from transformers import ContinuousBatchingConfig

    prompts = _prompts(spec)
    cb = ContinuousBatchingConfig(**spec["hf_cb_config"])
    gen = transformers.GenerationConfig(do_sample=False, max_new_tokens=16, eos_token_id=-1, pad_token_id=0)
    with torch.inference_mode():
        manager = model.init_continuous_batching(generation_config=gen, continuous_batching_config=cb)
        manager.start()
        try:
            t = time.perf_counter()
            manager.add_request([1, 2, 3, 4], request_id="warmup", max_new_tokens=2, eos_token_id=-1)
            res = manager.get_result(timeout=120)
            while res is not None and not res.is_finished():
                res = manager.get_result(timeout=120)
            if res is None or res.error:
                raise RuntimeError(f"continuous batching warm-up failed: {res}")
            warmup_s = time.perf_counter() - t
            reqs = spec["requests"]
            results: dict[str, Any] = {}
            t0 = time.perf_counter()
            for rid, _, o in reqs:
                manager.add_request(prompts[rid], request_id=str(rid), max_new_tokens=o, eos_token_id=-1)
            while len(results) < len(reqs):
                r = manager.get_result(timeout=1)
                if r is None:
                    if not manager.is_running():
                        raise RuntimeError(
                            "transformers' generation thread stopped before every request finished"
                        )
                    continue
                if r.is_finished():
                    if r.error:
                        raise RuntimeError(f"request {r.request_id} failed: {r.error}")
                    results[r.request_id] = r
            wall = time.perf_counter() - t0
        finally:
            manager.stop(block=True, timeout=30)
    tokens = {rid: list(results[str(rid)].generated_tokens) for rid, _, _ in reqs}
    fed = {rid: list(results[str(rid)].prompt_ids) for rid, _, _ in reqs}
    return {
        "wall_s": wall,
        "tokens": tokens,
        "prompt_digest": ids_digest(fed),
        "load_s": load_s,
        "warmup_s": warmup_s,
        "hf_cb_config": spec["hf_cb_config"],
        "attn_implementation": model.config._attn_implementation,
    }


def worker_vllm(spec: dict[str, Any]) -> dict[str, Any]:
    """vLLM's offline engine (``LLM.generate``) on the checkpoint: every request at once, greedy,
    ``ignore_eos`` and ``max_tokens`` its output length, token-id prompts, no detokenizing;
    ``max_num_seqs`` the slots, ``max_num_batched_tokens`` the token budget, no prefix cache.
    Runs in ``.vllm-venv`` (this module imports nothing of vLLM's at the top)."""
    # The settings it was started with, before vLLM adds its own to the environment.
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith(("VLLM_", "OMP_", "GOMP_"))}
    import torch
    import vllm
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    reqs = spec["requests"]
    max_len = max(p + o for _, p, o in reqs)
    engine_args = {
        "dtype": DTYPES[spec.get("dtype", "fp32")][1],
        "max_num_seqs": spec["slots"],
        "max_num_batched_tokens": spec["token_budget"],
        "max_model_len": max_len,
        "enable_prefix_caching": False,
        "seed": spec["seed"],
    }
    t = time.perf_counter()
    llm = LLM(model=spec["checkpoint"], **engine_args)
    load_s = time.perf_counter() - t

    def params(n: int) -> Any:
        return SamplingParams(temperature=0.0, max_tokens=n, ignore_eos=True, detokenize=False)

    t = time.perf_counter()  # untimed warm-up: one short request
    llm.generate([TokensPrompt(prompt_token_ids=[1, 2, 3, 4])], [params(2)], use_tqdm=False)
    warmup_s = time.perf_counter() - t
    prompts = _prompts(spec)
    t0 = time.perf_counter()
    outs = llm.generate(
        [TokensPrompt(prompt_token_ids=prompts[rid]) for rid, _, _ in reqs],
        [params(o) for _, _, o in reqs],
        use_tqdm=False,
    )
    wall = time.perf_counter() - t0
    cfg = llm.llm_engine.vllm_config
    return {
        "wall_s": wall,
        "tokens": {rid: list(out.outputs[0].token_ids) for (rid, _, _), out in zip(reqs, outs)},
        "prompt_digest": ids_digest(
            {rid: list(out.prompt_token_ids) for (rid, _, _), out in zip(reqs, outs)}
        ),
        "load_s": load_s,
        "warmup_s": warmup_s,
        "vllm": {
            "version": vllm.__version__,
            "distribution": "vllm-cpu " + version("vllm-cpu"),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "transformers": version("transformers"),
            "dtype": str(cfg.model_config.dtype).removeprefix("torch."),
            "api": "LLM.generate, all requests in one call; SamplingParams(temperature=0, max_tokens=n, "
            "ignore_eos=True, detokenize=False)",
            "engine_args": engine_args,
            "chunked_prefill": bool(cfg.scheduler_config.enable_chunked_prefill),
            "compilation_mode": str(cfg.compilation_config.mode),
            "env": env,
        },
    }


def vllm_missing() -> str | None:
    """Why the ``vllm`` mode cannot run here (None: it can)."""
    if not VLLM_STAMP.is_file():
        return f"no vLLM environment ({os.path.relpath(VLLM_VENV, ROOT)}/): run `make vllm`"
    return None


def worker(mode: str, spec_path: str, out_path: str) -> None:
    sources = source_digest()
    spec = json.loads(Path(spec_path).read_text())
    if mode.startswith("ours-"):
        doc = worker_ours(mode, spec)
    elif mode == "hf-static":
        doc = worker_hf_static(spec)
    elif mode == "hf-continuous":
        doc = worker_hf_continuous(spec)
    elif mode == "vllm":
        doc = worker_vllm(spec)
    else:
        raise SystemExit(f"unknown mode {mode!r}; valid: {', '.join(MODES)}")
    import torch

    out_tokens = sum(o for _, _, o in spec["requests"])
    got = {rid: len(doc["tokens"][rid]) for rid, _, _ in spec["requests"]}
    short = [rid for rid, _, o in spec["requests"] if got[rid] != o]
    if short:
        raise SystemExit(f"{mode}: requests {short[:5]} did not produce their output length")
    doc.update(
        mode=mode,
        source_digest=sources,
        output_tokens=out_tokens,
        tok_s=out_tokens / doc["wall_s"],
        threads=torch.get_num_threads(),
        max_rss_mb=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        tokens={str(k): v for k, v in doc["tokens"].items()},
    )
    Path(out_path).write_text(json.dumps(doc) + "\n")


# ---------------------------------------------------------------------------- driver
def first_difference(a: dict[str, list[int]], b: dict[str, list[int]]) -> dict[str, Any]:
    """Requests whose greedy tokens are equal, and where the first unequal one diverges."""
    rids = sorted(a, key=int)
    equal = [rid for rid in rids if a[rid] == b[rid]]
    out: dict[str, Any] = {"requests": len(rids), "equal": len(equal), "first_mismatch": None}
    bad = [rid for rid in rids if a[rid] != b[rid]]
    if bad:
        x, y = a[bad[0]], b[bad[0]]
        i = next(k for k in range(min(len(x), len(y)) + 1) if k == min(len(x), len(y)) or x[k] != y[k])
        out["first_mismatch"] = {
            "rid": int(bad[0]),
            "index": i,
            "of": len(x),
            "ours": x[i] if i < len(x) else None,
            "theirs": y[i] if i < len(y) else None,
        }
        out["mismatching_rids"] = [int(r) for r in bad]
    return out


def children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def worker_env(mode: str, threads: int, omp_wait: str) -> dict[str, str]:
    """The environment of a ``mode`` worker on ``threads`` threads."""
    env = {
        **os.environ,
        "OMP_WAIT_POLICY": omp_wait,
        "OMP_NUM_THREADS": str(threads),
        "MKL_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_NO_ADVISORY_WARNINGS": "1",
        "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
    }
    if omp_wait == "default":  # the project's setting (README, "Threads"): spin briefly, then sleep
        del env["OMP_WAIT_POLICY"]
    if mode == "vllm":  # see the module's docstring
        env.update(
            VLLM_ENABLE_V1_MULTIPROCESSING="0",
            VLLM_CPU_OMP_THREADS_BIND="nobind",
            VLLM_CPU_KVCACHE_SPACE=str(VLLM_KV_GB),
            VLLM_NO_USAGE_STATS="1",
            DO_NOT_TRACK="1",
        )
    # Every engine gets the spin count and the huge pages that `import batching.real` sets for
    # this one, so that neither is measured under a setting the other does not have.
    from batching.real import ENV_DEFAULTS

    env.update({k: os.environ.get(k) or v for k, v in ENV_DEFAULTS.items()})
    return env


def run_worker(variant: str, spec_path: Path, round_: int, threads: int, omp_wait: str) -> dict[str, Any]:
    """One ``mode@dtype`` in a fresh process; also how many cores other processes kept busy
    meanwhile (``others_cores``: the machine's busy CPU time minus the worker's own, over its
    lifetime)."""
    from batching.results import busy_cpu_s

    mode = engine(variant)
    out = CACHE / f"worker-{variant}-r{round_}.json"
    log = CACHE / f"worker-{variant}-r{round_}.log"
    env = worker_env(mode, threads, omp_wait)
    cmd = [
        str(VLLM_PY) if mode == "vllm" else sys.executable,
        str(Path(__file__).resolve()),
        "--worker",
        mode,
        "--spec",
        str(spec_path),
        "--out",
        str(out),
    ]
    t, busy0, own0 = time.perf_counter(), busy_cpu_s(), children_cpu_s()
    with open(log, "w") as f:
        p = subprocess.run(cmd, env=env, stdout=f, stderr=subprocess.STDOUT, cwd=ROOT, check=False)
    elapsed, busy1, own = time.perf_counter() - t, busy_cpu_s(), children_cpu_s() - own0
    if p.returncode:
        raise SystemExit(
            f"worker {mode} failed (exit {p.returncode}); its log, {log}:\n" + log.read_text()[-3000:]
        )
    doc = json.loads(out.read_text())
    doc["process_s"] = elapsed
    doc["worker_cpu_s"] = own
    doc["others_cores"] = (
        None if busy0 is None or busy1 is None else max(0.0, (busy1 - busy0 - own) / elapsed)
    )
    return doc


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="cpu-s", help="registry shape of the random model (default cpu-s)")
    p.add_argument("--model-seed", type=int, default=0, help="seed of the random weights")
    p.add_argument("--seed", type=int, default=0, help="seed of the workload's lengths and prompt ids")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt-median", type=float, default=64)
    p.add_argument("--prompt-sigma", type=float, default=1.0)
    p.add_argument("--prompt-lo", type=int, default=16)
    p.add_argument("--prompt-hi", type=int, default=512)
    p.add_argument("--output-median", type=float, default=40)
    p.add_argument("--output-sigma", type=float, default=0.9)
    p.add_argument("--output-lo", type=int, default=8)
    p.add_argument("--output-hi", type=int, default=256)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--modes", default=",".join(MODES), help="comma-separated subset of " + ", ".join(MODES))
    p.add_argument("--threads", type=int, default=2)
    p.add_argument(
        "--dtype",
        default="fp32,bf16,auto",
        help="comma-separated dtypes every engine runs in (fp32, bf16; the checkpoint is saved in fp32 "
        "and cast on load) and auto (this engine only: its probe's choice)",
    )
    p.add_argument(
        "--max-others",
        type=float,
        default=0.25,
        help="redo a worker if other processes kept more than this many cores busy meanwhile",
    )
    p.add_argument("--retries", type=int, default=2, help="at most this many redos per worker")
    p.add_argument(
        "--omp-wait-policy",
        choices=["PASSIVE", "ACTIVE", "default"],
        default="default",
        help="OMP_WAIT_POLICY of every worker ('default': unset, GOMP_SPINCOUNT=100000 as in make)",
    )
    p.add_argument("--slots", type=int, default=64, help="this engine: max running requests")
    p.add_argument("--token-budget", type=int, default=512, help="this engine, chunked: tokens per step")
    p.add_argument("--static-batch", type=int, default=16, help="hf-static: requests per generate call")
    p.add_argument("--hf-page-size", type=int, default=64)
    p.add_argument("--hf-num-blocks", type=int, default=256)
    p.add_argument("--hf-max-batch-tokens", type=int, default=512)
    p.add_argument("--hf-max-requests", type=int, default=64)
    p.add_argument("--quick", action="store_true", help="smoke run: tiny model, 8 short requests, 1 round")
    p.add_argument(
        "--out",
        help="results JSON (default benchmarks/results/peer-cpu-here-<model>.json; "
        "--quick: _build/peer/peer-quick.json)",
    )
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--spec", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.spec, a.out)
        return
    command = "python " + " ".join(shlex.quote(x) for x in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    if a.quick:
        a.model, a.requests, a.rounds = "tiny", 8, 1
        a.prompt_median, a.prompt_lo, a.prompt_hi = 16, 4, 48
        a.output_median, a.output_lo, a.output_hi = 8, 2, 16
        a.slots, a.token_budget, a.static_batch = 8, 32, 4
        a.hf_page_size, a.hf_num_blocks, a.hf_max_batch_tokens, a.hf_max_requests = 16, 32, 32, 8
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"unknown mode {m!r}; valid: {', '.join(MODES)}")
    dtypes = [d for d in a.dtype.split(",") if d]
    for d in dtypes:
        if d not in DTYPE_CHOICES:
            raise SystemExit(f"--dtype: unknown dtype {d!r}; valid: {', '.join(DTYPE_CHOICES)}")
    vllm_skipped = vllm_missing() if "vllm" in modes else None
    if vllm_skipped is None and "vllm" in modes and a.quick:
        vllm_skipped = "--quick: the tiny model's head_dim of 16 is not one vLLM's CPU attention supports"
    if vllm_skipped:
        modes.remove("vllm")
        print(f"vllm: skipped ({vllm_skipped})", flush=True)

    import torch

    from batching.costs.devices import Machine
    from batching.costs.models import get_model
    from batching.real import ENV_DEFAULTS
    from batching.real.checkpoint import save_hf_checkpoint, save_hf_tokenizer
    from batching.real.executor import device_name
    from batching.real.hardware import cpu_flags
    from batching.real.model import Llama, ModelConfig
    from batching.results import load_average

    shape = get_model(a.model)
    reqs = build_workload(a)
    if max(p + o for _, p, o in reqs) > shape.max_context:
        raise SystemExit(f"prompt + output lengths exceed {a.model}'s context of {shape.max_context}")
    CACHE.mkdir(parents=True, exist_ok=True)
    ckpt = CACHE / f"{a.model}-seed{a.model_seed}"
    model = Llama(ModelConfig.from_shape(shape), "cpu", torch.float32, seed=a.model_seed)
    save_hf_checkpoint(model, ckpt)
    save_hf_tokenizer(ckpt, shape.vocab)  # vLLM loads one; EOS is a reserved id in the vocabulary
    del model
    spec = {
        "checkpoint": str(ckpt),
        "seed": a.seed,
        "vocab": shape.vocab,
        "threads": a.threads,
        "requests": reqs,
        "slots": a.slots,
        "token_budget": a.token_budget,
        "static_batch": a.static_batch,
        "hf_cb_config": {
            "page_size": a.hf_page_size,
            "num_blocks": a.hf_num_blocks,
            "max_batch_tokens": a.hf_max_batch_tokens,
            "max_requests_per_batch": a.hf_max_requests,
        },
    }
    spec_paths = {}
    for d in dtypes:  # one spec per dtype, which each worker reads
        spec_paths[d] = CACHE / f"spec-{d}.json"
        spec_paths[d].write_text(json.dumps({**spec, "dtype": d}) + "\n")
    runs = variants(modes, dtypes)

    load0 = load_average()
    git0 = git_state()
    rounds: list[dict[str, Any]] = []
    tokens: dict[str, dict[str, list[int]]] = {}
    deterministic = {m: True for m in runs}
    t_start = time.perf_counter()
    for r in range(a.rounds):
        order = runs[r % len(runs) :] + runs[: r % len(runs)]  # rotate: each run takes each place
        row: dict[str, Any] = {"round": r, "order": order, "loadavg_before": load_average(), "modes": {}}
        for m in order:
            tries = []
            for _ in range(1 + a.retries):  # a run disturbed by other processes is redone, the quietest kept
                tries.append(run_worker(m, spec_paths[m.split("@")[1]], r, a.threads, a.omp_wait_policy))
                if (tries[-1]["others_cores"] or 0.0) <= a.max_others:
                    break
                print(
                    f"round {r} {m:21} {tries[-1]['tok_s']:8.1f} tok/s  others used "
                    f"{tries[-1]['others_cores']:.2f} cores: again",
                    flush=True,
                )
            doc = min(tries, key=lambda d: d["others_cores"] or 0.0)
            doc["attempts"] = [{"tok_s": d["tok_s"], "others_cores": d["others_cores"]} for d in tries]
            toks = doc.pop("tokens")
            if m in tokens and toks != tokens[m]:
                deterministic[m] = False
            tokens.setdefault(m, toks)
            row["modes"][m] = doc
            print(
                f"round {r} {m:21} {doc['tok_s']:8.1f} tok/s  wall {doc['wall_s']:6.2f} s  "
                f"(process {doc['process_s']:.1f} s, load {doc['load_s']:.2f} s, warm-up {doc['warmup_s']:.2f} s, "
                f"others {doc['others_cores'] or 0.0:.2f} cores)",
                flush=True,
            )
        row["loadavg_after"] = load_average()
        rounds.append(row)
    total_s = time.perf_counter() - t_start

    digests = {m: rounds[0]["modes"][m]["prompt_digest"] for m in runs}
    sources = sorted({row["modes"][m]["source_digest"] for row in rounds for m in runs})
    per_mode = {}
    for m in runs:
        tps = [row["modes"][m]["tok_s"] for row in rounds]
        walls = [row["modes"][m]["wall_s"] for row in rounds]
        per_mode[m] = {
            "tok_s": tps,
            "tok_s_best": max(tps),
            "tok_s_median": statistics.median(tps),
            "wall_s": walls,
            "others_cores": [row["modes"][m]["others_cores"] for row in rounds],
            "tokens_identical_across_rounds": deterministic[m],
        }
        if "executor" in rounds[0]["modes"][m]:  # this engine: the kernels it ran
            per_mode[m]["kernels"] = rounds[0]["modes"][m]["executor"].get("kernels")
        if "linear_floor_s" in rounds[0]["modes"][m]:
            # The most this engine's steps could reach were everything but their matrix
            # products free: output tokens / (the products alone, replayed; median of rounds).
            floor = statistics.median(row["modes"][m]["linear_floor_s"] for row in rounds)
            per_mode[m]["linear_floor_s"] = floor
            per_mode[m]["tok_s_ceiling"] = sum(o for _, _, o in reqs) / floor
    best = best_variants(per_mode)
    # Each engine at its best dtype against every peer at theirs, and dtype by dtype.
    ratios = {}
    for ours in (e for e in best if e.startswith("ours-")):
        for peer in (e for e in best if e.startswith("hf-") or e == "vllm"):
            x, y = per_mode[best[ours]], per_mode[best[peer]]
            ratios[f"{ours}/{peer} (best dtype each)"] = {
                "variants": [best[ours], best[peer]],
                "best": x["tok_s_best"] / y["tok_s_best"],
                "median": x["tok_s_median"] / y["tok_s_median"],
            }
            for d in dtypes:
                if f"{ours}@{d}" in per_mode and f"{peer}@{d}" in per_mode:
                    x, y = per_mode[f"{ours}@{d}"], per_mode[f"{peer}@{d}"]
                    ratios[f"{ours}/{peer} ({d})"] = {
                        "best": x["tok_s_best"] / y["tok_s_best"],
                        "median": x["tok_s_median"] / y["tok_s_median"],
                    }
    equality = {}
    pairs = [
        (x, y)
        for x in runs
        for y in runs
        if x.startswith("ours-")
        and (y.startswith("hf-") or y.startswith("vllm"))
        and x.split("@")[1] == y.split("@")[1]
    ]
    for d in dtypes:
        pairs += [
            (f"{x}@{d}", f"{y}@{d}")
            for x, y in (("ours-continuous", "ours-chunked"), ("hf-static", "hf-continuous"))
            if f"{x}@{d}" in runs and f"{y}@{d}" in runs
        ]
    for x, y in pairs:
        equality[f"{x} vs {y}"] = first_difference(tokens[x], tokens[y])
    goal = {}
    for ours in (e for e in best if e.startswith("ours-")):
        for peer, target in (("hf-continuous", GOAL), ("vllm", VLLM_GOAL)):
            key = f"{ours}/{peer} (best dtype each)"
            if key in ratios:
                goal[f"{ours}/{peer}"] = {
                    "target": f">= {target}x, each at its best dtype (median)",
                    "ratio_best": ratios[key]["best"],
                    "ratio_median": ratios[key]["median"],
                    "met": ratios[key]["median"] >= target,
                }
                ceiling = per_mode[best[ours]].get("tok_s_ceiling")
                if ceiling is not None:
                    # Whether the goal is reachable with these matrix-product kernels at all.
                    goal[f"{ours}/{peer}"]["ceiling_ratio"] = ceiling / per_mode[best[peer]]["tok_s_median"]
    prompts = [p for _, p, _ in reqs]
    outputs = [o for _, _, o in reqs]
    doc = {
        "benchmark": "peer: this engine vs Hugging Face transformers and vLLM, same weights and workload",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "host": platform.node(),
        "device": "cpu-here",
        "device_name": device_name(torch.device("cpu")),
        # The workers' torch threads, not this process's: what the timed steps ran on.
        "machine": Machine("cpu", device_name(torch.device("cpu")), a.threads, cpu_flags()).to_dict(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": version("transformers"),
        "safetensors": version("safetensors"),
        # vLLM's own environment (its versions, dtype, engine arguments), or why it was skipped.
        "vllm": (
            {"skipped": vllm_skipped}
            if vllm_skipped
            else next(rounds[0]["modes"][v]["vllm"] for v in runs if engine(v) == "vllm")
            if "vllm" in modes
            else None
        ),
        "threads": a.threads,
        "dtypes": dtypes,
        "best_variant": best,
        "omp_wait_policy": a.omp_wait_policy,
        "gomp_spincount": os.environ.get("GOMP_SPINCOUNT") or ENV_DEFAULTS["GOMP_SPINCOUNT"],
        "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE") or ENV_DEFAULTS["THP_MEM_ALLOC_ENABLE"],
        "loadavg_before": load0,
        "loadavg_after": load_average(),
        "total_s": total_s,
        "git": git0,
        "git_after": git_state(),
        "batching_source_digests": sources,
        "model": {
            "name": a.model,
            "params": shape.params,
            "seed": a.model_seed,
            "layers": shape.layers,
            "hidden": shape.hidden,
            "heads": shape.heads,
            "kv_heads": shape.kv_heads,
            "ffn": shape.ffn,
            "vocab": shape.vocab,
            "tied_embeddings": shape.tied_embeddings,
            "checkpoint": os.path.relpath(ckpt, ROOT),
        },
        "workload": {
            "requests": len(reqs),
            "arrival": "all at t=0",
            "seed": a.seed,
            "prompt": f"lognormal median {a.prompt_median} sigma {a.prompt_sigma}, clipped to "
            f"[{a.prompt_lo}, {a.prompt_hi}]",
            "output": f"lognormal median {a.output_median} sigma {a.output_sigma}, clipped to "
            f"[{a.output_lo}, {a.output_hi}]",
            "prompt_tokens": sum(prompts),
            "output_tokens": sum(outputs),
            "prompt_len": {"min": min(prompts), "median": statistics.median(prompts), "max": max(prompts)},
            "output_len": {"min": min(outputs), "median": statistics.median(outputs), "max": max(outputs)},
            "prompt_ids": "batching.real.runner.prompt_ids(seed, rid, prompt_len, vocab), identical in every mode",
            "prompt_ids_digest": digests,
            "stop": "each request at its output length; EOS disabled",
            "lengths": reqs,
        },
        "modes_config": {
            "ours-continuous": {"scheduler": "continuous", "prefill_mode": "mixed", "slots": a.slots},
            "ours-chunked": {"scheduler": "chunked", "slots": a.slots, "token_budget": a.token_budget},
            "hf-static": {
                "generate": "left-padded batches in arrival order, greedy, each batch decodes to its "
                "longest output, outputs trimmed to each request's length",
                "batch": a.static_batch,
            },
            "hf-continuous": {
                "api": "model.init_continuous_batching + add_request(max_new_tokens=n)",
                "config": spec["hf_cb_config"],
            },
            "vllm": {
                "api": "vllm.LLM.generate (offline engine, in process), every request in one call",
                "slots": a.slots,
                "token_budget": a.token_budget,
                "environment": os.path.relpath(VLLM_VENV, ROOT),
                "kv_cache_gb": VLLM_KV_GB,
            },
        },
        "timing": "tokens/s = workload output tokens / wall time from the first request submitted to the last "
        "token; model load (vLLM: with its compilation) and one small warm-up request excluded in "
        "every engine; each mode in its own process; mode order rotated every round",
        "summary": per_mode,
        "ratios": ratios,
        "goal": goal,
        "token_equality": equality,
        "rounds": rounds,
    }
    errors = []
    if len(set(digests.values())) != 1:
        errors.append("prompt ids differ between modes")
    if len(sources) != 1:
        errors.append("the batching/ sources changed during the run: rounds measured different engines")
    if errors:
        doc["error"] = "; ".join(errors)
    out = (
        Path(a.out)
        if a.out
        else (
            CACHE / "peer-quick.json"
            if a.quick
            else ROOT / "benchmarks" / "results" / f"peer-cpu-here-{a.model}.json"
        )
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(
        f"\n{a.model} ({shape.params / 1e6:.1f}M params, {','.join(dtypes)}), {len(reqs)} requests, "
        f"{sum(outputs)} output tokens, "
        f"{a.rounds} rounds, {total_s:.0f} s"
    )
    for m in runs:
        print(
            f"  {m:21} best {per_mode[m]['tok_s_best']:8.1f}  median {per_mode[m]['tok_s_median']:8.1f} tok/s"
            + ("  (best dtype)" if best.get(engine(m)) == m else "")
        )
    for m in runs:
        if "tok_s_ceiling" in per_mode[m]:
            print(
                f"  {m:21} matrix products alone {per_mode[m]['linear_floor_s']:6.2f} s: at most "
                f"{per_mode[m]['tok_s_ceiling']:8.1f} tok/s"
            )
    for k, v in ratios.items():
        print(f"  {k:44} best {v['best']:5.2f}x  median {v['median']:5.2f}x")
    for k, v in goal.items():
        if "ceiling_ratio" in v:
            print(
                f"  {k:44} at most {v['ceiling_ratio']:5.2f}x with these matrix products (goal {v['target']})"
            )
    for k, v in equality.items():
        fm = v["first_mismatch"]
        print(
            f"  tokens {k:44} {v['equal']}/{v['requests']} equal"
            + ("" if fm is None else f"; first mismatch rid {fm['rid']} at token {fm['index']}")
        )
    if git0["dirty"]:
        print(f"  note: batching/ differs from commit {git0['commit'][:10]}: {', '.join(git0['dirty'])}")
    if "error" in doc:
        print("  ERROR: " + doc["error"])
    print(f"wrote {os.path.relpath(out, ROOT)}")


if __name__ == "__main__":
    main()
