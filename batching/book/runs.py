"""One live measurement per book build, shown by its page and by "Measured on this machine".

Measured twice, two pages would quote two measurements of a noisy machine (a 7.3 stall of
491 ms on one, 61 ms on the other). :func:`shared` runs a measurement once and keeps it under
``_build/runs/``, keyed by the function, its arguments and a digest of the package's source
and committed profiles; a result older than :data:`MAX_AGE_S` is measured again, and
``tools/build_book.py`` empties the folder before each build.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

PACKAGE = Path(__file__).resolve().parents[1]
#: Where results are kept: ``_build/runs`` at the repository root (BATCHING_RUNS overrides).
RUNS_DIR = Path(os.environ.get("BATCHING_RUNS", PACKAGE.parent / "_build" / "runs"))
#: A kept result older than this is measured again (a book build takes minutes).
MAX_AGE_S = 3600.0

T = TypeVar("T")


def source_digest(package: Path = PACKAGE) -> str:
    """SHA-256 over every ``.py`` file of the package and every committed profile beside it
    (``data/profiles/*.json``: a run's simulated columns come from one), by path and content."""
    h = hashlib.sha256()
    files = sorted(package.rglob("*.py")) + sorted((package.parent / "data" / "profiles").glob("*.json"))
    for f in files:
        h.update(str(f.relative_to(package.parent)).encode())
        h.update(f.read_bytes())
    return h.hexdigest()


#: The package's source as this process imported it. Taken at import, not at each call: a
#: kernel that loaded the code before an edit must not file its results under the edited
#: code's key (it would hand a result without the edit's new fields to the next page).
LOADED_SOURCE = source_digest()


def key(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> str:
    """The file name a call's result is kept under: function name and a 16-hex digest."""
    h = hashlib.sha256(pickle.dumps((fn.__module__, fn.__qualname__, args, sorted(kwargs.items()))))
    h.update(LOADED_SOURCE.encode())
    return f"{fn.__name__}-{h.hexdigest()[:16]}"


def shared(fn: Callable[..., T], *args: Any, directory: Path | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)``, or the result a page of the same build already measured."""
    d = Path(directory) if directory is not None else RUNS_DIR
    path = d / f"{key(fn, args, kwargs)}.pkl"
    if path.is_file() and time.time() - path.stat().st_mtime < MAX_AGE_S:
        with path.open("rb") as kept:
            result: T = pickle.load(kept)
            return result
    result = fn(*args, **kwargs)
    d.mkdir(parents=True, exist_ok=True)
    # Written whole and renamed, so a page never reads half of another's result.
    with tempfile.NamedTemporaryFile(dir=d, suffix=".tmp", delete=False) as tmp:
        pickle.dump(result, tmp)
    os.replace(tmp.name, path)
    return result


def clear(directory: Path | None = None) -> int:
    """Remove every kept result (a new build measures afresh); returns how many."""
    d = Path(directory) if directory is not None else RUNS_DIR
    files = list(d.glob("*.pkl")) if d.is_dir() else []
    for f in files:
        f.unlink()
    return len(files)
