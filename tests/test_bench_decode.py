"""The decode benchmark (benchmarks/bench_decode.py): every efficiency figure it writes, consistent with each other."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")


pytestmark = pytest.mark.model
ROOT = Path(__file__).resolve().parent.parent


def test_cli_writes_every_efficiency_figure(tmp_path: Path) -> None:
    out = tmp_path / "decode.json"
    subprocess.run(
        [
            sys.executable,
            str(ROOT / "benchmarks" / "bench_decode.py"),
            "--model",
            "tiny",
            "--ctx",
            "8",
            "--batches",
            "1,2",
            "--reps",
            "2",
            "--rounds",
            "1",
            "--pairs",
            "3",
            "--out",
            str(out),
        ],
        check=True,
        cwd=ROOT,
        capture_output=True,
    )
    doc = json.loads(out.read_text())
    for k in ("efficiency_vs_matvec", "efficiency_best_vs_best", "efficiency_median_vs_median"):
        assert doc[k] > 0
    # Best against best can only be at least the median step against the best matvec.
    assert doc["efficiency_best_vs_best"] >= doc["efficiency_vs_matvec"]
    # The paired ratio: one per (step, matvec) pair, its median reported.
    assert (
        len(doc["efficiency_paired"]) == 3
        and doc["efficiency_paired_median"] == sorted(doc["efficiency_paired"])[1]
    )
    # On a CPU, numpy's matvec over the same bytes is reported beside torch's (another BLAS).
    assert doc["numpy_matvec_GBps"]["best"] >= doc["numpy_matvec_GBps"]["median"] > 0
    assert doc["efficiency_vs_numpy_matvec"] == pytest.approx(
        doc["achieved_GBps_batch1"] / doc["numpy_matvec_GBps"]["best"]
    )
    assert set(doc["step_ms"]) == {"1", "2"} and doc["knee"]["2.0x"] in (1, 2)
    assert "thp_mem_alloc" in doc  # recorded, whatever the caller set
    # Where a CPU batch-1 step's time goes: the matrix products and the rest add up to the
    # profiled step, and tiny's every weight matrix is multiplied in every one of its steps.
    bd = doc["batch1_breakdown"]
    assert bd["matmul_ms"] > 0 and bd["other_ms"] > 0
    assert bd["matmul_ms"] + bd["other_ms"] == pytest.approx(bd["profiled_step_ms"])
    assert bd["matmul_share"] == pytest.approx(bd["matmul_ms"] / bd["profiled_step_ms"])
    from batching.costs.models import get_model

    tiny = get_model("tiny")
    assert bd["matmul_GBps"] == pytest.approx(tiny.weight_read_bytes / (bd["matmul_ms"] / 1e3) / 1e9)
    # One product per weight matrix per step: qkv, o, gate/up, down of each layer, the lm head.
    assert bd["matmul_calls_per_step"] == 4 * tiny.layers + 1
    assert bd["ops_per_step"] > bd["matmul_calls_per_step"] and len(bd["top_other_ops"]) <= 8
