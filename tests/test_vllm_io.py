"""Exchange with ``vllm bench serve``: the custom-dataset JSONL we export, the Gamma fit of a
trace's arrivals, and a ``--save-result --save-detailed`` JSON written by hand in vLLM's
format (``vllm/benchmarks/serve.py``) imported as a results file."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from batching.cli import main
from batching.servers.vllm_io import fit_gamma
from batching.workloads import Workload, gamma_arrivals


def test_gamma_fit_recovers_vllms_arrival_model():
    # vLLM's draw: Gamma(shape=B, scale=1/(R*B)); 20,000 gaps pin R and B to ~2%.
    for rate, b in [(4.0, 1.0), (2.5, 0.3), (10.0, 4.0)]:
        a = gamma_arrivals(20_001, rate, b, np.random.default_rng(1))
        fit = fit_gamma(a)
        assert fit["rate"] == pytest.approx(rate, rel=0.03)
        assert fit["burstiness"] == pytest.approx(b, rel=0.06)
        assert fit["burstiness_mle"] == pytest.approx(b, rel=0.04)


def test_gamma_fit_by_hand():
    # gaps 1, 3: mean 2, sample variance 2 -> rate 0.5, burstiness 4/2 = 2.
    fit = fit_gamma(np.array([0.0, 1.0, 4.0]))
    assert fit["rate"] == 0.5 and fit["burstiness"] == 2.0 and fit["gaps"] == 2
    # Equal gaps: perfectly regular (infinite burstiness); one gap: nothing to fit.
    assert math.isinf(fit_gamma(np.arange(5.0))["burstiness"])
    assert fit_gamma(np.array([0.0, 1.0]))["burstiness"] is None


def test_export_writes_vllms_custom_dataset(tmp_path, capsys):
    out = tmp_path / "w.jsonl"
    info = tmp_path / "w.info.json"
    args = ["--preset", "chat-rag", "-n", "20", "--out", str(out), "--info", str(info)]
    assert main(["export", "--format", "vllm-custom", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    from batching.workloads import preset

    w = preset("chat-rag", seed=0, n=20)
    assert [r["output_tokens"] for r in rows] == w.output_lens.tolist()
    assert [len(r["prompt"].split()) for r in rows] == w.prompt_lens.tolist()
    meta = json.loads(info.read_text())
    assert meta["arrival_fit"]["rate"] == pytest.approx(19 / w.duration)
    flags = " ".join(meta["vllm_bench_flags"])
    for f in ("--dataset-name custom", "--custom-output-len -1", "--disable-shuffle", "--save-detailed"):
        assert f in flags
    printed = capsys.readouterr().out
    assert "Gamma burstiness" in printed and "vllm bench serve --dataset-name custom" in printed


def test_export_with_a_tokenizer_has_exact_prompt_lengths(tmp_path):
    pytest.importorskip("tokenizers")
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {f"t{i}": i for i in range(100)} | {"<s>": 100}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 100)])
    tok.save(str(tmp_path / "tokenizer.json"))
    out = tmp_path / "w.jsonl"
    args = ["--preset", "chat-rag", "-n", "10", "--scale-lengths", "10", "--out", str(out)]
    assert main(["export", "--format", "vllm-custom", *args, "--tokenizer", str(tmp_path)]) == 0
    from batching.workloads import preset

    want = preset("chat-rag", seed=0, n=10).scale(lengths=10).prompt_lens.tolist()
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    # vLLM counts the BOS its tokenizer adds: the text plus BOS is exactly the prompt length.
    assert [len(tok.encode(r["prompt"]).ids) for r in rows] == want


def vllm_result(n_err: int = 0) -> dict:
    """Three requests as vllm bench serve --save-result --save-detailed writes them (the
    keys of ``benchmark()`` and ``main_async()`` in vllm/benchmarks/serve.py): ``start_times``
    are its client's perf_counter at each send, ``queue_times`` the wait for a
    --max-concurrency slot before it."""
    return {
        "date": "20261201-120000",
        "endpoint_type": "vllm",
        "backend": "vllm",
        "label": None,
        "model_id": "meta-llama/Llama-3.1-8B",
        "tokenizer_id": "meta-llama/Llama-3.1-8B",
        "num_prompts": 3,
        "request_rate": 2.0,
        "burstiness": 1.0,
        "max_concurrency": None,
        "duration": 2.5,
        "completed": 3 - n_err,
        "failed": n_err,
        "total_input_tokens": 60,
        "total_output_tokens": 7,
        "request_throughput": 1.2,
        "output_throughput": 2.8,
        "input_lens": [10, 20, 30],
        "output_lens": [3, 1, 3 if not n_err else 0],
        "ttfts": [0.05, 0.04, 0.06 if not n_err else 0.0],
        "itls": [[0.01, 0.02], [], [0.03, 0.03] if not n_err else []],
        "latencies": [0.08, 0.04, 0.12 if not n_err else 0.0],
        "start_times": [1000.0, 1000.3, 1001.2],
        "queue_times": [0.0, 0.1, 0.0],
        "generated_texts": ["a b c", "d", "e f g" if not n_err else ""],
        "errors": ["", "", "" if not n_err else "Traceback (most recent call last):\n  File x\nBad Request"],
        "mean_ttft_ms": 50.0,
    }


def test_import_vllm_result(tmp_path, capsys):
    src = tmp_path / "vllm.json"
    res = vllm_result()
    src.write_text(json.dumps(res))
    out = tmp_path / "r.json"
    assert main(["import-vllm", str(src), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    r0, r1, r2 = doc["requests"]
    # Sent at start_times (from the first), arrived queue_times earlier; chunks at send + ttft, + each ITL.
    assert [r["sent"] for r in doc["requests"]] == pytest.approx([0.0, 0.3, 1.2])
    assert [r["arrival"] for r in doc["requests"]] == pytest.approx([0.0, 0.2, 1.2])
    assert r0["token_times"] == pytest.approx([0.05, 0.06, 0.08])
    assert r0["ttft"] == pytest.approx(0.05) and r0["e2e"] == pytest.approx(0.08)
    assert r1["ttft"] == pytest.approx(0.14) and r1["ttft_from_send"] == pytest.approx(0.04)
    assert [r["e2e_from_send"] for r in doc["requests"]] == pytest.approx(res["latencies"])
    assert r0["tpot"] == pytest.approx(0.015) and r1["tpot"] is None
    s = doc["summary"]
    assert s["completed"] == 3 and s["duration_s"] == 2.5  # vLLM's own measured window
    assert s["request_throughput"] == pytest.approx(3 / 2.5) and s["output_tokens"] == 7
    assert s["itl"]["mean"] == pytest.approx(np.mean([0.01, 0.02, 0.03, 0.03]))
    assert s["ttft_from_send"]["mean"] == pytest.approx(np.mean(res["ttfts"]))  # vLLM's mean TTFT
    assert doc["config"]["model"] == "meta-llama/Llama-3.1-8B" and doc["config"]["vllm"]["burstiness"] == 1.0
    assert "start_times" in doc["config"]["arrivals"]
    assert "vllm | vllm (3 requests, 3 complete)" in capsys.readouterr().out


def test_import_without_start_times_is_nominal_and_says_so():
    from batching.servers.vllm_io import import_result

    res = vllm_result()
    del res["start_times"], res["queue_times"]
    reqs, _, _, how = import_result(res)
    assert [r.arrival for r in reqs] == [0.0, 0.5, 1.0] and "nominal" in how
    res["request_rate"] = "inf"
    assert [r.arrival for r in import_result(res)[0]] == [0.0, 0.0, 0.0]


def test_bundled_tokens_are_kept_with_vllms_latencies(tmp_path, capsys):
    # Five requests; one streamed its 6 tokens in 3 chunks (speculative decoding): vLLM counts
    # it completed and averages its TTFT in, and so does the import; only its per-token gaps
    # are unknown, and that is counted and said.
    res = vllm_result()
    res.update(
        input_lens=[10, 20, 30, 40, 50],
        output_lens=[3, 1, 3, 6, 2],
        ttfts=[0.25, 0.19, 0.21, 0.18, 0.24],
        itls=[[0.01, 0.02], [], [0.03, 0.03], [0.05, 0.05], [0.02]],
        latencies=[0.28, 0.19, 0.27, 0.28, 0.26],
        start_times=[5.0, 5.1, 5.2, 5.3, 5.4],
        queue_times=[0.0] * 5,
        generated_texts=[""] * 5,
        errors=[""] * 5,
    )
    src, out = tmp_path / "v.json", tmp_path / "r.json"
    src.write_text(json.dumps(res))
    assert main(["import-vllm", str(src), "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    s, r3 = doc["summary"], doc["requests"][3]
    assert s["completed"] == 5 and r3["status"] == "ok" and r3["token_times"] is None
    assert r3["ttft"] == pytest.approx(0.18) and r3["e2e"] == pytest.approx(0.28)
    assert r3["tpot"] == pytest.approx(0.10 / 5)  # vLLM's (latency - ttft) / (output - 1)
    assert s["ttft"]["mean"] == pytest.approx(np.mean(res["ttfts"]))
    assert s["excluded"]["itl"] == {"bundled": 1, "one_output_token": 1} and s["excluded"]["ttft"] == {}
    assert s["itl_chunks"]["mean"] == pytest.approx(np.mean([0.01, 0.02, 0.03, 0.03, 0.05, 0.05, 0.02]))
    assert "itl leave(s) out 1 request(s): several tokens per streamed chunk" in capsys.readouterr().err


def test_import_vllm_checks_lengths_against_the_workload():
    from batching.servers.vllm_io import VllmFormatError, import_result

    res = vllm_result(n_err=1)
    w = Workload.from_arrays([0, 1, 2], [10, 20, 31], [3, 1, 3], name="mine", rids=[7, 8, 9])
    reqs, _, _, _ = import_result(res, w)
    assert [r.rid for r in reqs] == [7, 8, 9]
    assert [r.status for r in reqs] == ["ok", "ok", "error"]
    assert reqs[2].error == "Bad Request"  # a traceback's last line
    res["errors"][2], res["output_lens"][2], res["itls"][2] = "", 3, [0.01, 0.01]
    reqs, _, _, _ = import_result(res, w)
    assert reqs[2].status == "usage_mismatch" and "prompt 30" in reqs[2].error
    res["itls"][0] = [0.01]  # two chunks for three tokens: vLLM bundled them, still counted
    assert import_result(res, w)[0][0].status == "ok"
    with pytest.raises(VllmFormatError, match="the result holds 3 requests, the workload 2"):
        import_result(res, Workload.from_arrays([0, 1], [10, 20], [3, 1]))


def _bad(**changes: object) -> str:
    doc = vllm_result()
    doc.update(changes)
    return json.dumps(doc)


@pytest.mark.parametrize(
    "content, msg",
    [
        ("not json", "not JSON"),
        ("[1, 2]", "expected one JSON object"),
        (
            json.dumps({"duration": 1.0, "completed": 3}),
            "run vllm bench serve with --save-result --save-detailed",
        ),
        (
            json.dumps({"input_lens": [1, 2], "output_lens": [1], "ttfts": [0, 0], "itls": [[], []]}),
            "output_lens has 1 entries, input_lens 2",
        ),
        (_bad(input_lens="abc"), "input_lens is str, expected a list"),
        (_bad(itls={"a": 1}), "itls is dict, expected a list"),
        (_bad(ttfts=[0.05, None, 0.06]), "ttfts[1]=None: a request without an error needs"),
        (_bad(itls=[None, [], [0.03]]), "itls[0]=None: expected a list of inter-token seconds"),
        (_bad(request_rate="fast"), "request_rate='fast': expected a number > 0 or \"inf\""),
        (_bad(output_lens=[3, "1", 3]), "output_lens[1]='1': expected a token count"),
        (_bad(start_times=[1.0, None, 2.0]), "start_times[1]=None: expected seconds"),
        (json.dumps(vllm_result()) + "\n" + json.dumps(vllm_result()), "2 results one after another"),
    ],
)
def test_import_vllm_bad_files_are_one_line(tmp_path, capsys, content, msg):
    src = tmp_path / "bad.json"
    src.write_text(content)
    assert main(["import-vllm", str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and msg in err and "\n" not in err and "Traceback" not in err
    assert main(["import-vllm", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err


def test_append_result_files_need_run(tmp_path, capsys):
    a, b = vllm_result(), vllm_result()
    b["ttfts"] = [0.5, 0.4, 0.6]
    src = tmp_path / "appended.json"
    src.write_text(json.dumps(a) + "\n" + json.dumps(b))  # what --append-result writes
    assert main(["import-vllm", str(src)]) == 2
    assert "choose one with --run N (1 to 2)" in capsys.readouterr().err
    out = tmp_path / "r.json"
    assert main(["import-vllm", str(src), "--run", "2", "--out", str(out)]) == 0
    assert json.loads(out.read_text())["requests"][0]["ttft_from_send"] == pytest.approx(0.5)
    capsys.readouterr()
    for run in ("3", "0"):
        assert main(["import-vllm", str(src), "--run", run]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("error: --run") and "\n" not in err


def test_export_needs_jsonl(tmp_path, capsys):
    for fmt in ("vllm-custom", "vllm-timed-trace"):
        out = tmp_path / "x.json"
        assert main(["export", "--format", fmt, "--preset", "chat-rag", "-n", "4", "--out", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert "reads only from a .jsonl file" in err and "\n" not in err and not out.exists()


def test_export_timed_trace(tmp_path, capsys):
    from batching.workloads import preset

    out, info = tmp_path / "t.jsonl", tmp_path / "t.info.json"
    args = ["--preset", "chat-rag", "-n", "12", "--out", str(out), "--info", str(info)]
    assert main(["export", "--format", "vllm-timed-trace", *args]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    w = preset("chat-rag", seed=0, n=12)
    assert [r["input_length"] for r in rows] == w.prompt_lens.tolist()
    assert [r["output_length"] for r in rows] == w.output_lens.tolist()
    assert [r["timestamp"] for r in rows] == pytest.approx((w.arrivals - w.arrivals.min()).tolist(), abs=1e-6)
    assert [len(r["hash_ids"]) for r in rows] == [math.ceil(p / 16) for p in w.prompt_lens]
    ids = [h for r in rows for h in r["hash_ids"]]
    assert len(ids) == len(set(ids))  # no prefix shared: every block its own id
    flags = " ".join(json.loads(info.read_text())["vllm_bench_flags"])
    for f in (
        "--dataset-name timed_trace",
        "--self-timed",
        "--timed-trace-chunk-hash-size 16",
        "--save-detailed",
    ):
        assert f in flags
    printed = capsys.readouterr().out
    assert "vllm bench serve --backend openai --dataset-name timed_trace" in printed
    assert "import-vllm RESULT.json (these workload options) --self-timed" in printed
    assert main(["export", "--format", "vllm-timed-trace", *args, "--block-size", "64"]) == 0
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [len(r["hash_ids"]) for r in rows] == [math.ceil(p / 64) for p in w.prompt_lens]
    capsys.readouterr()
    assert main(["export", "--format", "vllm-timed-trace", *args, "--block-size", "0"]) == 2
    assert capsys.readouterr().err.strip() == "error: --block-size=0: must be >= 1"


def test_import_self_timed_measures_vllms_lateness_past_the_trace(tmp_path, capsys):
    # vLLM's --self-timed run of a timed_trace export: rows due at 0, 0.5 and 1.0 s; its client
    # released them 0, 20 and 3 ms late (start_times less queue_times) and sent them 0.1 ms
    # after. Without --self-timed the arrival is the release, so lateness reads only the 0.1 ms
    # queue wait; with it the arrival is the row's timestamp and lateness is vLLM's own.
    from batching.servers.vllm_io import VllmFormatError, import_result

    res = vllm_result()
    res.update(start_times=[1000.0001, 1000.5201, 1001.0031], queue_times=[0.0001] * 3, request_rate="inf")
    w = Workload.from_arrays([10.0, 10.5, 11.0], [10, 20, 30], [3, 1, 3], name="tt")
    plain, _, _, _ = import_result(res, w)
    assert [r.sent - r.arrival for r in plain] == pytest.approx([0.0001] * 3)
    timed, _, _, how = import_result(res, w, self_timed=True)
    assert [r.arrival for r in timed] == [10.0, 10.5, 11.0] and "--self-timed" in how
    assert [r.sent - r.arrival for r in timed] == pytest.approx([0.0001, 0.0201, 0.0031])
    with pytest.raises(ValueError, match="give the exported workload"):
        import_result(res, None, self_timed=True)
    del res["start_times"]
    with pytest.raises(VllmFormatError, match="no start_times"):
        import_result(res, w, self_timed=True)
    src, out = tmp_path / "v.json", tmp_path / "r.json"
    res = vllm_result()
    src.write_text(json.dumps(res))
    assert main(["import-vllm", str(src), "--self-timed"]) == 2
    assert "--self-timed: give the exported workload" in capsys.readouterr().err
    args = ["import-vllm", str(src), "--preset", "chat-rag", "-n", "3", "--self-timed", "--out", str(out)]
    assert main(args) == 0
    doc = json.loads(out.read_text())
    assert doc["config"]["self_timed"] is True and "--self-timed" in doc["config"]["arrivals"]
    assert doc["summary"]["dispatch_lateness"]["p50"] is not None
