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
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "bench_decode.py"), "--model", "tiny", "--ctx", "8",
                    "--batches", "1,2", "--reps", "2", "--rounds", "1", "--pairs", "3", "--out", str(out)],
                   check=True, cwd=ROOT, capture_output=True)
    doc = json.loads(out.read_text())
    for k in ("efficiency_vs_matvec", "efficiency_best_vs_best", "efficiency_median_vs_median"):
        assert doc[k] > 0
    # Best against best can only be at least the median step against the best matvec.
    assert doc["efficiency_best_vs_best"] >= doc["efficiency_vs_matvec"]
    # The paired ratio: one per (step, matvec) pair, its median reported.
    assert len(doc["efficiency_paired"]) == 3 and doc["efficiency_paired_median"] == sorted(doc["efficiency_paired"])[1]
    # On a CPU, numpy's matvec over the same bytes is reported beside torch's (another BLAS).
    assert doc["numpy_matvec_GBps"]["best"] >= doc["numpy_matvec_GBps"]["median"] > 0
    assert doc["efficiency_vs_numpy_matvec"] == pytest.approx(
        doc["achieved_GBps_batch1"] / doc["numpy_matvec_GBps"]["best"])
    assert set(doc["step_ms"]) == {"1", "2"} and doc["knee"]["2.0x"] in (1, 2)
    assert "thp_mem_alloc" in doc   # recorded, whatever the caller set
