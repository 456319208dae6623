"""What importing the package does to the process: ``import batching`` (the torch-free simulator)
leaves the environment alone; ``import batching.real`` sets the real engine's thread and
huge-page defaults, before torch loads, unless the caller set them; and the one warning the
package silences (tqdm's "IProgress not found") is silenced around the import that gives it,
not for the whole process."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
VARS = ("GOMP_SPINCOUNT", "THP_MEM_ALLOC_ENABLE")

# Records the two variables as they are when torch is first looked up, then prints them with
# the variables now and whether torch was imported at all.
PROBE = """
import importlib.abc, json, os, sys
VARS = {vars!r}
seen = {{}}
class Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "torch" and "torch" not in seen:
            seen["torch"] = {{k: os.environ.get(k) for k in VARS}}
        return None
sys.meta_path.insert(0, Hook())
{imports}
print(json.dumps({{"now": {{k: os.environ.get(k) for k in VARS}}, "at_torch": seen.get("torch"),
                  "torch": "torch" in sys.modules}}))
"""


def probe(imports: str, **env: str) -> dict:
    """Run ``imports`` in a fresh interpreter (from the repository root, so that this tree's
    ``batching`` is the one imported) whose environment lacks both variables, plus ``env``."""
    clean = {k: v for k, v in os.environ.items() if k not in VARS}
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(vars=VARS, imports=imports)],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_import_batching_leaves_the_environment_alone():
    got = probe(
        "import batching, batching.engine, batching.schedulers, batching.metrics, batching.results, "
        "batching.workloads, batching.costs, batching.cli"
    )
    assert got["now"] == dict.fromkeys(VARS)
    assert not got["torch"]


def test_import_batching_real_sets_the_defaults_without_loading_torch():
    from batching.real import ENV_DEFAULTS

    assert set(ENV_DEFAULTS) == set(VARS)
    got = probe("import batching.real")
    assert got["now"] == ENV_DEFAULTS
    assert not got["torch"]  # the package's own module imports no torch
    # A value the caller set wins.
    assert probe("import batching.real", GOMP_SPINCOUNT="7")["now"]["GOMP_SPINCOUNT"] == "7"


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_torch_loads_after_the_defaults_are_set():
    from batching.real import ENV_DEFAULTS

    got = probe("import batching.real.executor")
    assert got["torch"] and got["at_torch"] == ENV_DEFAULTS


def test_the_servers_and_peer_workers_started_here_get_the_defaults(monkeypatch):
    """vLLM's server and the peer benchmark's workers run beside this engine: the same thread
    and huge-page settings (a caller's value still wins)."""
    from helpers import load_benchmark

    from batching.real import ENV_DEFAULTS
    from batching.servers import vllm_serve

    worker_env = load_benchmark("bench_peer").worker_env
    for k in VARS:
        monkeypatch.delenv(k, raising=False)
    for env in (vllm_serve.vllm_env(), worker_env("hf-continuous", 2, "default")):
        assert {k: env[k] for k in VARS} == ENV_DEFAULTS
    monkeypatch.setenv("GOMP_SPINCOUNT", "7")
    for env in (vllm_serve.vllm_env(), worker_env("vllm", 2, "default")):
        assert env["GOMP_SPINCOUNT"] == "7"


# In a stand-in for a Jupyter kernel (what tqdm.autonotebook looks for): the filters that
# importing batching.book leaves about IProgress, the warnings writing both tokenizers gives,
# and those of importing tqdm.auto afresh, which must warn (the stand-in works).
KERNEL = """
import importlib, json, sys, tempfile, types, warnings
import IPython
sys.modules["ipykernel.zmqshell"] = types.ModuleType("ipykernel.zmqshell")
IPython.get_ipython = lambda: type("ZMQInteractiveShell", (), {})()
import batching.book
held = [f[1].pattern for f in warnings.filters if f[1] is not None and "IProgress" in f[1].pattern]
from batching.real.checkpoint import save_hf_tokenizer
from batching.servers.transformers_serve import write_tokenizer
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    write_tokenizer(tempfile.mkdtemp(), 64)
    save_hf_tokenizer(tempfile.mkdtemp(), 64)
ours = [str(w.message) for w in caught]
for name in ("tqdm.autonotebook", "tqdm.auto"):
    sys.modules.pop(name, None)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    importlib.import_module("tqdm.auto")
print(json.dumps({"held": held, "ours": ours, "control": [str(w.message) for w in caught]}))
"""


@pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in ("transformers", "IPython", "torch")),
    reason="needs transformers, IPython and torch",
)
def test_the_iprogress_warning_is_silenced_at_the_transformers_import_only():
    """transformers' import makes tqdm.auto warn "IProgress not found" in a Jupyter kernel
    without ipywidgets; the two places that import it silence that there, and ``import
    batching.book`` installs no process-wide filter."""
    out = subprocess.run(
        [sys.executable, "-c", KERNEL], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["held"] == []
    assert not [m for m in got["ours"] if "IProgress" in m], got["ours"]
    assert any("IProgress not found" in m for m in got["control"]), got["control"]
