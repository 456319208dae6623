"""``python -m batching simulate``: results files, determinism, and one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from batching import results
from batching.cli import main

ROOT = Path(__file__).resolve().parent.parent


def sim(tmp_path: Path, *args: str, name: str = "r.json") -> dict:
    out = tmp_path / name
    assert main(["simulate", *args, "--out", str(out), "--no-progress"]) == 0
    return json.loads(out.read_text())


def test_simulate_preset_writes_results_and_is_deterministic(tmp_path, capsys):
    args = [
        "--preset",
        "chat-rag",
        "-n",
        "60",
        "--scheduler",
        "chunked",
        "--slots",
        "16",
        "--token-budget",
        "512",
        "--model",
        "llama-8b",
        "--device",
        "h100",
        "--steps",
        "--goodput",
        "ttft:500 tpot:50",
    ]
    a = sim(tmp_path, *args, name="a.json")
    b = sim(tmp_path, *args, name="b.json")
    assert results.comparable(a) == results.comparable(b)
    assert a["summary"]["num_requests"] == 60 and len(a["requests"]) == 60
    assert a["config"]["scheduler"]["token_budget"] == 512 and "goodput" in a["summary"]
    assert sum(s["n"] for s in a["steps"]) == a["summary"]["steps"]
    printed = capsys.readouterr().out
    assert "chunked | chat-rag (60 requests)" in printed and "ttft" in printed
    c = sim(tmp_path, *args[:-2], "--seed", "1", name="c.json")  # another seed, another workload
    assert c["requests"] != a["requests"]


def test_first_finisher_preset_utilization(tmp_path):
    st = sim(
        tmp_path,
        "--preset",
        "first-finisher",
        "--scheduler",
        "static",
        "--slots",
        "32",
        "--model",
        "llama-8b",
        "--device",
        "h100",
        name="s.json",
    )["summary"]
    assert st["slot_utilization"] == pytest.approx((31 * 20 + 2000) / (32 * 2000))


def test_continuous_beats_static_on_long_tailed_traffic(tmp_path):
    # Loaded (20 req/s into 32 slots): idle slots are then waste, not an absence of work.
    common = [
        "--preset",
        "chat-rag",
        "-n",
        "300",
        "--rate",
        "20",
        "--slots",
        "32",
        "--model",
        "llama-8b",
        "--device",
        "h100",
    ]
    st = sim(tmp_path, *common, "--scheduler", "static", "--timeout", "0.5", name="s.json")["summary"]
    co = sim(tmp_path, *common, "--scheduler", "continuous", name="c.json")["summary"]
    assert st["slot_utilization"] < 0.2 and co["slot_utilization"] > 0.5
    assert co["e2e"]["p99"] < st["e2e"]["p99"]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--preset", "nope", "--scheduler", "static"], "unknown preset 'nope'"),
        (["--preset", "chat-rag", "--scheduler", "static", "--model", "gpt-5"], "unknown model 'gpt-5'"),
        (["--preset", "chat-rag", "--scheduler", "static", "--device", "tpu"], "unknown device 'tpu'"),
        (["--preset", "chat-rag", "--scheduler", "continuous", "--slots", "0"], "max_slots=0"),
        (
            ["--preset", "chat-rag", "--scheduler", "chunked", "--token-budget", "8"],
            "token_budget=8 < max_slots=32",
        ),
        (
            ["--preset", "chat-rag", "--scheduler", "continuous", "--model", "llama-70b", "--device", "h100"],
            "needs 141.1 GB",
        ),
        (["--trace", str(ROOT / "missing.csv"), "--scheduler", "static"], "missing.csv"),
        (
            ["--preset", "chat-rag", "--scheduler", "continuous", "--kv-tokens", "99999999"],
            "--kv-tokens=99999999: llama-8b on 1 x h100 leaves room for",
        ),
        (
            ["--preset", "chat-rag", "--scheduler", "static", "--kv-tokens", "8192"],
            "batch_size=32 x max_context=8192 = 262144 KV tokens exceeds kv capacity=8192",
        ),
    ],
)
def test_bad_input_is_one_clear_line(args, message, capsys):
    assert main(["simulate", *args, "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_module_entry_point_runs(tmp_path):
    out = tmp_path / "r.json"
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "batching",
            "simulate",
            "--preset",
            "padding-pair",
            "--scheduler",
            "static",
            "--slots",
            "2",
            "--out",
            str(out),
        ],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )
    assert p.returncode == 0, p.stderr
    s = json.loads(out.read_text())["summary"]
    assert s["padding_fraction"] == pytest.approx(3950 / 8000)
