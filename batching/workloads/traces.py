"""Real request traces as workloads: Azure LLM inference 2023 and Mooncake.

:func:`load_trace` finds a named trace (:mod:`batching.trace_files`). Files may be
gzip-compressed (``.csv.gz``, ``.jsonl.gz``: the repository ships its traces so). Every
workload records its source file, the sha256 of its uncompressed text (the same for a
trace and its ``.gz``), selection and the attribution the data's licence asks for in
``info``. Parse errors name the file, line, column and value: a silently skipped row
would change a published number.
"""

from __future__ import annotations

import csv
import gzip
import hashlib
import io
import json
import math
import zlib
from datetime import datetime, timedelta
from pathlib import Path
from typing import TextIO

import numpy as np

from ..validate import integer
from .errors import WorkloadError
from .trace_files import _KNOWN_SHA, GZ, TRACES, TraceError, find_trace
from .workload import Workload

__all__ = [
    "TraceError",
    "AZURE_ATTRIBUTION",
    "MOONCAKE_ATTRIBUTION",
    "load_azure",
    "load_mooncake",
    "load_trace",
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
_BUCKET_S = 3.0  # the width of Mooncake's timestamp buckets


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


def _open(path: Path, kind: str, encoding: str, newline: str | None = None) -> tuple[TextIO, str]:
    """The text of trace ``path`` (gunzipped if it ends in ``.gz``) and the sha256 of that text.

    The file is read into memory once (a few MB): hashing the uncompressed bytes keeps a
    ``.gz`` trace's sha256 equal to its plain file's, so either names the same trace, and
    parsing from the same bytes costs no second read.
    """
    try:
        data = path.read_bytes()
        if path.suffix.lower() == GZ:
            data = gzip.decompress(data)
    except (OSError, EOFError, zlib.error) as e:  # BadGzipFile is an OSError; EOFError: truncated
        raise TraceError(f"cannot open {kind} trace {path}: {e}") from None
    text = io.TextIOWrapper(io.BytesIO(data), encoding=encoding, newline=newline)
    return text, hashlib.sha256(data).hexdigest()


def _plain(path: Path) -> Path:
    """``x.csv`` for ``x.csv`` and ``x.csv.gz``: the name that tells the format and the stem."""
    name = path.name
    return Path(name[: -len(GZ)] if name.lower().endswith(GZ) else name)


def _select(
    path: Path,
    arrivals: np.ndarray,
    prompts: list[int],
    outputs: list[int],
    *,
    limit: int | None,
    window: tuple[float, float] | None,
    info: dict[str, object],
    epoch: datetime | None = None,
) -> Workload:
    """Apply window, then limit; rebase arrivals so the first selected request is at t=0.

    The offset goes to ``info["t_offset_s"]`` (seconds from the trace's first row), and
    ``info["epoch"]`` is the wall-clock time of the new t=0 when the trace has one.
    """
    if limit is not None:
        limit = integer("limit", limit, 1, error=WorkloadError)
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
    if epoch is not None:
        info["epoch"] = (epoch + timedelta(seconds=offset)).isoformat(sep=" ")
    name = str(info.get("trace", _plain(path).stem))
    p, o = np.array(prompts, dtype=np.int64)[idx], np.array(outputs, dtype=np.int64)[idx]
    return Workload.from_arrays(arrivals[idx] - offset, p, o, name=name, info=info)


def _base_info(path: Path, sha: str, fmt: str, attribution: str) -> dict[str, object]:
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


def load_azure(
    path: str | Path,
    *,
    limit: int | None = None,
    window: tuple[float, float] | None = None,
) -> Workload:
    """Load an Azure LLM inference trace CSV (``TIMESTAMP,ContextTokens,GeneratedTokens``),
    plain or gzip-compressed (``.gz``).

    Arrival = seconds since the first (selected) row. ``window=(t0, t1)`` keeps rows with t0 <= arrival < t1,
    ``limit`` then keeps the first N. ``info["epoch"]`` is the wall-clock time of t=0.
    """
    path = Path(path)
    f, sha = _open(path, "Azure", "utf-8-sig", newline="")
    times: list[datetime] = []
    prompts: list[int] = []
    outputs: list[int] = []
    prev_line = 0
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
                    f"{prev_line}'s {prev.isoformat(' ')}; the trace must be sorted by time"
                )
            prev = t
            prompts.append(_parse_length(row[ip], where, "ContextTokens"))
            outputs.append(_parse_length(row[io], where, "GeneratedTokens"))
            times.append(t)
            prev_line = reader.line_num
    if not times:
        raise TraceError(f"{path}: header only, no requests")
    t0 = times[0]
    us = timedelta(microseconds=1)
    # Integer microseconds keep arrivals exact (1.5 s stays 1.5, not 1.4999999).
    arrivals = np.array([(t - t0) // us for t in times], dtype=np.int64) / 1e6
    info = _base_info(path, sha, "azure-2023-csv", AZURE_ATTRIBUTION)
    return _select(path, arrivals, prompts, outputs, limit=limit, window=window, info=info, epoch=t0)


def load_mooncake(
    path: str | Path,
    *,
    limit: int | None = None,
    window: tuple[float, float] | None = None,
    spread: bool = True,
) -> Workload:
    """Load a Mooncake JSON-lines trace (``timestamp`` ms, ``input_length``, ``output_length``),
    plain or gzip-compressed (``.gz``).

    ``hash_ids`` are ignored. The trace stamps requests in 3-second buckets (up to 28 share one
    timestamp); ``spread=True`` places the k requests of a bucket at t + i*w/k, i = 0..k-1,
    where w is the bucket width (or the gap to the next timestamp, if shorter), so the
    replay is not a train of 28-request bursts. Deterministic, and noted in ``info``.
    Other options as :func:`load_azure`. Output lengths of 1 occur (TPOT is then null).
    """
    path = Path(path)
    f, sha = _open(path, "Mooncake", "utf-8")
    ts: list[float] = []
    prompts: list[int] = []
    outputs: list[int] = []
    prev_line = 0
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
                    f"{where}, field 'timestamp': {t!r} is earlier than line {prev_line}'s "
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
            prev_line = n
    if not ts:
        raise TraceError(f"{path}: empty file (expected JSON lines with {', '.join(_MOONCAKE_FIELDS)})")
    raw = (np.array(ts, dtype=np.float64) - ts[0]) / 1000.0
    arrivals = _spread(raw, _BUCKET_S) if spread else raw
    info = _base_info(path, sha, "mooncake-jsonl", MOONCAKE_ATTRIBUTION)
    info["spread"] = spread and (
        f"requests sharing a timestamp spread evenly over the bucket "
        f"(width min({_BUCKET_S} s, gap to next timestamp)), deterministic"
    )
    info["ignored"] = "hash_ids (prefix-sharing blocks)"
    return _select(path, arrivals, prompts, outputs, limit=limit, window=window, info=info)


def _spread(t: np.ndarray, bucket_s: float) -> np.ndarray:
    """Spread each run of equal timestamps evenly over its bucket, never past the next one."""
    starts = np.flatnonzero(np.r_[True, t[1:] != t[:-1]])
    counts = np.diff(np.r_[starts, len(t)])
    nxt = np.r_[t[starts[1:]], np.inf]
    width = np.minimum(bucket_s, nxt - t[starts])
    rank = np.arange(len(t)) - np.repeat(starts, counts)
    return t + rank * np.repeat(width / counts, counts)


def load_trace(path_or_name: str | Path, *, download: bool = False, **options: object) -> Workload:
    """Load a trace by name (``azure-conv``, ``azure-code``, ``mooncake-conv``) or by path.

    Paths dispatch on extension, before an optional ``.gz``: ``.csv`` -> :func:`load_azure`,
    ``.jsonl`` -> :func:`load_mooncake`; ``options`` pass through (limit, window;
    spread for Mooncake). ``download``: see :func:`~batching.workloads.trace_files.find_trace`.
    """
    key = str(path_or_name)
    if key in TRACES:
        path = find_trace(key, download=download)
    else:
        path = Path(path_or_name)
    suffix = _plain(path).suffix.lower()
    if suffix == ".csv":
        return load_azure(path, **options)  # type: ignore[arg-type]
    if suffix == ".jsonl":
        return load_mooncake(path, **options)  # type: ignore[arg-type]
    raise TraceError(
        f"{path}: cannot tell the trace format from extension {suffix!r} "
        f"(.csv = Azure, .jsonl = Mooncake, either optionally .gz); named traces: {', '.join(TRACES)}"
    )


def trace_workload(name: str, limit: int | None = None, max_context: int = 8192) -> Workload:
    """The first ``limit`` requests of a named trace, each capped to ``max_context`` (a model's
    context); how many were capped is in ``info["capped"]``."""
    return load_trace(name, limit=limit).cap_to_context(max_context, mode="cap")[0]
