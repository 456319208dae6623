"""``python -m batching measure``: the device's bandwidth and matmul peak, then the model's
decode, prefill and mixed steps (median and spread), as a profile (``ProfileCost``'s schema
1). Decode rows sit at their context in a zero-filled slab (contents do not change the cost)."""

from __future__ import annotations

import datetime as dt
import os
import platform
import socket
import statistics
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from ..costs.devices import get_device
from ..costs.models import ModelShape, get_model
from ..plan import PrefillChunk, StepPlan
from ..request import Request
from ..results import load_average
from .executor import kernel_plan, resolve_dtype
from .hardware import (
    DeviceEntry,
    device_entry,
    device_memory,
    machine,
    measured_spec,
    resolve_device,
    synchronize,
)
from .kernels import apply, dnnl_available, dtype_name, prepare, split_ways
from .model import Llama
from .runner import SPAN_PER_ROW, ModelRunner

PROFILE_SCHEMA = 1


def time_fn(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 2) -> list[float]:
    """Synchronized wall-clock seconds of ``reps`` calls after ``warmup`` untimed ones."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        out.append(time.perf_counter() - t0)
    return out


def stats(ts: list[float]) -> dict[str, float]:
    """Median and spread (min, quartiles, max) in milliseconds."""
    q = statistics.quantiles(ts, n=4) if len(ts) >= 2 else [ts[0]] * 3
    return {
        "median_ms": statistics.median(ts) * 1e3,
        "min_ms": min(ts) * 1e3,
        "p25_ms": q[0] * 1e3,
        "p75_ms": q[2] * 1e3,
        "max_ms": max(ts) * 1e3,
        "reps": len(ts),
    }


#: Columns of the matrix-vector reference (a decode step's matrices have 512 to 14,336).
MATVEC_COLS = 4096


def _matvecs(src: Tensor) -> dict[str, tuple[Callable[[], Any], int]]:
    """Matrix-vector products over ``src``'s bytes, each with the bytes it reads: ``W @ x``,
    ``x @ W.T`` (``W.T`` row-major) and, on CPU, that split one input piece per thread (the
    kernels' ``split`` path) and oneDNN's prepacked product (``dnnl``, where it runs)."""
    n, cols = src.numel(), MATVEC_COLS
    w = src[: (n // cols) * cols].view(-1, cols)  # [rows, 4096]
    wt = w.view(cols, -1)  # the same bytes as [4096, rows]
    x = torch.rand(cols, 1, dtype=src.dtype, device=src.device)
    xr = torch.rand(1, cols, dtype=src.dtype, device=src.device)
    out = {"matvec_wx": (lambda: w @ x, w.nbytes), "matvec_xwt": (lambda: xr @ wt, w.nbytes)}
    if src.device.type == "cpu":  # a GPU kernel uses the whole device already
        s = split_ways(cols, torch.get_num_threads())
        xs, ws = xr.view(s, 1, cols // s), wt.view(s, cols // s, -1)  # [s, 1, 4096/s], [s, 4096/s, rows]
        out["matvec_split"] = (lambda: torch.bmm(xs, ws).sum(0), w.nbytes)
        if dnnl_available(src.dtype):
            # oneDNN's prepacked product, the kernels' `dnnl` path: in bf16 the fastest weight
            # stream here (aten's bf16 matrix-vector product reaches half of it), so a decode
            # step's bytes are not measured against a slower reference than its own kernel.
            packed = prepare("dnnl", wt.T)  # [rows, 4096], reordered once
            out["matvec_dnnl"] = (lambda: apply("dnnl", xr, wt.T, packed), w.nbytes)
    return out


def matvec(
    device: torch.device, dtype: torch.dtype, nbytes: int, layout: str
) -> tuple[Callable[[], Any], int]:
    """One :func:`_matvecs` product (``layout``) over ``nbytes`` of fresh weights, and its bytes."""
    n = nbytes // dtype.itemsize
    return _matvecs(torch.empty(n, dtype=dtype, device=device).uniform_())[layout]


@torch.inference_mode()
def bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int, reps: int = 10) -> dict[str, Any]:
    """Copy into an existing tensor (``clone()`` page-faults fresh memory), a reduction and
    :func:`_matvecs` over ``nbytes``; ``matvec``, the best product, is decode efficiency's reference."""
    n = nbytes // dtype.itemsize
    src = torch.empty(n, dtype=dtype, device=device).uniform_()  # no fp32 copy: 15 GB for an 8B's bytes
    dst = torch.empty_like(src)
    out: dict[str, Any] = {"bytes": nbytes}
    fns = [("copy", lambda: dst.copy_(src), 2 * src.nbytes), ("read", lambda: src.sum(), src.nbytes)]
    matvecs = _matvecs(src)
    fns += [(name, fn, moved) for name, (fn, moved) in matvecs.items()]
    for name, fn, moved in fns:
        ts = time_fn(fn, device, reps)
        out[name] = {"GBps_best": moved / min(ts) / 1e9, "GBps_median": moved / statistics.median(ts) / 1e9}
    best = max(matvecs, key=lambda k: out[k]["GBps_best"])
    out["matvec"] = {**out[best], "layout": best}
    return out


#: The longest one product of :func:`matmul_peak` may take (s): where ``n`` would take longer
#: (bf16 on a CPU without AVX-512 BF16 or AMX runs at ~1-3 GFLOP/s, so a 2,048-cubed product
#: takes minutes), the size halves until it fits, down to :data:`PEAK_MIN_N`.
PEAK_BUDGET_S = 2.0
PEAK_MIN_N = 256


@torch.inference_mode()
def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int = 5) -> dict[str, float]:
    """FLOP/s of an n x n x n matrix product. On a CPU at most ``n``: the size is halved while
    one product would take longer than :data:`PEAK_BUDGET_S` (estimated from one timed product
    at :data:`PEAK_MIN_N`, the time growing as the cube of the size; a GPU's small product
    times its launch, not its arithmetic). ``n`` in the result is the size measured."""
    if device.type == "cpu" and n > PEAK_MIN_N:
        t_small = min(time_fn(_product(device, dtype, PEAK_MIN_N), device, 1, warmup=1))
        while n > PEAK_MIN_N and t_small * (n / PEAK_MIN_N) ** 3 > PEAK_BUDGET_S:
            n //= 2
    ts = time_fn(_product(device, dtype, n), device, reps)
    return {
        "n": n,
        "TFLOPs_best": 2 * n**3 / min(ts) / 1e12,
        "TFLOPs_median": 2 * n**3 / statistics.median(ts) / 1e12,
    }


