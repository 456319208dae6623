"""Measure what a step costs on this device: ``python -m batching measure``.

The device's bandwidth and matmul peak, then the model's decode steps against batch size
and context, prefills against tokens and mixed steps, each as median and spread: a profile
(``ProfileCost``'s schema 1) that the simulator interpolates. Only torch and numpy are
needed. Decode rows sit at the measured context in a zero-filled slab (its contents do not
change a step's cost), with no real prefill.
"""

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

from ..models import ModelShape, get_model
from ..plan import PrefillChunk, StepPlan
from ..request import Request
from ..results import load_average
from .executor import REGISTRY_DTYPE, resolve_dtype
from .hardware import DeviceEntry, device_entry, device_memory, measured_spec, resolve_device, synchronize
from .model import split_ways
from .runner import SPAN_PER_ROW, ModelRunner

PROFILE_SCHEMA = 1


def time_fn(fn: Callable[[], Any], device: torch.device, reps: int, warmup: int = 2) -> list[float]:
    """Wall-clock seconds of ``reps`` calls after ``warmup`` untimed ones (synchronized)."""
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


# ------------------------------------------------------------------ the device
#: Columns of the matrix-vector reference (a decode step's matrices have 512 to 14,336).
MATVEC_COLS = 4096


def _matvecs(src: Tensor) -> dict[str, tuple[Callable[[], Any], int]]:
    """The matrix-vector products over ``src``'s bytes, with the bytes each reads: ``W @ x``
    (``matvec_wx``), ``x @ W.T`` with ``W.T`` stored row-major (``matvec_xwt``), and the
    same split one piece of the input dimension per thread, one ``bmm`` summed
    (``matvec_split``, CPU only: how a CPU model's one-token steps multiply, ``Llama.linear``)."""
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
    return out


def matvec(
    device: torch.device, dtype: torch.dtype, nbytes: int, layout: str
) -> tuple[Callable[[], Any], int]:
    """One matrix-vector product over ``nbytes`` of fresh weights in ``layout`` (a
    :func:`bandwidth` key) and the bytes it reads: the reference of decode efficiency."""
    n = nbytes // dtype.itemsize
    return _matvecs(torch.empty(n, dtype=dtype, device=device).uniform_())[layout]


@torch.inference_mode()
def bandwidth(device: torch.device, dtype: torch.dtype, nbytes: int, reps: int = 10) -> dict[str, Any]:
    """Memory bandwidth: copy into an existing tensor (``clone()`` page-faults fresh memory),
    a reduction, and the matrix-vector products of :func:`_matvecs` over ``nbytes``;
    ``matvec``, the best of those, is the reference of decode efficiency."""
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


@torch.inference_mode()
def matmul_peak(device: torch.device, dtype: torch.dtype, n: int, reps: int = 5) -> dict[str, float]:
    """FLOP/s of an n x n x n matrix product (the compute roof)."""
    a = torch.rand(n, n, device=device).to(dtype)
    b = torch.rand(n, n, device=device).to(dtype)
    ts = time_fn(lambda: a @ b, device, reps)
    return {
        "n": n,
        "TFLOPs_best": 2 * n**3 / min(ts) / 1e12,
        "TFLOPs_median": 2 * n**3 / statistics.median(ts) / 1e12,
    }


