"""``python -m batching replay`` against an in-process fake OpenAI server (tests/fake_openai.py):
exact lengths in the request bodies, real arrival times, token timestamps, the usage check,
and one-line errors with exit status 2 that keep what was measured."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("httpx")

from fake_openai import FakeOpenAI

from batching.cli import main
from batching.metrics import PERCENTILES
from batching.servers.process import free_port


def simulate_doc(tmp_path: Path) -> dict:
    """A ``simulate`` results file of the same preset: the schema replay must match."""
    out = tmp_path / "sim.json"
    args = ["simulate", "--preset", "chat-rag", "-n", "6", "--scheduler", "continuous", "--no-progress"]
    assert main([*args, "--out", str(out)]) == 0
    return json.loads(out.read_text())


def replay(tmp_path: Path, url: str, *extra: str, model: str = "fake", n: int = 6) -> tuple[int, dict | None]:
    out = tmp_path / "r.json"
    rc = main(
        [
            "replay",
            "--preset",
            "chat-rag",
            "-n",
            str(n),
            "--scale-lengths",
            "40",
            "--time-scale",
            "20",
            "--url",
            url,
            "--served-model",
            model,
            "--out",
            str(out),
            "--no-progress",
            *extra,
        ]
    )
    return rc, json.loads(out.read_text()) if out.exists() else None


def test_replay_sends_exact_lengths_at_arrival_times(tmp_path, capsys):
    with FakeOpenAI() as srv:
        rc, doc = replay(tmp_path, srv.url, "--max-connections", "64")
    assert rc == 0 and doc is not None
    reqs = doc["requests"]
    assert [r["status"] for r in reqs] == ["ok"] * 6
    # The bodies: token-id prompts of exactly the workload's length, output forced to its length.
    bodies = sorted((b for _, b in srv.received), key=lambda b: len(b["prompt"]))
    want = sorted((r["prompt_len"], r["output_len"]) for r in reqs)
    got = sorted((len(b["prompt"]), b["max_tokens"]) for b in bodies)
    assert got == want
    assert all(b["ignore_eos"] and b["min_tokens"] == b["max_tokens"] and b["stream"] for b in bodies)
    assert all(b["return_token_ids"] is True for b in bodies)  # each chunk says its tokens
    assert all(isinstance(t, int) for b in bodies for t in b["prompt"])
    # Each request left at (never before) its scheduled arrival; token times ordered, after it.
    first = reqs[0]["arrival"]
    for r in reqs:
        t = r["token_times"]
        assert len(t) == r["output_len"] == r["usage_output"] and r["usage_prompt"] == r["prompt_len"]
        assert r["sent"] >= r["arrival"] and t == sorted(t) and t[0] > r["sent"]
        assert r["ttft"] == pytest.approx(t[0] - r["arrival"]) and r["e2e"] == pytest.approx(
            t[-1] - r["arrival"]
        )
        # Both origins: the scheduled arrival (the trace's) and the send (vLLM's).
        assert r["ttft_from_send"] == pytest.approx(t[0] - r["sent"]) and r["ttft_from_send"] <= r["ttft"]
        assert r["e2e_from_send"] == pytest.approx(t[-1] - r["sent"])
        assert r["chunks"] == r["tokens_received"] == r["output_len"] and r["token_times_exact"]
    # The server saw the requests in arrival order, spaced as the (scaled) trace spaces them
    # but for how late the client sent each (its dispatch lateness, which a busy machine
    # raises) and a margin for the loopback server's own thread.
    seen = [t for t, _ in srv.received]
    by_send = sorted(reqs, key=lambda r: r["sent"])
    assert [r["arrival"] for r in by_send] == sorted(r["arrival"] for r in reqs)
    for (r0, r1), (s0, s1) in zip(zip(by_send, by_send[1:]), zip(seen, seen[1:])):
        late = (r0["sent"] - r0["arrival"]) + (r1["sent"] - r1["arrival"])
        assert abs((s1 - s0) - (r1["arrival"] - r0["arrival"])) <= late + 0.1
    s = doc["summary"]
    sim = simulate_doc(tmp_path)
    assert (
        set(doc) == set(sim)
        and set(s) >= set(sim["summary"])
        and set(doc["config"]) >= {"workload", "scheduler", "executor", "model", "device"}
    )
    assert set(doc["requests"][0]) >= set(sim["requests"][0])
    assert s["steps"] is None and s["completed"] == 6 and s["failed"] == 0
    assert s["ttft_from_send"]["mean"] <= s["ttft"]["mean"] and s["itl_chunks"] == s["itl"]
    assert s["excluded"]["ttft"] == {} and s["excluded"]["e2e_from_send"] == {}
    assert s["duration_s"] == pytest.approx(max(r["finish"] for r in reqs) - first)
    assert s["output_tokens"] == sum(r["output_len"] for r in reqs)
    assert set(s["ttft"]) == {"mean", "max", *(f"p{p}" for p in PERCENTILES)}
    assert 0 <= s["dispatch_lateness"]["p50"] <= s["dispatch_lateness"]["p99"] < 0.5
    assert doc["config"]["max_connections"] == 64 and doc["meta"]["client"]["library"] == "httpx"
    assert doc["meta"]["server"]["models"] == ["fake"]
    assert "server | chat-rag (6 requests, 6 complete)" in capsys.readouterr().out


def test_a_saturated_connection_limit_is_reported(tmp_path, capsys):
    with FakeOpenAI(token_delay_s=0.05) as srv:
        rc, doc = replay(tmp_path, srv.url, "--max-connections", "1", "--time-scale", "1000")
    assert rc == 0 and doc is not None and doc["meta"]["client"]["peak_in_flight"] > 1
    err = capsys.readouterr().err
    assert "requests in flight on 1 connections" in err and "waited in the client" in err
    assert doc["config"]["max_connections"] == 1


def test_usage_mismatch_is_marked_counted_and_printed(tmp_path, capsys):
    with FakeOpenAI(mode="short") as srv:
        rc, doc = replay(tmp_path, srv.url)
    assert rc == 0 and doc is not None
    assert {r["status"] for r in doc["requests"]} == {"usage_mismatch"}
    s = doc["summary"]
    assert s["status_counts"]["usage_mismatch"] == 6 and s["completed"] == 0
    assert s["ttft"]["mean"] is None and s["request_throughput"] is None  # nothing averaged in
    assert "6 request(s) usage_mismatch" in capsys.readouterr().err


def test_empty_text_chunks_are_tokens(tmp_path, capsys):
    # vLLM streams a chunk per new token, also when its text is empty (a partial UTF-8
    # character held back, a skipped special token); vllm bench serve counts each one.
    for extra in ([], ["--no-token-ids"]):
        with FakeOpenAI(mode="empty_text") as srv:
            rc, doc = replay(tmp_path, srv.url, *extra, n=4)
        assert rc == 0 and doc is not None
        assert [r["status"] for r in doc["requests"]] == ["ok"] * 4
        for r in doc["requests"]:
            assert len(r["token_times"]) == r["output_len"] and r["ttft"] is not None
        assert doc["summary"]["completed"] == 4 and doc["summary"]["excluded"]["ttft"] == {}
    assert all("return_token_ids" not in b for _, b in srv.received)  # --no-token-ids


def test_bundled_chunks_keep_their_latencies(tmp_path, capsys):
    # Two tokens per chunk (speculative decoding streams so). With token_ids every token is
    # timed (the two of a chunk share its time); without, TTFT, E2E and TPOT stay and the
    # per-token gaps are left out, counted and said.
    with FakeOpenAI(mode="bundle") as srv:
        rc, doc = replay(tmp_path, srv.url, n=4)
    assert rc == 0 and doc is not None
    reqs = doc["requests"]
    assert [r["status"] for r in reqs] == ["ok"] * 4
    for r in reqs:
        t = r["token_times"]
        assert len(t) == r["output_len"] and r["chunks"] == (r["output_len"] + 1) // 2
        if r["output_len"] > 2:
            assert t[0] == t[1] and t[2] > t[1]
    assert doc["summary"]["excluded"]["itl"].get("bundled", 0) == 0
    capsys.readouterr()
    with FakeOpenAI(mode="bundle") as srv:
        rc, doc = replay(tmp_path, srv.url, "--no-token-ids", n=4)
    assert rc == 0 and doc is not None
    s, reqs = doc["summary"], doc["requests"]
    two_plus = [r for r in reqs if r["output_len"] > 1]
    assert two_plus and all(r["token_times"] is None and r["ttft"] is not None for r in two_plus)
    assert all(r["tpot"] == pytest.approx((r["e2e"] - r["ttft"]) / (r["output_len"] - 1)) for r in two_plus)
    assert s["completed"] == 4 and s["ttft"]["mean"] is not None
    assert s["excluded"]["itl"]["bundled"] == len(two_plus) and s["excluded"]["ttft"] == {}
    assert s["itl_chunks"]["mean"] is not None
    err = capsys.readouterr().err
    assert f"itl leave(s) out {len(two_plus)} request(s): several tokens per streamed chunk" in err


def test_a_last_chunk_with_only_a_finish_reason_is_no_token(tmp_path):
    # transformers serve ends with {"choices": [{"text": "", "finish_reason": ...}], "usage": ...}.
    with FakeOpenAI(mode="finish_chunk", token_delay_s=0.01) as srv:
        rc, doc = replay(tmp_path, srv.url, "--no-token-ids", n=3)
    assert rc == 0 and doc is not None
    for r in doc["requests"]:
        assert r["status"] == "ok" and r["chunks"] == r["output_len"] == len(r["token_times"])
    assert doc["summary"]["excluded"]["itl"].get("stream_vs_usage") is None


def test_missing_usage_is_marked(tmp_path):
    with FakeOpenAI(mode="no_usage") as srv:
        _, doc = replay(tmp_path, srv.url, "--no-token-ids", n=3)
    assert doc is not None
    assert all(r["status"] == "usage_mismatch" and "no usage" in r["error"] for r in doc["requests"])
    assert doc["summary"]["excluded"]["ttft"] == {"usage_mismatch": 3}
    assert all(r["ttft"] is not None for r in doc["requests"])  # measured, kept in the record


def test_api_key_and_headers(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    with FakeOpenAI(api_key="sekrit") as srv:
        rc, doc = replay(tmp_path, srv.url, n=2)
        err = capsys.readouterr().err.strip()
        assert rc == 2 and doc is None and "HTTP 401" in err and "\n" not in err
        rc, doc = replay(tmp_path, srv.url, "--api-key", "sekrit", "--header", "X-Team: book", n=2)
        assert rc == 0 and doc is not None and doc["summary"]["completed"] == 2
        assert all(h.get("X-Team") == "book" for h in srv.headers[-2:])
        assert doc["config"]["headers"] == ["Authorization", "X-Team"]  # names, never the key
        assert "sekrit" not in json.dumps(doc)
        monkeypatch.setenv("OPENAI_API_KEY", "sekrit")
        rc, doc = replay(tmp_path, srv.url, n=2)
        assert rc == 0 and doc is not None and doc["summary"]["completed"] == 2


@pytest.mark.parametrize("code", [400, 503])
def test_http_error_stops_with_one_line_and_keeps_results(tmp_path, capsys, code):
    with FakeOpenAI(mode=f"status:{code}") as srv:
        # The third request of the workload (its prompt length identifies it) is rejected.
        from batching.workloads import preset

        w = preset("chat-rag", seed=0, n=6).scale(lengths=40, time=20)
        srv.bad_prompt_len = int(w.prompt_lens[2])
        rc, doc = replay(tmp_path, srv.url)
    assert rc == 2 and doc is not None
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("error: request") and f"HTTP {code}" in err and "prompt rejected" in err
    statuses = [r["status"] for r in doc["requests"]]
    assert statuses[2] == "error" and len(statuses) == 6  # nothing dropped
    assert doc["summary"]["failed"] >= 1


def test_timeouts_are_marked_not_fatal(tmp_path, capsys):
    with FakeOpenAI(token_delay_s=0.5) as srv:
        rc, doc = replay(tmp_path, srv.url, "--request-timeout", "0.1", n=3)
    assert rc == 0 and doc is not None
    assert [r["status"] for r in doc["requests"]] == ["timeout"] * 3
    assert doc["summary"]["status_counts"]["timeout"] == 3
    assert "3 request(s) timeout: request 0: no data for 0.1 s" in capsys.readouterr().err


def test_non_streaming_server_is_refused(tmp_path, capsys):
    with FakeOpenAI(mode="json") as srv:
        rc, doc = replay(tmp_path, srv.url)
    assert rc == 2 and doc is not None
    assert "did not stream" in capsys.readouterr().err


def test_unknown_model_and_unreachable_url(tmp_path, capsys):
    with FakeOpenAI() as srv:
        rc, doc = replay(tmp_path, srv.url, model="llama-70b")
    assert rc == 2 and doc is None
    assert capsys.readouterr().err.strip() == "error: --served-model llama-70b: the server lists fake"
    url = f"http://127.0.0.1:{free_port()}/v1"
    rc, doc = replay(tmp_path, url)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and doc is None and err.startswith(f"error: --url {url}: cannot reach the server")
    assert "Traceback" not in err


def test_bad_options_are_one_line(tmp_path, capsys):
    with FakeOpenAI() as srv:
        for extra, msg in [
            (["--vocab", "9"], "--vocab '9': expected LO:HI"),
            (["--extra-body", "[1]"], "--extra-body '[1]': expected a JSON object"),
            (["--prompt", "text"], "--prompt text needs --tokenizer"),
            (["--max-connections", "0"], "--max-connections=0: must be >= 1"),
            (["--request-timeout", "0"], "--request-timeout=0.0: must be a finite number > 0"),
            (["--header", "nocolon"], "--header 'nocolon': expected NAME:VALUE"),
        ]:
            rc, _ = replay(tmp_path, srv.url, *extra)
            err = capsys.readouterr().err.strip()
            assert rc == 2 and err.startswith(f"error: {msg}") and "\n" not in err, (extra, err)


def test_text_prompts_have_exact_length(tmp_path):
    tokenizers = pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {f"t{i}": i for i in range(50)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    with FakeOpenAI() as srv:
        rc, doc = replay(tmp_path, srv.url, "--prompt", "text", "--tokenizer", str(tmp_path))
    assert rc == 0 and doc is not None and tokenizers
    for _, b in srv.received:
        assert isinstance(b["prompt"], str) and "ignore_eos" not in b
    got = sorted(len(tok.encode(b["prompt"]).ids) for _, b in srv.received)
    assert got == sorted(r["prompt_len"] for r in doc["requests"])
    assert all(r["status"] == "ok" for r in doc["requests"])


def test_replay_runs_inside_a_running_event_loop():
    # A notebook kernel runs an event loop: the library call must still work there.
    import asyncio

    from batching.servers.replay import ReplayOptions
    from batching.servers.replay import replay as replay_fn
    from batching.workloads import Workload

    w = Workload.from_arrays([0.0, 0.01], [5, 6], [3, 2])
    with FakeOpenAI() as srv:

        async def inside() -> list:
            return replay_fn(w, ReplayOptions(url=srv.url, model="fake"))[0]

        reqs = asyncio.run(inside())
    assert [r.status for r in reqs] == ["ok", "ok"] and [len(r.token_times or []) for r in reqs] == [3, 2]
