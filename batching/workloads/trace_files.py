"""Where the named traces are: found by name, downloaded into the cache only when asked.

The repository ships the named traces gzip-compressed in ``data/traces/`` (sources, sha256
and licences in its README). :data:`TRACES` names each (its path inside a traces directory,
download URL and the sha256 of its uncompressed text); :func:`find_trace` looks in
``$BATCHING_TRACES``, in ``../shared/traces`` next to the repository (both overrides), in the
repository's ``data/traces``, then in ``~/.cache/batching/traces``, taking in each the plain
file or its ``.gz``, and keeps a download only if its sha256 matches.
:mod:`batching.workloads.traces` parses the files into workloads.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import tempfile
import urllib.request
from pathlib import Path

from .errors import WorkloadError

__all__ = ["TraceError", "TRACES", "GZ", "trace_dirs", "find_trace"]

_AZURE_URL = "https://raw.githubusercontent.com/Azure/AzurePublicDataset/master/data/"
_MOONCAKE_URL = "https://raw.githubusercontent.com/kvcache-ai/Mooncake/main/FAST25-release/traces/"

#: Named traces: path relative to a traces directory (the plain file; ``+ GZ`` compressed),
#: download URL, sha256 of the uncompressed text (shared/traces/README.md, data/traces/README.md).
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
#: The suffix of a gzip-compressed trace (``data/traces`` holds only these).
GZ = ".gz"


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
    """Where named traces are looked for, in order: $BATCHING_TRACES, ../shared/traces,
    the repository's data/traces, the cache."""
    dirs = []
    env = os.environ.get("BATCHING_TRACES")
    if env:
        dirs.append(Path(env).expanduser())
    root = _repo_root()
    dirs.append(root.parent / "shared" / "traces")
    dirs.append(root / "data" / "traces")
    dirs.append(_cache_dir())
    return dirs


def find_trace(name: str, *, download: bool = False) -> Path:
    """The path of named trace ``name`` (:data:`TRACES`), plain or ``.gz``; ``download``: when
    no directory has it, fetch it into the cache, kept only if its sha256 matches the README's."""
    if name not in TRACES:
        raise TraceError(
            f"unknown trace {name!r}; known traces: {', '.join(TRACES)} "
            f"(or pass a .csv/.jsonl path, optionally .gz)"
        )
    rel = TRACES[name]["path"]
    looked = []
    for d in trace_dirs():
        p = d / rel
        # The plain file first: it is read as is, and ../shared holds plain files only.
        for cand in (p, p.with_name(p.name + GZ)):
            if cand.is_file():
                return cand
        looked.append(f"{p}[{GZ}]")
    if not download:
        # Read from the command line and from Python alike: a keyword argument would mislead the
        # first, so the message says what to do and names the flag as the command line's.
        raise TraceError(
            f"trace {name!r} not found; looked in: {'; '.join(looked)}. Set BATCHING_TRACES to a "
            f"directory laid out like data/traces, or ask for a download (--download on the "
            f"command line) to fetch {TRACES[name]['url']} into {_cache_dir()}"
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
