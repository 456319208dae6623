"""GPU profiles derived from Vidur's operator tables (benchmarks/derive_gpu_profiles.py, issue 22):
the measured parts equal the CSV rows summed by hand here, the committed files equal a fresh
derivation from the shipped copies, a missing or altered source is refused in one line, and
the simulator takes the profiles at their own tensor-parallel degree."""

from __future__ import annotations

import csv
import gzip
import hashlib
import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from batching.costs import ProfileCost, get_cost_model
from batching.costs.models import get_model

ROOT = Path(__file__).resolve().parent.parent
VIDUR = ROOT / "data" / "gpu-profiles" / "vidur"
GPU = ROOT / "data" / "profiles" / "gpu"
SCRIPT = ROOT / "benchmarks" / "derive_gpu_profiles.py"
H100_7B = "compute/h100/meta-llama/Llama-2-7b-hf/mlp.csv"
H100_NET = "network/h100_dgx/all_reduce.csv"
NINE = (
    "input_layernorm",
    "attn_pre_proj",
    "attn_rope",
    "attn_post_proj",
    "post_attention_layernorm",
    "mlp_up_proj",
    "mlp_act",
    "mlp_down_proj",
    "add",
)


def _csv(rel: str) -> list[dict[str, str]]:
    with gzip.open(VIDUR / (rel + ".gz"), "rt", newline="") as f:
        return list(csv.DictReader(f))


def _rows(rows: list[dict[str, str]], tokens: int, tp: int) -> list[dict[str, str]]:
    out = [r for r in rows if r["num_tokens"] == str(tokens) and r["num_tensor_parallel_workers"] == str(tp)]
    assert out, (tokens, tp)
    return out


def _nine(row: dict[str, str]) -> float:
    return sum(float(row[f"time_stats.{op}.median"]) for op in NINE)


def _profile(name: str) -> dict:
    return json.loads((GPU / name).read_text())


def _part(doc: dict, key: str, tokens: int) -> float:
    p = doc["parts"]
    return p[key][p["tokens"].index(tokens)]


def _script():
    spec = importlib.util.spec_from_file_location("derive_gpu_profiles", SCRIPT)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_readme_parser_check_holds_on_the_shipped_table():
    """H100, Llama-2-7B, tp 1: the nine per-layer medians add up to 0.175 ms at 1 token and
    0.286 ms at 256 (sums known beforehand, a check of the parser), in the CSV and in the
    derived profile."""
    rows = _csv(H100_7B)
    doc = _profile("h100-llama-2-7b-tp1.json")
    for tokens, want in ((1, 0.175), (256, 0.286)):
        (row,) = _rows(rows, tokens, 1)
        assert _nine(row) == pytest.approx(want, abs=5e-4)
        emb = float(row["time_stats.emb.median"])
        assert (_part(doc, "linear_ms", tokens) - emb) / 32 == pytest.approx(want, abs=5e-4)


@pytest.mark.parametrize("tp", [1, 2])
def test_linear_part_is_the_csv_rows_summed_by_hand(tp):
    """layers x the nine medians + emb once; a token count measured twice (2,048) averaged."""
    rows = _csv(H100_7B)
    doc = _profile(f"h100-llama-2-7b-tp{tp}.json")
    for tokens in (1, 64, 256, 512, 2048):
        rs = _rows(rows, tokens, tp)
        assert len(rs) == (2 if tokens == 2048 else 1)
        want = float(np.mean([32 * _nine(r) + float(r["time_stats.emb.median"]) for r in rs]))
        assert _part(doc, "linear_ms", tokens) == pytest.approx(want, abs=1e-5)
    # The A100 Llama-3-8B table too (32 layers), at tp 1.
    a100 = _csv("compute/a100/meta-llama/Meta-Llama-3-8B/mlp.csv")
    doc = _profile("a100-llama-8b-tp1.json")
    for tokens in (1, 512):
        (r,) = _rows(a100, tokens, 1)
        want = 32 * _nine(r) + float(r["time_stats.emb.median"])
        assert _part(doc, "linear_ms", tokens) == pytest.approx(want, abs=1e-5)


def test_allreduce_is_two_per_layer_interpolated_in_message_bytes():
    """tp 2: message = tokens x 4096 x 2 bytes; 1 token (8,192 B) lies between the rows of
    2,048 and 10,240 B, 256 tokens (2 MiB) is a measured size."""
    net = [r for r in _csv(H100_NET) if r["num_workers"] == "2" and r["devices_per_node"] == "2"]
    ms = {int(r["size"]): float(r["time_stats.all_reduce.median"]) for r in net}
    doc = _profile("h100-llama-2-7b-tp2.json")
    one = ms[2048] + (ms[10240] - ms[2048]) * (8192 - 2048) / (10240 - 2048)
    assert _part(doc, "allreduce_ms", 1) == pytest.approx(2 * 32 * one, abs=1e-5)
    assert _part(doc, "allreduce_ms", 256) == pytest.approx(2 * 32 * ms[256 * 4096 * 2], abs=1e-5)
    assert _part(_profile("h100-llama-2-7b-tp1.json"), "allreduce_ms", 256) == 0.0
    # The batch-1 decode step: the measured parts plus the modelled ones, never less.
    assert doc["decode"]["ms"][0][0] > _part(doc, "linear_ms", 1) + _part(doc, "allreduce_ms", 1)


def test_committed_profiles_equal_a_fresh_derivation():
    mod = _script()
    docs = mod.derive_all(VIDUR)
    assert sorted(docs) == sorted(p.name for p in GPU.glob("*.json"))
    for name, doc in docs.items():
        assert (GPU / name).read_text() == mod.dump(doc), f"{name} is stale: rerun the derive script"


