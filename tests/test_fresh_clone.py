"""A fresh clone works on its own (issue 21): the named traces ship with the repository.

The working tree's files (what a clone would hold, plus files not yet committed) are copied
into a directory with no ``shared/`` beside it, and run there with an empty ``HOME``, no
``BATCHING_TRACES``, no ``XDG_CACHE_HOME`` and ``PYTHONPATH`` at the copy, so that the copy's
package, its ``data/traces`` and nothing else are read: ``simulate`` on every named trace, and
one notebook in smoke mode (7.1, which replays the Azure conversation trace).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from batching.workloads.trace_files import TRACES

REPO = Path(__file__).resolve().parent.parent
NOTEBOOK = "chapters/static.ipynb"  # one of the two cheapest pages (~25 s here), and it reads a trace


def _tracked_files() -> list[str]:
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.skip("not a git checkout: no file list to copy")
    out = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout
    return [f for f in out.decode().split("\0") if f]


def _copy_tree(dest: Path) -> None:
    for rel in _tracked_files():
        src = REPO / rel
        if not src.is_file():  # deleted in the working tree, not yet in the index
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(src, dest / rel)


@pytest.mark.slow
@pytest.mark.notebook
def test_fresh_copy_simulates_every_named_trace_and_runs_a_notebook(tmp_path: Path) -> None:
    tmp_path = tmp_path.resolve()  # info["file"] is resolved; compare like with like
    clone, home = tmp_path / "clone", tmp_path / "home"
    _copy_tree(clone)
    home.mkdir()
    assert not (clone.parent / "shared").exists() and not (clone / "shared").exists()
    # Nothing of this machine's setup: no trace override, no cache but the empty HOME's.
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(home), "PYTHONPATH": str(clone)}
    env["LANG"] = "C.UTF-8"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        p = subprocess.run(
            [sys.executable, *args], cwd=clone, env=env, capture_output=True, text=True, timeout=300
        )
        assert p.returncode == 0, f"{args} exited {p.returncode}:\n{p.stdout}\n{p.stderr}"
        return p

    imported = run("-c", "import batching; print(batching.__file__)").stdout.strip()
    assert Path(imported) == clone / "batching" / "__init__.py"

    for name in TRACES:
        out = tmp_path / f"{name}.json"
        p = run(
            *("-m", "batching", "simulate", "--trace", name, "--limit", "40", "--cap"),
            *("--scheduler", "continuous", "--slots", "8", "--no-progress", "--out", str(out)),
        )
        assert f"continuous | {name} (40 requests)" in p.stdout
        info = json.loads(out.read_text())["config"]["workload"]["info"]
        assert info["trace"] == name and info["sha256"] == TRACES[name]["sha256"]
        assert info["file"] == str(clone / "data" / "traces" / (TRACES[name]["path"] + ".gz"))

    executed = tmp_path / "static.ipynb"
    run(
        "-c",
        "import sys; from pathlib import Path; sys.path.insert(0, 'tools'); import build_book; "
        f"build_book.execute_notebook(Path({NOTEBOOK!r}), Path({str(executed)!r}), "
        "parameters={'smoke': True}, kernel='python3', cwd=Path.cwd())",
    )
    # The figures land under the imported package's repository: the kernel ran the copy's.
    assert list((clone / "_build" / "figures" / "smoke").glob("*.png"))
    assert "Splitwise" in executed.read_text()  # the trace's attribution, glued under the figures
    assert not (home / ".cache" / "batching" / "traces").exists()  # found in data/traces, never downloaded
    # The only caches it writes are its own: this machine's kernel probe (batching.real.kernels)
    # and its build of the decode-attention kernel (batching.real.attention).
    assert {p.name for p in (home / ".cache" / "batching").iterdir()} <= {"kernels", "ext"}
