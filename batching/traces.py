"""Real request traces as workloads: Azure LLM inference 2023 and Mooncake (every section).

The traces themselves are never part of the repository (see ``shared/traces/README.md``):
:func:`load_trace` finds them by name (:mod:`batching.trace_files`) in ``$BATCHING_TRACES``,
in ``../shared/traces`` next to the repository, or in ``~/.cache/batching/traces``
(downloaded there only when asked).
Every workload records its source file, sha256, selection, scaling and the attribution the
data's licence asks for in ``info``.

Parse errors name the file, line, column and the offending value: a silently skipped row
would change a published number without anyone noticing.
"""

from __future__ import annotations

import csv
import json
import math
from datetime import datetime, timedelta
from pathlib import Path
from typing import Literal

import numpy as np

from .request import RequestError
from .trace_files import _KNOWN_SHA, TRACES, TraceError, _sha256, find_trace
from .workload import Workload
from .workload_base import WorkloadError, _count, _positive_finite

__all__ = [
    "TraceError",
    "AZURE_ATTRIBUTION",
    "MOONCAKE_ATTRIBUTION",
    "load_azure",
    "load_mooncake",
    "load_trace",
    "merge",
]

AZURE_ATTRIBUTION = (
    'Patel et al., "Splitwise: Efficient generative LLM inference using phase splitting", '
    "ISCA 2024; data from the Azure Public Dataset (github.com/Azure/AzurePublicDataset, "
    "commit b469a11), licensed CC BY 4.0."
)
MOONCAKE_ATTRIBUTION = (
    'Qin et al., "Mooncake: A KVCache-centric Architecture for Serving LLM Chatbot", FAST 2025; '
    "trace from github.com/kvcache-ai/Mooncake FAST25-release/traces/conversation_trace.jsonl "
    "(commit 3b5a594; repository licence Apache-2.0, the data carries no licence of its own)."
)

_AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_MOONCAKE_FIELDS = ("timestamp", "input_length", "output_length")


# ------------------------------------------------------------------------ helpers
def _parse_timestamp(text: str) -> datetime:
    """``2023-11-16 18:15:46.6805900`` -> datetime; the 7th fractional digit (100 ns) is dropped.

    Python < 3.11 only accepts 3 or 6 fractional digits, so normalise to 6 ourselves.
    """
    s = text.strip()
    if "." in s:
        head, frac = s.rsplit(".", 1)
        if not frac.isdigit():
            raise ValueError(text)
        s = f"{head}.{frac[:6].ljust(6, '0')}"
    return datetime.fromisoformat(s)


def _parse_length(text: str, where: str, column: str) -> int:
    try:
        v = int(text.strip())
    except ValueError:
        raise TraceError(f"{where}, column {column!r}: {text!r} is not an integer") from None
    if v < 1:
        raise TraceError(f"{where}, column {column!r}: {v} tokens; lengths must be >= 1")
    return v


def _check_option(
    limit: int | None, window: tuple[float, float] | None
) -> tuple[int | None, tuple[float, float] | None]:
    if limit is not None:
        limit = _count("limit", limit, minimum=1)
    if window is not None:
        if not isinstance(window, (tuple, list)) or len(window) != 2:
            raise WorkloadError(f"window={window!r}: must be (t0, t1) in seconds")
        try:
            t0, t1 = (float(x) for x in window)
        except (TypeError, ValueError):
            raise WorkloadError(f"window={window!r}: must be two numbers (t0, t1) in seconds") from None
        if not (math.isfinite(t0) and t0 >= 0 and t1 > t0):
            raise WorkloadError(f"window={window!r}: need 0 <= t0 < t1 (t1 may be inf)")
        window = (t0, t1)
    return limit, window


