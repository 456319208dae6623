"""The prepared GPU session (benchmarks/gpu_session.py), run dry on the CPU: every stage of the
pipeline runs and writes the file a GPU session would bring back."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")

from helpers import load_benchmark

pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent


def test_dry_run_writes_every_result_file(tmp_path: Path) -> None:
    r = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "gpu_session.py"), "--dry-run", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout + (tmp_path / "log.txt").read_text()[-3000:]
    session = json.loads((tmp_path / "session.json").read_text())
    assert [s["stage"] for s in session["stages"]] == [
        "check-graphs",
        "decode-8b",
        "profile-1b",
        "fidelity-1b",
        "profile-8b",
        "stall-1b",
    ]
    assert all(s["rc"] == 0 for s in session["stages"])
    head = session["headline"]  # what the next session reads first
    assert head["graphs_check_ok"] is True and head["decode_8b"]["step_ms_batch1"] > 0
    assert set(head) >= {"h200-llama-1b.json", "h200-llama-8b.json", "fidelity_1b"}
    assert set(head["fidelity_1b"]) == {"continuous", "chunked"}
    assert head["stall_1b"]["mixed_itl_max_ms"] > 0 and head["stall_1b"]["padding_time_ratio_short"] > 0
    stall = json.loads((tmp_path / "stall-h200-llama-1b.json").read_text())
    assert stall["model"] == "tiny" and stall["padding"]["pad_tokens"] == 300 - 8
    assert stall["stall"]["prompt"] == 300 and stall["stall"]["chunk"] == 32
    assert set(stall["stall"]["series"]) == set(stall["stall"]["labels"].values())
    decode = json.loads((tmp_path / "decode-h200-llama-8b.json").read_text())
    assert (
        decode["efficiency_vs_matvec"] > 0 and decode["decode_graphs"] is False
    )  # nothing to capture on a CPU
    for name in ("h200-llama-1b.json", "h200-llama-8b.json"):
        prof = json.loads((tmp_path / name).read_text())
        assert prof["schema"] == 1 and prof["meta"]["decode_graphs"] is None
    check = json.loads((tmp_path / "graphs-check.json").read_text())
    assert check["ok"] and all(v["requests_equal"] == v["requests"] for v in check["schedulers"].values())
    # The bf16 stand-in: graphed and eager logits compared at each bucket, backends recorded.
    bf16 = check["bf16"]
    assert bf16["ok"] and [(b["rows"], b["ctx"]) for b in bf16["buckets"]] == [(1, 16), (4, 40)]
    assert all(b["rel_diff"] <= bf16["tolerance"] for b in bf16["buckets"])
    assert set(bf16["attention"]) == {"decode", "prefill", "chunk"} and bf16["attention_on_math"] == []
    assert head["partial"] == []  # every stage finished: no file is marked partial
    fid = json.loads((tmp_path / "fidelity-h200-llama-1b.json").read_text())
    assert set(fid["results"]) == {"continuous", "chunked"} and fid["token_budget"] == 32
    # At most 8 files come back from the device machine.
    assert len(list(tmp_path.iterdir())) <= 8
    # --install refuses a CPU's files named as H200 ones, naming the file and its device ...
    mod = load_benchmark("gpu_session")
    root = tmp_path / "repo"
    with pytest.raises(ValueError, match=r"graphs-check.json: measured on '[^']*', not an H200"):
        mod.install(tmp_path, root)
    assert not root.exists()
    # ... and puts an H200's where the project keeps them (profiles loaded as the simulator does).
    gpu = tmp_path / "gpu"
    gpu.mkdir()
    graphs_ok = {
        "captured": 4,
        "replayed_as_graphs": True,
        "buckets": [[1, 64]],
        "failed": {},
        "eager_steps": 0,
    }
    for name in ("h200-llama-1b.json", "decode-h200-llama-8b.json"):
        doc = json.loads((tmp_path / name).read_text())
        if "meta" in doc:
            doc["meta"]["device_name"] = "NVIDIA H200"
            doc["meta"]["decode_graphs"] = graphs_ok
        else:
            doc["device_name"] = "NVIDIA H200"
        (gpu / name).write_text(json.dumps(doc))
    # A GPU profile whose graphs failed (steps timed eagerly) or that its stage left partial
    # is refused, naming the file and the reason.
    prof = json.loads((gpu / "h200-llama-1b.json").read_text())
    bad = tmp_path / "bad"
    bad.mkdir()
    for meta, why in (
        ({"decode_graphs": {**graphs_ok, "failed": {"256x4096": "out of memory"}}}, "decode graphs failed"),
        ({"decode_graphs": None}, "decode graphs were off"),
        ({"partial": True}, "partial"),
    ):
        (bad / "h200-llama-1b.json").write_text(json.dumps({**prof, "meta": {**prof["meta"], **meta}}))
        with pytest.raises(ValueError, match=f"h200-llama-1b.json: {why}"):
            mod.install(bad, root)
    assert not root.exists()
    done = mod.install(gpu, root)
    assert sorted(p.relative_to(root).as_posix() for p in done) == [
        "benchmarks/results/decode-h200-llama-8b.json",
        "data/profiles/h200-llama-1b.json",
    ]


def test_stages_fit_the_device_time_and_cover_each_dry_stage() -> None:
    """A session has 15 device minutes, start-up included, and one command may run 10."""
    mod = load_benchmark("gpu_session")
    # Every stage but the last (which runs only if the others finish early) fits in the budget.
    assert sum(limit for _, limit, _ in mod.STAGES[:-1]) <= 8 * 60
    assert [n for n, _, _ in mod.STAGES] == list(mod.DRY)
    for _, _, argv in mod.STAGES:
        assert "cuda" in argv and any(a.startswith("{out}/") for a in argv)


def test_the_headline_reads_a_stage_cut_short(tmp_path: Path) -> None:
    """A stall stage killed after its padding half leaves a partial file: the headline
    names it partial instead of failing on the missing stall."""
    mod = load_benchmark("gpu_session")
    partial = {"benchmark": "7.1 padding (7.3 stall not finished)", "partial": True, "padding": {"x": 1.0}}
    (tmp_path / "stall-h200-llama-1b.json").write_text(json.dumps(partial))
    head = mod.headline(tmp_path)
    assert head["partial"] == ["stall-h200-llama-1b.json"] and "stall_1b" not in head
