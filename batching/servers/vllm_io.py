"""Exchange workloads and results with ``vllm bench serve``.

Export: the JSONL of ``--dataset-name custom`` (``prompt``, ``output_tokens``; vLLM's
``CustomDataset``). vLLM draws its own arrivals (Gamma gaps: ``--request-rate R --burstiness
B``) and cannot replay a trace's timestamps, so :func:`fit_gamma` states the closest R and B.

Import: ``--save-result --save-detailed``'s per-request ``input_lens``, ``output_lens``,
``ttfts``, ``itls`` and ``errors`` (vLLM's ``benchmarks/serve.py``). Token times are rebuilt
as ``ttft, ttft + itl[0], ...`` from nominal send times ``i / request_rate`` (the file has
none; latencies do not depend on them); throughput uses vLLM's own ``duration``.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from ..workloads import Workload
from .served import ServedRequest


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


def export_custom(
    w: Workload, path: str | Path, tokenizer: str | None = None, seed: int = 0
) -> dict[str, Any]:
    """Write ``w`` as vLLM custom-dataset JSONL; returns what to tell ``vllm bench serve``.
    Prompts: with ``tokenizer``, texts of exactly the prompt length (BOS included); without,
    ``prompt_len`` words ``hi`` (a BOS may be added; the import marks such a mismatch)."""
    if tokenizer:
        from .replay import text_prompts

        prompts = text_prompts(w, tokenizer, seed)
    else:
        prompts = {r.rid: ("hi " * r.prompt_len).strip() for r in w.requests}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w") as f:
        for r in w.requests:
            f.write(json.dumps({"prompt": prompts[r.rid], "output_tokens": r.output_len}) + "\n")
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


_LISTS = ("input_lens", "output_lens", "ttfts", "itls")


def read_result(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except FileNotFoundError:
        raise FileNotFoundError(f"{path}: no such file") from None
    except json.JSONDecodeError as e:
        raise VllmFormatError(f"{path}: not JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(doc, dict):
        raise VllmFormatError(f"{path}: expected one JSON object, as vllm bench serve --save-result writes")
    missing = [k for k in _LISTS if k not in doc]
    if missing:
        raise VllmFormatError(
            f"{path}: no {', '.join(missing)}: run vllm bench serve with --save-result --save-detailed"
        )
    n = len(doc["input_lens"])
    for k in (*_LISTS, "errors"):
        if k in doc and (not isinstance(doc[k], list) or len(doc[k]) != n):
            raise VllmFormatError(f"{path}: {k} has {len(doc[k])} entries, input_lens {n}")
    if n == 0:
        raise VllmFormatError(f"{path}: no requests")
    return doc


def import_result(
    doc: dict[str, Any], w: Workload | None = None
) -> tuple[list[ServedRequest], dict[str, Any], float | None]:
    """vLLM's per-request lists as :class:`ServedRequest` (with ``w``, the exported workload,
    checked against its lengths and given its rids), vLLM's parameters, its duration."""
    n = len(doc["input_lens"])
    if w is not None and len(w) != n:
        raise VllmFormatError(f"the result holds {n} requests, the workload {len(w)}")
    rate = doc.get("request_rate", "inf")
    rate_f = math.inf if rate in ("inf", None) else float(rate)
    errors = doc.get("errors") or [""] * n
    reqs = []
    for i in range(n):
        p_in, p_out = int(doc["input_lens"][i]), int(doc["output_lens"][i])
        wr = w.requests[i] if w is not None else None
        arrival = 0.0 if math.isinf(rate_f) else i / rate_f
        r = ServedRequest(
            rid=wr.rid if wr else i,
            arrival=arrival,
            prompt_len=wr.prompt_len if wr else p_in,
            output_len=wr.output_len if wr else max(p_out, 1),
            sent=arrival,
            usage_prompt=p_in,
            usage_output=p_out,
        )
        if errors[i]:
            r.status, r.error = "error", str(errors[i])[:200]
        else:
            itl = [float(x) for x in doc["itls"][i]]
            t = arrival + float(doc["ttfts"][i]) + np.concatenate(([0.0], np.cumsum(itl)))
            r.token_times = t.tolist()
            if (p_in, p_out) != (r.prompt_len, r.output_len):
                r.status = "usage_mismatch"
                r.error = (
                    f"vLLM counted prompt {p_in} / output {p_out} tokens, "
                    f"the workload asks {r.prompt_len} / {r.output_len}"
                )
            elif len(r.token_times) != p_out:
                # vLLM records one ITL per streamed chunk; bundled tokens share a chunk.
                r.status = "stream_mismatch"
                r.error = f"{len(r.token_times)} token chunks for {p_out} tokens"
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
    return reqs, params, float(dur) if dur is not None else None
