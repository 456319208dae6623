"""Why batching carries the load (chapters/why.ipynb): the roofline of a decode step, the live
decode sweep on the reader's device, and the committed profiles beside it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import MEM_RESERVE, RooflineCost
from ..models import ModelShape
from .common import roofline_numbers

# ------------------------------------------------------------------ why batching
# "Why batching carries the load" (chapters/why.ipynb): one decode step streams every
# weight, so extra rows are nearly free until compute binds at B*. The roofline functions
# are torch-free; the live measurement imports torch (the ``model`` extra) when called.

#: Live decode sweep defaults per device type: the model that tells the weight-streaming
#: story there, and the batch sizes. On the CPU, cpu-m (117M parameters, 469 MB in fp32)
#: is bandwidth-bound while cpu-s is dominated by per-step overhead
#: (shared/notes/cpu-decode-measurements.md); on a GPU, the 8B shape the prose derives.
LIVE_DEFAULTS: dict[str, tuple[str, tuple[int, ...]]] = {
    "cpu": ("cpu-m", (1, 2, 4, 8, 16, 32, 64, 128)),
    "cuda": ("llama-8b", (1, 2, 4, 8, 16, 32, 64, 128, 256)),
}
#: Where committed profiles live (data/README.md); every ``*.json`` there is shown.
PROFILE_DIR = "data/profiles"


def bstar_of(peak_flops: float, bandwidth: float, bytes_per_param: float) -> float:
    """Why batching: B* = peak x bytes per weight / (2 x bandwidth), the batch at which a
    decode step's 2 FLOPs per weight per row take as long as streaming the weights once."""
    if not (peak_flops > 0 and bandwidth > 0 and bytes_per_param > 0):
        raise ValueError(f"peak={peak_flops}, bandwidth={bandwidth}, bytes={bytes_per_param}: must be > 0")
    return float(peak_flops * bytes_per_param / (2.0 * bandwidth))


def knee(batch: Sequence[float], times: Sequence[float], factor: float) -> int:
    """Why batching: the largest batch up to which the step time *stays* within ``factor``
    times the first batch's (the first point above it ends the run; later points that dip
    back under do not count). ``batch`` must be increasing; ``factor`` >= 1."""
    b, t = np.asarray(batch, dtype=float), np.asarray(times, dtype=float)
    if b.ndim != 1 or b.shape != t.shape or len(b) == 0:
        raise ValueError(f"batch {b.shape} and times {t.shape}: need two 1-d arrays of the same length")
    if np.any(np.diff(b) <= 0) or not np.all(np.isfinite(t)) or np.any(t <= 0):
        raise ValueError("batch must be increasing and times finite and > 0")
    if factor < 1:
        raise ValueError(f"factor={factor}: must be >= 1")
    ok = t <= factor * t[0]
    n = len(ok) if ok.all() else int(np.argmin(ok))
    return int(b[n - 1])


def roofline_curve(
    shape: ModelShape,
    batches: Sequence[float],
    ctx: int,
    bandwidth: float,
    peak_flops: float,
    overhead_s: float = 0.0,
) -> dict[str, np.ndarray]:
    """Why batching: the roofline of one decode step of ``b`` rows, each holding ``ctx``
    KV tokens, for every ``b`` in ``batches``.

    Arrays: ``batch``; ``weights_s`` (weight bytes streamed / bandwidth, the same at every
    batch); ``memory_s`` (weights + KV read and written, ``ModelShape.bytes_arrays``, over
    bandwidth); ``compute_s`` (``ModelShape.flops_arrays`` over peak); ``time_s`` =
    max(memory, compute) + ``overhead_s`` (what ``RooflineCost.decode_step`` returns for a
    single device); ``tokens_per_s`` = batch / time; ``bound`` (1 where compute binds).
    """
    b = np.asarray(batches, dtype=np.float64)
    z = np.zeros_like(b)
    mem = shape.bytes_arrays(z, z, b, b * float(ctx)) / bandwidth
    cmp = shape.flops_arrays(z, z, b, b * float(ctx)) / peak_flops
    t = np.maximum(mem, cmp) + overhead_s
    return {
        "batch": b,
        "weights_s": np.full_like(b, shape.weight_read_bytes / bandwidth),
        "memory_s": mem,
        "compute_s": cmp,
        "time_s": t,
        "tokens_per_s": b / t,
        "bound": (cmp > mem).astype(float),
    }


