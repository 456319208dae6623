"""batching.book.runs: a live measurement runs once per build and both pages get its result."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from batching.book import runs

calls: list[tuple] = []


def measure(n: int, scale: float = 1.0) -> dict:
    calls.append((n, scale))
    return {"n": n, "series": np.arange(n) * scale, "noise": np.random.default_rng(len(calls)).random()}


@pytest.fixture(autouse=True)
def _fresh() -> None:
    calls.clear()


def test_the_second_page_gets_the_first_pages_run(tmp_path: Path) -> None:
    a = runs.shared(measure, 3, scale=2.0, directory=tmp_path)
    b = runs.shared(measure, 3, scale=2.0, directory=tmp_path)
    assert calls == [(3, 2.0)]
    assert b["noise"] == a["noise"] and np.array_equal(b["series"], [0.0, 2.0, 4.0])
    assert [p.suffix for p in tmp_path.iterdir()] == [".pkl"]  # no temporary file left


def test_other_arguments_measure_again(tmp_path: Path) -> None:
    runs.shared(measure, 3, scale=2.0, directory=tmp_path)
    runs.shared(measure, 3, scale=1.0, directory=tmp_path)
    runs.shared(measure, 4, scale=2.0, directory=tmp_path)
    assert calls == [(3, 2.0), (3, 1.0), (4, 2.0)]


def test_a_code_change_or_an_old_result_measures_again(tmp_path: Path, monkeypatch) -> None:
    runs.shared(measure, 3, directory=tmp_path)
    (kept,) = tmp_path.glob("*.pkl")
    old = time.time() - runs.MAX_AGE_S - 1
    os.utime(kept, (old, old))
    runs.shared(measure, 3, directory=tmp_path)
    assert len(calls) == 2
    monkeypatch.setattr(runs, "LOADED_SOURCE", "edited")
    runs.shared(measure, 3, directory=tmp_path)
    assert len(calls) == 3


def test_clear_forgets_every_run(tmp_path: Path) -> None:
    runs.shared(measure, 1, directory=tmp_path)
    runs.shared(measure, 2, directory=tmp_path)
    assert runs.clear(tmp_path) == 2 and runs.clear(tmp_path / "none") == 0
    runs.shared(measure, 1, directory=tmp_path)
    assert len(calls) == 3


def test_the_digest_covers_every_source_file_and_profile(tmp_path: Path) -> None:
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    (tmp_path / "data" / "profiles").mkdir(parents=True)
    (pkg / "a.py").write_text("x = 1\n")
    (pkg / "sub" / "b.py").write_text("y = 2\n")
    d0 = runs.source_digest(pkg)
    (pkg / "sub" / "b.py").write_text("y = 3\n")
    d1 = runs.source_digest(pkg)
    (tmp_path / "data" / "profiles" / "cpu.json").write_text("{}")
    assert len({d0, d1, runs.source_digest(pkg)}) == 3
