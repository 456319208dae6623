"""The package's shape: the torch-free library imports without torch, and the real engine
and the book support live in their own subpackages."""

from __future__ import annotations

import subprocess
import sys

LIBRARY = [
    "batching",
    "batching.cli",
    "batching.cost_base",
    "batching.costs",
    "batching.devices",
    "batching.engine",
    "batching.kv",
    "batching.lengths",
    "batching.metrics",
    "batching.models",
    "batching.plan",
    "batching.profile",
    "batching.request",
    "batching.results",
    "batching.schedulers",
    "batching.trace_files",
    "batching.traces",
    "batching.workload",
    "batching.workload_base",
]


def test_importing_the_library_does_not_import_torch() -> None:
    code = "import sys\n" + "".join(f"import {m}\n" for m in LIBRARY) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_real_module_imports_on_its_own() -> None:
    # One fresh interpreter per module: an import cycle between two of them shows up as an
    # ImportError in whichever is imported first.
    for m in ["model", "graphs", "cache", "runner", "executor", "hardware", "measure", "checkpoint"]:
        subprocess.run([sys.executable, "-c", f"import batching.real.{m}"], check=True)