def _select(
    path: Path,
    arrivals: np.ndarray,
    prompts: np.ndarray,
    outputs: np.ndarray,
    lines: np.ndarray,
    *,
    limit: int | None,
    window: tuple[float, float] | None,
    time_scale: float,
    max_context: int | None,
    cap: bool,
    name: str,
    info: dict[str, object],
    epoch: datetime | None = None,
) -> Workload:
    """Apply window, then limit, then time_scale, then the context check; build the workload.

    Arrivals are rebased so the first selected request arrives at t=0; the offset goes to
    ``info["t_offset_s"]`` (seconds from the trace's first row, before time scaling), and
    ``info["epoch"]`` is the wall-clock time of the new t=0 when the trace has one.
    """
    limit, window = _check_option(limit, window)
    time_scale = _positive_finite("time_scale", time_scale)
    keep = np.ones(len(arrivals), dtype=bool)
    if window is not None:
        keep &= (arrivals >= window[0]) & (arrivals < window[1])
        info["window_s"] = list(window)
    idx = np.flatnonzero(keep)
    if limit is not None:
        idx = idx[:limit]
        info["limit"] = limit
    if len(idx) == 0:
        raise TraceError(f"{path}: no requests in window={window!r} (trace spans 0..{arrivals[-1]:.3f} s)")
    info["rows_in_file"] = int(len(arrivals))
    info["rows_selected"] = int(len(idx))
    offset = float(arrivals[idx[0]])
    info["t_offset_s"] = offset
    info["time_scale"] = time_scale
    if epoch is not None:
        info["epoch"] = (epoch + timedelta(seconds=offset)).isoformat(sep=" ")
    if cap and max_context is None:
        raise WorkloadError("cap=True needs max_context (the context length to cap to)")
    a = (arrivals[idx] - offset) / time_scale
    p, o, ln = prompts[idx], outputs[idx], lines[idx]
    if max_context is not None:
        max_context = _count("max_context", max_context, minimum=2)
        over = np.flatnonzero(p + o > max_context)
        if len(over) and not cap:
            i = int(over[0])
            raise RequestError(
                f"{path}, line {int(ln[i])}: request {i}: prompt_len + output_len = {int(p[i])} + {int(o[i])} "
                f"= {int(p[i] + o[i])} exceeds max_context={max_context} ({len(over)} of {len(idx)} "
                f"selected requests too long; pass cap=True to shorten them)"
            )
    w = Workload.from_arrays(a, p, o, name=name, info=info)
    if max_context is not None and cap:
        w, _ = w.cap_to_context(max_context, mode="cap")
    return w


def _base_info(path: Path, fmt: str, attribution: str) -> dict[str, object]:
    sha = _sha256(path)
    info: dict[str, object] = {
        "source": "trace",
        "format": fmt,
        "file": str(path),
        "sha256": sha,
        "attribution": attribution,
    }
    if sha in _KNOWN_SHA:
        info["trace"] = _KNOWN_SHA[sha]
    return info


