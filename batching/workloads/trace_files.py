"""Where the named traces are: found by name, downloaded into the cache only when asked.

The traces themselves are never part of the repository (see ``shared/traces/README.md``).
:data:`TRACES` names each (its path inside a traces directory, download URL and sha256);
:func:`find_trace` looks in ``$BATCHING_TRACES``, in ``../shared/traces`` next to the
repository, then in ``~/.cache/batching/traces``, and keeps a download only if its sha256
matches. :mod:`batching.workloads.traces` parses the files into workloads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from .errors import WorkloadError

__all__ = ["TraceError", "TRACES", "trace_dirs", "find_trace"]

_AZURE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_MOONCAKE_URL = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"

#: Named traces: path relative to a traces directory, download URL, sha256 (from the README).
TRACES: dict[str, dict[str, str]] = {
    "azure-conv": {
        "path": "azure-2023/AzureLLMInferenceTrace_conv.csv",
        "url": _AZURE_URL + "AzureLLMInferenceTrace_conv.csv",
        "sha256": "2f1e5b666d4e3055fdbba98598ce2ec307767b9064e03e2fa46676dbcc7d0bf8",
    },
    "azure-code": {
        "path": "azure-2023/AzureLLMInferenceTrace_code.csv",
        "url": _AZURE_URL + "AzureLLMInferenceTrace_code.csv",
        "sha256": "54e9a6d2a4bd06ba1e060304b900abbc74cbea53de96506e60fe5bb4f2277fb6",
    },
    "mooncake-conv": {
        "path": "mooncake-2025/conversation_trace.jsonl",
        "url": _MOONCAKE_URL + "conversation_trace.jsonl",
        "sha256": "b8cbb061a85206d729d91cdc2981f43c9e0d99209dce588d3af5f7934408b9df",
    },
}
_KNOWN_SHA = {v["sha256"]: k for k, v in TRACES.items()}


class TraceError(WorkloadError):
    """A trace file that cannot be read, or a trace that cannot be found."""


def _sha256(path: Path) -> str:
    # A few MB at >1 GB/s: cheap enough to record on every load.
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _repo_root() -> Path:
    return Path(__file__).resolve().parents[2]


def _cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batching" / "traces"


def trace_dirs() -> list[Path]:
    """Where named traces are looked for, in order: $BATCHING_TRACES, ../shared/traces, cache."""
    dirs = []
    env = os.environ.get("BATCHING_TRACES")
    if env:
        dirs.append(Path(env).expanduser())
    dirs.append(_repo_root().parent / "shared" / "traces")
    dirs.append(_cache_dir())
    return dirs


def find_trace(name: str, *, download: bool = False) -> Path:
    """The path of named trace ``name`` (:data:`TRACES`); ``download``: fetch it into the
    cache, kept only if its sha256 matches the README's."""
    if name not in TRACES:
        raise TraceError(
            f"unknown trace {name!r}; known traces: {', '.join(TRACES)} (or pass a .csv/.jsonl path)"
        )
    rel = TRACES[name]["path"]
    looked = []
    for d in trace_dirs():
        p = d / rel
        if p.is_file():
            return p
        looked.append(str(p))
    if not download:
        raise TraceError(
            f"trace {name!r} not found; looked in: {'; '.join(looked)}. Set BATCHING_TRACES to a "
            f"directory laid out like shared/traces, or pass download=True to fetch "
            f"{TRACES[name]['url']} into the cache"
        )
    return _download(name, _cache_dir() / rel)


def _download(name: str, dest: Path) -> Path:
    url, want = TRACES[name]["url"], TRACES[name]["sha256"]
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=60) as resp:
            shutil.copyfileobj(resp, out)
        got = _sha256(Path(tmp))
        if got != want:
            raise TraceError(f"download of {name!r} from {url} has sha256 {got}, expected {want}; not kept")
        os.replace(tmp, dest)
    except OSError as e:
        raise TraceError(f"cannot download trace {name!r} from {url}: {e}") from None
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return dest
