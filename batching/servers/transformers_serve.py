"""``transformers serve`` with continuous batching on this CPU, on the seeded checkpoint
(:func:`batching.real.checkpoint.save_hf_checkpoint`).

:func:`write_tokenizer` adds a word-level tokenizer ``t0 .. t{V-1}`` (a prompt of N tokens
is N words) and an EOS with id ``V``, outside the model's logits, so greedy decoding runs
every request to its ``max_tokens``. The server refuses ``ignore_eos`` (422), hence text
prompts. Needs the ``serve`` extra.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .process import free_port, stop_group, wait_ready

EOS = "<eos>"

# transformers' continuous batching is ~4x slower here with its defaults; these are the
# peer benchmark's CPU settings (benchmarks/bench_peer.py: --hf-page-size etc.).
CPU_CB_FLAGS = ("--cb-block-size", "64", "--cb-num-blocks", "256", "--cb-max-batch-tokens", "512")


def missing_packages() -> list[str]:
    """The serving packages this machine lacks (empty: ``transformers serve`` can start)."""
    import importlib.util

    need = ("transformers", "tokenizers", "fastapi", "uvicorn", "openai", "httpx", "torch")
    return [m for m in need if importlib.util.find_spec(m) is None]


def write_tokenizer(folder: str | Path, vocab: int) -> Path:
    """A word-level tokenizer ``t0 .. t{vocab-1}`` plus an unreachable EOS (id ``vocab``),
    saved as ``PreTrainedTokenizerFast`` files beside the checkpoint."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    # Importing transformers imports huggingface_hub, which imports tqdm.auto: in a Jupyter
    # kernel without ipywidgets that warns "IProgress not found" (once per process), about a
    # progress bar that nothing here shows; the measured page, which makes its checkpoint
    # here (batching.book.serve), would print it.
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="IProgress not found")
        from transformers import PreTrainedTokenizerFast

    words = {f"t{i}": i for i in range(vocab)}
    words[EOS] = vocab
    tok = Tokenizer(models.WordLevel(words, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tok, eos_token=EOS).save_pretrained(str(folder))
    return Path(folder)


def prepare_checkpoint(folder: str | Path, model: str = "tiny", seed: int = 0) -> Path:
    """The seeded ``model`` as a Hugging Face checkpoint with its tokenizer in ``folder``
    (written once; the weights depend only on ``model`` and ``seed``)."""
    folder = Path(folder)
    if not (folder / "model.safetensors").exists() or not (folder / "tokenizer.json").exists():
        from ..costs.models import get_model
        from ..real.checkpoint import save_hf_checkpoint  # torch loads here, after batching.real
        from ..real.kernels import DTYPES
        from ..real.model import Llama, ModelConfig

        shape = get_model(model)
        save_hf_checkpoint(Llama(ModelConfig.from_shape(shape), "cpu", DTYPES["fp32"], seed=seed), folder)
        write_tokenizer(folder, shape.vocab)
    return folder


@dataclass
class Server:
    url: str  # base URL ending in /v1
    model: str  # the served model name
    process: subprocess.Popen[bytes]
    command: list[str]
    startup_s: float

    def describe(self) -> dict[str, Any]:
        from importlib.metadata import version

        return {
            "server": "transformers serve",
            "transformers": version("transformers"),
            "command": " ".join(self.command),
            "startup_s": self.startup_s,
        }


@contextlib.contextmanager
def transformers_serve(
    checkpoint: str | Path, *, threads: int | None = None, log: str | Path | None = None
) -> Iterator[Server]:
    """Start ``transformers serve CHECKPOINT --continuous-batching`` on a free loopback port,
    wait until ``/v1/models`` answers, and stop its process group on exit. The server gets
    this engine's thread and huge-page settings (:data:`batching.real.ENV_DEFAULTS`) unless
    the environment sets them."""

    port, startup_timeout_s = free_port(), 120.0
    ckpt = str(Path(checkpoint).resolve())
    exe = shutil.which("transformers", path=str(Path(sys.executable).parent)) or shutil.which("transformers")
    if exe is None:
        raise FileNotFoundError(
            "the transformers command is not installed (pip install 'transformers[serving]')"
        )
    cmd = [exe, "serve", ckpt, "--continuous-batching", "--device", "cpu", "--dtype", "float32"]
    cmd += ["--host", "127.0.0.1", "--port", str(port), "--log-level", "warning", *CPU_CB_FLAGS]
    from ..real import ENV_DEFAULTS  # the thread and huge-page settings this engine runs with

    env = {**ENV_DEFAULTS, **os.environ}
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    log_path = Path(log) if log else Path(ckpt) / "serve.log"
    t0 = time.perf_counter()
    with log_path.open("wb") as logf:
        proc = subprocess.Popen(cmd, stdout=logf, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}/v1"
    try:
        wait_ready(proc, url, log_path, "transformers serve", startup_timeout_s)
        yield Server(url, ckpt, proc, cmd, time.perf_counter() - t0)
    finally:
        stop_group(proc)
