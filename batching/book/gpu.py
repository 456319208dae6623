"""GPU step costs from Vidur's measured operator tables (``data/profiles/gpu/*.json``, derived by
``benchmarks/derive_gpu_profiles.py``): where a real H100's and A100's linear layers leave
the flat, bandwidth-bound region of a decode step, how far the batch-1 weight stream falls
short of the datasheet bandwidth, and how large a prefill chunk must be before a token's
linear-layer cost stops falling. Numbers and verdicts only; the pages word them.

Every number here is read from the measured part of a profile (``parts.linear_ms``: the
nine per-layer operators x layers + the embedding, Vidur's medians), not from its modelled
terms (KV, LM head, attention, overhead), unless its name says ``step``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import roofline
from ..costs.knee import first_reaching, knee
from ..costs.profile import GPU_PROFILE_DIR, ProfileCost
from ..plan import StepWork
from .common import Claim, flat_verdict

#: Where the derived GPU profiles live (data/README.md).
#: The profiles the pages quote, by GPU: Llama-2-7B on the H100, Llama-3-8B on the A100, tp 1.
BOOK_PROFILES: dict[str, str] = {"h100": "h100-llama-2-7b-tp1.json", "a100": "a100-llama-8b-tp1.json"}
#: Token counts (decode batch or chunk) whose linear-layer time the pages quote.
QUOTED_TOKENS: tuple[int, ...] = (1, 64, 128, 256, 512)
#: The step-time multiples of batch 1 whose first batch the pages quote.
FACTORS: tuple[float, ...] = (1.25, 2.0)
#: Prefill chunk sizes whose per-token linear cost the pages quote.
CHUNKS: tuple[int, ...] = (128, 256, 512, 1024, 2048)
#: The largest decode batch read from a profile's curve (the decode grid's edge).
DECODE_MAX = 1024
#: A chunk "fills the GPU" when a token of it costs at most this many times the cheapest
#: per-token cost the table measured (any chunk size); PARTLY up to :data:`FILL_PARTLY`.
FILL_TOL = 1.10
FILL_PARTLY = 1.25
#: The token counts :func:`chunk_curve` draws (the H100 tables end at 4,096).
CURVE_MIN, CURVE_MAX = 128, 4096


def load_gpu_profile(name: str | Path) -> dict[str, Any]:
    """A derived GPU profile by file name (in :data:`GPU_PROFILE_DIR`) or path, validated
    through ``ProfileCost`` (a broken file raises ``ProfileError``)."""
    path = Path(name)
    if not path.is_file():
        path = GPU_PROFILE_DIR / str(name)
    doc: dict[str, Any] = json.loads(path.read_text())
    ProfileCost.from_dict(doc, source=str(path))
    if "parts" not in doc or "linear_ms" not in doc["parts"]:
        raise ValueError(f"{path}: no parts.linear_ms (not a derived GPU profile)")
    return doc


def linear_part(doc: dict[str, Any]) -> tuple[np.ndarray, np.ndarray]:
    """Token counts and the measured linear + element-wise ms of one step at each."""
    p = doc["parts"]
    return np.asarray(p["tokens"], dtype=np.float64), np.asarray(p["linear_ms"], dtype=np.float64)


def decode_numbers(doc: dict[str, Any], ctx: int = 128) -> dict[str, Any]:
    """The linear part of a decode step of ``b`` rows (= ``b`` tokens) against batch: its ms at
    :data:`QUOTED_TOKENS` (``linear_ms``), the first batch at each of :data:`FACTORS` x batch
    1 (``reach``) and the last batch before it (``knee``), the datasheet B* (the roofline's:
    peak x bytes per weight / (2 x bandwidth), one device) and the linear part's ratio to
    batch 1 there (interpolated), the whole modelled step's ratio at B* rounded down at
    ``ctx`` KV tokens per row (``step_ratio_bstar``; ``step_fits``: whether that KV fits the
    GPUs' memory), and the batch-1 weight stream: the
    projections' bytes per GPU over the 1-token linear time (``achieved_gbs``), against the
    datasheet's."""
    cost = ProfileCost.from_dict(doc)
    tokens, lin = linear_part(doc)
    keep = tokens <= DECODE_MAX
    b, t = tokens[keep], lin[keep]
    m, dev, tp = cost.model, cost.device, cost.tp
    bstar = roofline.bstar(dev.peak(m.dtype), dev.bandwidth, m.bytes_per_param)
    lin1 = float(np.interp(1.0, tokens, lin))
    weights = m.layers * m.layer_matmul_params * m.bytes_per_param / tp
    achieved = weights / (lin1 / 1e3)
    bs = max(1, int(bstar))
    step1 = cost.step_time(StepWork(decode_rows=1, decode_ctx=ctx))
    step_bs = cost.step_time(StepWork(decode_rows=bs, decode_ctx=bs * ctx))
    return {
        "model": m.name,
        "device": dev.name,
        "tp": tp,
        "linear_ms": {n: float(np.interp(n, tokens, lin)) for n in QUOTED_TOKENS},
        "reach": {f: first_reaching(b, t, f) for f in FACTORS},
        "knee": {f: knee(b, t, f) for f in FACTORS},
        "bstar": bstar,
        "ratio_bstar": float(np.interp(bstar, tokens, lin)) / lin1,
        "bstar_floor": float(bs),
        "step_ms_1": step1 * 1e3,
        "step_ms_bstar": step_bs * 1e3,
        "step_ratio_bstar": step_bs / step1,
        "step_fits": bs * ctx <= cost.kv_capacity(),
        "ctx": float(ctx),
        "weights_gb": weights / 1e9,
        "achieved_gbs": achieved / 1e9,
        "datasheet_gbs": dev.bandwidth / 1e9,
        "bandwidth_fraction": achieved / dev.bandwidth,
    }


def chunk_numbers(doc: dict[str, Any], chunks: Sequence[int] = CHUNKS) -> dict[str, Any]:
    """The linear layers' cost per token of a prefill chunk (us) at each of ``chunks``, the
    cheapest per-token cost over every measured token count (``floor_us``, at
    ``floor_tokens``), each chunk's ratio to it, and the smallest measured chunk (>= the
    first of ``chunks``) within :data:`FILL_TOL` of it (``fill_chunk``; None if none)."""
    tokens, lin = linear_part(doc)
    per = lin / tokens * 1e3
    i = int(np.argmin(per))
    floor = float(per[i])
    within = tokens[(per <= FILL_TOL * floor) & (tokens >= min(chunks))]
    per_c = {int(c): float(np.interp(c, tokens, lin)) / c * 1e3 for c in chunks}
    return {
        "per_token_us": per_c,
        "ratio_floor": {c: v / floor for c, v in per_c.items()},
        "floor_us": floor,
        "floor_tokens": int(tokens[i]),
        "fill_chunk": int(within[0]) if len(within) else None,
    }


def chunk_curve(doc: dict[str, Any], lo: int = CURVE_MIN, hi: int = CURVE_MAX) -> dict[str, np.ndarray]:
    """The linear layers' per-token cost (us) of a prefill chunk at every measured token count
    from ``lo`` to ``hi`` (``tokens``, ``per_token_us``) and its ratio to the cheapest over the
    whole profile (``ratio_floor``, as :func:`chunk_numbers`' ``floor_us``): the page's figure."""
    tokens, lin = linear_part(doc)
    per = lin / tokens * 1e3
    keep = (tokens >= lo) & (tokens <= hi)
    if not keep.any():
        raise ValueError(f"lo={lo}, hi={hi}: no measured token count between them")
    return {"tokens": tokens[keep], "per_token_us": per[keep], "ratio_floor": per[keep] / float(per.min())}


def fill_verdict(numbers: dict[str, Any], chunk: int = 512) -> Claim:
    """The claim "a ``chunk``-token chunk fills the GPU" on :func:`chunk_numbers`: HOLDS when a
    token of it costs within :data:`FILL_TOL` of the cheapest per-token cost, PARTLY within
    :data:`FILL_PARTLY`, else DOES_NOT_HOLD."""
    r = numbers["ratio_floor"][chunk]
    if r <= FILL_TOL:
        return Claim.HOLDS
    return Claim.PARTLY if r <= FILL_PARTLY else Claim.DOES_NOT_HOLD


def gpu_numbers(profiles: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """:func:`decode_numbers` and :func:`chunk_numbers` (``chunks``) with the 512-token
    verdict (``fill``) and :func:`chunk_curve` (``chunk_curve``) for each GPU of
    :data:`BOOK_PROFILES`."""
    out: dict[str, dict[str, Any]] = {}
    for gpu, name in (profiles or BOOK_PROFILES).items():
        doc = load_gpu_profile(name)
        ch = chunk_numbers(doc)
        out[gpu] = {
            **decode_numbers(doc),
            "chunks": ch,
            "fill": fill_verdict(ch),
            "chunk_curve": chunk_curve(doc),
        }
    return out


def decode_curves(profiles: dict[str, str] | None = None) -> dict[str, dict[str, Any]]:
    """For each GPU of :data:`BOOK_PROFILES`: the measured linear part of a decode step
    against batch (``batch``, ``measured_ms``: Vidur's medians, one row per token count up to
    :data:`DECODE_MAX`) beside the roofline of the same part on the datasheet (``roofline_ms``
    = max(weight bytes / bandwidth, 2 FLOPs per weight per row / peak)), with B*, the knee
    (the last batch within :data:`~batching.book.why.KNEE_FACTOR` of batch 1), the measured
    and predicted ratios at B* (``ratio_bstar``, ``pred_ratio_bstar``) and the verdict on
    "extra rows are nearly free until B*" (:func:`~batching.book.why.flat_verdict`, the
    rule the live measurement is judged by)."""

    out: dict[str, dict[str, Any]] = {}
    for gpu, name in (profiles or BOOK_PROFILES).items():
        doc = load_gpu_profile(name)
        cost = ProfileCost.from_dict(doc)
        m, dev = cost.model, cost.device
        tokens, lin = linear_part(doc)
        keep = tokens <= DECODE_MAX
        b, t = tokens[keep], lin[keep]
        n = float(m.layers * m.layer_matmul_params) / cost.tp
        peak = dev.peak(m.dtype)
        roof = np.maximum(n * m.bytes_per_param / dev.bandwidth, 2.0 * n * b / peak) * 1e3
        bstar = roofline.bstar(peak, dev.bandwidth, m.bytes_per_param)
        nums = {
            "bstar": bstar,
            "knee": float(knee(b, t)),
            "ratio_bstar": float(np.interp(bstar, b, t) / t[0]),
            "pred_ratio_bstar": float(np.interp(bstar, b, roof) / roof[0]),
        }
        out[gpu] = {
            "model": m.name,
            "device": dev.name,
            "batch": b,
            "measured_ms": t,
            "roofline_ms": roof,
            **nums,
            "verdict": flat_verdict(nums),
        }
    return out


#: From the claim holding to its failing: the combined verdict of several GPUs is the weakest.
_STRENGTH = {Claim.HOLDS: 2, Claim.PARTLY: 1, Claim.DOES_NOT_HOLD: 0}


def weakest(verdicts: Sequence[Claim]) -> Claim:
    """The weakest of ``verdicts`` (HOLDS > PARTLY > DOES_NOT_HOLD): a claim holds on the
    measured GPUs only as far as it holds on each."""
    if not verdicts:
        raise ValueError("no verdicts to combine")
    return min(verdicts, key=lambda v: _STRENGTH[v])


def profile_records(directory: Path = GPU_PROFILE_DIR) -> list[dict[str, Any]]:
    """One record per derived GPU profile (sorted by file name): its GPU, model, tensor
    parallel degree, token range, the batch-1 weight stream's share of the datasheet
    bandwidth, the KV tokens that fit beside the weights, and its source file's sha256
    prefix, for the measured page's list."""
    out = []
    for path in sorted(directory.glob("*.json")):
        doc = load_gpu_profile(path)
        cost = ProfileCost.from_dict(doc, source=str(path))
        meta, tokens = doc["meta"], doc["parts"]["tokens"]
        out.append(
            {
                "file": path.name,
                "device": cost.device.name,
                "model": cost.model.name,
                "tp": cost.tp,
                "tokens_max": int(max(tokens)),
                "bandwidth_fraction": float(meta["bandwidth"]["achieved_fraction"]),
                "kv_tokens": int(cost.kv_capacity()),
                "sha256": meta["source"]["files"][0]["sha256"][:12],
            }
        )
    return out
