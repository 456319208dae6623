"""Independent simulations on several cores: a capacity search per configuration, a run per
point of a sweep. Each job is a pure function of its arguments, so the results are the same,
in the same order, whatever the number of workers.

``workers`` None takes ``$BATCHING_WORKERS`` (default 1: one process, nothing spawned). The
book's full build sets it to the machine's cores (``tools/build_book.py``); a page's live
measurements never run beside it, since the cells that simulate and the cells that measure
run one after the other.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import TypeVar

from .validate import integer

T = TypeVar("T")
R = TypeVar("R")

#: The environment variable that sets the default number of worker processes.
WORKERS_ENV = "BATCHING_WORKERS"


def default_workers() -> int:
    """``$BATCHING_WORKERS`` as a positive integer, else 1."""
    raw = os.environ.get(WORKERS_ENV, "").strip()
    if not raw:
        return 1
    try:
        value: object = int(raw)
    except ValueError:
        value = raw
    return integer(WORKERS_ENV, value, 1)


def pmap(fn: Callable[[T], R], items: Sequence[T], workers: int | None = None) -> list[R]:
    """``[fn(x) for x in items]``, over up to ``workers`` processes (``fn`` must be a module's
    top-level function, ``items`` and results picklable). Processes are spawned, not forked:
    a parent that has run torch's OpenMP threads cannot safely fork."""
    n = default_workers() if workers is None else integer("workers", workers, 1)
    if n <= 1 or len(items) <= 1:
        return [fn(x) for x in items]
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=min(n, len(items)), mp_context=ctx) as ex:
        return list(ex.map(fn, items))