def _product(device: torch.device, dtype: torch.dtype, n: int) -> Callable[[], Any]:
    a = torch.rand(n, n, device=device).to(dtype)
    b = torch.rand(n, n, device=device).to(dtype)
    return lambda: a @ b


@torch.inference_mode()
def linear_replay(model: Llama, steps: Sequence[tuple[int, int]], rounds: int = 1) -> list[float]:
    """Seconds of each step's matrix products alone: for ``(rows, logit_rows)`` per step, every
    layer's linear layers on ``rows`` rows and the head on ``logit_rows``, by the model's own
    kernels (its plan, padding included), on random activations. Attention, norms and the
    rest cost nothing here, so a run takes at least their sum: the floor the matrix products
    set (the fastest of ``rounds`` replays per step)."""
    dev, dt = model.device, model.dtype
    g = torch.Generator(device=dev).manual_seed(0)
    acts: dict[tuple[int, int], Tensor] = {}

    def act(rows: int, width: int) -> Tensor:  # [rows, width], one per shape
        if (rows, width) not in acts:
            acts[(rows, width)] = torch.randn(rows, width, generator=g, device=dev).to(dt)
        return acts[(rows, width)]

    weights = model.linear_weights()  # the head last
    model.ensure_forms()
    out = []
    for rows, logit_rows in steps:
        best = float("inf")
        for _ in range(max(1, rounds)):
            t0 = time.perf_counter()
            for w in weights[:-1] if rows else []:
                model.linear(act(rows, w.shape[1]), w)
            if logit_rows:
                model.linear(act(logit_rows, weights[-1].shape[1]), weights[-1])
            synchronize(dev)
            best = min(best, time.perf_counter() - t0)
        out.append(best)
    return out


