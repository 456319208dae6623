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
    keys of ``benchmark()`` and ``main_async()`` in vllm/benchmarks/serve.py)."""
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
        "generated_texts": ["a b c", "d", "e f g" if not n_err else ""],
        "errors": ["", "", "" if not n_err else "Bad Request"],
        "mean_ttft_ms": 50.0,
    }


def test_import_vllm_result(tmp_path, capsys):
    src = tmp_path / "vllm.json"
    src.write_text(json.dumps(vllm_result()))
    out = tmp_path / "r.json"
    assert main(["import-vllm", str(src), "--out", str(out), "--no-progress"]) == 0
    doc = json.loads(out.read_text())
    r0, r1, r2 = doc["requests"]
    # Arrivals at the nominal i / rate; token times = arrival + ttft, then + each ITL.
    assert [r["arrival"] for r in doc["requests"]] == [0.0, 0.5, 1.0]
    assert r0["token_times"] == pytest.approx([0.05, 0.06, 0.08])
    assert r0["ttft"] == pytest.approx(0.05) and r0["e2e"] == pytest.approx(0.08)
    assert r0["tpot"] == pytest.approx(0.015) and r1["tpot"] is None
    s = doc["summary"]
    assert s["completed"] == 3 and s["duration_s"] == 2.5  # vLLM's own measured window
    assert s["request_throughput"] == pytest.approx(3 / 2.5) and s["output_tokens"] == 7
    assert s["itl"]["mean"] == pytest.approx(np.mean([0.01, 0.02, 0.03, 0.03]))
    assert doc["config"]["model"] == "meta-llama/Llama-3.1-8B" and doc["config"]["vllm"]["burstiness"] == 1.0
    assert "vllm | vllm (3 requests, 3 complete)" in capsys.readouterr().out


def test_import_vllm_checks_lengths_against_the_workload():
    from batching.servers.vllm_io import VllmFormatError, import_result

    res = vllm_result(n_err=1)
    w = Workload.from_arrays([0, 1, 2], [10, 20, 31], [3, 1, 3], name="mine", rids=[7, 8, 9])
    reqs, _, _ = import_result(res, w)
    assert [r.rid for r in reqs] == [7, 8, 9]
    assert [r.status for r in reqs] == ["ok", "ok", "error"] and reqs[2].error == "Bad Request"
    res["errors"][2], res["output_lens"][2], res["itls"][2] = "", 3, [0.01, 0.01]
    reqs, _, _ = import_result(res, w)
    assert reqs[2].status == "usage_mismatch" and "prompt 30" in reqs[2].error
    res["itls"][0] = [0.01]  # two chunks for three tokens: vLLM bundled them
    assert import_result(res, w)[0][0].status == "stream_mismatch"
    with pytest.raises(VllmFormatError, match="the result holds 3 requests, the workload 2"):
        import_result(res, Workload.from_arrays([0, 1], [10, 20], [3, 1]))


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
    ],
)
def test_import_vllm_bad_files_are_one_line(tmp_path, capsys, content, msg):
    src = tmp_path / "bad.json"
    src.write_text(content)
    assert main(["import-vllm", str(src)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and msg in err and "\n" not in err
    assert main(["import-vllm", str(tmp_path / "missing.json")]) == 2
    assert "no such file" in capsys.readouterr().err