# ------------------------------------------------------------------ the model
class StepTimer:
    """Times synthetic step plans through ``ModelRunner.execute`` exactly as the real
    executor runs them (per-step Python included)."""

    def __init__(self, runner: ModelRunner, reps: int, warmup: int = 2, pool: bool = False) -> None:
        """``pool``: statistics over every repetition of a step so far, not just this call's."""
        self.r, self.reps, self.warmup = runner, reps, warmup
        self.pooled: dict[tuple, list[float]] | None = {} if pool else None

    def _decoding(self, rid: int, slot: int, ctx: int) -> Request:
        """A request in ``slot`` that has ``ctx`` tokens cached and decodes next."""
        req = Request(rid, 0.0, max(ctx, 1), 1 << 30)
        req.on_admit(slot, 0.0)
        req.on_prefill(req.prompt_len)
        req.on_token(0.0, 1)  # its newest id, which the decode step computes
        return req

    @torch.inference_mode()
    def _time(self, key: tuple, plan: StepPlan) -> dict[str, float]:
        # Nothing commits the step, so the requests stay where they are and every
        # repetition is the same step.
        ts = time_fn(lambda: self.r.execute(plan), self.r.device, self.reps, self.warmup)
        if self.pooled is not None:
            self.pooled.setdefault(key, []).extend(ts)
            ts = self.pooled[key]
        return stats(ts)

    def decode(
        self, batch: int, ctx: int, uniform: bool = False, scattered: bool = False
    ) -> dict[str, float]:
        """``batch`` decode rows with ``ctx`` cached tokens on average.

        By default like a live batch: the rows' contexts differ (spread evenly over
        ctx/2 .. 3ctx/2, so attention reads up to the longest and masks the shorter ones);
        their slots are 0..B-1, as the schedulers' lowest-free-slot policy mostly leaves
        them. ``scattered=True`` spreads the rows evenly over all the runner's slots, so that
        the runner gathers (copies) their slabs in every layer; the runner must have more
        than ``SPAN_PER_ROW`` x ``batch`` slots. ``uniform=True`` gives every row the same
        context: the pure weight-streaming story of "Why batching".
        """
        if uniform or batch == 1:
            pos = [ctx] * batch
        else:
            pos = [round(ctx * (0.5 + i / (batch - 1))) for i in range(batch)]
        slots = list(range(batch))
        if scattered and batch > 1:
            # The runner sorts rows by slot, so any order of slots 0..B-1 is still one range,
            # read as a view: only a span wider than SPAN_PER_ROW slots per row is gathered.
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
        """``rows`` prompts of ``tokens`` tokens each from empty caches (slots 0..rows-1) in
        one pass, each emitting its first token. Several rows are a static batch's prefill of
        equal prompts: the same positions as one prompt of ``rows x tokens``, 1/rows of its
        attention."""
        chunks = []
        for i in range(rows):
            req = Request(i, 0.0, tokens, 1)
            req.on_admit(i, 0.0)
            chunks.append(PrefillChunk(req, tokens))
        return self._time(("prefill", rows, tokens), StepPlan(prefills=chunks))

    def mixed(self, tokens: int, rows: int, ctx: int) -> dict[str, float]:
        """A ``tokens``-token prompt prefilled in the pass of ``rows`` decodes, its slot in
        the middle of theirs (slots 0..rows). That is where a live batch puts it: a finished
        request frees a slot among the running ones and the next prompt takes it, so the
        decode rows read their slabs with a hole (runner.SPAN_PER_ROW)."""
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
    """What a measurement runs on (a profile, ``measure``, or the live decode sweep,
    :mod:`.sweep`): the device and its registry entry, the torch dtype, the bandwidth and
    matmul-peak probes taken in this process, and the warmed-up model with its slabs."""

    dev: torch.device
    entry: DeviceEntry
    tdt: torch.dtype
    bw: dict[str, Any]
    peak: dict[str, float]
    runner: ModelRunner
    load0: float | None
    t0: float

    def where(self) -> dict[str, Any]:
        """The meta keys every measurement records of where and how it ran."""
        return {
            "device": self.entry.name,
            "device_name": self.entry.device_name,
            "datasheet": self.entry.datasheet,
            "torch": torch.__version__,
            "threads": torch.get_num_threads(),
            "decode_graphs": self.runner.graphs_info(),
            "attention": self.runner.attention_backends(),
        }

    def spec(self, dtype: str) -> dict[str, Any] | None:
        """A GPU the registry lacks: its figures as measured here (None for a registered one)."""
        if self.entry.registered:
            return None
        return measured_spec(self.entry, self.bw, self.peak, dtype, device_memory(self.dev) or 0.0)


