"""vLLM as the peer, on the seeded ``cpu-s`` checkpoint: its offline engine token for token
against this engine (benchmarks/bench_peer.py's ``vllm`` worker), and one start of its OpenAI
server (a module fixture, stopped with its process group and leak-checked at the end) shared
by ``python -m batching replay --prompt ids`` and by the real ``vllm bench serve`` on both
datasets ``python -m batching export`` writes, each result imported with ``import-vllm`` and
checked against vLLM's own numbers. vLLM lives in its own environment, ``.vllm-venv`` (``make
vllm``); without it these tests are skipped, all but the tokenizer's."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from helpers import load_benchmark

from batching.costs.models import get_model
from batching.real.checkpoint import EOS_ID, save_hf_checkpoint, save_hf_tokenizer
from batching.real.model import Llama, ModelConfig
from batching.real.runner import prompt_ids
from batching.servers import process, vllm_serve

ROOT = Path(__file__).resolve().parent.parent
VLLM_PY = vllm_serve.VLLM_PY
HAVE_VLLM = vllm_serve.have_vllm()

pytestmark = pytest.mark.model
needs_vllm = pytest.mark.skipif(not HAVE_VLLM, reason="needs vLLM's environment, .vllm-venv: run `make vllm`")
MODEL = "cpu-s"  # vLLM's CPU attention refuses tiny's head_dim of 16; cpu-s has 64
STARTUP_S = 300.0  # the first start compiles the model (~40 s here), later ones reuse the cache
# A small Azure-like slice: chat-rag's lengths / 16 (prompts 7-215 tokens, outputs 5-61).
SLICE = ["--preset", "chat-rag", "-n", "12", "--scale-lengths", "16"]
# vLLM's --self-timed client sleeps until each row's timestamp on an event loop that also reads
# every stream: measured here 0.1-5.5 ms late (p99 5.5 ms over 12 rows, 2 busy shared cores). A
# send more than this past its timestamp is not following the trace (a run ignoring the
# timestamps would send all 12 at once, up to 2.2 s early).
LATE_S = 0.25


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


@pytest.fixture(scope="module")
def vllm_server(checkpoint, tmp_path_factory):
    """vLLM's OpenAI server on cpu-s on a free loopback port (batching.servers.vllm_serve),
    started once for the module's tests; at the end its process group (the engine's process
    included) is stopped and checked gone."""
    log = tmp_path_factory.mktemp("vllm-server") / "vllm-server.log"
    try:
        with vllm_serve.vllm_serve(checkpoint, model=MODEL, log=log, startup_s=STARTUP_S) as srv:
            print(f"vLLM server up in {srv.startup_s:.1f} s")
            yield srv
    except RuntimeError as e:
        pytest.fail(f"{e}:\n{log.read_text()[-3000:]}")


def _run(
    cmd: list[str], timeout_s: float, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run ``cmd`` in its own process group from the repository root; on a timeout the whole
    group is stopped, so nothing it started stays."""
    proc = subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.stop_group(proc)
        out, err = proc.communicate()
        pytest.fail(f"{cmd[:4]} ran past {timeout_s:g} s:\n{(out + err)[-3000:]}")
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def _batching(*args: str) -> subprocess.CompletedProcess[str]:
    p = _run([sys.executable, "-m", "batching", *args], 300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p


def _printed_flags(stdout: str) -> list[str]:
    """The ``vllm bench serve`` flags ``export`` printed, split as a shell would."""
    line = next(ln for ln in stdout.splitlines() if ln.startswith("vllm bench serve "))
    return line.split()[3:]


def _bench_serve(server: vllm_serve.Server, flags: list[str], result: Path) -> tuple[dict[str, Any], float]:
    """The real ``vllm bench serve`` (.vllm-venv) against ``server`` with ``flags`` as export
    printed them, plus where to reach it and the checkpoint's tokenizer; its result JSON."""
    cmd = [str(VLLM_PY.parent / "vllm"), "bench", "serve", *flags]
    cmd += ["--base-url", server.url.removesuffix("/v1"), "--model", MODEL]
    cmd += ["--tokenizer", str(server.checkpoint), "--disable-tqdm"]
    cmd += ["--result-dir", str(result.parent), "--result-filename", result.name]
    t0 = time.monotonic()
    p = _run(cmd, 300, env=vllm_serve.vllm_env())
    wall = time.monotonic() - t0
    assert p.returncode == 0 and result.is_file(), (p.stdout + p.stderr)[-3000:]
    return json.loads(result.read_text()), wall


def _assert_vllms_numbers(doc: dict[str, Any], theirs: dict[str, Any], n: int) -> int:
    """The imported summary states vLLM's own statistics: completed, mean TTFT (from the send,
    vLLM's origin), mean ITL (its gaps between chunks) and mean TPOT, to 0.01 ms. A busy
    server streams two tokens in one chunk now and then (its output collector merges what the
    client has not read yet): such a request is counted as bundled, as its ITL list in vLLM's
    file says, and leaves only the per-token ITL, which then differs from vLLM's per-chunk one.
    Returns how many were bundled."""
    s = doc["summary"]
    assert s["completed"] == theirs["completed"] == n and theirs["failed"] == 0
    pairs = list(zip(theirs["itls"], theirs["output_lens"]))
    bundled = sum(len(itl) < out - 1 for itl, out in pairs)
    one = sum(out <= 1 for _, out in pairs)
    want = {k: v for k, v in (("bundled", bundled), ("one_output_token", one)) if v}
    assert s["excluded"]["ttft"] == {} and s["excluded"]["itl"] == want
    ms = lambda x: 1e3 * x
    assert ms(s["ttft_from_send"]["mean"]) == pytest.approx(theirs["mean_ttft_ms"], abs=0.01)
    assert ms(s["itl_chunks"]["mean"]) == pytest.approx(theirs["mean_itl_ms"], abs=0.01)
    if not bundled:  # one token per chunk: the per-token ITL is vLLM's too
        assert ms(s["itl"]["mean"]) == pytest.approx(theirs["mean_itl_ms"], abs=0.01)
    assert ms(s["tpot"]["mean"]) == pytest.approx(theirs["mean_tpot_ms"], abs=0.01)
    assert s["duration_s"] == theirs["duration"]
    return bundled


@pytest.mark.slow
@needs_vllm
def test_replay_against_vllm_server(vllm_server, tmp_path) -> None:
    """`python -m batching replay --prompt ids` of 8 requests against vLLM's OpenAI server on
    cpu-s: every request completes with exactly its output length."""
    out = tmp_path / "replay.json"
    replay = ["replay", "--preset", "chat-rag", "-n", "8"]
    replay += [
        "--scale-lengths",
        "16",
        "--time-scale",
        "8",
        "--url",
        vllm_server.url,
        "--served-model",
        MODEL,
    ]
    replay += ["--prompt", "ids", "--vocab", f"1:{get_model(MODEL).vocab}", "--out", str(out)]
    replay += ["--no-progress"]
    t1 = time.monotonic()
    _batching(*replay)
    replay_s = time.monotonic() - t1
    doc = json.loads(out.read_text())
    reqs = doc["requests"]
    assert len(reqs) == 8 and [r["status"] for r in reqs] == ["ok"] * 8, [r["error"] for r in reqs]
    for r in reqs:
        assert r["usage_prompt"] == r["prompt_len"] and r["usage_output"] == r["output_len"]
        assert len(r["token_times"]) == r["output_len"]
    assert doc["summary"]["completed"] == 8
    print(f"replay {replay_s:.1f} s")


@pytest.mark.slow
@needs_vllm
def test_vllm_bench_serve_custom_dataset_imports_with_vllms_numbers(vllm_server, tmp_path) -> None:
    """`export --format vllm-custom` with the checkpoint's tokenizer (texts of exact length),
    the real `vllm bench serve --dataset-name custom` with the flags export printed (Gamma
    arrivals at the fitted rate), then `import-vllm`: every request's lengths are the
    workload's, and the imported statistics are vLLM's own to 0.01 ms."""
    from batching.workloads import preset

    w = preset("chat-rag", seed=0, n=12).scale(lengths=16, time=8)
    data, result, out = tmp_path / "custom.jsonl", tmp_path / "vllm-custom.json", tmp_path / "imported.json"
    slice_ = [*SLICE, "--time-scale", "8"]
    p = _batching(
        "export",
        "--format",
        "vllm-custom",
        *slice_,
        "--tokenizer",
        str(vllm_server.checkpoint),
        "--out",
        str(data),
    )
    flags = _printed_flags(p.stdout)
    assert flags[:2] == ["--dataset-name", "custom"] and "--request-rate" in flags
    theirs, wall = _bench_serve(vllm_server, flags, result)
    assert theirs["input_lens"] == w.prompt_lens.tolist() and theirs["output_lens"] == w.output_lens.tolist()
    _batching("import-vllm", str(result), *slice_, "--out", str(out), "--no-progress")
    doc = json.loads(out.read_text())
    reqs = doc["requests"]
    assert [r["status"] for r in reqs] == ["ok"] * len(w), [r["error"] for r in reqs]
    for r, want in zip(reqs, w.requests):
        assert (r["prompt_len"], r["output_len"]) == (want.prompt_len, want.output_len)
        assert (r["usage_prompt"], r["usage_output"]) == (want.prompt_len, want.output_len)
        assert r["chunks"] <= want.output_len
        assert not r["token_times_exact"] or len(r["token_times"]) == want.output_len
    bundled = _assert_vllms_numbers(doc, theirs, len(w))
    assert sum(not r["token_times_exact"] for r in reqs) == bundled
    print(
        f"vllm bench serve (custom, {len(w)} requests) {wall:.1f} s, its run {theirs['duration']:.2f} s, "
        f"{bundled} streamed several tokens in a chunk"
    )


@pytest.mark.slow
@needs_vllm
def test_vllm_bench_serve_timed_trace_sends_at_the_trace_timestamps(vllm_server, tmp_path) -> None:
    """`export --format vllm-timed-trace`, the real `vllm bench serve --dataset-name
    timed_trace --self-timed` with the flags export printed, then `import-vllm --self-timed`:
    all complete with the workload's lengths (vLLM builds the prompts from hash_ids), vLLM's
    numbers are the import's, and vLLM sent the rows in order, each at its timestamp (its
    measured lateness under LATE_S)."""
    from batching.workloads import preset

    w = preset("chat-rag", seed=0, n=12).scale(lengths=16, time=2)  # 2.2 s of arrivals
    data, result, out = tmp_path / "trace.jsonl", tmp_path / "vllm-trace.json", tmp_path / "imported.json"
    slice_ = [*SLICE, "--time-scale", "2"]
    p = _batching("export", "--format", "vllm-timed-trace", *slice_, "--out", str(data))
    flags = _printed_flags(p.stdout)
    assert "--self-timed" in flags and flags[flags.index("--dataset-name") + 1] == "timed_trace"
    assert "--self-timed" in p.stdout.splitlines()[-1]  # how to import it
    theirs, wall = _bench_serve(vllm_server, flags, result)
    assert theirs["input_lens"] == w.prompt_lens.tolist() and theirs["output_lens"] == w.output_lens.tolist()
    starts = theirs["start_times"]
    assert starts == sorted(starts)  # in the file's order, which is the trace's
    _batching("import-vllm", str(result), *slice_, "--self-timed", "--out", str(out), "--no-progress")
    doc = json.loads(out.read_text())
    reqs = doc["requests"]
    assert [r["status"] for r in reqs] == ["ok"] * len(w), [r["error"] for r in reqs]
    for r, want in zip(reqs, w.requests):
        assert (r["usage_prompt"], r["usage_output"]) == (want.prompt_len, want.output_len)
        assert r["arrival"] == pytest.approx(want.arrival)  # due at its row's timestamp
    late = [r["lateness"] for r in reqs]
    assert 0.0 <= min(late) < 0.005 and max(late) < LATE_S, late  # the least late: its queue wait only
    # Each gap between sends is the trace's gap, up to the two requests' lateness.
    sends = [r["sent"] for r in reqs]
    off = [float(g) for g in abs(np.diff(sends) - np.diff(w.arrivals))]
    assert max(off) < LATE_S, off
    assert sends[-1] - sends[0] == pytest.approx(w.duration, abs=LATE_S)
    bundled = _assert_vllms_numbers(doc, theirs, len(w))
    lat = doc["summary"]["dispatch_lateness"]
    print(
        f"vllm bench serve (timed_trace, {len(w)} requests over {w.duration:.2f} s) {wall:.1f} s, its run "
        f"{theirs['duration']:.2f} s; sent late by p50 {1e3 * lat['p50']:.1f} ms, max {1e3 * lat['max']:.1f} ms; "
        f"{bundled} streamed several tokens in a chunk"
    )