class StepTimer:
    """Times synthetic plans through ``ModelRunner.execute``, as the real executor runs them;
    ``pool``: statistics over every repetition of a step so far."""

    def __init__(self, runner: ModelRunner, reps: int, warmup: int = 2, pool: bool = False) -> None:
        self.r, self.reps, self.warmup = runner, reps, warmup
        self.pooled: dict[tuple, list[float]] | None = {} if pool else None

    def _decoding(self, rid: int, slot: int, ctx: int) -> Request:
        """A request in ``slot`` with ``ctx`` tokens cached, decoding next."""
        req = Request(rid, 0.0, max(ctx, 1), 1 << 30)
        req.on_admit(slot, 0.0)
        req.on_prefill(req.prompt_len)
        req.on_token(0.0, 1)  # its newest id, which the decode step computes
        return req

    @torch.inference_mode()
    def _time(self, key: tuple, plan: StepPlan) -> dict[str, float]:
        # Nothing commits the step: every repetition is the same step.
        ts = time_fn(lambda: self.r.execute(plan), self.r.device, self.reps, self.warmup)
        if self.pooled is not None:
            self.pooled.setdefault(key, []).extend(ts)
            ts = self.pooled[key]
        return stats(ts)

    def decode(
        self, batch: int, ctx: int, uniform: bool = False, scattered: bool = False
    ) -> dict[str, float]:
        """``batch`` decode rows in slots 0..B-1 with contexts over ctx/2 .. 3ctx/2, like a
        live batch; ``uniform``: all at ``ctx``; ``scattered``: spread over all the runner's
        slots (more than ``SPAN_PER_ROW`` x ``batch``), so that their slabs are gathered."""
        if uniform or batch == 1:
            pos = [ctx] * batch
        else:
            pos = [round(ctx * (0.5 + i / (batch - 1))) for i in range(batch)]
        slots = list(range(batch))
        if scattered and batch > 1:
            # The runner sorts rows by slot, so any order of slots 0..B-1 is still one range read
            # as a view: only a span wider than SPAN_PER_ROW slots per row is gathered.
            span = self.r.slots
            if span <= SPAN_PER_ROW * batch:
                raise ValueError(
                    f"scattered decode of {batch} rows needs a runner of more than "
                    f"{SPAN_PER_ROW * batch} slots; this one has {span}"
                )
            slots = [round(i * (span - 1) / (batch - 1)) for i in range(batch)]
        return self._time(
            ("decode", batch, ctx, uniform, scattered),
            StepPlan(decodes=[self._decoding(i, s, c) for i, (s, c) in enumerate(zip(slots, pos))]),
        )

    def prefill(self, tokens: int, rows: int = 1) -> dict[str, float]:
        """``rows`` prompts of ``tokens`` tokens from empty slots 0..rows-1 in one pass (a static
        batch's prefill: the positions of one ``rows x tokens`` prompt, 1/rows of its attention)."""
        chunks = []
        for i in range(rows):
            req = Request(i, 0.0, tokens, 1)
            req.on_admit(i, 0.0)
            chunks.append(PrefillChunk(req, tokens))
        return self._time(("prefill", rows, tokens), StepPlan(prefills=chunks))

    def mixed(self, tokens: int, rows: int, ctx: int) -> dict[str, float]:
        """A ``tokens``-token prefill in the pass of ``rows`` decodes, its slot amid theirs (slots
        0..rows), where a live batch's freed slot puts it: the decodes read around a hole."""
        hole = rows // 2 if rows > 1 else rows
        req = Request(rows, 0.0, tokens, 1)
        req.on_admit(hole, 0.0)
        slots = [s for s in range(rows + 1) if s != hole]
        return self._time(
            ("mixed", tokens, rows, ctx),
            StepPlan(
                prefills=[PrefillChunk(req, tokens)],
                decodes=[self._decoding(i, s, ctx) for i, s in enumerate(slots)],
            ),
        )


@dataclass
class Rig:
    """What a profile or the live sweep runs on: device, entry, dtype, this process's
    bandwidth and peak probes, and the warmed-up runner."""

    dev: torch.device
    entry: DeviceEntry
    tdt: torch.dtype
    bw: dict[str, Any]
    peak: dict[str, float]
    runner: ModelRunner
    load0: float | None
    t0: float

    def where(self) -> dict[str, Any]:
        """The meta keys every measurement records of where, how and when it ran (the load and
        the wall clock up to this call). ``machine``: what the device is (the ``device`` entry
        files every CPU alike)."""
        return {
            "device": self.entry.name,
            "device_name": self.entry.device_name,
            "machine": machine(self.dev).to_dict(),
            "datasheet": self.entry.datasheet,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "decode_graphs": self.runner.graphs_info(),
            "attention": self.runner.attention_backends(),
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "loadavg_before": self.load0,
            "loadavg_after": load_average(),
            "wall_s": time.perf_counter() - self.t0,
        }

    def spec(self, dtype: str) -> dict[str, Any] | None:
        """The device's figures as measured here where the registry has none for ``dtype`` (an
        unregistered GPU; this CPU in bf16, which the registry's CPU entry, measured in fp32 on
        an AVX2 machine, has no peak for); None otherwise."""
        if self.entry.registered and (
            self.entry.datasheet or dtype in get_device(self.entry.name).peak_flops
        ):
            return None
        return measured_spec(self.entry, self.bw, self.peak, dtype, device_memory(self.dev) or 0.0)