def target(device: str, dtype: str | None, what: str) -> tuple[torch.device, DeviceEntry, torch.dtype]:
    """The device ("auto": the GPU if there is one), its registry entry and the torch dtype
    of a measurement; ``what`` names it in the error for a dtype other than fp32 or bf16."""
    dev = resolve_device(device)
    tdt = resolve_dtype(dtype, dev)
    if tdt not in REGISTRY_DTYPE:
        raise ValueError(f"dtype={dtype!r}: {what} fp32 or bf16")
    return dev, device_entry(dev), tdt


def rig(
    dev: torch.device,
    entry: DeviceEntry,
    tdt: torch.dtype,
    shape: ModelShape,
    slots: int,
    max_len: int,
    *,
    bandwidth_bytes: int | None = None,
    peak_n: int | None = None,
    seed: int = 0,
    graphs: bool | None = None,
) -> Rig:
    """Probe the device, then build and warm up ``shape`` with ``slots`` slabs of ``max_len``.

    The probes come first: their buffers (twice ``bandwidth_bytes``, by default the weights'
    bytes) are freed before the model and its slabs take the memory (an 8B profile's slabs
    fill most of an H200)."""
    load0, t0 = load_average(), time.perf_counter()
    nbytes = bandwidth_bytes or shape.with_dtype(REGISTRY_DTYPE[tdt]).weight_read_bytes
    bw = bandwidth(dev, tdt, nbytes)
    peak = matmul_peak(dev, tdt, peak_n or (2048 if dev.type == "cpu" else 8192))
    if dev.type == "cuda":  # hand the probes' buffers back (available_bytes counts them anyway)
        torch.cuda.empty_cache()
    runner = ModelRunner.from_shape(
        shape, slots, device=dev, dtype=tdt, seed=seed, max_len=max_len, graphs=graphs
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
    """Measure one model on one device; returns the profile document (schema 1).

    ``rounds`` sweeps the whole grid that many times, ``reps`` repetitions of each step per
    round, and each point's statistics pool all of them. On a shared machine whose speed
    drifts by 20-30% over minutes (this project's CPU), one sweep puts a slow spell on a
    few neighbouring points and bends the interpolated curve; rounds spread every spell
    over the whole grid. ``graphs``: decode steps as CUDA graphs (default on CUDA, as the
    real executor runs them; each (rows, context) bucket is captured in its first warm-up).
    ``prefill_rows``: (rows, tokens) pairs, that many equal prompts prefilled in one pass
    (:meth:`StepTimer.prefill`): set beside single prompts of ``rows x tokens``
    tokens, they separate the cost of attention from the cost of positions (``ProfileCost``).
    ``partial``: called with the profile so far (``meta.partial`` true, points not yet
    measured null) at most every ``partial_every_s`` seconds and after each round, so that
    a run cut by a time limit keeps what it measured (a GPU session's stage)."""
    for name, n in (("rounds", rounds), ("reps", reps)):
        if not (isinstance(n, int) and n >= 1):
            raise ValueError(f"{name}={n!r}: must be an integer >= 1")
    dev, entry, tdt = target(device, dtype, "profiles are")  # no GPU is said before any length is checked
    shape = get_model(model)
    for name, vals in (("batches", batches), ("ctxs", ctxs), ("prefill_tokens", prefill_tokens)):
        if not vals or sorted(set(vals)) != list(vals) or vals[0] < (0 if name == "ctxs" else 1):
            raise ValueError(f"{name}={vals!r}: must be increasing and positive")
    for rows, tokens in prefill_rows:
        if not (isinstance(rows, int) and isinstance(tokens, int) and rows >= 2 and tokens >= 1):
            raise ValueError(f"prefill_rows ({rows!r}, {tokens!r}): need integers rows >= 2, tokens >= 1")
    max_len = max(
        [c * 3 // 2 + 2 for c in ctxs]
        + prefill_tokens
        + [t for t, _, _ in mixed]
        + [c + 1 for _, _, c in mixed]
        + [t for _, t in prefill_rows]
    )
    if max_len > shape.max_context:
        raise ValueError(f"a measured length of {max_len} exceeds {model}'s max_context={shape.max_context}")
    slots = max(batches + [r + 1 for _, r, _ in mixed] + [r for r, _ in prefill_rows])
    r = rig(
        dev,
        entry,
        tdt,
        shape,
        slots,
        max_len,
        bandwidth_bytes=bandwidth_bytes,
        peak_n=peak_n,
        seed=seed,
        graphs=graphs,
    )
    runner, bw, peak = r.runner, r.bw, r.peak
    weight_bytes = shape.with_dtype(REGISTRY_DTYPE[tdt]).weight_read_bytes
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

    def med(p: dict[str, float] | None) -> float | None:
        return None if p is None else p["median_ms"]

    def document(done: int) -> dict[str, Any]:
        # The profile document (schema 1) of the points measured so far.
        doc: dict[str, Any] = {
            "schema": PROFILE_SCHEMA,
            "meta": {
                "device": entry.name,
                "device_name": entry.device_name,
                "datasheet": entry.datasheet,
                "model": shape.name,
                "dtype": REGISTRY_DTYPE[tdt],
                "element_bytes": tdt.itemsize,
                "torch": torch.__version__,
                "threads": torch.get_num_threads(),
                "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                "gomp_spincount": os.environ.get("GOMP_SPINCOUNT"),
                "thp_mem_alloc": os.environ.get("THP_MEM_ALLOC_ENABLE"),
                "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
                "host": socket.gethostname(),
                "python": platform.python_version(),
                "params": shape.params,
                "weight_read_bytes": weight_bytes,
                "reps": reps,
                "rounds": rounds,
                "seed": seed,
                "token_buckets": runner.model.token_buckets(),
                "decode_graphs": runner.graphs_info(),
                "attention": runner.attention_backends(),
                "loadavg_before": r.load0,
                "slots": runner.slots,
                "max_len": runner.max_len,
                "loadavg_after": load_average(),
                "wall_s": time.perf_counter() - r.t0,
                "how": "python -m batching measure: synchronized wall clock around ModelRunner's packed forward "
                "pass; decode rows sit at the stated context in a zero-filled slab (no real prefill)",
            },
            "device": {"bandwidth": bw, "matmul_peak": peak},
            "decode": {
                "batch": batches,
                "ctx": ctxs,
                "ms": [[med(p) for p in row] for row in grid],
                "spread": grid,
            },
            "prefill": {"tokens": prefill_tokens, "ms": [med(p) for p in pre], "spread": pre},
            "mixed": {
                "prefill_tokens": [t for t, _, _ in mixed],
                "decode_rows": [r for _, r, _ in mixed],
                "decode_ctx": [c for _, _, c in mixed],
                "ms": [med(p) for p in mix],
                "spread": mix,
            },
        }
        if (spec := r.spec(REGISTRY_DTYPE[tdt])) is not None:  # a GPU the registry lacks
            doc["meta"]["device_spec"] = spec
        if prefill_rows:
            doc["prefill_rows"] = {
                "rows": [r for r, _ in prefill_rows],
                "tokens": [t for _, t in prefill_rows],
                "ms": [med(p) for p in prows],
                "spread": prows,
            }
        if done < len(points) * rounds:
            doc["meta"]["partial"] = True
            doc["meta"]["points_done"] = done
            doc["meta"]["points"] = len(points) * rounds
        return doc

    last = time.perf_counter()
    for n, (kind, i, j) in enumerate(_progress(points * rounds, f"{rounds} round(s)", progress), 1):
        if kind == "decode":
            grid[i][j] = timer.decode(batches[i], ctxs[j])  # pooled over the rounds so far
        elif kind == "prefill":
            pre[i] = timer.prefill(prefill_tokens[i])
        elif kind == "prefill_rows":
            rows, tokens = prefill_rows[i]
            prows[i] = timer.prefill(tokens, rows)
        else:
            mix[i] = timer.mixed(*mixed[i])
        end_of_round = n % len(points) == 0
        if (
            partial is not None
            and n < len(points) * rounds
            and (end_of_round or time.perf_counter() - last >= partial_every_s)
        ):
            partial(document(n))
            last = time.perf_counter()
    return document(len(points) * rounds)
