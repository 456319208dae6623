"""Results files: one JSON per run and a per-request CSV (README, "Semantics").

The JSON is ``{"schema", "meta", "config", "summary", "requests", "steps"}``: ``meta`` holds
what varies between identical runs (date, host, versions, wall time) and is left out of
determinism checks (:func:`comparable`); ``config`` holds everything needed to rerun;
``summary`` the run's metrics (:func:`batching.metrics.summarize`); ``requests`` one record
per request (the CSV's rows); ``steps``, optional, the per-step log.
"""

from __future__ import annotations

import csv
import datetime as _dt
import json
import math
import os
import platform
import socket
from pathlib import Path
from typing import Any

import numpy as np

from .engine import RunResult
from .metrics import SLO, request_records, summarize, token_times

SCHEMA = 1


def machine_busy(load: float | None, cpus: int | float | None) -> bool:
    """Whether other work shared the cores while something was measured: the 1-minute load
    average above the core count (unknown load, as on Windows: not busy). The pages then say
    so instead of reading the measurement as the device's."""
    return load is not None and load > float(cpus or 1)


def load_average() -> float | None:
    """The 1-minute load average now, or None where the platform has none (``os.getloadavg``
    does not exist on Windows)."""
    getloadavg = getattr(os, "getloadavg", None)
    if getloadavg is None:
        return None
    try:
        return float(getloadavg()[0])
    except OSError:
        return None


def busy_cpu_s() -> float | None:
    """CPU seconds the whole machine has spent busy (user, nice, system, irq, softirq, steal),
    from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat") as f:
            v = [int(x) for x in f.readline().split()[1:9]]
    except (OSError, ValueError):
        return None
    return (v[0] + v[1] + v[2] + v[5] + v[6] + v[7]) / os.sysconf("SC_CLK_TCK")


def machine_load(*loads: float | None) -> dict[str, Any]:
    """What a live run records about its machine: ``load``, the highest of the 1-minute load
    averages taken around it (nan if none is known), ``cpus`` and ``busy``
    (:func:`machine_busy`)."""
    known = [x for x in loads if x is not None and not math.isnan(x)]
    cpus = float(os.cpu_count() or 1)
    load = max(known) if known else None
    return {"load": math.nan if load is None else load, "cpus": cpus, "busy": machine_busy(load, cpus)}


def run_meta() -> dict[str, Any]:
    """What every results file's ``meta`` starts with: date, host, versions."""
    v = {"python": platform.python_version(), "numpy": np.__version__}
    try:
        from importlib.metadata import version

        v["batching"] = version("batching")
    except Exception:  # not installed as a distribution (running from a checkout)
        pass
    date = _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return {"date": date, "host": socket.gethostname(), "versions": v}


def build(
    result: RunResult,
    config: dict[str, Any],
    slo: SLO | None = None,
    include_steps: bool = True,
    include_token_times: bool = False,
) -> dict[str, Any]:
    """The results document of one run; ``include_token_times`` adds every token's
    timestamp to each request record (so every inter-token latency can be recomputed)."""
    times = token_times(result.requests)  # millions of timestamps on a trace: read them once
    records = request_records(result.requests, times)
    if include_token_times:
        for rec, r in zip(records, result.requests):
            rec["token_times"] = list(r.token_times)
    doc: dict[str, Any] = {
        "schema": SCHEMA,
        "meta": {**run_meta(), "wall_s": result.wall_s, "fast_steps": result.fast_steps},
        "config": {**config, "scheduler": result.scheduler, "executor": result.executor},
        "summary": summarize(result, records, slo, times),
        "requests": records,
    }
    if include_steps:
        doc["steps"] = result.log.records()
    return doc


def write_json(doc: dict[str, Any], path: str | os.PathLike[str], allow_nan: bool = False) -> Path:
    """Write ``doc`` whole or not at all (a temporary file beside it, then renamed): a run
    killed by its time limit while saving leaves the previous file, never a truncated one.
    NaN is refused unless ``allow_nan`` (a profile marks unmeasured points and unknown load so)."""
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1, allow_nan=allow_nan) + "\n")
    os.replace(tmp, out)
    return out


def write_requests_csv(doc: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [{k: v for k, v in r.items() if k != "token_times"} for r in doc["requests"]]
    with path.open("w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    return path


def comparable(doc: dict[str, Any]) -> dict[str, Any]:
    """The parts of a results document that identical runs must reproduce exactly."""
    return {k: v for k, v in doc.items() if k != "meta"}
