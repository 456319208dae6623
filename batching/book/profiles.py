"""The committed profiles (``data/profiles/*.json``, written by ``python -m batching measure``)
for the pages: loaded and summarized, their roofline, and the measured page's table."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import roofline
from ..costs.knee import knee
from ..costs.profile import PROFILE_DIR, ProfileCost
from ..costs.roofline import decode_curve
from .common import machine_label


def profile_roofline(profile: Mapping[str, Any], points: int = 60) -> dict[str, np.ndarray]:
    """The roofline of a :func:`load_profiles` entry at its ``ref_ctx``, from its own bandwidth
    and peak, no overhead."""
    bw, peak = profile["bandwidth_gbs"] * 1e9, profile["peak_tflops"] * 1e12
    return decode_curve(profile["shape"], profile["batch"], int(profile["ref_ctx"]), bw, peak, points=points)


def load_profiles(directory: str | Any = PROFILE_DIR, ctx: int = 128) -> list[dict[str, Any]]:
    """Every committed profile (``<directory>/*.json``, by name), validated through
    ``ProfileCost``: its decode grid (``ms[i, j]``: batch i at context j), model shape,
    bandwidth and peak (measured in the same run if the profile has them, else the registry's),
    B*, mixed steps, and ``ref_ms``, the column at ``ref_ctx``, the context nearest ``ctx``;
    ``machine``: the machine it was measured on, by name (``device`` is the registry entry,
    one for every CPU)."""
    out = []
    for path in sorted(Path(directory).glob("*.json")):
        data = json.loads(path.read_text())
        cost = ProfileCost.from_dict(data, source=str(path))
        meta, dev = data["meta"], data.get("device") or {}
        try:
            bw = float(dev["bandwidth"]["matvec"]["GBps_best"])
            peak = float(dev["matmul_peak"]["TFLOPs_best"])
        except (KeyError, TypeError):
            bw, peak = cost.device.bandwidth / 1e9, cost.device.peak(cost.model.dtype) / 1e12
        b, ms = cost.db, cost.ds * 1e3
        j = int(np.argmin(np.abs(np.log(np.maximum(cost.dc, 1.0) / max(ctx, 1)))))
        out.append(
            {
                "meta": meta,
                "device": cost.device.name,
                "machine": machine_label(meta),
                "batch": b,
                "ctxs": cost.dc,
                "ms": ms,
                "shape": cost.model,
                "bandwidth_gbs": bw,
                "peak_tflops": peak,
                "bstar": roofline.bstar(peak * 1e12, bw * 1e9, cost.model.bytes_per_param),
                "mixed": cost.mixed,
                "ref_ctx": float(cost.dc[j]),
                "ref_ms": ms[:, j],
            }
        )
    return out


def profile_rows(profiles: Sequence[Mapping[str, Any]]) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of the committed-profiles table: per profile and context, the batch-1
    step, the step at the largest batch, and the knee."""
    header = ["measured on", "model", "ctx", "B=1 ms", "largest B", "ms", "knee"]
    rows: list[list[Any]] = []
    for p in profiles:
        m = p["meta"]  # model, dtype and date are in the figure's legend
        for j, c in enumerate(p["ctxs"]):
            col = p["ms"][:, j]
            rows.append(
                [
                    p["machine"],
                    m["model"],
                    f"{c:.0f}",
                    f"{col[0]:.1f}",
                    f"{p['batch'][-1]:.0f}",
                    f"{col[-1]:.1f}",
                    f"{knee(p['batch'], col)}",
                ]
            )
    return rows, header