def stream_numbers(
    cost: RooflineCost, ctx: int = 1, long_ctx: int = 2048, long_batch: int = 128
) -> dict[str, float]:
    """Why batching: the batch-1 derivation for a roofline cost model (one device).

    :func:`roofline_numbers`, plus ``bandwidth_gbs``, ``peak_gflops``, ``weight_read_mb``,
    ``stream_ms`` (weight bytes / bandwidth: the step's floor), ``step_ms`` (the cost
    model's batch-1 step at ``ctx`` KV tokens, overhead included), ``overhead_ms``,
    ``tokens_s`` (1 / step), ``bytes_per_param``, ``ctx``; at B* (rounded down):
    ``bstar_floor``, ``step_bstar_ms`` and ``tokens_s_bstar``; and for ``long_batch`` rows
    of ``long_ctx`` tokens: ``kv_long_gb`` (KV bytes the step reads), ``kv_long_ratio``
    (over the weights), ``tokens_s_long`` and ``long_fit`` (rows of ``long_ctx`` tokens
    whose KV fits the device after the weights, in the ``mem_usable`` fraction of its
    ``mem_gb`` that the cost model counts: all but ``mem_reserve``,
    :data:`~batching.costs.MEM_RESERVE`). For each other bandwidth reference in the device's
    notes (``<name>_bandwidth``, e.g. the CPU's copy and sum): ``<name>_gbs`` and
    ``bstar_<name>``.
    """
    if cost.tp != 1:
        raise ValueError("stream_numbers is the single-device derivation: tp must be 1")
    m = cost.model
    out = roofline_numbers(cost)
    bs = max(1, int(cost.bstar()))
    step = cost.decode_step(1, ctx)
    kv_long = long_batch * long_ctx * m.kv_bytes_per_token
    out.update(
        bandwidth_gbs=cost.bandwidth / 1e9,
        peak_gflops=cost.peak_flops / 1e9,
        weight_read_mb=m.weight_read_bytes / 1e6,
        stream_ms=m.weight_read_bytes / cost.bandwidth * 1e3,
        step_ms=step * 1e3,
        overhead_ms=cost.device.step_overhead_s * 1e3,
        tokens_s=1.0 / step,
        bytes_per_param=float(m.bytes_per_param),
        ctx=float(ctx),
        bstar_floor=float(bs),
        step_bstar_ms=cost.decode_step(bs, ctx) * 1e3,
        tokens_s_bstar=bs / cost.decode_step(bs, ctx),
        long_ctx=float(long_ctx),
        long_batch=float(long_batch),
        kv_long_gb=kv_long / 1e9,
        kv_long_ratio=kv_long / m.weight_read_bytes,
        tokens_s_long=long_batch / cost.decode_step(long_batch, long_ctx),
        long_fit=float(cost.kv_capacity() // long_ctx),
        mem_reserve=MEM_RESERVE,
        mem_usable=1 - MEM_RESERVE,
        mem_gb=cost.device.mem_bytes / 1e9,
    )
    for name, bw in cost.device.notes.items():  # other bandwidth references (cpu-here: copy, sum)
        if name.endswith("_bandwidth"):
            out[f"bstar_{name[: -len('_bandwidth')]}"] = bstar_of(cost.peak_flops, bw, m.bytes_per_param)
            out[f"{name[: -len('_bandwidth')]}_gbs"] = bw / 1e9
    return out


def bstar_answer_text(a: Mapping[str, float], b: Mapping[str, float], name_a: str, name_b: str) -> str:
    """Why batching, exercise on B*: which of two devices (:func:`stream_numbers` of each)
    needs the larger batch before decode turns compute-bound, and why: B* is compute per
    byte of bandwidth, so the device whose peak grew more than its bandwidth has the larger."""
    big, small = (b, a) if b["bstar"] >= a["bstar"] else (a, b)
    nb, ns = (name_b, name_a) if big is b else (name_a, name_b)
    peak, bw = big["peak_tflops"] / small["peak_tflops"], big["bandwidth_tbs"] / small["bandwidth_tbs"]
    if a["bytes_per_param"] != 2 or b["bytes_per_param"] != 2:
        raise ValueError(
            "bstar_answer_text reads B* as peak / bandwidth: both models must be 2 bytes per weight"
        )
    return (
        f"The {nb}: B* = peak / bandwidth in bf16, {ns} {small['peak_tflops']:,.0f} / "
        f"{small['bandwidth_tbs']:.2f} = {small['bstar']:.0f}, {nb} {big['peak_tflops']:,.0f} / "
        f"{big['bandwidth_tbs']:.2f} = {big['bstar']:.0f}. The {nb} has {peak:.1f} times the {ns}'s compute "
        f"but only {bw:.1f} times its bandwidth: more arithmetic for every byte it streams, so it takes "
        f"more rows per weight read to keep that arithmetic busy."
    )


def gpu_rooflines(
    model: str = "llama-8b",
    devices: Sequence[str] = ("h100", "h200"),
    batches: Sequence[int] = tuple(2**i for i in range(11)),
    ctxs: Sequence[int] = (128, 2048),
) -> dict[str, Any]:
    """Why batching: roofline predictions (datasheet constants, not measurements) of a
    decode step for ``model`` on each device, at each context per row.

    Returns ``{"model", "dtype", "devices": {device name: {"bstar", "kv_capacity",
    "ctx": {ctx: roofline_curve(...) + "fits"}}}}``; ``fits`` is 1 where batch x ctx KV
    tokens fit the device's KV capacity (``RooflineCost.kv_capacity``).
    """
    from ..costs import get_cost_model

    out: dict[str, Any] = {"model": model, "devices": {}}
    for dev in devices:
        cost = get_cost_model(model, dev)
        out["dtype"] = cost.model.dtype
        per: dict[int, dict[str, np.ndarray]] = {}
        for c in ctxs:
            cur = roofline_curve(
                cost.model, batches, c, cost.bandwidth, cost.peak_flops, cost.device.step_overhead_s
            )
            cur["fits"] = (cur["batch"] * c <= cost.kv_capacity()).astype(float)
            per[int(c)] = cur
        out["devices"][cost.device.name] = {
            "bstar": float(cost.bstar()),
            "kv_capacity": float(cost.kv_capacity()),
            "ctx": per,
        }
    return out


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
    batch size at ``ctx`` KV tokens per row, every path at one batch size before the next,
    so that drift hits the paths alike (``batching.measure.StepTimer.decode``), along

    the paths of :func:`decode_paths` (uniform, mixed, and on the CPU gathered).

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
    from ..real.measure import StepTimer, bandwidth, load_average, matmul_peak
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
    # what makes the eager runner copy their slabs (StepTimer.decode, scattered=True). CUDA
    # steps replay graphs, which read the slabs of slots 0 .. up to the bucket whatever the
    # slots are (graphs.py): there is no gathered path to time.
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
    acc: dict[str, list[float]] = {f"{p}_{s}": [] for p in paths for s in ("ms", "p25_ms", "p75_ms")}
    for path in paths:
        for b in bs:
            st = time_stats(samples[(path, b)])
            acc[f"{path}_ms"].append(st["median_ms"])
            acc[f"{path}_p25_ms"].append(st["p25_ms"])
            acc[f"{path}_p75_ms"].append(st["p75_ms"])
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


def _sweep_shape(sweep: Mapping[str, Any]) -> ModelShape:
    from ..models import get_model

    return get_model(sweep["meta"]["model"]).with_dtype(sweep["meta"]["dtype"])


def _dense(batches: Sequence[float], points: int) -> np.ndarray:
    b = np.asarray(batches, dtype=float)
    return np.geomspace(b[0], b[-1], points) if points > 1 else b


def live_roofline(sweep: Mapping[str, Any], points: int = 0) -> dict[str, np.ndarray]:
    """Why batching: the roofline a live sweep predicts from the bandwidth (matrix-vector)
    and matmul peak it measured itself, no overhead (:func:`roofline_curve`), at the
    sweep's batch sizes, or at ``points`` batch sizes spread evenly in log between them."""
    return roofline_curve(
        _sweep_shape(sweep),
        _dense(sweep["batch"], points),
        sweep["ctx"],
        sweep["matvec_gbs"] * 1e9,
        sweep["peak_tflops"] * 1e12,
    )


def profile_roofline(profile: Mapping[str, Any], points: int = 60) -> dict[str, np.ndarray]:
    """Why batching: the roofline of a :func:`load_profiles` entry at its ``ref_ctx``, from
    its own bandwidth and peak (or the registry's), no overhead; ``points`` as in
    :func:`live_roofline`."""
    return roofline_curve(
        profile["shape"],
        _dense(profile["batch"], points),
        int(profile["ref_ctx"]),
        profile["bandwidth_gbs"] * 1e9,
        profile["peak_tflops"] * 1e12,
    )


def live_numbers(sweep: Mapping[str, Any]) -> dict[str, float]:
    """Why batching: the numbers the prose quotes from a :func:`live_decode_sweep`.

    Sizes: ``params_m``, ``weight_mb`` (streamed per step), ``kv_kb_per_token``, ``ctx``,
    ``bmax``. Device, same run: ``matvec_gbs``, ``copy_gbs``, ``read_gbs``, ``peak_gflops``,
    ``bstar`` (:func:`bstar_of` on matvec bandwidth and peak). Batch 1 (uniform path):
    ``stream_ms`` (weights / matvec bandwidth), ``pred1_ms`` (roofline, KV included),
    ``t1_ms`` measured, ``over_pred`` (measured / predicted), ``achieved_gbs`` ((weight +
    KV bytes) / step time), ``efficiency`` (achieved / matvec bandwidth),
    ``efficiency_copy`` (achieved / copy bandwidth). Uniform path: ``knee125``, ``knee2``
    (:func:`knee`), at the largest batch ``tmax_ms``, ``ratio_max`` (over batch 1),
    ``tps1``, ``tps_max``, ``tps_gain`` (tokens/s and their ratio), ``per_token_max_ms``;
    ``pred_max_ms`` (roofline at the largest batch); ``reps``, ``threads``, ``wall_s``
    from the sweep's meta. Every other measured path ``p``
    (``gathered``, ``mixed``): ``p_t1_ms``, ``p_knee125``, ``p_knee2``, ``p_tmax_ms``,
    ``p_ratio_max``, ``p_tps_max`` and ``p_gap_max`` (its step over the uniform one at the
    largest batch).
    """
    from ..plan import StepWork

    shape = _sweep_shape(sweep)
    b = np.asarray(sweep["batch"], dtype=float)
    if b[0] != 1:
        raise ValueError("the sweep must start at batch 1")
    u = np.asarray(sweep["uniform_ms"], dtype=float)
    roof = live_roofline(sweep)
    bw = sweep["matvec_gbs"] * 1e9
    moved1 = shape.bytes_moved(StepWork(decode_rows=1, decode_ctx=sweep["ctx"]))
    achieved = moved1 / (u[0] / 1e3)
    out = {
        "params_m": shape.params / 1e6,
        "weight_mb": shape.weight_read_bytes / 1e6,
        "kv_kb_per_token": shape.kv_bytes_per_token / 1e3,
        "ctx": float(sweep["ctx"]),
        "bmax": float(b[-1]),
        "matvec_gbs": float(sweep["matvec_gbs"]),
        "copy_gbs": float(sweep["copy_gbs"]),
        "read_gbs": float(sweep["read_gbs"]),
        "peak_gflops": float(sweep["peak_tflops"]) * 1e3,
        "bstar": bstar_of(sweep["peak_tflops"] * 1e12, bw, shape.bytes_per_param),
        "stream_ms": shape.weight_read_bytes / bw * 1e3,
        "pred1_ms": float(roof["time_s"][0]) * 1e3,
        "t1_ms": float(u[0]),
        "over_pred": float(u[0] / (roof["time_s"][0] * 1e3)),
        "achieved_gbs": achieved / 1e9,
        "efficiency": achieved / bw,
        "efficiency_copy": achieved / (sweep["copy_gbs"] * 1e9),
        "knee125": float(knee(b, u, 1.25)),
        "knee2": float(knee(b, u, 2.0)),
        "tmax_ms": float(u[-1]),
        "ratio_max": float(u[-1] / u[0]),
        "pred_max_ms": float(roof["time_s"][-1]) * 1e3,
        "tps1": float(1e3 / u[0]),
        "tps_max": float(b[-1] * 1e3 / u[-1]),
        "tps_gain": float(b[-1] * u[0] / u[-1]),
        "per_token_max_ms": float(u[-1] / b[-1]),
        "reps": float(sweep["meta"]["reps"]),
        "threads": float(sweep["meta"]["threads"]),
        "wall_s": float(sweep["meta"]["wall_s"]),
    }
    for path in sweep.get("paths", ["uniform"]):
        if path == "uniform":
            continue
        t = np.asarray(sweep[f"{path}_ms"], dtype=float)
        out.update(
            {
                f"{path}_t1_ms": float(t[0]),
                f"{path}_knee125": float(knee(b, t, 1.25)),
                f"{path}_knee2": float(knee(b, t, 2.0)),
                f"{path}_tmax_ms": float(t[-1]),
                f"{path}_ratio_max": float(t[-1] / t[0]),
                f"{path}_tps_max": float(b[-1] * 1e3 / t[-1]),
                f"{path}_gap_max": float(t[-1] / u[-1]),
            }
        )
    return {k: float(v) for k, v in out.items()}


def batch1_kernel_text(sweep: Mapping[str, Any]) -> str:
    """Why batching, measured: on a CPU model one-token steps run a kernel of their own
    (``Llama.linear`` splits each product over the threads), so the step from batch 1 to
    batch 2 is partly a change of kernel; this says so with the weight-read rates of both
    batches from the sweep's uniform path (empty where batch 1 uses no such kernel, or the
    sweep has no batch 2)."""
    from ..plan import StepWork
    from ..real.model import LINEAR_CPU

    b = [float(x) for x in sweep["batch"]]
    if sweep["meta"].get("linear") != LINEAR_CPU or 2.0 not in b:
        return ""
    shape, u = _sweep_shape(sweep), np.asarray(sweep["uniform_ms"], dtype=float)
    rate = [
        shape.bytes_moved(StepWork(decode_rows=r, decode_ctx=r * sweep["ctx"])) / (u[b.index(r)] / 1e3) / 1e9
        for r in (1.0, 2.0)
    ]
    return (
        f"On a CPU the one-token step runs a kernel of its own: each weight product is split over the "
        f"{sweep['meta']['threads']} threads, one piece of the input per core (`Llama.linear`), while with "
        f"two rows and more MKL's kernel streams each matrix from one core. Batch 1 reads its weights and KV "
        f"at {rate[0]:.1f} GB/s, batch 2 at {rate[1]:.1f}: part of the first step up in the curve is that "
        "change of kernel, not arithmetic."
    )


def _relation(x: float, ref: float, tol: float = 0.25) -> str:
    """'below', 'above' or 'close to': how ``x`` sits against ``ref`` (within ``tol``)."""
    if abs(x - ref) <= tol * ref:
        return "close to"
    return "below" if x < ref else "above"


def live_text(sweep: Mapping[str, Any]) -> str:
    """Why batching: one paragraph (MyST) saying what the live measurement ran on, for the
    prose; it names the device the build found and never claims another."""
    m = sweep["meta"]
    what = (
        f"{m['model']} ({m['params'] / 1e6:,.1f}M parameters, {m['dtype']} weights and KV cache, "
        f"random weights)"
    )
    if m["device_type"] == "cuda":
        where = f"the GPU this page was built on, {m['device_name']}"
        note = "This build found a GPU, so the live curves below are GPU measurements."
    else:
        where = f"this page's build machine, a CPU ({m['device_name']}, {m['threads']} threads)"
        note = (
            "No GPU was present when this page was built, so the live curves below are CPU "
            "measurements; the GPU numbers on this page are roofline predictions."
        )
    return (
        f"The measurement below ran {what} on {where}, torch {m['torch']}, on {m['date'][:10]}: "
        f"{sweep['ctx']} KV tokens per row, median of {m['reps']} timed steps per point, "
        f"{m['wall_s']:.0f} s in all (load average {m['loadavg_before']:.2f} before, "
        f"{m['loadavg_after']:.2f} after). {note}"
    )


def live_labels(sweep: Mapping[str, Any]) -> dict[str, str]:
    """Why batching: caption strings of a live sweep: ``what`` (model, size, dtype),
    ``where`` (device name, registry name, threads on a CPU), ``kind`` ("CPU" or "GPU"),
    ``paths`` (the measured paths and how the figure draws them)."""
    m = sweep["meta"]
    gpu = m["device_type"] == "cuda"
    where = f"{m['device_name']} [{m['device']}]" + ("" if gpu else f", {m['threads']} threads")
    # The names of the prose's three paths and of the figure's legend (plots.PATH_LABELS).
    names = {
        "uniform": "uniform (green circles): equal contexts in contiguous slots",
        "mixed": "mixed (blue triangles): mixed contexts in contiguous slots",
        "gathered": "gathered (brown squares): mixed contexts in scattered slots, their slabs gathered",
    }
    paths = "; ".join(names[p] for p in sweep.get("paths", ["uniform"]))
    return {
        "what": f"{m['model']} ({m['params'] / 1e6:,.1f}M parameters, {m['dtype']})",
        "where": where,
        "kind": "GPU" if gpu else "CPU",
        "paths": paths,
    }


def knee_text(numbers: Mapping[str, float]) -> str:
    """Why batching: how the measured knees sit against B* (a sentence for the prose).

    A knee at batch 1 means that no larger batch stayed within the factor: said so, not
    as "up to batch 1"."""
    n = numbers
    k125, k2 = n["knee125"], n["knee2"]
    rel = (
        f"{_relation(k2, n['bstar'])} the B* of {n['bstar']:.1f} that this run's own bandwidth and peak give"
    )
    if k125 > 1:
        return (
            f"The uniform step stays within 1.25x of batch 1 up to batch {k125:.0f} and within 2x up to "
            f"batch {k2:.0f}, {rel}."
        )
    if k2 > 1:
        return (
            f"No batch above 1 keeps the uniform step within 1.25x of batch 1; within 2x it stays up to "
            f"batch {k2:.0f}, {rel}."
        )
    return f"No batch above 1 keeps the uniform step within 1.25x of batch 1, nor within 2x: {rel}."


def _cost_phrase(gap: float, tol: float = 0.05) -> str:
    """How a step time ``gap`` times the uniform one reads: 'x% more', 'the same within x%', 'x% less'."""
    if abs(gap - 1.0) <= tol:
        return f"the same within {tol:.0%}"
    return f"{abs(gap - 1.0):.0%} {'more' if gap > 1 else 'less'}"


def slab_cost_text(numbers: Mapping[str, float], tol: float = 0.05) -> str:
    """Why batching, "What the slab layout costs": what the mixed and gathered paths measured
    against the uniform one at the largest batch (``live_numbers``' ``*_gap_max``), and only
    the effects the measurement shows: a path within ``tol`` of the uniform step is said to
    cost nothing measurable here, one below it to be no slower. A sweep without a gathered
    path (CUDA graphs: :func:`decode_paths`) says why it has none."""
    n, b = numbers, f"{numbers['bmax']:.0f}"
    m, g = n["mixed_gap_max"], n.get("gathered_gap_max")
    out = [
        f"At batch {b} the mixed step takes {m:.2f} times the uniform one ({_cost_phrase(m, tol)})"
        + (f" and the gathered step {g:.2f} times ({_cost_phrase(g, tol)})." if g is not None else ".")
    ]
    if m > 1 + tol:
        out.append(
            "The mixed step reads, in every row, KV positions up to the batch's longest context and "
            "masks those a shorter row does not hold; that reading shows in its time."
        )
    else:
        out.append(
            "The mixed step reads, in every row, KV positions up to the batch's longest context and "
            "masks those a shorter row does not hold, but here that reading does not show in the step "
            "time."
        )
    if g is None:
        out.append(
            "This build replays its decode steps as CUDA graphs, which gather the slabs of a small "
            "batch and read every slab of a large one by their own rule (`batching/graphs.py`), "
            "whatever the slots: no separate gathered path was timed."
        )
    elif g > max(m, 1.0) + tol:
        out.append(
            f"The gathered step differs from the mixed one only in copying the keys and values of every "
            f"row in every layer before reading them, and it takes {g / m - 1:.0%} longer: a copy that "
            f"grows with batch times context, in the regime where batching should be nearly free."
        )
    else:
        out.append(
            "The gathered step differs from the mixed one only in copying the keys and values of every "
            "row in every layer before reading them; at this batch and context the copy does not show "
            "in the step time."
        )
    out.append(
        "Both are costs of giving each sequence one contiguous slab: a paged KV cache whose attention "
        "reads each sequence's blocks in place, and only up to its own length, does neither."
    )
    return " ".join(out)


def slab_cost_takeaway(numbers: Mapping[str, float], tol: float = 0.05) -> str:
    """Why batching: the takeaway's sentence on the slab layout, from the same measurement
    as :func:`slab_cost_text`."""
    n, b = numbers, f"{numbers['bmax']:.0f}"
    shown = [
        f"{name} {n[key]:.2f}x"
        for name, key in (("mixed contexts", "mixed_gap_max"), ("gathered slabs", "gathered_gap_max"))
        if key in n and n[key] > 1 + tol
    ]
    if not shown:
        return (
            f"At batch {b} the slab KV layout's extra reading and copying did not show in the step time "
            f"(within {tol:.0%} of the uniform step)."
        )
    return f"The slab KV layout's extra work shows at batch {b}: {' and '.join(shown)} the uniform step."


def gather_bytes(shape: ModelShape, rows: int, longest_ctx: int) -> float:
    """Why batching, exercise on the gathered path: bytes of K and V the runner copies in one
    decode step, every layer, each row's slab up to the longest context plus the new token."""
    return float(
        2 * shape.layers * shape.kv_heads * shape.head_dim * shape.kv_bytes * (longest_ctx + 1) * rows
    )


def gather_answer_text(sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> str:
    """Why batching: what this build measured for the gathered path against the mixed one
    at its largest batch, beside the time the copy takes at the copy bandwidth measured in
    the same run (a read and a write per byte), for the exercise's answer; where the step
    took longer than that copy, how much of the extra time the copy's bytes explain. The
    rest is only said not to be those bytes: the sweep times whole steps, so it cannot say
    what the rest is."""
    n, shape = numbers, _sweep_shape(sweep)
    rows = int(n["bmax"])
    if "gathered_tmax_ms" not in n:
        return (
            f"This build ran {shape.name} with CUDA graphs, which gather or read slabs by their own rule, "
            f"so it timed no separate gathered path."
        )
    longest = round(sweep["ctx"] * 1.5)  # StepTimer.decode spreads contexts over ctx/2 .. 3ctx/2
    nbytes = gather_bytes(shape, rows, longest)
    copy_ms = 2 * nbytes / (n["copy_gbs"] * 1e9) * 1e3
    extra = n["gathered_tmax_ms"] - n["mixed_tmax_ms"]
    what = (
        f"This build measured {shape.name} at batch {rows}: its gathered step copies "
        f"{nbytes / 1e6:,.0f} MB, which at the {n['copy_gbs']:,.1f} GB/s a copy moved in the same run "
        f"takes {copy_ms:,.1f} ms, "
    )
    if extra <= 0:
        return what + f"yet the step took no longer than the mixed one ({-extra:,.1f} ms less)."
    what += f"and the step took {extra:,.1f} ms longer than the mixed one"
    if copy_ms >= extra:
        return what + ": the copy's bytes are enough to account for all of it."
    return what + (
        f": the copy's bytes, at that bandwidth, explain {copy_ms / extra:.0%} of the extra time. "
        f"The other {extra - copy_ms:,.1f} ms is more than moving those bytes would take; a sweep "
        f"that times whole steps cannot say where it goes."
    )


def profile_stream(profile: Mapping[str, Any]) -> dict[str, float]:
    """Why batching, "Every device measured so far": how much of a :func:`load_profiles`
    entry's batch-1 step (at ``ref_ctx``) streams weights: ``weight_mb``, ``ctx``, ``t1_ms``,
    ``params_m``, ``bandwidth_gbs`` (the profile's own matrix-vector probe, or the registry's),
    ``stream_ms`` (weights / bandwidth), ``stream_fraction`` (of the step), ``achieved_gbs``
    ((weight + KV bytes) / step) and ``efficiency`` (achieved / bandwidth)."""
    from ..plan import StepWork

    shape, ctx, t1 = profile["shape"], float(profile["ref_ctx"]), float(profile["t1_ms"])
    bw = float(profile["bandwidth_gbs"]) * 1e9
    moved = shape.bytes_moved(StepWork(decode_rows=1, decode_ctx=int(ctx)))
    stream_ms = shape.weight_read_bytes / bw * 1e3
    return {
        "weight_mb": shape.weight_read_bytes / 1e6,
        "ctx": ctx,
        "t1_ms": t1,
        "params_m": shape.params / 1e6,
        "bandwidth_gbs": bw / 1e9,
        "stream_ms": stream_ms,
        "stream_fraction": stream_ms / t1,
        "achieved_gbs": moved / (t1 / 1e3) / 1e9,
        "efficiency": moved / (t1 / 1e3) / bw,
    }


def find_profile(
    profiles: Sequence[Mapping[str, Any]], model: str, device: str = "cpu-here"
) -> Mapping[str, Any]:
    """Why batching: the first committed profile of ``model`` on ``device`` (registry name);
    ValueError naming what is there if none is."""
    for p in profiles:
        if p["meta"]["model"] == model and p["device"] == device:
            return p
    have = ", ".join(f"{p['meta']['model']} on {p['device']}" for p in profiles) or "none"
    raise ValueError(f"no committed profile of {model} on {device} (profiles: {have})")


def stream_entries(
    profiles: Sequence[Mapping[str, Any]], sweep: Mapping[str, Any], numbers: Mapping[str, float]
) -> list[dict[str, Any]]:
    """Why batching: every batch-1 measurement on the page, each as ``model``, ``device``,
    ``params_m``, ``achieved_gbs``, ``efficiency`` (against its own run's matrix-vector
    bandwidth), ``stream_fraction`` and ``source`` ("committed profile" or "this build"),
    sorted by size."""
    out = [
        {
            "model": p["meta"]["model"],
            "device": p["device"],
            "source": "committed profile",
            **{
                k: v
                for k, v in profile_stream(p).items()
                if k in ("params_m", "achieved_gbs", "efficiency", "stream_fraction")
            },
        }
        for p in profiles
    ]
    out.append(
        {
            "model": sweep["meta"]["model"],
            "device": sweep["meta"]["device"],
            "source": "this build",
            "params_m": numbers["params_m"],
            "achieved_gbs": numbers["achieved_gbs"],
            "efficiency": numbers["efficiency"],
            "stream_fraction": numbers["stream_ms"] / numbers["t1_ms"],
        }
    )
    return sorted(out, key=lambda e: e["params_m"])


def size_efficiency_text(entries: Sequence[Mapping[str, Any]]) -> str:
    """Why batching, exercise on model size: whether this page's batch-1 measurements
    (:func:`stream_entries`) of different models on one device reach a larger share of
    their run's bandwidth as the model grows; it says so only if they do."""
    by_dev: dict[str, list[Mapping[str, Any]]] = {}
    for e in entries:
        by_dev.setdefault(e["device"], []).append(e)
    dev, group = max(by_dev.items(), key=lambda kv: len({e["model"] for e in kv[1]}))
    if len({e["model"] for e in group}) < 2:
        return "This page has measured one model per device only, so it cannot show the trend itself."
    parts = [
        f"{e['model']} ({e['params_m']:,.1f}M parameters, {e['source']}) reaches "
        f"{e['achieved_gbs']:,.1f} GB/s counting weight and KV bytes, {e['efficiency']:.0%} of the "
        f"matrix-vector bandwidth of its run"
        for e in group
    ]
    rising = all(b["efficiency"] > a["efficiency"] for a, b in zip(group, group[1:]))
    head = "The measurements on this page agree" if rising else "The measurements on this page do not show it"
    return f"{head}: at batch 1 on {dev}, " + "; ".join(parts) + "."


def stream_share_text(entries: Sequence[Mapping[str, Any]], model: str, ref: str) -> str:
    """Why batching: the share of ``model``'s batch-1 step that streaming its weights alone
    takes (``stream_fraction``, KV bytes left out) against ``ref``'s, from this page's
    measurements (:func:`stream_entries`; this build's own run first); it says the flat
    region proves more for ``model`` only if its share is larger."""

    def first(name: str) -> Mapping[str, Any] | None:
        mine = sorted((e for e in entries if e["model"] == name), key=lambda e: e["source"] != "this build")
        return mine[0] if mine else None

    e, r = first(model), first(ref)
    if e is None or r is None:
        return f"This page has no measurement of {model if e is None else ref} to compare with."
    # The same measure for both, and named: weights alone, not the weight-and-KV bytes of
    # size_efficiency_text, which a reader sees a few lines above with other percentages.
    said = (
        f"Streaming the weights alone (weight bytes at the matrix-vector bandwidth of the run, KV bytes "
        f"left out) fills {e['stream_fraction']:.0%} of {model}'s batch-1 step ({e['source']}) and "
        f"{r['stream_fraction']:.0%} of {ref}'s ({r['source']})"
    )
    if e["stream_fraction"] > r["stream_fraction"]:
        return said + f", so {model}'s flat region says more about bandwidth."
    return said + f": here {model}'s flat region proves no more than {ref}'s."


def bandwidth_note(registry_gbs: float, sweep: Mapping[str, Any], numbers: Mapping[str, float]) -> str:
    """Why batching: how the bandwidth measured in this build's live sweep sits beside the
    registry's CPU figure (``registry_gbs``), so the page never quotes two bandwidths for one
    machine without saying which is which."""
    if sweep["meta"]["device"] != "cpu-here":
        return (
            "This build's live measurement below ran on another device, so it has no second "
            "bandwidth for this CPU."
        )
    live = numbers["matvec_gbs"]
    split = (
        (
            " The fastest product in this build was the one split over the threads, one piece of the input "
            "per core, as this CPU's one-token steps run it; the registry's figure is MKL's product on one "
            "core."
        )
        if sweep["meta"].get("matvec_layout") == "matvec_split"
        else ""
    )
    return (
        f"The next section measures the bandwidth again, in the same process as its step times, and "
        f"builds its roofline on that measurement, not on the registry's figure: {live:,.1f} GB/s in this "
        f"build, {live / registry_gbs:.2f} times the registry's, at which {sweep['meta']['model']}'s "
        f"weights stream in {numbers['stream_ms']:,.1f} ms.{split}"
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
    (batch 1), ``knee125``/``knee2`` (:func:`knee`); ``mixed``: the measured mixed steps
    (``ProfileCost.mixed``, times in seconds; None if the profile has none).
    """
    from ..costs import ProfileCost

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
                "knee125": float(knee(b, col, 1.25)),
                "knee2": float(knee(b, col, 2.0)),
            }
        )
    return out


def profiles_text(profiles: Sequence[Mapping[str, Any]]) -> str:
    """Why batching: which devices the committed profiles cover (a paragraph for the
    prose); it says plainly when no GPU measurement is there."""
    if not profiles:
        return (
            "No profile is committed in `data/profiles/` yet, so this section has only the live "
            "measurement above and the roofline predictions."
        )
    parts = [
        f"{p['label']}: at {p['ref_ctx']:,.0f} tokens per row, {p['t1_ms']:.1f} ms at batch 1, within 2x "
        f"of that up to batch {p['knee2']:.0f}, {p['ref_ms'][-1]:.0f} ms at batch {p['batch'][-1]:.0f} "
        f"(B* = {p['bstar']:.0f} from {p['roofs_from']})"
        for p in profiles
    ]
    n = len(profiles)
    head = (
        f"{n} profile{'s are' if n > 1 else ' is'} committed in `data/profiles/`. " + "; ".join(parts) + "."
    )
    gpus = sorted({p["device"] for p in profiles if p["gpu"]})
    if gpus:
        tail = (
            f" GPU measurements are among them ({', '.join(gpus)}): for those devices the figure shows "
            "measured step times beside the roofline."
        )
    else:
        tail = (
            f" {'None of them was' if n > 1 else 'It was not'} measured on a GPU: every H100 and H200 "
            "number on this page is a roofline prediction from datasheet constants, not a measurement."
        )
    return head + tail


def profile_rows(profiles: Sequence[Mapping[str, Any]]) -> tuple[list[str], list[list[Any]]]:
    """Why batching: header and rows of the committed-profiles table (one row per profile
    and context: batch-1 step, step at the largest batch, knees)."""
    header = ["device", "model", "dtype", "date", "ctx", "B=1 ms", "max B", "ms", "knee 1.25x", "knee 2x"]
    rows: list[list[Any]] = []
    for p in profiles:
        m = p["meta"]
        for j, c in enumerate(p["ctxs"]):
            col = p["ms"][:, j]
            rows.append(
                [
                    p["device"],
                    m["model"],
                    p["shape"].dtype,
                    m["date"][:10],
                    f"{c:.0f}",
                    f"{col[0]:.1f}",
                    f"{p['batch'][-1]:.0f}",
                    f"{col[-1]:.1f}",
                    f"{knee(p['batch'], col, 1.25)}",
                    f"{knee(p['batch'], col, 2.0)}",
                ]
            )
    return header, rows