def target(
    device: str, dtype: str | None = None, shape: ModelShape | None = None
) -> tuple[torch.device, DeviceEntry, torch.dtype]:
    """The device ("auto": the GPU if any), its registry entry and the torch dtype (fp32, bf16;
    ``auto``: the faster for ``shape`` here)."""
    dev = resolve_device(device)
    tdt = resolve_dtype(dtype, dev, shape)
    if tdt not in (torch.float32, torch.bfloat16):
        raise ValueError(f"dtype={dtype!r}: profiles are fp32 or bf16")
    return dev, device_entry(dev), tdt


def rig(
    at: tuple[torch.device, DeviceEntry, torch.dtype],
    shape: ModelShape,
    slots: int,
    max_len: int,
    *,
    bandwidth_bytes: int | None = None,
    peak_n: int | None = None,
    seed: int = 0,
    graphs: bool | None = None,
    auto: bool = False,
) -> Rig:
    """Probe the :func:`target`, then build and warm up ``shape`` with ``slots`` slabs of ``max_len``,
    its linear layers on this machine's kernels (``auto``: the dtype was chosen by probing both,
    which the plan records). Probes first: their buffers (twice ``bandwidth_bytes``, default the weights' bytes) are
    freed before the slabs take the memory (an 8B profile's fill most of an H200)."""
    (dev, entry, tdt), load0, t0 = at, load_average(), time.perf_counter()
    nbytes = bandwidth_bytes or shape.with_dtype(dtype_name(tdt)).weight_read_bytes
    bw = bandwidth(dev, tdt, nbytes)
    peak = matmul_peak(dev, tdt, peak_n or (2048 if dev.type == "cpu" else 8192))
    if dev.type == "cuda":
        torch.cuda.empty_cache()
    # ``auto`` chose the dtype by probing both: the plan keeps why (a dtype asked for: its own).
    plan = kernel_plan(shape, dev, "auto" if auto else tdt)
    runner = ModelRunner.from_shape(
        shape, slots, device=dev, dtype=tdt, seed=seed, max_len=max_len, graphs=graphs, kernels=plan
    )
    runner.warmup()
    return Rig(dev, entry, tdt, bw, peak, runner, load0, t0)


def _progress(items: list, desc: str, enabled: bool) -> Iterable:
    if not enabled:
        return items
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, leave=False)


