"""A real OpenAI-compatible server on this CPU: ``transformers serve --continuous-batching``
on the seeded ``tiny`` checkpoint, replayed with a small workload (batching.servers.transformers_serve)."""

from __future__ import annotations

import json
import time

import pytest

from batching.cli import main
from batching.servers import process, transformers_serve

MISSING = transformers_serve.missing_packages()

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        bool(MISSING), reason=f"needs the serve extra (transformers[serving]); missing: {', '.join(MISSING)}"
    ),
]


def test_tokenizer_counts_words_and_its_eos_is_out_of_the_models_reach(tmp_path):
    from transformers import AutoTokenizer

    transformers_serve.write_tokenizer(tmp_path, 256)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tok("t1 t2 t255 t7").input_ids == [1, 2, 255, 7]  # no BOS: N words are N tokens
    assert tok.eos_token_id == 256  # the tiny model has 256 logits: ids 0..255


def test_replay_against_transformers_serve(tmp_path):
    ckpt = transformers_serve.prepare_checkpoint(tmp_path / "tiny", "tiny", seed=0)
    out = tmp_path / "r.json"
    with transformers_serve.transformers_serve(ckpt, threads=2) as srv:
        pgid = srv.process.pid
        t_start = time.time()
        rc = main(
            [
                "replay",
                "--preset",
                "chat-rag",
                "-n",
                "8",
                "--scale-lengths",
                "16",
                "--time-scale",
                "8",
                "--url",
                srv.url,
                "--served-model",
                srv.model,
                "--prompt",
                "text",
                "--tokenizer",
                str(ckpt),
                "--out",
                str(out),
                "--no-progress",
            ]
        )
        wall = time.time() - t_start
    assert rc == 0
    assert srv.process.poll() is not None and not process.group_alive(pgid)  # nothing left behind
    doc = json.loads(out.read_text())
    reqs = doc["requests"]
    assert [r["status"] for r in reqs] == ["ok"] * 8, [r["error"] for r in reqs]
    first = min(r["arrival"] for r in reqs)
    for r in reqs:
        assert r["usage_prompt"] == r["prompt_len"] and r["usage_output"] == r["output_len"]
        t = r["token_times"]
        assert len(t) == r["output_len"] and t == sorted(t)
        assert r["arrival"] <= r["sent"] < t[0] and t[-1] - first <= wall
    assert doc["summary"]["completed"] == 8 and doc["summary"]["ttft"]["p50"] > 0
