"""The live decode sweep: running it on the reader's device, its roofline, and the numbers
and labels the pages quote (the live figure of chapters/why.ipynb, whose verdict is
:func:`batching.book.why.flat_verdict`); and, for the "Decode on this device" section of
chapters/measured.ipynb, what the sweep knows beyond that figure: the rates of its first two
steps, the gathered path's copy, a table per path, and the device probes with the B* each
gives. The committed profiles are :mod:`batching.book.profiles`'.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from ..models import ModelShape
from ..results import load_average
from .common import step_work
from .why import bstar_of, knee, roofline_curve

# The sweep imports torch (the ``model`` extra) when called; everything else here is torch-free.

#: Live decode sweep defaults per device type: the model that tells the weight-streaming
#: story there, and the batch sizes. On the CPU, cpu-m (117M parameters, 469 MB in fp32)
#: is bandwidth-bound while cpu-s is dominated by per-step overhead
#: (shared/notes/cpu-decode-measurements.md); on a GPU, the 8B shape the prose derives.
LIVE_DEFAULTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "cpu": ("cpu-m", (1, 2, 4, 8, 16, 32, 64, 128)),
    "cuda": ("llama-8b", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
}


def live_defaults(
    device_type: str,
    model: str | None = None,
    batches: Sequence[int] | None = None,
    free_bytes: float | None = None,
) -> tuple[str, list[int]]:
    """Why batching: the model and batch sizes of the live sweep (``None`` = the device
    type's :data:`LIVE_DEFAULTS`). On a GPU with under 40 GB free, the default model is
    llama-1b instead of llama-8b (16 GB of weights plus the bandwidth probe's buffers)."""
    kind = "cuda" if device_type == "cuda" else "cpu"
    name, bs = LIVE_DEFAULTS[kind]
    if model is None and kind == "cuda" and free_bytes is not None and free_bytes < 40e9:
        name = "llama-1b"
    out = [int(b) for b in (bs if batches is None else batches)]
    if not out or out[0] != 1 or any(b2 <= b1 for b1, b2 in zip(out, out[1:])):
        raise ValueError(f"batches={out}: must start at 1 and increase")
    return (name if model is None else model), out


def decode_paths(graphs: bool = False) -> dict[str, dict[str, bool]]:
    """Why batching: the decode paths the live sweep times, as ``StepTimer.decode`` options.

    * ``uniform``: equal contexts, slots 0..B-1 (the slabs are read as one view): the pure
      weight-streaming step;
    * ``mixed``: contexts spread over ctx/2 .. 3ctx/2, slots 0..B-1 (measure's default, the
      schedulers' usual layout): attention reads every row's slab up to the longest
      context and masks the rest;
    * ``gathered``: the same mixed contexts in slots spread over twice the batch and more,
      as a batch has them once requests have come and gone out of order: the runner
      gathers (copies) the slabs in every layer before attention. Not with ``graphs``
      (CUDA graphs, ``batching/graphs.py``): a replayed step gathers or reads every slab
      by its own rule, whatever the slots, so a separate gathered timing would not differ
      from the mixed one by the gather.
    """
    paths: dict[str, dict[str, bool]] = {"uniform": {"uniform": True}, "mixed": {}}
    return paths if graphs else {**paths, "gathered": {"scattered": True}}


def live_decode_sweep(
    model: str | None = None,
    device: str = "auto",
    dtype: str | None = None,
    batches: Sequence[int] | None = None,
    ctx: int = 128,
    reps: int = 5,
    seed: int = 0,
    peak_n: int | None = None,
    bandwidth_bytes: int | None = None,
) -> dict[str, Any]:
    """Why batching: decode-step time against batch size, measured now on this device.

    Builds ``model`` (random weights) with a slab KV cache on ``device`` ("auto": CUDA if
    present, else the CPU; dtype fp32 on CPU, bf16 on CUDA unless given), measures the
    device's bandwidth (copy, read, matrix-vector over the model's weight bytes; capped at
    2 GiB on a GPU) and matmul peak in the same process, then times decode steps of every
    batch size at ``ctx`` KV tokens per row along the paths of :func:`decode_paths`, every
    path at one batch size before the next, so that drift hits the paths alike
    (``batching.real.measure.StepTimer.decode``).

    Returns ``meta`` (what, where, when), ``batch``, ``ctx``, ``paths``, ``<path>_ms``
    (medians) with ``<path>_p25_ms``/``<path>_p75_ms``, and ``matvec_gbs``, ``copy_gbs``,
    ``read_gbs`` (best of the bandwidth probe; copy counts read + write), ``peak_tflops``.
    """
    import datetime as dt
    import time

    import torch

    from ..models import get_model
    from ..real.executor import REGISTRY_DTYPE, resolve_dtype
    from ..real.hardware import available_bytes, device_entry, device_memory, measured_spec, resolve_device
    from ..real.measure import StepTimer, bandwidth, matmul_peak
    from ..real.measure import stats as time_stats
    from ..real.runner import SPAN_PER_ROW, ModelRunner

    dev = resolve_device(device)
    entry = device_entry(dev)  # any GPU: one the registry lacks gets its measured figures below
    free = float(available_bytes(dev) or 0) if dev.type == "cuda" else None
    name, bs = live_defaults(dev.type, model, batches, free)
    tdt = resolve_dtype(dtype, dev)
    if tdt not in REGISTRY_DTYPE:
        raise ValueError(f"dtype={dtype!r}: the live sweep runs in fp32 or bf16")
    shape = get_model(name).with_dtype(REGISTRY_DTYPE[tdt])
    if not (isinstance(ctx, int) and ctx >= 2 and ctx * 3 // 2 + 2 <= shape.max_context):
        raise ValueError(f"ctx={ctx!r}: must be an integer >= 2 with 1.5 x ctx inside {name}'s context")
    load0, t0 = load_average(), time.perf_counter()
    # The gathered path spreads the rows over more than SPAN_PER_ROW slots each, which is
    # what makes the eager runner copy their slabs (StepTimer.decode, scattered=True).
    paths = decode_paths(graphs=dev.type == "cuda")
    slots = SPAN_PER_ROW * max(bs) + 1 if "gathered" in paths else max(bs)
    runner = ModelRunner.from_shape(
        get_model(name), slots, device=dev, dtype=tdt, seed=seed, max_len=ctx * 3 // 2 + 2
    )
    runner.warmup()
    nbytes = bandwidth_bytes or (
        shape.weight_read_bytes if dev.type == "cpu" else min(shape.weight_read_bytes, 2 << 30)
    )
    bw = bandwidth(dev, tdt, nbytes)
    n = peak_n or (2048 if dev.type == "cpu" else 8192)
    peak = matmul_peak(dev, tdt, n)
    # Round-robin: each of the ``reps`` rounds times every (batch, path) once, right after
    # one untimed step of the same shape; a slow spell of a shared machine then spreads
    # over all points instead of bending one stretch of the curve.
    timer = StepTimer(runner, 1, warmup=1)
    samples: dict[tuple[str, int], list[float]] = {(p, b): [] for p in paths for b in bs}
    for _ in range(reps):
        for b in bs:
            for path, kwargs in paths.items():
                samples[(path, b)].append(timer.decode(b, ctx, **kwargs)["median_ms"] / 1e3)
    st = {key: time_stats(v) for key, v in samples.items()}
    stat = {"ms": "median_ms", "p25_ms": "p25_ms", "p75_ms": "p75_ms"}
    acc = {f"{p}_{k}": [st[(p, b)][s] for b in bs] for p in paths for k, s in stat.items()}
    meta = {
        "device": entry.name,
        "device_type": dev.type,
        "device_name": entry.device_name,
        "datasheet": entry.datasheet,
        "model": name,
        "dtype": shape.dtype,
        "params": float(shape.params),
        "weight_read_bytes": float(shape.weight_read_bytes),
        "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "reps": reps,
        "seed": seed,
        "bandwidth_bytes": float(nbytes),
        "peak_n": n,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "loadavg_before": load0,
        "loadavg_after": load_average(),
        "wall_s": time.perf_counter() - t0,
        "linear": runner.model.linear_form,
        "matvec_layout": bw["matvec"]["layout"],
        "decode_graphs": runner.graphs_info(),
        "attention": runner.attention_backends(),
    }
    if not entry.registered:  # a GPU the registry lacks: its figures are the ones measured here
        meta["device_spec"] = measured_spec(entry, bw, peak, shape.dtype, device_memory(dev) or 0.0)
    del runner, timer
    return {
        "meta": meta,
        "batch": np.asarray(bs, dtype=float),
        "ctx": int(ctx),
        "paths": list(paths),
        **{k: np.asarray(v) for k, v in acc.items()},
        "matvec_gbs": bw["matvec"]["GBps_best"],
        "copy_gbs": bw["copy"]["GBps_best"],
        "read_gbs": bw["read"]["GBps_best"],
        "peak_tflops": peak["TFLOPs_best"],
    }


def sweep_shape(sweep: Mapping[str, Any]) -> ModelShape:
    from ..models import get_model

    return get_model(sweep["meta"]["model"]).with_dtype(sweep["meta"]["dtype"])


def live_roofline(sweep: Mapping[str, Any], points: int = 0) -> dict[str, np.ndarray]:
    """Why batching: the roofline a live sweep predicts from the bandwidth (matrix-vector) and
    matmul peak it measured itself, no overhead (:func:`~batching.book.why.roofline_curve`, at
    the sweep's batch sizes or ``points`` of them)."""
    bw, peak = sweep["matvec_gbs"] * 1e9, sweep["peak_tflops"] * 1e12
    return roofline_curve(sweep_shape(sweep), sweep["batch"], sweep["ctx"], bw, peak, points=points)


def live_numbers(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Why batching: the numbers the pages quote from a :func:`live_decode_sweep`. B* and the
    roofline (``pred*``) come from the sweep's own matrix-vector bandwidth and matmul peak;
    ``bstar_batch`` is the largest swept batch at or below B*; each path other than uniform
    adds ``<path>_`` keys, ``<path>_gap_max`` being its step over the uniform one at ``bmax``."""
    shape = sweep_shape(sweep)
    b = np.asarray(sweep["batch"], dtype=float)
    if b[0] != 1:
        raise ValueError("the sweep must start at batch 1")
    u = np.asarray(sweep["uniform_ms"], dtype=float)
    roof = live_roofline(sweep)
    bw = sweep["matvec_gbs"] * 1e9
    peak = sweep["peak_tflops"] * 1e12
    bstar = bstar_of(peak, bw, shape.bytes_per_param)
    moved1 = shape.bytes_moved(step_work((), 1, sweep["ctx"]))
    achieved = moved1 / (u[0] / 1e3)
    ib = int(np.flatnonzero(b <= max(bstar, 1.0))[-1])
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
        "tmax_ms": float(u[-1]),
        "ratio_max": float(u[-1] / u[0]),
        "tps_max": float(b[-1] * 1e3 / u[-1]),
        "per_token_max_ms": float(u[-1] / b[-1]),
        "reps": float(sweep["meta"]["reps"]),
        "wall_s": float(sweep["meta"]["wall_s"]),
    }
    for path in sweep.get("paths", ["uniform"]):
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


# ------------------------------------------------------ the measured page's decode section


def first_step_rates(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Measured page: the weight-and-KV bytes per second of the uniform step at
    batch 1 (``rate1_gbs``) and at the sweep's next batch ``next_batch`` (``rate_next_gbs``),
    and ``split`` (1.0 where batch 1 ran the CPU's one-token kernel, each product split over
    the threads, ``Llama.linear``: the first step up of the curve is then partly a change of
    kernel). The sweep needs two batches at least."""
    from ..real.model import LINEAR_CPU

    b = [float(x) for x in sweep["batch"]]
    if len(b) < 2:
        raise ValueError(f"batches {b}: need two at least")
    shape, u = sweep_shape(sweep), np.asarray(sweep["uniform_ms"], dtype=float)
    rate = [
        shape.bytes_moved(step_work((), int(r), sweep["ctx"])) / (u[i] / 1e3) / 1e9
        for i, r in enumerate(b[:2])
    ]
    return {
        "rate1_gbs": rate[0],
        "next_batch": b[1],
        "rate_next_gbs": rate[1],
        "split": float(sweep["meta"].get("linear") == LINEAR_CPU),
    }


def gather_bytes(shape: ModelShape, rows: int, longest_ctx: int) -> float:
    """The gathered path: bytes of K and V the runner copies in one decode
    step, every layer, each row's slab up to the longest context plus the new token."""
    return float(
        2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_bytes * (longest_ctx + 1) * rows
    )


def gather_numbers(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> dict[str, float]:
    """Measured page: at the sweep's largest batch, the bytes the gathered path
    copies (``copy_mb``), the time that copy takes at the copy bandwidth of the same run,
    which counts a read and a write per byte (``copy_ms``), and how much longer the gathered
    step took than the mixed one (``extra_ms``; negative if shorter). Empty where the sweep
    timed no gathered path (CUDA graphs: :func:`decode_paths`)."""
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
    """Measured page: rows and header of the per-path table (batch-1 step,
    knee, step and tokens/s at the largest batch, that step over batch 1 and over the
    uniform path's)."""
    n, bmax = numbers, f"{numbers['bmax']:.0f}"
    header = ["path", "B=1 ms", "knee", f"B={bmax} ms", "x B=1", f"tokens/s at B={bmax}", "x uniform"]
    rows: list[list[Any]] = []
    for p in sweep.get("paths", ["uniform"]):
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
    """Measured page: rows and header of the device-probe table: each
    bandwidth the sweep measured (and the device registry's matrix-vector figure, if given)
    with the B* it gives against the same run's matmul peak (``numbers``: :func:`live_numbers`)."""
    peak, bpp = numbers["peak_gflops"] * 1e9, numbers["bytes_per_param"]
    probes = [
        ("matrix-vector product over the weight bytes", numbers["matvec_gbs"]),
        ("copy (read + write)", numbers["copy_gbs"]),
        ("sum (read)", numbers["read_gbs"]),
    ]
    if registry_gbs is not None:
        probes.append(("device registry's matrix-vector figure", registry_gbs))
    rows: list[list[Any]] = [
        [name, f"{gbs:,.1f}", f"{bstar_of(peak, gbs * 1e9, bpp):,.1f}"] for name, gbs in probes
    ]
    return rows, ["bandwidth probe", "GB/s", "B*"]