def test_every_profile_carries_its_provenance_and_loads():
    sums = {
        line.split()[1].removeprefix("./"): line.split()[0]
        for line in (VIDUR / "SHA256SUMS").read_text().splitlines()
        if line.strip()
    }
    for name, digest in sums.items():  # the shipped copies are Vidur's files, byte for byte
        assert hashlib.sha256(gzip.decompress((VIDUR / (name + ".gz")).read_bytes())).hexdigest() == digest
    assert "MIT License" in (VIDUR / "LICENSE").read_text()
    for path in sorted(GPU.glob("*.json")):
        doc = json.loads(path.read_text())
        meta = doc["meta"]
        src = meta["source"]
        assert src["repo"] == "github.com/microsoft/vidur"
        assert src["commit"] == "7d47513363ec447a741ac5e47241580b47724fbf"
        assert "MIT" in src["licence"]
        for f in src["files"]:
            assert sums[f["path"]] == f["sha256"]
        assert (meta["tp"] > 1) == any("all_reduce" in f["path"] for f in src["files"])
        assert path.name.endswith(f"-tp{meta['tp']}.json")
        assert meta["measured"] and set(meta["modelled"]) >= {"kv", "lm_head", "attention", "overhead_ms"}
        bw = meta["bandwidth"]
        frac = bw["achieved_gbs"] / bw["datasheet_gbs"]
        assert frac == pytest.approx(bw["achieved_fraction"]) and 0.5 < frac < 0.9
        cost = ProfileCost.from_json(path)
        assert cost.tp == meta["tp"] and cost.kv_capacity() > 0
        assert cost.attn_s > 0  # the attention per pair, fitted from the modelled prefill_rows
        assert path.stat().st_size < 20_000


def _run_script(source: Path, out: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(SCRIPT), "--source", str(source), "--out", str(out)],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_a_missing_or_altered_source_is_refused_in_one_line(tmp_path):
    src = tmp_path / "vidur"
    shutil.copytree(VIDUR, src)
    gz = src / (H100_NET + ".gz")
    original = gz.read_bytes()
    gz.unlink()
    p = _run_script(src, tmp_path / "out")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "all_reduce.csv" in p.stderr and "missing" in p.stderr
    assert "Traceback" not in p.stderr and not (tmp_path / "out").exists()
    # One changed digit in a table: refused by its sha256.
    text = gzip.decompress(original).decode()
    gz.write_bytes(gzip.compress(text.replace("0.007", "0.008", 1).encode()))
    p = _run_script(src, tmp_path / "out")
    assert p.returncode == 2
    assert len(p.stderr.strip().splitlines()) == 1 and "all_reduce.csv" in p.stderr and "altered" in p.stderr
    # Plain files (as in ../shared) are read as well as the .gz copies, and give the same profiles.
    gz.unlink()
    (src / H100_NET).write_text(text)
    p = _run_script(src, tmp_path / "out")
    assert p.returncode == 0, p.stderr
    name = "h100-llama-2-7b-tp2.json"
    assert (tmp_path / "out" / name).read_text() == (GPU / name).read_text()


def _simulate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "batching", "simulate", "--trace", "azure-conv", "--limit", "40", "--cap"]
        + ["--no-progress", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
    )


def test_simulate_runs_on_a_gpu_profile(tmp_path):
    out = tmp_path / "r.json"
    prof = "data/profiles/gpu/h100-llama-2-7b-tp1.json"
    p = _simulate(
        "--model", "llama-2-7b", "--device", "h100", "--profile", prof,
        "--scheduler", "chunked", "--slots", "32", "--token-budget", "512", "--out", str(out),
    )  # fmt: skip
    assert p.returncode == 0, p.stderr
    res = json.loads(out.read_text())
    assert res["config"]["profile"] == prof and res["summary"]["num_requests"] == len(res["requests"]) == 40
    prof2 = "data/profiles/gpu/h100-llama-2-70b-tp2.json"
    p = _simulate("--model", "llama-2-70b", "--device", "h100", "--tp", "2", "--profile", prof2,
                  "--scheduler", "continuous", "--kv-policy", "exact")  # fmt: skip
    assert p.returncode == 0, p.stderr


def test_a_tp_mismatch_or_a_broken_profile_is_refused_in_one_line(tmp_path):
    prof2 = str(GPU / "h100-llama-2-70b-tp2.json")
    with pytest.raises(ValueError, match="tp=2, not tp=4"):
        get_cost_model("llama-2-70b", "h100", tp=4, profile=prof2)
    with pytest.raises(ValueError, match="tp=2, not tp=1"):
        get_cost_model("llama-2-70b", "h100", profile=prof2)
    c = get_cost_model("llama-2-70b", "h100", tp=2, profile=prof2)
    assert c.tp == 2 and c.bandwidth == 2 * c.device.bandwidth
    assert c.kv_capacity() == int((2 * 80e9 * 0.9 - get_model("llama-2-70b").weight_bytes) // 327680)
    p = _simulate(
        "--model", "llama-2-70b", "--device", "h100", "--profile", prof2, "--scheduler", "continuous"
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "tp=2" in p.stderr
    bad = tmp_path / "bad.json"
    doc = _profile("h100-llama-2-7b-tp1.json")
    doc["meta"]["tp"] = 0
    bad.write_text(json.dumps(doc))
    p = _simulate(
        "--model", "llama-2-7b", "--device", "h100", "--profile", str(bad), "--scheduler", "continuous"
    )
    assert p.returncode == 2 and len(p.stderr.strip().splitlines()) == 1 and "meta.tp" in p.stderr
