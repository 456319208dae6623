"""The committed profiles (``data/profiles/*.json``, written by ``python -m batching measure``):
loaded and summarized for the pages (the why page's figure on the measured page, 7.3's
chunk sizes), their roofline, and the measured page's table. Numbers and table rows only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..profile import ProfileCost
from .common import ROOT
from .why import bstar_of, knee, roofline_curve

#: Where committed profiles live (data/README.md); every ``*.json`` there is shown.
PROFILE_DIR = ROOT / "data" / "profiles"


def profile_roofline(profile: Mapping[str, Any], points: int = 60) -> dict[str, np.ndarray]:
    """Why batching: the roofline of a :func:`load_profiles` entry at its ``ref_ctx``, from its
    own bandwidth and peak (or the registry's), no overhead; ``points`` as in
    :func:`~batching.book.why.roofline_curve`."""
    bw, peak = profile["bandwidth_gbs"] * 1e9, profile["peak_tflops"] * 1e12
    return roofline_curve(
        profile["shape"], profile["batch"], int(profile["ref_ctx"]), bw, peak, points=points
    )


def load_profiles(directory: str | Any = PROFILE_DIR, ctx: int = 128) -> list[dict[str, Any]]:
    """Why batching: every committed profile (``<directory>/*.json``, sorted by name),
    validated through ``ProfileCost`` and summarized for the page.

    Each entry: ``path``, ``meta``, ``label`` (model, dtype, device, date), ``gpu`` (not
    the CPU), ``device`` (registry name), ``batch``, ``ctxs``, ``ms`` (decode grid,
    ``ms[i, j]`` = batch i at context j), ``shape`` (the model in the profile's dtype),
    ``bandwidth_gbs``/``peak_tflops`` and ``roofs_from`` (the profile's own ``device``
    section if it has one, else the device registry's constants), ``bstar``; and at
    ``ref_ctx``, the profile's context nearest ``ctx``: ``ref_ms`` (the column), ``t1_ms``
    (batch 1), ``knee`` (:func:`~batching.book.why.knee`); ``mixed``: the measured mixed steps
    (``ProfileCost.mixed``, times in seconds; None if the profile has none).
    """
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        cost = ProfileCost.from_dict(data, source=str(path))
        meta, dev = data["meta"], data.get("device") or {}
        try:
            bw = float(dev["bandwidth"]["matvec"]["GBps_best"])
            peak = float(dev["matmul_peak"]["TFLOPs_best"])
            roofs = "bandwidth and peak measured in the same run"
        except (KeyError, TypeError):
            bw, peak = cost.device.bandwidth / 1e9, cost.device.peak(cost.model.dtype) / 1e12
            roofs = "the device registry's bandwidth and peak"
        where = meta.get("device_name") or cost.device.name
        label = (
            f"{meta['model']} ({cost.model.dtype}) on {where} [{cost.device.name}], "
            f"measured {meta['date'][:10]}"
        )
        b, ms = cost.db, cost.ds * 1e3
        j = int(np.argmin(np.abs(np.log(np.maximum(cost.dc, 1.0) / max(ctx, 1)))))
        col = ms[:, j]
        out.append(
            {
                "path": str(path),
                "meta": meta,
                "label": label,
                "gpu": cost.device.name != "cpu-here",
                "device": cost.device.name,
                "batch": b,
                "ctxs": cost.dc,
                "ms": ms,
                "shape": cost.model,
                "bandwidth_gbs": bw,
                "peak_tflops": peak,
                "roofs_from": roofs,
                "bstar": bstar_of(peak * 1e12, bw * 1e9, cost.model.bytes_per_param),
                "mixed": cost.mixed,
                "ref_ctx": float(cost.dc[j]),
                "ref_ms": col,
                "t1_ms": float(col[0]),
                "knee": float(knee(b, col)),
            }
        )
    return out


def profile_rows(profiles: Sequence[Mapping[str, Any]]) -> tuple[list[list[Any]], list[str]]:
    """Measured page: rows and header of the committed-profiles table (one row
    per profile and context: batch-1 step, step at the largest batch, knee)."""
    header = ["device", "model", "ctx", "B=1 ms", "largest B", "ms", "knee"]
    rows: list[list[Any]] = []
    for p in profiles:
        m = p["meta"]  # model, dtype and date are in the figure's legend
        for j, c in enumerate(p["ctxs"]):
            col = p["ms"][:, j]
            rows.append(
                [
                    p["device"],
                    m["model"],
                    f"{c:.0f}",
                    f"{col[0]:.1f}",
                    f"{p['batch'][-1]:.0f}",
                    f"{col[-1]:.1f}",
                    f"{knee(p['batch'], col)}",
                ]
            )
    return rows, header
