"""Exchange workloads and results with ``vllm bench serve``.

Export, both as JSONL (vLLM reads no other form of either):

- ``vllm-timed-trace``: the rows of ``--dataset-name timed_trace`` (``timestamp`` in seconds,
  ``input_length``, ``output_length``, ``hash_ids``; vLLM >= 0.23.0), which vLLM sends at their
  timestamps (``--self-timed``, its default for that dataset): the trace's own arrivals.
  ``hash_ids`` name the prompt's blocks of ``block_size`` tokens; the workloads hold no
  prefix-sharing information, so every block of every request has an id of its own (a row
  without ``hash_ids`` would get an empty prompt).
- ``vllm-custom``: the JSONL of ``--dataset-name custom`` (``prompt``, ``output_tokens``;
  vLLM's ``CustomDataset``), for which vLLM draws its own arrivals (Gamma gaps:
  ``--request-rate R --burstiness B``); :func:`fit_gamma` states the closest R and B.

Import: ``--save-result --save-detailed``'s per-request ``input_lens``, ``output_lens``,
``ttfts``, ``itls``, ``errors``, ``start_times`` and ``queue_times`` (vLLM's
``benchmarks/serve.py``). A request was sent at its ``start_times`` entry and released by
vLLM's arrival process ``queue_times`` earlier (the wait for ``--max-concurrency``): that is
its arrival. Files from before ``start_times`` fall back to nominal arrivals ``i /
request_rate``, said so in the config. Chunk times are rebuilt as ``send + ttft``, then
``+ itl`` per chunk; a request whose chunks are fewer than its tokens (several per chunk, as
speculative decoding streams them) keeps its TTFT, E2E and TPOT, and only its per-token gaps
are unknown. Throughput uses vLLM's own ``duration``. A ``timed_trace --self-timed`` run is
imported with ``self_timed``: arrivals at the trace's timestamps, so lateness is vLLM's own.
A file written with ``--append-result`` (several JSON objects) needs ``run`` to say which one.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads import Workload
from .served import ServedRequest, last_line


class VllmFormatError(ValueError):
    """A file that is not what ``vllm bench serve`` writes or reads."""


def fit_gamma(arrivals: np.ndarray) -> dict[str, float | int | None]:
    """Rate and Gamma burstiness of a trace's gaps (vLLM: Gamma(shape=B, scale=1/(R*B))): by
    moments R = 1/mean, B = mean^2 / variance (1: Poisson, < 1 burstier), and the
    maximum-likelihood shape (Minka's fixed point), which weighs small gaps more."""
    a = np.sort(np.asarray(arrivals, dtype=float))
    gaps = np.diff(a)
    out: dict[str, float | int | None] = {"gaps": int(gaps.size), "rate": None, "burstiness": None}
    if gaps.size < 2 or gaps.mean() <= 0:
        return {**out, "burstiness_mle": None, "zero_gaps": int((gaps == 0).sum())}
    mean, var = float(gaps.mean()), float(gaps.var(ddof=1))
    out["rate"] = 1.0 / mean
    out["burstiness"] = mean * mean / var if var > 0 else math.inf
    pos = gaps[gaps > 0]  # log of a zero gap is -inf: the MLE uses the positive ones
    out["zero_gaps"] = int(gaps.size - pos.size)
    out["burstiness_mle"] = _gamma_mle_shape(pos) if pos.size >= 2 else None
    return out


def _gamma_mle_shape(x: np.ndarray, iters: int = 50) -> float | None:
    s = math.log(x.mean()) - float(np.log(x).mean())
    if s <= 0:
        return None  # all gaps equal: infinitely regular
    k = (3 - s + math.sqrt((s - 3) ** 2 + 24 * s)) / (12 * s)  # Minka's start, within 1.5%
    for _ in range(iters):  # Newton on log k - digamma(k) = s
        f = math.log(k) - _digamma(k) - s
        df = 1 / k - _trigamma(k)
        k_new = k - f / df
        if k_new <= 0:
            k_new = k / 2
        if abs(k_new - k) < 1e-10 * k:
            return k_new
        k = k_new
    return k


def _digamma(x: float) -> float:
    r = 0.0
    while x < 6:
        r -= 1 / x
        x += 1
    f = 1 / (x * x)
    return r + math.log(x) - 0.5 / x - f * (1 / 12 - f * (1 / 120 - f * (1 / 252 - f / 240)))


def _trigamma(x: float) -> float:
    r = 0.0
    while x < 6:
        r += 1 / (x * x)
        x += 1
    f = 1 / (x * x)
    return r + 1 / x + f / 2 + f / x * (1 / 6 - f * (1 / 30 - f / 42))


def require_jsonl(path: str | Path, fmt: str) -> Path:
    """vLLM reads its custom and timed-trace datasets as JSONL only, by the file's suffix."""
    path = Path(path)
    if path.suffix != ".jsonl":
        raise ValueError(
            f"--out {path}: --format {fmt} writes JSONL, which vllm bench serve reads only from a .jsonl file"
        )
    return path


def _write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for row in rows:
            f.write(json.dumps(row) + "\n")


def export_custom(
    w: Workload, path: str | Path, tokenizer: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """Write ``w`` as vLLM custom-dataset JSONL; returns what to tell ``vllm bench serve``.
    Prompts: with ``tokenizer``, texts of exactly the prompt length (BOS included); without,
    ``prompt_len`` words ``hi`` (a BOS may be added; the import marks such a mismatch)."""
    path = require_jsonl(path, "vllm-custom")
    if tokenizer:
        from .replay import text_prompts

        prompts = text_prompts(w, tokenizer, seed)
    else:
        prompts = {r.rid: ("hi " * r.prompt_len).strip() for r in w.requests}
    _write_jsonl(path, [{"prompt": prompts[r.rid], "output_tokens": r.output_len} for r in w.requests])
    fit = fit_gamma(w.arrivals)
    rate, b = fit["rate"], fit["burstiness"]
    flags = [
        "--dataset-name custom",
        f"--dataset-path {path}",
        f"--num-prompts {len(w)}",
        "--custom-output-len -1",
        "--skip-chat-template",
        "--disable-shuffle",
        "--ignore-eos",
    ]
    if rate is not None:
        flags.append(f"--request-rate {rate:.4g}")
        if b is not None and math.isfinite(b):
            flags.append(f"--burstiness {b:.3g}")
    flags += ["--save-result", "--save-detailed"]
    return {"path": str(path), "requests": len(w), "arrival_fit": fit, "vllm_bench_flags": flags}


def timed_trace_rows(w: Workload, block_size: int = 16) -> list[dict[str, Any]]:
    """``w`` as ``timed_trace`` rows: seconds since the first arrival, the lengths, and one
    hash id per block of ``block_size`` prompt tokens (the last block may be partial), unique
    to its request (no prefix is shared)."""
    if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
        raise ValueError(f"--block-size={block_size}: must be an integer >= 1")
    rows, next_id = [], 0
    first = float(w.arrivals.min()) if len(w) else 0.0
    for r in w.requests:
        blocks = -(-r.prompt_len // block_size)
        rows.append(
            {
                "timestamp": round(float(r.arrival) - first, 6),
                "input_length": int(r.prompt_len),
                "output_length": int(r.output_len),
                "hash_ids": list(range(next_id, next_id + blocks)),
            }
        )
        next_id += blocks
    return rows


def export_timed_trace(w: Workload, path: str | Path, block_size: int = 16) -> dict[str, Any]:
    """Write ``w`` as ``vllm bench serve --dataset-name timed_trace`` JSONL (vLLM >= 0.23.0);
    returns what to tell ``vllm bench serve``, which sends each row at its timestamp."""
    path = require_jsonl(path, "vllm-timed-trace")
    rows = timed_trace_rows(w, block_size)
    _write_jsonl(path, rows)
    flags = [
        "--backend openai",
        "--dataset-name timed_trace",
        f"--dataset-path {path}",
        f"--num-prompts {len(w)}",
        f"--timed-trace-chunk-hash-size {block_size}",
        "--timed-trace-sec-multiplier 1",
        "--self-timed",
        "--disable-shuffle",
        "--ignore-eos",
        "--save-result",
        "--save-detailed",
    ]
    span = rows[-1]["timestamp"] if rows else 0.0
    return {
        "path": str(path),
        "requests": len(w),
        "block_size": block_size,
        "span_s": span,
        "vllm_bench_flags": flags,
    }


_LISTS = ("input_lens", "output_lens", "ttfts", "itls")
_OPTIONAL_LISTS = ("errors", "start_times", "queue_times", "latencies")


def _objects(text: str) -> list[Any]:
    """The JSON values of a file: one, or several one after another (``--append-result``)."""
    dec = json.JSONDecoder()
    out: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i == len(text):
            return out
        obj, i = dec.raw_decode(text, i)
        out.append(obj)


def _number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _kind(x: Any) -> str:
    return "null" if x is None else type(x).__name__


def read_result(path: str | Path, run: int | None = None) -> dict[str, Any]:
    """The result of ``vllm bench serve --save-result --save-detailed`` at ``path``, checked
    field by field; ``run`` (1 = first) picks one of the results an ``--append-result`` file
    holds. Anything else is a :class:`VllmFormatError` naming the field."""
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    try:
        docs = _objects(text)
    except json.JSONDecodeError as e:
        raise VllmFormatError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not docs:
        raise VllmFormatError(f"{path}: empty file")
    if len(docs) > 1 and run is None:
        raise VllmFormatError(
            f"{path}: {len(docs)} results one after another (vllm bench serve --append-result): "
            f"choose one with --run N (1 to {len(docs)})"
        )
    if run is not None and not 1 <= run <= len(docs):
        raise VllmFormatError(f"--run {run}: {path} holds {len(docs)} result(s), numbered from 1")
    doc = docs[(run or 1) - 1]
    where = f"{path}" + (f" (result {run})" if len(docs) > 1 else "")
    check_result(doc, where)
    return doc


def check_result(doc: Any, where: str = "the result") -> None:
    """Raise :class:`VllmFormatError` naming the first field of ``doc`` that is not what
    vLLM writes."""
    if not isinstance(doc, dict):
        raise VllmFormatError(f"{where}: expected one JSON object, as vllm bench serve --save-result writes")
    missing = [k for k in _LISTS if k not in doc]
    if missing:
        raise VllmFormatError(
            f"{where}: no {', '.join(missing)}: run vllm bench serve with --save-result --save-detailed"
        )
    for k in (*_LISTS, *_OPTIONAL_LISTS):
        if k in doc and not isinstance(doc[k], list):
            raise VllmFormatError(f"{where}: {k} is {_kind(doc[k])}, expected a list (one entry per request)")
    n = len(doc["input_lens"])
    for k in (*_LISTS, *_OPTIONAL_LISTS):
        if k in doc and len(doc[k]) != n:
            raise VllmFormatError(f"{where}: {k} has {len(doc[k])} entries, input_lens {n}")
    if n == 0:
        raise VllmFormatError(f"{where}: no requests")
    rate = doc.get("request_rate")
    if not (rate is None or rate == "inf" or (_number(rate) and rate > 0)):
        raise VllmFormatError(f'{where}: request_rate={rate!r}: expected a number > 0 or "inf"')
    dur = doc.get("duration")
    if dur is not None and not (_number(dur) and dur >= 0):
        raise VllmFormatError(f"{where}: duration={dur!r}: expected seconds")
    errors = doc.get("errors") or [""] * n
    for i in range(n):
        for k in ("input_lens", "output_lens"):
            v = doc[k][i]
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise VllmFormatError(f"{where}: {k}[{i}]={v!r}: expected a token count")
        if errors[i] is not None and not isinstance(errors[i], str):
            raise VllmFormatError(f"{where}: errors[{i}]={errors[i]!r}: expected a text")
        if _failed(doc, errors, i):
            continue
        t = doc["ttfts"][i]
        if not (_number(t) and t >= 0):
            raise VllmFormatError(
                f"{where}: ttfts[{i}]={t!r}: a request without an error needs its time to first token"
            )
        itl = doc["itls"][i]
        if not isinstance(itl, list) or not all(_number(x) and x >= 0 for x in itl):
            raise VllmFormatError(f"{where}: itls[{i}]={itl!r}: expected a list of inter-token seconds")
        for k in ("start_times", "queue_times", "latencies"):
            if k in doc and not _number(doc[k][i]):
                raise VllmFormatError(f"{where}: {k}[{i}]={doc[k][i]!r}: expected seconds")


def _failed(doc: dict[str, Any], errors: list[Any], i: int) -> bool:
    """vLLM's failed request: an error text, or (no text) nothing streamed at all."""
    if errors[i]:
        return True
    return doc["output_lens"][i] == 0 and doc["itls"][i] in ([], None) and doc["ttfts"][i] in (0, 0.0, None)


def import_result(
    doc: dict[str, Any], w: Workload | None = None, self_timed: bool = False
) -> tuple[list[ServedRequest], dict[str, Any], float | None, str]:
    """vLLM's per-request lists as :class:`ServedRequest` (with ``w``, the exported workload,
    checked against its lengths and given its rids), vLLM's parameters, its duration, and
    where the arrivals came from. ``doc`` is checked first (:func:`check_result`).

    ``self_timed``: the run was ``--dataset-name timed_trace --self-timed`` on ``w``'s export,
    so each request was due at ``w``'s own arrival (its row's timestamp), and its lateness is
    vLLM's dispatch delay past it (its arrival process's release, ``start_times`` less
    ``queue_times``, is when it woke, not when it was due). vLLM's file does not record the
    dataset or the flag, so the caller says so. The clocks are joined where the least late
    request was on time (the first row, due at 0, is never slept for)."""
    check_result(doc)
    n = len(doc["input_lens"])
    if w is not None and len(w) != n:
        raise VllmFormatError(f"the result holds {n} requests, the workload {len(w)}")
    if self_timed and w is None:
        raise ValueError("--self-timed: give the exported workload's options (its arrivals are the schedule)")
    errors = doc.get("errors") or [""] * n
    base = float(w.arrivals.min()) if w is not None else 0.0
    starts, queues = doc.get("start_times"), doc.get("queue_times")
    if self_timed:
        assert w is not None
        if starts is None:
            raise VllmFormatError("--self-timed: the result has no start_times (send times) to place")
        st = np.asarray(starts, dtype=float)
        q = np.asarray(queues, dtype=float) if queues is not None else np.zeros(n)
        due = np.asarray(w.arrivals, dtype=float) - base
        origin = float((st - q - due).min())
        sent = st - origin + base
        arrival = due + base
        how = (
            "the workload's own arrivals (vLLM's --self-timed timestamps); sent at vLLM's "
            "start_times, the clocks joined where the least late request was on time"
        )
    elif starts is not None:
        st = np.asarray(starts, dtype=float)
        q = np.asarray(queues, dtype=float) if queues is not None else np.zeros(n)
        origin = float((st - q).min())
        sent = st - origin + base
        arrival = sent - q
        how = (
            "vLLM's start_times (send) less queue_times (its wait for --max-concurrency)"
            if queues is not None
            else "vLLM's start_times (send; the file has no queue_times)"
        )
    else:
        rate = doc.get("request_rate", "inf")
        rate_f = math.inf if rate in ("inf", None) else float(rate)
        arrival = base + (np.zeros(n) if math.isinf(rate_f) else np.arange(n) / rate_f)
        sent = arrival
        how = "nominal i / request_rate (the file holds no start_times)"
    reqs = []
    for i in range(n):
        p_in, p_out = int(doc["input_lens"][i]), int(doc["output_lens"][i])
        wr = w.requests[i] if w is not None else None
        r = ServedRequest(
            rid=wr.rid if wr else i,
            arrival=float(arrival[i]),
            prompt_len=wr.prompt_len if wr else p_in,
            output_len=wr.output_len if wr else max(p_out, 1),
            sent=float(sent[i]),
            usage_prompt=p_in,
            usage_output=p_out,
        )
        if _failed(doc, errors, i):
            r.status = "error"
            r.error = last_line(errors[i] or "") or "vLLM marked it failed (no error text)"
        else:
            # One chunk per entry: vLLM records an ITL per streamed chunk, several tokens or one.
            itl = [float(x) for x in doc["itls"][i]]
            t = float(sent[i]) + float(doc["ttfts"][i]) + np.concatenate(([0.0], np.cumsum(itl)))
            for x in t.tolist():
                r.add_chunk(x, None)
            if (p_in, p_out) != (r.prompt_len, r.output_len):
                r.status = "usage_mismatch"
                r.error = (
                    f"vLLM counted prompt {p_in} / output {p_out} tokens, "
                    f"the workload asks {r.prompt_len} / {r.output_len}"
                )
            else:
                r.status = "ok"
        reqs.append(r)
    params = {
        k: doc.get(k)
        for k in (
            "date",
            "backend",
            "label",
            "model_id",
            "tokenizer_id",
            "num_prompts",
            "request_rate",
            "burstiness",
            "max_concurrency",
        )
    }
    dur = doc.get("duration")
    return reqs, params, float(dur) if dur is not None else None, how