def measure(
    model: str,
    device: str = "auto",
    dtype: str | None = None,
    *,
    batches: list[int],
    ctxs: list[int],
    prefill_tokens: list[int],
    mixed: list[tuple[int, int, int]],
    prefill_rows: Sequence[tuple[int, int]] = (),
    reps: int = 5,
    rounds: int = 1,
    seed: int = 0,
    bandwidth_bytes: int | None = None,
    peak_n: int | None = None,
    graphs: bool | None = None,
    progress: bool = False,
    partial: Callable[[dict[str, Any]], object] | None = None,
    partial_every_s: float = 10.0,
) -> dict[str, Any]:
    """The profile document (schema 1) of one model on one device.

    ``rounds`` sweeps of the grid, ``reps`` repetitions per step and round, pooled per point:
    this project's CPU drifts 20-30% over minutes, and rounds spread a slow spell over the
    grid instead of bending a few neighbouring points. ``graphs``: CUDA-graph decode
    (default on CUDA). ``prefill_rows``: (rows, tokens) equal prompts in one pass; beside
    single ``rows x tokens`` prompts they separate attention from positions. ``partial``:
    called with the profile so far (``meta.partial``, unmeasured points null) at most every
    ``partial_every_s`` and after each round, so that a run cut short keeps what it measured."""
    for name, n in (("rounds", rounds), ("reps", reps)):
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"{name}={n!r}: must be an integer >= 1")
    shape = get_model(model)
    dev, entry, tdt = at = target(device, dtype, shape)  # no GPU is said before any length is checked
    for name, vals in (("batches", batches), ("ctxs", ctxs), ("prefill_tokens", prefill_tokens)):
        if not vals or sorted(set(vals)) != list(vals) or vals[0] < (0 if name == "ctxs" else 1):
            raise ValueError(f"{name}={vals!r}: must be increasing and positive")
    for rows, tokens in prefill_rows:
        if not (isinstance(rows, int) and isinstance(tokens, int) and rows >= 2 and tokens >= 1):
            raise ValueError(f"prefill_rows ({rows!r}, {tokens!r}): need integers rows >= 2, tokens >= 1")
    lens = [c * 3 // 2 + 2 for c in ctxs] + prefill_tokens + [t for _, t in prefill_rows]
    max_len = max(lens + [max(t, c + 1) for t, _, c in mixed])
    if max_len > shape.max_context:
        raise ValueError(f"a measured length of {max_len} exceeds {model}'s max_context={shape.max_context}")
    slots = max(batches + [r + 1 for _, r, _ in mixed] + [r for r, _ in prefill_rows])
    rg = rig(
        at,
        shape,
        slots,
        max_len,
        bandwidth_bytes=bandwidth_bytes,
        peak_n=peak_n,
        seed=seed,
        graphs=graphs,
        auto=str(dtype).lower() == "auto",
    )
    runner, bw, peak = rg.runner, rg.bw, rg.peak
    weight_bytes = shape.with_dtype(dtype_name(tdt)).weight_read_bytes
    timer = StepTimer(runner, reps, pool=True)
    grid: list[list[Any]] = [[None] * len(ctxs) for _ in batches]
    pre: list[Any] = [None] * len(prefill_tokens)
    mix: list[Any] = [None] * len(mixed)
    prows: list[Any] = [None] * len(prefill_rows)
    points = (
        [("decode", i, j) for i in range(len(batches)) for j in range(len(ctxs))]
        + [("prefill", i, 0) for i in range(len(prefill_tokens))]
        + [("mixed", i, 0) for i in range(len(mixed))]
        + [("prefill_rows", i, 0) for i in range(len(prefill_rows))]
    )

    total = len(points) * rounds

    def ms(p: Any) -> Any:  # the medians of a point, or of a (nested) list of points
        return [ms(x) for x in p] if isinstance(p, list) else None if p is None else p["median_ms"]

    def section(spread: list[Any], **axes: Any) -> dict[str, Any]:
        return {**axes, "ms": ms(spread), "spread": spread}

    def document(done: int) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "schema": PROFILE_SCHEMA,
            "meta": {
                **rg.where(),
                "model": shape.name,
                "dtype": dtype_name(tdt),
                "element_bytes": tdt.itemsize,
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                "host": socket.gethostname(),
                "python": platform.python_version(),
                "params": shape.params,
                "weight_read_bytes": weight_bytes,
                "reps": reps,
                "rounds": rounds,
                "seed": seed,
                "token_buckets": runner.model.token_buckets(),
                "kernels": runner.model.kernels.to_dict(),
                "slots": runner.slots,
                "max_len": runner.max_len,
                "how": "python -m batching measure: synchronized wall clock around ModelRunner's packed forward "
                "pass; decode rows sit at the stated context in a zero-filled slab (no real prefill)",
            },
            "device": {"bandwidth": bw, "matmul_peak": peak},
            "decode": section(grid, batch=batches, ctx=ctxs),
            "prefill": section(pre, tokens=prefill_tokens),
            "mixed": section(
                mix,
                prefill_tokens=[t for t, _, _ in mixed],
                decode_rows=[r for _, r, _ in mixed],
                decode_ctx=[c for _, _, c in mixed],
            ),
        }
        if (spec := rg.spec(dtype_name(tdt))) is not None:
            doc["meta"]["device_spec"] = spec
        if prefill_rows:
            doc["prefill_rows"] = section(
                prows, rows=[r for r, _ in prefill_rows], tokens=[t for _, t in prefill_rows]
            )
        if done < total:
            doc["meta"].update(partial=True, points_done=done, points=total)
        return doc

    last = time.perf_counter()
    for n, (kind, i, j) in enumerate(_progress(points * rounds, f"{rounds} round(s)", progress), 1):
        if kind == "decode":
            grid[i][j] = timer.decode(batches[i], ctxs[j])
        elif kind == "prefill":
            pre[i] = timer.prefill(prefill_tokens[i])
        elif kind == "prefill_rows":
            rows, tokens = prefill_rows[i]
            prows[i] = timer.prefill(tokens, rows)
        else:
            mix[i] = timer.mixed(*mixed[i])
        due = n % len(points) == 0 or time.perf_counter() - last >= partial_every_s
        if partial is not None and n < total and due:
            partial(document(n))
            last = time.perf_counter()
    return document(total)
