"""The live decode sweep: decode-step time against batch size on the reader's device, set up
as a profile is (:func:`.measure.rig`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from ..costs.models import get_model
from .attention import decode_kernel
from .hardware import available_bytes, resolve_device
from .kernels import dtype_name
from .measure import StepTimer, rig, stats, target
from .runner import SPAN_PER_ROW

#: Model and batch sizes per device type: on the CPU cpu-m is bandwidth-bound, cpu-s dominated
#: by per-step overhead (~9 ms of its 14.7 ms batch-1 step: the cpu-here entry's comment in
#: :mod:`batching.costs.devices`).
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
    """The model and batch sizes (``None``: :data:`LIVE_DEFAULTS`); on a GPU with under 40 GB
    free, llama-1b instead of llama-8b (16 GB of weights plus the probe's buffers)."""
    kind = "cuda" if device_type == "cuda" else "cpu"
    name, bs = LIVE_DEFAULTS[kind]
    if model is None and kind == "cuda" and free_bytes is not None and free_bytes < 40e9:
        name = "llama-1b"
    out = [int(b) for b in (bs if batches is None else batches)]
    if not out or out[0] != 1 or any(b2 <= b1 for b1, b2 in zip(out, out[1:])):
        raise ValueError(f"batches={out}: must start at 1 and increase")
    return (name if model is None else model), out


def decode_paths(graphs: bool = False, gathers: bool = True) -> dict[str, dict[str, bool]]:
    """The decode paths the sweep times, as ``StepTimer.decode`` options: ``uniform`` (equal
    contexts), ``mixed`` (contexts over ctx/2 .. 3ctx/2; SDPA reads them to the longest) and,
    except with CUDA ``graphs`` (whose replay reads slabs by its own rule) or where the
    runner never ``gathers`` (a CPU's decode kernel reads every slot in place),
    ``gathered`` (the mixed rows scattered, so SDPA's runner copies their slabs in every
    layer)."""
    paths: dict[str, dict[str, bool]] = {"uniform": {"uniform": True}, "mixed": {}}
    return paths if graphs or not gathers else {**paths, "gathered": {"scattered": True}}


def decode_sweep(
    model: str | None = None,
    device: str = "auto",
    batches: Sequence[int] | None = None,
    ctx: int = 128,
    reps: int = 5,
    peak_n: int | None = None,
    bandwidth_bytes: int | None = None,
    dtype: str | None = "auto",
    only: Sequence[str] | None = None,
) -> dict[str, Any]:
    """Decode-step time against batch size at ``ctx`` KV tokens per row, along every
    :func:`decode_paths`, after probing bandwidth (at most 2 GiB on a GPU) and matmul peak.
    ``dtype``: ``auto`` (the faster here, :mod:`batching.real.kernels`), ``fp32`` or ``bf16``;
    ``only``: the paths to time (default all).

    Returns ``meta``, ``batch``, ``ctx``, ``paths``, ``<path>_ms`` (medians) with
    ``<path>_p25_ms``/``<path>_p75_ms``, and ``matvec_gbs``, ``copy_gbs``, ``read_gbs`` (best
    of each probe; copy counts read + write), ``peak_tflops``.
    """
    dev0 = resolve_device(device)
    free = float(available_bytes(dev0) or 0) if dev0.type == "cuda" else None
    name, bs = live_defaults(dev0.type, model, batches, free)
    base = get_model(name)
    dev, entry, tdt = at = target(device, dtype, base)
    shape = base.with_dtype(dtype_name(tdt))
    if not (isinstance(ctx, int) and ctx >= 2 and ctx * 3 // 2 + 2 <= shape.max_context):
        raise ValueError(f"ctx={ctx!r}: must be an integer >= 2 with 1.5 x ctx inside {name}'s context")
    paths = decode_paths(graphs=dev.type == "cuda", gathers=dev.type != "cpu" or decode_kernel() is None)
    if only is not None:
        if not set(only) <= set(paths) or not only:
            raise ValueError(f"only={list(only)!r}: must name some of {', '.join(paths)}")
        paths = {p: kw for p, kw in paths.items() if p in only}
    slots = SPAN_PER_ROW * max(bs) + 1 if "gathered" in paths else max(bs)
    nbytes = bandwidth_bytes or (
        shape.weight_read_bytes if dev.type == "cpu" else min(shape.weight_read_bytes, 2 << 30)
    )
    r = rig(
        at,
        base,
        slots,
        ctx * 3 // 2 + 2,
        bandwidth_bytes=nbytes,
        peak_n=peak_n,
        auto=str(dtype).lower() == "auto",
    )
    plan = r.runner.model.kernels
    # Round-robin over (batch, path), each after one untimed step: a slow spell of a shared
    # machine spreads over all points instead of bending one stretch of the curve.
    timer = StepTimer(r.runner, 1, warmup=1)
    samples: dict[tuple[str, int], list[float]] = {(p, b): [] for p in paths for b in bs}
    for _ in range(reps):
        for b in bs:
            for path, kwargs in paths.items():
                samples[(path, b)].append(timer.decode(b, ctx, **kwargs)["median_ms"] / 1e3)
    st = {key: stats(v) for key, v in samples.items()}
    acc = {
        f"{p}_{k}": [st[(p, b)][s] for b in bs]
        for p in paths
        for k, s in {"ms": "median_ms", "p25_ms": "p25_ms", "p75_ms": "p75_ms"}.items()
    }
    meta = {
        **r.where(),
        "device_type": dev.type,
        "model": name,
        "dtype": shape.dtype,
        "params": float(shape.params),
        "weight_read_bytes": float(shape.weight_read_bytes),
        "kv_bytes_per_token": float(shape.kv_bytes_per_token),
        "reps": reps,
        "seed": 0,
        "bandwidth_bytes": float(nbytes),
        "peak_n": r.peak["n"],
        "linear": r.runner.model.linear_form,
        "decode_attention": r.runner.decode_attention,
        "kernels": plan.to_dict(),
        # Batch 1 runs another kernel than batch 2 (the CPU's one-row product, say): the
        # claim is then read from batch 2 (batching.book.decode.base_index).
        "linear_split": plan.lookup(1)[0] != plan.lookup(2)[0],
        "matvec_layout": r.bw["matvec"]["layout"],
    }
    if (spec := r.spec(shape.dtype)) is not None:
        meta["device_spec"] = spec
    out = {
        "meta": meta,
        "batch": np.asarray(bs, dtype=float),
        "ctx": int(ctx),
        "paths": list(paths),
        **{k: np.asarray(v) for k, v in acc.items()},
        "matvec_gbs": r.bw["matvec"]["GBps_best"],
        "copy_gbs": r.bw["copy"]["GBps_best"],
        "read_gbs": r.bw["read"]["GBps_best"],
        "peak_tflops": r.peak["TFLOPs_best"],
    }
    del r, timer
    return out
