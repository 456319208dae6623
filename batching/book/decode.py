"""The live decode sweep (:func:`batching.real.sweep.decode_sweep`) as the why page and the
measured page read it: its own roofline, its numbers, and the measured page's tables."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from ..costs import roofline
from ..costs.knee import knee
from ..costs.models import ModelShape, get_model
from ..costs.roofline import decode_curve
from ..plan import StepWork


def sweep_shape(sweep: Mapping[str, Any]) -> ModelShape:
    """The model the sweep ran, in the dtype it ran."""
    return get_model(sweep["meta"]["model"]).with_dtype(sweep["meta"]["dtype"])


def live_roofline(sweep: Mapping[str, Any], points: int = 0) -> dict[str, np.ndarray]:
    """The roofline from the sweep's own matrix-vector bandwidth and matmul peak, no overhead
    (:func:`~batching.costs.roofline.decode_curve`, at the sweep's batches or ``points`` of them)."""
    bw, peak = sweep["matvec_gbs"] * 1e9, sweep["peak_tflops"] * 1e12
    return decode_curve(sweep_shape(sweep), sweep["batch"], sweep["ctx"], bw, peak, points=points)


def base_index(sweep: Mapping[str, Any]) -> int:
    """Index of the first swept batch that runs the kernel every larger batch runs: 1 where
    batch 1 ran the CPU's one-token kernel (``meta["linear_split"]``, :attr:`Llama.linear_form`)
    and a second batch was swept, else 0."""
    return 1 if sweep["meta"].get("linear_split") and len(sweep["batch"]) > 1 else 0


def live_numbers(sweep: Mapping[str, Any]) -> dict[str, float]:
    """The sweep's numbers (ms, GB/s): B* and the roofline (``pred*``) from its own bandwidth
    and peak, the uniform path at batch 1, at ``bstar_batch`` (the largest swept batch at or
    below B*) and at ``bmax``, and the bytes moved at batch 1 over the probes (``efficiency*``).

    On the kernels batching uses (:func:`base_index`): ``split`` (1.0 where batch 1 ran a
    kernel of its own), ``base_batch`` and its step ``base_ms``, ``test_batch`` (the largest
    swept batch at or below B*, at least the one after ``base_batch``), ``ratio_test`` and the
    roofline's ``pred_ratio_test`` (its step over ``base_batch``'s), ``knee_base`` (the knee
    counted from ``base_batch``); and the first step up, ``first_ratio`` (the second swept
    batch's step over batch 1's), ``pred_first_ratio`` and ``tps_first_ratio`` (its tokens/s
    over batch 1's). Each other path adds ``<path>_`` keys, ``<path>_gap_max`` being its step
    over the uniform one at ``bmax``."""
    shape = sweep_shape(sweep)
    b = np.asarray(sweep["batch"], dtype=float)
    if b[0] != 1:
        raise ValueError("the sweep must start at batch 1")
    u = np.asarray(sweep["uniform_ms"], dtype=float)
    roof = live_roofline(sweep)
    bw = sweep["matvec_gbs"] * 1e9
    peak = sweep["peak_tflops"] * 1e12
    bstar = roofline.bstar(peak, bw, shape.bytes_per_param)
    moved1 = shape.bytes_moved(StepWork.fresh((), 1, sweep["ctx"]))
    achieved = moved1 / (u[0] / 1e3)
    ib = int(np.flatnonzero(b <= max(bstar, 1.0))[-1])
    i0 = base_index(sweep)
    it = max(ib, min(i0 + 1, len(b) - 1))
    i1 = min(1, len(b) - 1)
    rt = roof["time_s"]
    out = {
        "weight_mb": shape.weight_read_bytes / 1e6,
        "ctx": float(sweep["ctx"]),
        "bmax": float(b[-1]),
        "matvec_gbs": float(sweep["matvec_gbs"]),
        "copy_gbs": float(sweep["copy_gbs"]),
        "read_gbs": float(sweep["read_gbs"]),
        "peak_gflops": float(sweep["peak_tflops"]) * 1e3,
        "bytes_per_param": float(shape.bytes_per_param),
        "bstar": bstar,
        "pred1_ms": float(roof["time_s"][0]) * 1e3,
        "t1_ms": float(u[0]),
        "over_pred": float(u[0] / (roof["time_s"][0] * 1e3)),
        "achieved_gbs": achieved / 1e9,
        "efficiency": achieved / bw,
        "efficiency_copy": achieved / (sweep["copy_gbs"] * 1e9),
        "knee": float(knee(b, u)),
        "bstar_batch": float(b[ib]),
        "ratio_bstar": float(u[ib] / u[0]),
        "pred_ratio_bstar": float(roof["time_s"][ib] / roof["time_s"][0]),
        "split": float(i0),
        "base_batch": float(b[i0]),
        "base_ms": float(u[i0]),
        "test_batch": float(b[it]),
        "ratio_test": float(u[it] / u[i0]),
        "pred_ratio_test": float(rt[it] / rt[i0]),
        "knee_base": float(knee(b[i0:], u[i0:])),
        "first_ratio": float(u[i1] / u[0]),
        "pred_first_ratio": float(rt[i1] / rt[0]),
        "tps_first_ratio": float(b[i1] * u[0] / u[i1]),
        "tmax_ms": float(u[-1]),
        "ratio_max": float(u[-1] / u[0]),
        "tps_max": float(b[-1] * 1e3 / u[-1]),
        "per_token_max_ms": float(u[-1] / b[-1]),
        "reps": float(sweep["meta"]["reps"]),
        "wall_s": float(sweep["meta"]["wall_s"]),
    }
    for path in sweep["paths"]:
        if path == "uniform":
            continue
        t = np.asarray(sweep[f"{path}_ms"], dtype=float)
        out.update(
            {
                f"{path}_t1_ms": float(t[0]),
                f"{path}_knee": float(knee(b, t)),
                f"{path}_tmax_ms": float(t[-1]),
                f"{path}_ratio_max": float(t[-1] / t[0]),
                f"{path}_tps_max": float(b[-1] * 1e3 / t[-1]),
                f"{path}_gap_max": float(t[-1] / u[-1]),
            }
        )
    return {k: float(v) for k, v in out.items()}


def first_step_rates(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Weight and KV bytes per second of the uniform step at batch 1 (``rate1_gbs``) and at
    the next swept batch ``next_batch`` (``rate_next_gbs``), and ``split``: 1.0 where batch 1
    ran the CPU's one-token kernel (``Llama.linear``), so the curve's first step up is partly
    a change of kernel."""
    b = [float(x) for x in sweep["batch"]]
    if len(b) < 2:
        raise ValueError(f"batches {b}: need two at least")
    shape, u = sweep_shape(sweep), np.asarray(sweep["uniform_ms"], dtype=float)
    rate = [
        shape.bytes_moved(StepWork.fresh((), int(r), sweep["ctx"])) / (u[i] / 1e3) / 1e9
        for i, r in enumerate(b[:2])
    ]
    return {
        "rate1_gbs": rate[0],
        "next_batch": b[1],
        "rate_next_gbs": rate[1],
        "split": float(bool(sweep["meta"].get("linear_split"))),
    }


def kernel_numbers(sweep: Mapping[str, Any]) -> dict[str, Any]:
    """How the sweep's linear layers ran (``meta.kernels``): ``dtype``, ``probed`` (the dtype
    was chosen by this machine's probe rather than asked for or fixed, as on a GPU), the
    chosen and the other dtype's probe cost (``gm_ms``, ``other``: fp32 for bf16 and the
    reverse, ``other_gm_ms``: ms per pass over the linear layers, geometric mean over the
    probe's row counts; None where not probed), and the paths
    of batch 1 and batch 2 (``path1``, ``path2``; ``rows1``: the rows batch 1 runs as)."""
    k = sweep["meta"].get("kernels") or {}
    gms = dict(k.get("geomean_ms") or {})
    dt = str(k.get("dtype") or sweep["meta"]["dtype"])
    other = {"fp32": "bf16", "bf16": "fp32"}.get(dt, "fp32")
    buckets = [tuple(b) for b in k.get("buckets") or []]

    def lookup(rows: int) -> tuple[str, int]:
        for top, path, run in buckets:
            if rows <= top:
                return str(path), max(rows, int(run))
        return (str(buckets[-1][1]), rows) if buckets else ("aten", rows)

    return {
        "dtype": dt,
        "probed": k.get("dtype_reason", "asked for") != "asked for" and other in gms,
        "gm_ms": gms.get(dt),
        "other": other,
        "other_gm_ms": gms.get(other),
        "path1": lookup(1)[0],
        "rows1": lookup(1)[1],
        "path2": lookup(2)[0],
    }


def dtype_rows(chosen: Mapping[str, Any], other: Mapping[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of the two dtypes' uniform decode steps side by side (ms, and each
    over its batch 1), at the batches both sweeps timed."""
    ca, oa = chosen["meta"]["dtype"], other["meta"]["dtype"]
    cb = [float(x) for x in chosen["batch"]]
    ob = {float(b): float(t) for b, t in zip(other["batch"], other["uniform_ms"])}
    c1, o1 = float(chosen["uniform_ms"][0]), float(other["uniform_ms"][0])
    rows: list[list[Any]] = [
        [f"{b:.0f}", f"{t:,.1f}", f"{t / c1:.2f}", f"{ob[b]:,.1f}", f"{ob[b] / o1:.2f}"]
        for b, t in zip(cb, (float(x) for x in chosen["uniform_ms"]))
        if b in ob
    ]
    return rows, ["batch", f"{ca} ms", f"{ca} x B=1", f"{oa} ms", f"{oa} x B=1"]


def gather_bytes(shape: ModelShape, rows: int, longest_ctx: int) -> float:
    """Bytes of K and V the gathered path copies in one decode step: every layer, each row's
    slab up to the longest context plus the new token."""
    return float(
        2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_bytes * (longest_ctx + 1) * rows
    )


def decode_reading(sweep: Mapping[str, Any]) -> str:
    """How the sweep's decode rows read their keys and values: ``graphs`` (CUDA graphs, every
    slab by their own rule), ``kernel`` (the CPU decode kernel: each row to its own length in
    its own slot, nothing masked or copied) or ``sdpa`` (SDPA: rows read to the longest
    context and masked, scattered slots gathered first). Sweeps from before the kernel
    recorded no ``decode_attention``: SDPA."""
    meta = sweep["meta"]
    if meta.get("device_type") == "cuda":
        return "graphs"
    return "kernel" if meta.get("decode_attention") == "kernel" else "sdpa"


def gather_numbers(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> dict[str, float]:
    """At the largest batch: the MB the gathered path copies (``copy_mb``), that copy's ms at
    the run's copy bandwidth, a read and a write per byte (``copy_ms``), and the gathered
    step's ms over the mixed one's (``extra_ms``). Empty where no gathered path was timed
    (CUDA graphs, the CPU decode kernel: :func:`decode_reading`)."""
    if "gathered_tmax_ms" not in numbers:
        return {}
    longest = round(sweep["ctx"] * 1.5)  # StepTimer.decode spreads contexts over ctx/2 .. 3ctx/2
    nbytes = gather_bytes(sweep_shape(sweep), int(numbers["bmax"]), longest)
    return {
        "copy_mb": nbytes / 1e6,
        "copy_ms": 2 * nbytes / (numbers["copy_gbs"] * 1e9) * 1e3,
        "extra_ms": numbers["gathered_tmax_ms"] - numbers["mixed_tmax_ms"],
    }


def path_rows(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of the per-path table: batch-1 step, knee, step and tokens/s at the
    largest batch, that step over batch 1 and over the uniform path's."""
    n, bmax = numbers, f"{numbers['bmax']:.0f}"
    header = ["path", "B=1 ms", "knee", f"B={bmax} ms", "x B=1", f"tokens/s at B={bmax}", "x uniform"]
    rows: list[list[Any]] = []
    for p in sweep["paths"]:
        pre = "" if p == "uniform" else f"{p}_"
        gap = 1.0 if p == "uniform" else n[f"{p}_gap_max"]
        rows.append(
            [
                p,
                f"{n[f'{pre}t1_ms']:,.1f}",
                f"{n[f'{pre}knee']:.0f}",
                f"{n[f'{pre}tmax_ms']:,.1f}",
                f"{n[f'{pre}ratio_max']:.1f}",
                f"{n[f'{pre}tps_max']:,.0f}",
                f"{gap:.2f}",
            ]
        )
    return rows, header


def probe_rows(
    numbers: Mapping[str, float], registry_gbs: float | None = None
) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of the probe table: each bandwidth the sweep measured (and the
    registry's, if given) with the B* it gives against the run's matmul peak."""
    peak, bpp = numbers["peak_gflops"] * 1e9, numbers["bytes_per_param"]
    probes = [
        ("matrix-vector product over the weight bytes", numbers["matvec_gbs"]),
        ("copy (read + write)", numbers["copy_gbs"]),
        ("sum (read)", numbers["read_gbs"]),
    ]
    if registry_gbs is not None:
        probes.append(
            (
                "device registry's matrix-vector figure (cpu-here, measured on a 2-vCPU AMD EPYC, Zen 3)",
                registry_gbs,
            )
        )
    rows: list[list[Any]] = [
        [name, f"{gbs:,.1f}", f"{roofline.bstar(peak, gbs * 1e9, bpp):,.1f}"] for name, gbs in probes
    ]
    return rows, ["bandwidth probe", "GB/s", "B* (this run's matmul peak)"]