# ------------------------------------------------------------------------- Azure
def load_azure(
    path: str | Path,
    *,
    limit: int | None = None,
    window: tuple[float, float] | None = None,
    time_scale: float = 1.0,
    max_context: int | None = None,
    cap: bool = False,
    name: str | None = None,
) -> Workload:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``).

    Workloads for every section. Arrival = seconds since the first row (first selected row
    when ``window`` is given). ``window=(t0, t1)`` keeps rows with t0 <= arrival < t1,
    ``limit`` then keeps the first N; ``time_scale=k`` replays k times faster;
    ``max_context`` raises on a request that does not fit unless ``cap=True``, which
    shortens it (see :meth:`Workload.cap_to_context`). ``info["epoch"]`` is the wall-clock
    time of t=0, which :func:`merge` uses to align traces recorded in the same hour.
    """
    path = Path(path)
    try:
        f = open(path, newline="", encoding="utf-8-sig")
    except OSError as e:
        raise TraceError(f"cannot open Azure trace {path}: {e}") from None
    times: list[datetime] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []
    with f:
        reader = csv.reader(f)
        header = next(reader, None)
        while header is not None and not any(c.strip() for c in header):
            header = next(reader, None)
        if header is None:
            raise TraceError(f"{path}: empty file (expected header {','.join(_AZURE_COLUMNS)})")
        cols = [c.strip() for c in header]
        missing = [c for c in _AZURE_COLUMNS if c not in cols]
        if missing:
            raise TraceError(
                f"{path}, line {reader.line_num}: missing column(s) {', '.join(map(repr, missing))}; "
                f"header is {','.join(cols)!r}, expected {','.join(_AZURE_COLUMNS)}"
            )
        it, ip, io = (cols.index(c) for c in _AZURE_COLUMNS)
        ncols = len(cols)
        prev: datetime | None = None
        for row in reader:
            if not row or (len(row) == 1 and not row[0].strip()):
                continue  # blank line, e.g. a trailing newline
            where = f"{path}, line {reader.line_num}"
            if len(row) != ncols:
                raise TraceError(f"{where}: {len(row)} fields {row!r}, header has {ncols}")
            try:
                t = _parse_timestamp(row[it])
            except ValueError:
                raise TraceError(
                    f"{where}, column 'TIMESTAMP': {row[it]!r} is not a timestamp "
                    f"like 2023-11-16 18:15:46.6805900"
                ) from None
            if prev is not None and t < prev:
                raise TraceError(
                    f"{where}, column 'TIMESTAMP': {row[it]!r} is earlier than line "
                    f"{lines[-1]}'s {prev.isoformat(' ')}; the trace must be sorted by time"
                )
            prev = t
            prompts.append(_parse_length(row[ip], where, "ContextTokens"))
            outputs.append(_parse_length(row[io], where, "GeneratedTokens"))
            times.append(t)
            lines.append(reader.line_num)
    if not times:
        raise TraceError(f"{path}: header only, no requests")
    t0 = times[0]
    us = timedelta(microseconds=1)
    # Integer microseconds keep arrivals exact (1.5 s stays 1.5, not 1.4999999).
    arrivals = np.array([(t - t0) // us for t in times], dtype=np.int64) / 1e6
    info = _base_info(path, "azure-2023-csv", AZURE_ATTRIBUTION)
    w = _select(
        path,
        arrivals,
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        np.array(lines),
        limit=limit,
        window=window,
        time_scale=time_scale,
        max_context=max_context,
        cap=cap,
        name=name or str(info.get("trace", path.stem)),
        info=info,
        epoch=t0,
    )
    return w


# ---------------------------------------------------------------------- Mooncake
def load_mooncake(
    path: str | Path,
    *,
    limit: int | None = None,
    window: tuple[float, float] | None = None,
    time_scale: float = 1.0,
    max_context: int | None = None,
    cap: bool = False,
    spread: bool = True,
    bucket_s: float = 3.0,
    name: str | None = None,
) -> Workload:
    """Load a Mooncake JSON-lines trace (``timestamp`` ms, ``input_length``, ``output_length``).

    Workloads for every section (the long-context stress case of 7.3). ``hash_ids`` are
    ignored. The trace stamps requests in ``bucket_s``-second buckets (up to 28 share one
    timestamp); ``spread=True`` places the k requests of a bucket at t + i*w/k, i = 0..k-1,
    where w is the bucket width (or the gap to the next timestamp, if shorter), so the
    replay is not a train of 28-request bursts. Deterministic, and noted in ``info``.
    Other options as :func:`load_azure`. Output lengths of 1 occur (TPOT is then null).
    """
    path = Path(path)
    bucket_s = _positive_finite("bucket_s", bucket_s)
    try:
        f = open(path, encoding="utf-8")
    except OSError as e:
        raise TraceError(f"cannot open Mooncake trace {path}: {e}") from None
    ts: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    lines: list[int] = []
    with f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            where = f"{path}, line {n}"
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise TraceError(
                    f"{where}: not valid JSON ({e.msg} at column {e.colno}): {line.strip()[:80]!r}"
                ) from None
            if not isinstance(rec, dict):
                raise TraceError(f"{where}: expected a JSON object, got {line.strip()[:80]!r}")
            for k in _MOONCAKE_FIELDS:
                if k not in rec:
                    raise TraceError(f"{where}: missing field {k!r} (fields: {', '.join(rec)})")
            t = rec["timestamp"]
            if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
                raise TraceError(f"{where}, field 'timestamp': {t!r} is not a time in ms >= 0")
            if ts and t < ts[-1]:
                raise TraceError(
                    f"{where}, field 'timestamp': {t!r} is earlier than line {lines[-1]}'s "
                    f"{ts[-1]!r}; the trace must be sorted by time"
                )
            for k, out in (("input_length", prompts), ("output_length", outputs)):
                v = rec[k]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise TraceError(f"{where}, field {k!r}: {v!r} is not an integer")
                if v < 1:
                    raise TraceError(f"{where}, field {k!r}: {v} tokens; lengths must be >= 1")
                out.append(v)
            ts.append(t)
            lines.append(n)
    if not ts:
        raise TraceError(f"{path}: empty file (expected JSON lines with {', '.join(_MOONCAKE_FIELDS)})")
    raw = (np.array(ts, dtype=np.float64) - ts[0]) / 1000.0
    arrivals = _spread(raw, bucket_s) if spread else raw
    info = _base_info(path, "mooncake-jsonl", MOONCAKE_ATTRIBUTION)
    info["spread"] = (
        (
            f"requests sharing a timestamp spread evenly over the bucket "
            f"(width min({bucket_s} s, gap to next timestamp)), deterministic"
        )
        if spread
        else False
    )
    info["ignored"] = "hash_ids (prefix-sharing blocks)"
    return _select(
        path,
        arrivals,
        np.array(prompts, dtype=np.int64),
        np.array(outputs, dtype=np.int64),
        np.array(lines),
        limit=limit,
        window=window,
        time_scale=time_scale,
        max_context=max_context,
        cap=cap,
        name=name or str(info.get("trace", path.stem)),
        info=info,
    )


def _spread(t: np.ndarray, bucket_s: float) -> np.ndarray:
    """Spread each run of equal timestamps evenly over its bucket, never past the next one."""
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    counts = np.diff(np.r_[starts, len(t)])
    nxt = np.r_[t[starts[1:]], np.inf]
    width = np.minimum(bucket_s, nxt - t[starts])
    rank = np.arange(len(t)) - np.repeat(starts, counts)
    return t + rank * np.repeat(width / counts, counts)


# ------------------------------------------------------------------ by name or path
def load_trace(path_or_name: str | Path, *, download: bool = False, **options: object) -> Workload:
    """Load a trace by name (``azure-conv``, ``azure-code``, ``mooncake-conv``) or by path.

    Workloads for every section. Paths dispatch on extension: ``.csv`` -> :func:`load_azure`,
    ``.jsonl`` -> :func:`load_mooncake`; ``options`` pass through (limit, window,
    time_scale, max_context, cap; spread for Mooncake).
    """
    key = str(path_or_name)
    if key in TRACES:
        path = find_trace(key, download=download)
    else:
        path = Path(path_or_name)
    suffix = path.suffix.lower()
    if suffix == ".csv":
        return load_azure(path, **options)  # type: ignore[arg-type]
    if suffix == ".jsonl":
        return load_mooncake(path, **options)  # type: ignore[arg-type]
    raise TraceError(
        f"{path}: cannot tell the trace format from extension {suffix!r} "
        f"(.csv = Azure, .jsonl = Mooncake); named traces: {', '.join(TRACES)}"
    )


# ------------------------------------------------------------------------- merge
def merge(
    *workloads: Workload, align: Literal["auto", "epoch", "start"] = "auto", name: str | None = None
) -> Workload:
    """Interleave workloads by arrival, renumbering rids 0..n-1 (workloads for every section).

    Azure conv and code cover the same hour but each loads with t=0 at its own first row.
    ``align="epoch"`` shifts each by its ``info["epoch"]`` (wall time of its t=0, divided
    by the common time_scale) so the real interleaving comes back; ``"start"`` overlays
    them as they are; ``"auto"`` uses epoch when every workload has one. Ties keep argument
    order. The result starts at t=0.
    """
    if not workloads:
        raise WorkloadError("merge() needs at least one workload")
    for w in workloads:
        if not isinstance(w, Workload):
            raise WorkloadError(f"merge(): {w!r} is not a Workload")
    infos = [w.info for w in workloads]
    if align not in ("auto", "epoch", "start"):
        raise WorkloadError(f"align={align!r}: must be 'auto', 'epoch' or 'start'")
    has_epoch = all("epoch" in i for i in infos)
    if align == "epoch" and not has_epoch:
        lacking = [w.name for w, i in zip(workloads, infos) if "epoch" not in i]
        raise WorkloadError(f"align='epoch' but {', '.join(lacking)} carry no info['epoch']")
    use_epoch = has_epoch and align != "start"
    offsets = [0.0] * len(workloads)
    if use_epoch:
        scales = {float(i.get("time_scale", 1.0)) for i in infos}  # type: ignore[arg-type]
        if len(scales) != 1:
            raise WorkloadError(
                f"cannot align on epoch workloads replayed at different time_scale {sorted(scales)}"
            )
        k = scales.pop()
        epochs = [datetime.fromisoformat(str(i["epoch"])) for i in infos]
        e0 = min(epochs)
        offsets = [(e - e0) / timedelta(microseconds=1) / 1e6 / k for e in epochs]
    a = np.concatenate([w.arrivals + off for w, off in zip(workloads, offsets)])
    p = np.concatenate([w.prompt_lens for w in workloads])
    o = np.concatenate([w.output_lens for w in workloads])
    order = np.argsort(a, kind="stable")
    a_first = a[order[0]]
    a = a[order] - a_first
    parts = [
        {"name": w.name, "n": len(w), "offset_s": off, "info": i}
        for w, off, i in zip(workloads, offsets, infos)
    ]
    info: dict[str, object] = {"source": "merge", "align": "epoch" if use_epoch else "start", "parts": parts}
    if use_epoch:
        # Keep the merged workload alignable with others (e.g. merging a merge).
        info["time_scale"] = k
        info["epoch"] = (e0 + timedelta(seconds=float(a_first) * k)).isoformat(sep=" ")
    attributions = sorted({str(i["attribution"]) for i in infos if "attribution" in i})
    if attributions:
        info["attribution"] = " ".join(attributions)
    return Workload.from_arrays(
        a, p[order], o[order], name=name or "+".join(w.name for w in workloads), info=info
    )
