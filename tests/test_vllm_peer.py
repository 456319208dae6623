"""vLLM as the peer, on the seeded ``cpu-s`` checkpoint: its OpenAI server replayed by
``python -m batching replay --prompt ids``, and its offline engine token for token against this
engine (benchmarks/bench_peer.py's ``vllm`` worker). vLLM lives in its own environment,
``.vllm-venv`` (``make vllm``); without it these tests are skipped, all but the tokenizer's."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import load_benchmark

from batching.costs.models import get_model
from batching.real.checkpoint import EOS_ID, save_hf_checkpoint, save_hf_tokenizer
from batching.real.model import Llama, ModelConfig
from batching.real.runner import prompt_ids

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = ROOT / ".vllm-venv" / "bin" / "python"
HAVE_VLLM = (ROOT / ".vllm-venv" / ".installed-vllm").is_file()

pytestmark = pytest.mark.model
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="needs vLLM's environment, .vllm-venv: run `make vllm`")
MODEL = "cpu-s"  # vLLM's CPU attention refuses tiny's head_dim of 16; cpu-s has 64
STARTUP_S = 300.0  # the first start compiles the model (~40 s here), later ones reuse the cache


def test_tokenizer_eos_is_a_logit_no_prompt_uses(tmp_path) -> None:
    """EOS is inside the vocabulary (a server may index the logits at it: vLLM's min_tokens
    does), and the prompt ids of every engine and of ``replay --vocab 1:V`` never hold it."""
    from transformers import AutoTokenizer

    save_hf_tokenizer(tmp_path, 256)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok.eos_token_id == EOS_ID and 0 <= EOS_ID < 256 and len(tok) == 256
    assert tok("t1 t2 t255 t7").input_ids == [1, 2, 255, 7]  # no BOS: N words are N tokens
    assert all(EOS_ID not in prompt_ids(s, rid, 500, 4) for s in range(3) for rid in range(20))


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The seeded ``cpu-s`` model as a checkpoint with its tokenizer."""
    path = tmp_path_factory.mktemp("vllm") / f"{MODEL}-seed0"
    shape = get_model(MODEL)
    save_hf_checkpoint(Llama(ModelConfig.from_shape(shape), "cpu", torch.float32, seed=0), path)
    save_hf_tokenizer(path, shape.vocab)
    return path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the server's process group (its engine process included), SIGKILL after 15 s."""
    for sig, wait_s in ((signal.SIGTERM, 15.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(wait_s)
        deadline = time.monotonic() + wait_s
        while _group_alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if proc.poll() is not None and not _group_alive(proc.pid):
            return


@pytest.mark.slow
@needs_vllm
def test_replay_against_vllm_server(checkpoint, tmp_path) -> None:
    """`python -m batching replay --prompt ids` of 8 requests against vLLM's OpenAI server on
    cpu-s: every request completes with exactly its output length, and no process stays."""
    import httpx

    port, log = _free_port(), tmp_path / "vllm-server.log"
    cmd = [str(VLLM_PY), "-m", "vllm.entrypoints.openai.api_server", "--model", str(checkpoint)]
    cmd += ["--served-model-name", MODEL, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--dtype", "float32", "--max-model-len", "1024", "--max-num-seqs", "8"]
    cmd += ["--max-num-batched-tokens", "512", "--no-enable-prefix-caching", "--seed", "0"]
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    env.update(
        VLLM_CPU_KVCACHE_SPACE="1",  # GB
        VLLM_CPU_OMP_THREADS_BIND="nobind",
        OMP_NUM_THREADS="2",
        VLLM_NO_USAGE_STATS="1",
        DO_NOT_TRACK="1",
        HF_HUB_OFFLINE="1",
    )
    url, out = f"http://127.0.0.1:{port}/v1", tmp_path / "replay.json"
    t0 = time.monotonic()
    with log.open("wb") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{url}/models", timeout=2.0).status_code == 200:
                    break
            if time.monotonic() - t0 > STARTUP_S:
                pytest.fail(
                    f"vLLM's server did not answer within {STARTUP_S:g} s:\n{log.read_text()[-3000:]}"
                )
            time.sleep(0.5)
        startup_s = time.monotonic() - t0
        replay = [sys.executable, "-m", "batching", "replay", "--preset", "chat-rag", "-n", "8"]
        replay += ["--scale-lengths", "16", "--time-scale", "8", "--url", url, "--served-model", MODEL]
        replay += ["--prompt", "ids", "--vocab", f"1:{get_model(MODEL).vocab}", "--out", str(out)]
        replay += ["--no-progress"]
        t1 = time.monotonic()
        p = subprocess.run(replay, capture_output=True, text=True, timeout=300, cwd=ROOT, check=False)
        replay_s = time.monotonic() - t1
    finally:
        _stop_group(proc)
    assert proc.poll() is not None and not _group_alive(proc.pid), "a vLLM process outlived the test"
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    doc = json.loads(out.read_text())
    reqs = doc["requests"]
    assert len(reqs) == 8 and [r["status"] for r in reqs] == ["ok"] * 8, [r["error"] for r in reqs]
    for r in reqs:
        assert r["usage_prompt"] == r["prompt_len"] and r["usage_output"] == r["output_len"]
        assert len(r["token_times"]) == r["output_len"]
    assert doc["summary"]["completed"] == 8
    print(f"vLLM server up in {startup_s:.1f} s, replay {replay_s:.1f} s")


@pytest.mark.slow
@needs_vllm
def test_vllm_offline_tokens_equal_this_engines(checkpoint, tmp_path) -> None:
    """bench_peer's vllm worker (LLM.generate, fp32, greedy) in .vllm-venv and this engine's
    chunked prefill on the same checkpoint and 6 requests: the same prompt ids, the same tokens."""
    bench = load_benchmark("bench_peer")
    shape = get_model(MODEL)
    reqs = [[0, 20, 12], [1, 5, 30], [2, 90, 8], [3, 33, 17], [4, 140, 5], [5, 12, 24]]
    spec = {"checkpoint": str(checkpoint), "seed": 0, "vocab": shape.vocab, "threads": 2}
    spec |= {"requests": reqs, "slots": 4, "token_budget": 64}
    spec_path, out = tmp_path / "spec.json", tmp_path / "vllm.json"
    spec_path.write_text(json.dumps(spec))
    cmd = [str(VLLM_PY), str(ROOT / "benchmarks" / "bench_peer.py"), "--worker", "vllm"]
    cmd += ["--spec", str(spec_path), "--out", str(out)]
    env = bench.worker_env("vllm", 2, "default")
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=400, cwd=ROOT, check=False)
    assert p.returncode == 0, (p.stdout + p.stderr)[-3000:]
    theirs = json.loads(out.read_text())
    assert theirs["vllm"]["dtype"] == "float32" and theirs["vllm"]["version"].startswith("0.32")
    ours = bench.worker_ours("ours-chunked", spec)
    assert theirs["prompt_digest"] == ours["prompt_digest"]
    assert {int(k): v for k, v in theirs["tokens"].items()} == ours["tokens"]
    assert [len(ours["tokens"][rid]) for rid, _, _ in reqs] == [o for _, _, o in reqs]
