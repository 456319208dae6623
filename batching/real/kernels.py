"""How a CPU model multiplies by its weights, chosen by timing the candidates on this machine.

A decode step streams every weight once whatever its batch, so long as the kernel that
multiplies them does: on CPUs the library kernels differ by an order of magnitude on the same
shapes, and which one wins depends on the machine (AVX-512 BF16 and AMX make bf16 the fast
dtype on a recent Intel CPU; an AMD EPYC without them runs bf16 several times slower than
fp32) and on the number of rows. So a model's linear layers are timed once per machine
(:func:`probe`, cached on disk per machine, torch version and shapes), and each bucket of
rows gets the fastest path (:func:`choose`, deterministic given the timings):

* ``aten``: ``F.linear(x, W)`` (MKL or oneDNN, as torch dispatches it);
* ``wx``: ``(W @ x.T).T``, which keeps MKL's fp32 product flat to about 4 rows where
  ``F.linear`` doubles from 1 to 2 (214 MB of fp32 weights on the project's AMD EPYC:
  15.4 / 14.5 / 14.9 ms at 1 / 2 / 4 rows, against 14.9 / 29.4 / 48.1 ms);
* ``split`` (one row only): the transposed weight split one piece per thread, one ``bmm``,
  summed (MKL runs a one-row product on a single thread);
* ``dnnl``: oneDNN with the weight reordered once into its blocked layout (what
  ``torch.compile``'s CPU freezing does), AMX tiles where the CPU has them.

A bucket may also run padded to a larger row count when that is faster, so a step never
costs more than a bigger one (the batch-1 path is never slower than batch 2). The dtype
(``auto``: fp32 or bf16) is the one whose chosen paths are faster over the probe's row
counts, each weighted alike (a geometric mean). On CUDA nothing is probed: ``F.linear``.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor

from ..costs.models import ModelShape, dtype_key
from ..results import busy_cpu_s
from .hardware import cpu_flags, device_name

#: Every path, in the order a tie goes (the plainest first).
PATHS = ("aten", "wx", "split", "dnnl")
#: The paths that multiply by a form of the weights made once (:func:`prepare`), not the weights.
FORM_PATHS = ("split", "dnnl")
#: Row counts the probe times. A step of T rows is in the bucket of the smallest probe row count
#: >= T and, up to :data:`PAD_MAX`, runs padded to it (MKL's fp32 product is slow at odd row
#: counts: cpu-m steps of 3 rows 55.6 ms against 38.9 for 4); above, unpadded.
PROBE_ROWS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512)
#: The largest bucket that pads its steps to its own row count.
PAD_MAX = 128
#: A bucket runs padded to a larger probe row count only when that is faster by this factor:
#: the probe's noise (a few percent) must not make a step pay for rows it does not need.
PAD_MARGIN = 0.95
#: ... and to at most this many times its rows: a kernel that is faster on twice the rows
#: exists (oneDNN's bf16 one-row product here: 4.7 ms against 4.8 for 2 rows, and up to 7
#: ms), one faster on many times the rows is a probe disturbed by another process.
PAD_FACTOR = 2
#: Cores other processes may keep busy during a probe before it counts as disturbed: a
#: 2-thread product then stalls for milliseconds whenever a thread is descheduled, and its
#: timings say nothing of this machine. A disturbed probe is used but never cached.
PROBE_MAX_OTHERS = 0.3
#: The probe's weights: the model's own matrices, layer by layer up to this many bytes per
#: dtype (more than any CPU's last-level cache, so that they stream from memory as the model's do).
PROBE_BYTES = 512 * 2**20
#: Torch dtypes by the names plans and profiles record.
DTYPES: dict[str, torch.dtype] = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp64": torch.float64}
#: Bumped when the probe or the choice changes meaning: older cache files are ignored.
PROBE_VERSION = 1


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of ``name``, spelled as the registry, plans and profiles spell it
    (``fp32``, ``bf16``, ``fp64``) or as torch does (``float32``, ``bfloat16``, ``float64``)."""
    try:
        return DTYPES[dtype_key(name)]
    except KeyError:
        raise ValueError(f"dtype={name!r}: must be one of {', '.join(DTYPES)}") from None


def dtype_name(dtype: torch.dtype) -> str:
    """``fp32``, ``bf16`` or ``fp64``."""
    for name, dt in DTYPES.items():
        if dt == dtype:
            return name
    raise ValueError(f"dtype={dtype}: CPU kernels are chosen for fp32, bf16 or fp64")


def split_ways(in_features: int, threads: int) -> int:
    """Pieces a one-row product splits its input into: up to one per thread, dividing
    ``in_features`` evenly."""
    return max(s for s in range(1, max(threads, 1) + 1) if in_features % s == 0)


def dnnl_available(dtype: torch.dtype) -> bool:
    """Whether oneDNN's prepacked linear runs ``dtype`` here (bf16 needs AVX-512 BF16 or AMX:
    oneDNN refuses it on, say, an AMD EPYC with AVX2)."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    if dtype == torch.bfloat16:
        return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return True


def paths_for(dtype: torch.dtype) -> tuple[str, ...]:
    """The candidate paths of ``dtype`` on this machine."""
    return tuple(p for p in PATHS if p != "dnnl" or dnnl_available(dtype))


# ------------------------------------------------------------------------------ the forms
def prepare(path: str, w: Tensor) -> Tensor:
    """What ``path`` multiplies by, made once from ``w`` [out, in]: ``w`` itself, its transpose
    [in, out] (``split``) or oneDNN's reordered copy (``dnnl``)."""
    if path == "split":
        return w.T.contiguous()
    if path == "dnnl":
        return torch.ops.mkldnn._reorder_linear_weight(w, None)
    return w


def apply(path: str, x: Tensor, w: Tensor, form: Tensor) -> Tensor:
    """x [T, in] times ``w`` [out, in] transposed -> [T, out], by ``path`` (``form``: its
    :func:`prepare` of ``w``). Contiguous: the next product's fast path needs row-major input."""
    if path == "aten":
        return F.linear(x, w)
    if path == "wx":
        return (w @ x.T).T.contiguous()
    if path == "dnnl":
        return torch.ops.mkldnn._linear_pointwise(x, form, None, "none", [], "")
    if path == "split":
        if x.shape[0] != 1:
            raise ValueError(f"path 'split' multiplies one row, not {x.shape[0]}")
        n, out = form.shape
        s = split_ways(n, torch.get_num_threads())
        if s == 1:
            return x @ form
        # [s, 1, in/s] @ [s, in/s, out] -> [s, 1, out], a piece per thread; summed -> [1, out]
        return torch.bmm(x.reshape(s, 1, n // s), form.view(s, n // s, out)).sum(0)
    raise ValueError(f"path={path!r}: must be one of {', '.join(PATHS)}")


# ------------------------------------------------------------------------------ the plan
@dataclass(frozen=True)
class Bucket:
    """Steps of up to ``rows`` rows (above the previous bucket's) run ``path`` on ``run_rows``
    rows: padded with zero rows to that many, or, where it is 0, on their own count."""

    rows: int
    path: str
    run_rows: int


@dataclass(frozen=True)
class LinearPlan:
    """The path of each bucket of rows for one dtype; steps above the last bucket run its path
    unpadded. ``source``: ``probe`` (timed in this process), ``cache`` (a probe of this machine
    read from disk), ``fixed`` (not timed: a GPU, float64, or asked for). ``ms``: the probe's
    timings it was chosen from, {dtype: {path: {rows: ms}}}; ``choice``: why this dtype."""

    dtype: str
    buckets: tuple[Bucket, ...]
    source: str = "fixed"
    ms: Mapping[str, Mapping[str, Mapping[int, float]]] | None = field(default=None, compare=False)
    dtype_reason: str = "asked for"
    #: Each probed dtype's chosen cost, the geometric mean over the row counts (ms per pass
    #: over the linear layers): what ``auto`` compared; empty where nothing was probed.
    geomean_ms: Mapping[str, float] = field(default_factory=dict, compare=False)

    @classmethod
    def fixed(cls, path: str = "aten", dtype: str = "fp32") -> LinearPlan:
        """One path at every row count (``split`` at one row, ``wx`` elsewhere), unpadded."""
        if path not in PATHS:
            raise ValueError(f"path={path!r}: must be one of {', '.join(PATHS)}")
        if path == "split":
            return cls(dtype, (Bucket(1, "split", 0), Bucket(2, "wx", 0)))
        return cls(dtype, (Bucket(1, path, 0),))

    def lookup(self, rows: int) -> tuple[str, int]:
        """(path, rows to run on) of a step of ``rows`` rows."""
        for b in self.buckets:
            if rows <= b.rows:
                return b.path, max(rows, b.run_rows)
        return self.buckets[-1].path, rows

    @property
    def form_paths(self) -> tuple[str, ...]:
        """The paths some bucket runs that multiply by a form of the weights (:func:`prepare`)."""
        return tuple(p for p in self.paths if p in FORM_PATHS)

    @property
    def paths(self) -> tuple[str, ...]:
        """The paths some bucket runs, in :data:`PATHS` order."""
        used = {b.path for b in self.buckets}
        return tuple(p for p in PATHS if p in used)

    def token_buckets(self) -> list[int] | None:
        """Row counts a step runs on (the rest are padded up to the next; ``ProfileCost``
        reads a measured step of T rows at its bucket); None: nothing is padded."""
        if all(b.run_rows == 0 for b in self.buckets):
            return None
        top = max(b.run_rows for b in self.buckets)
        return [t for t in range(1, top + 1) if self.lookup(t)[1] == t]

    def describe(self) -> str:
        """One line: ``bf16: dnnl (1 row as 2), ...`` (what results and pages record)."""
        parts, lo = [], 1
        for b in self.buckets:
            span = f"{lo}" if lo == b.rows else f"{lo}-{b.rows}"
            pad = f" as {b.run_rows}" if b.run_rows > b.rows else ""
            parts.append(f"{span}{pad}: {b.path}")
            lo = b.rows + 1
        return f"{self.dtype}; rows " + ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """The record every profile and result keeps (``meta.kernels``, the executor's ``kernels``)."""
        return {
            "dtype": self.dtype,
            "dtype_reason": self.dtype_reason,
            "source": self.source,
            "buckets": [[b.rows, b.path, b.run_rows] for b in self.buckets],
            "describe": self.describe(),
            "geomean_ms": dict(self.geomean_ms),
        }


def choose_paths(
    ms: Mapping[str, Mapping[int, float]], dtype: str
) -> tuple[tuple[Bucket, ...], dict[int, float]]:
    """The buckets of one dtype from its timings {path: {rows: ms}}, and each bucket's cost.

    Each probe row count takes its fastest path (ties: :data:`PATHS` order); a bucket runs
    padded to a larger row count, up to :data:`PAD_FACTOR` times its own, where that is
    faster by more than the probe's noise (:data:`PAD_MARGIN`): a step then never costs more
    than one of up to twice its rows. Steps up to :data:`PAD_MAX` rows pad to their bucket."""
    rows = sorted({r for per in ms.values() for r in per})
    if not rows:
        raise ValueError(f"no timings for {dtype}")
    best: dict[int, tuple[float, str]] = {}
    for r in rows:
        cands = [(ms[p][r], PATHS.index(p), p) for p in PATHS if p in ms and r in ms[p]]
        if not cands:
            raise ValueError(f"{dtype}: no path timed at {r} rows")
        t, _, p = min(cands)
        best[r] = (t, p)
    cost: dict[int, float] = {}
    chosen: dict[int, tuple[str, int]] = {}
    for i, r in enumerate(rows):
        t, p = best[r]
        reach = [q for q in rows[i:] if q <= PAD_FACTOR * r]
        low = min(best[q][0] for q in reach)
        # The smallest row count at or above r (within PAD_FACTOR) near the cheapest there.
        q = next(q for q in reach if best[q][0] * PAD_MARGIN <= low)
        pad = q > r and best[q][0] < t * PAD_MARGIN
        chosen[r] = (best[q][1], q) if pad else (p, r)
        cost[r] = best[q][0] if pad else t
    buckets = []
    for r in rows:
        p, run = chosen[r]
        buckets.append(Bucket(r, p, run if (run > r or r <= PAD_MAX) else 0))
    return tuple(buckets), cost


def choose(
    ms: Mapping[str, Mapping[str, Mapping[int, float]]], dtype: str | None = None, source: str = "probe"
) -> LinearPlan:
    """The plan of ``dtype`` (None: the faster of the timed dtypes, by the geometric mean of
    their chosen costs over the row counts both were timed at) from timings
    {dtype: {path: {rows: ms}}}. Deterministic: the same timings give the same plan."""
    if dtype is not None and dtype not in ms:
        raise ValueError(f"dtype={dtype!r}: not probed (probed: {', '.join(ms)})")
    costs = {d: choose_paths(per, d) for d, per in ms.items()}
    if not costs:
        raise ValueError("no timings to choose from")
    common = sorted(set.intersection(*(set(c) for _, c in costs.values())))
    if not common:
        raise ValueError("the dtypes were timed at no common row count")

    def geo(d: str) -> float:
        return math.exp(statistics.fmean(math.log(max(costs[d][1][r], 1e-9)) for r in common))

    gms = {d: geo(d) for d in costs}
    if dtype is not None:
        return LinearPlan(dtype, costs[dtype][0], source, ms, "asked for", gms)
    order = sorted(costs, key=lambda d: (gms[d], d != "fp32"))  # a tie keeps fp32
    pick = order[0]
    reason = (
        f"faster here: {gms[pick]:.3g} ms against {gms[order[1]]:.3g} ms ({order[1]}), geometric "
        f"mean over {common[0]}-{common[-1]} rows"
        if len(order) > 1
        else "the only dtype probed"
    )
    return LinearPlan(pick, costs[pick][0], source, ms, reason, gms)


# ------------------------------------------------------------------------------ the probe
def linear_shapes(shape: ModelShape) -> list[tuple[int, int]]:
    """[out, in] of one layer's matrices as the model stores them (q, k, v in one; gate and
    up in one), as ``Llama.linear_weights`` lists them."""
    d, H, K, D = shape.hidden, shape.heads, shape.kv_heads, shape.head_dim
    return [((H + 2 * K) * D, d), (d, H * D), (2 * shape.ffn, d), (d, shape.ffn)]


def probe_weights(shape: ModelShape, dtype: torch.dtype, seed: int = 0) -> list[Tensor]:
    """The model's matrices, layer by layer up to :data:`PROBE_BYTES` (at least one layer),
    then its head: random, but of the size that streams like the model's."""
    per_layer = sum(o * i for o, i in linear_shapes(shape)) * dtype.itemsize
    layers = max(1, min(shape.layers, PROBE_BYTES // max(per_layer, 1)))
    g = torch.Generator().manual_seed(seed)
    ws = [torch.randn(o, i, generator=g).to(dtype) for _ in range(layers) for o, i in linear_shapes(shape)]
    return ws + [torch.randn(shape.vocab, shape.hidden, generator=g).to(dtype)]


def probe(
    shape: ModelShape,
    dtypes: Sequence[torch.dtype],
    rows: Sequence[int] = PROBE_ROWS,
    rounds: int = 3,
    clock: Callable[[], float] = time.perf_counter,
) -> dict[str, dict[str, dict[int, float]]]:
    """Milliseconds of one pass over the model's linear layers (:func:`probe_weights`) for each
    dtype, candidate path and row count: the fastest of ``rounds`` passes (another process
    only ever adds time), the paths taking turns within each round."""
    return {dtype_name(dt): _probe_dtype(shape, dt, rows, rounds, clock) for dt in dtypes}


def own_cpu_s() -> float:
    """CPU seconds this process has spent (all its threads)."""
    return time.process_time()


@torch.inference_mode()
def _probe_dtype(
    shape: ModelShape, dt: torch.dtype, rows: Sequence[int], rounds: int, clock: Callable[[], float]
) -> dict[str, dict[int, float]]:
    ws = probe_weights(shape, dt)
    paths = paths_for(dt)
    forms = {p: [prepare(p, w) for w in ws] for p in paths if p in FORM_PATHS}
    g = torch.Generator().manual_seed(1)
    widths = sorted({w.shape[1] for w in ws})
    xs = {r: {n: torch.randn(r, n, generator=g).to(dt) for n in widths} for r in rows}
    points = [(p, r) for r in rows for p in paths if p != "split" or r == 1]

    def once(p: str, r: int) -> float:
        t0 = clock()
        for w, fw in zip(ws, forms.get(p, ws)):
            apply(p, xs[r][w.shape[1]], w, fw)
        return clock() - t0

    for p, r in points:  # warm-up: first calls pay for oneDNN's kernel generation
        once(p, r)
    times: dict[tuple[str, int], list[float]] = {pt: [] for pt in points}
    for _ in range(rounds):
        for p, r in points:
            times[(p, r)].append(once(p, r))
    out: dict[str, dict[int, float]] = {}
    for (p, r), ts in times.items():
        out.setdefault(p, {})[r] = min(ts) * 1e3
    return out


# ------------------------------------------------------------------------------ the cache
def machine_key(shape: ModelShape) -> dict[str, Any]:
    """What a cached probe is valid for: the CPU (model name, flags, torch's threads), torch's
    version and the model's matrix shapes."""

    return {
        "probe_version": PROBE_VERSION,
        "cpu": device_name(torch.device("cpu")),
        "flags": cpu_flags(),
        "threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "shapes": [list(s) for s in linear_shapes(shape)] + [[shape.vocab, shape.hidden]],
        "layers": shape.layers,
    }


def user_cache(name: str, env: str) -> Path:
    """``$env``, else ``~/.cache/batching/<name>`` (``$XDG_CACHE_HOME``): where this machine's
    measured or built kernels are kept."""
    if os.environ.get(env):
        return Path(os.environ[env])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "batching" / name


def cache_dir() -> Path:
    """The probes' cache: ``$BATCHING_KERNEL_CACHE``, else ``~/.cache/batching/kernels``."""
    return user_cache("kernels", "BATCHING_KERNEL_CACHE")


_MEMO: dict[str, dict[str, dict[str, dict[int, float]]]] = {}


def _digest(key: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:16]


def timings(shape: ModelShape, dtypes: Sequence[torch.dtype]) -> tuple[dict[str, Any], str]:
    """This machine's timings of ``shape`` in ``dtypes`` and where they came from (``probe``
    or ``cache``): read from the cache when a probe of this machine, torch and shapes is
    there, else probed and written (a cache that cannot be written is skipped)."""
    key = machine_key(shape)
    digest = _digest(key)
    names = [dtype_name(d) for d in dtypes]
    have = _MEMO.get(digest, {})
    source = "cache"
    path = cache_dir() / f"{digest}.json"
    if not all(n in have for n in names):
        try:
            doc = json.loads(path.read_text())
            if doc.get("key") == key:
                have = {
                    d: {p: {int(r): float(v) for r, v in per.items()} for p, per in paths.items()}
                    for d, paths in doc["ms"].items()
                }
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass
    missing = [d for d, n in zip(dtypes, names) if n not in have]
    if missing:
        busy0, own0, t0 = busy_cpu_s(), own_cpu_s(), time.perf_counter()
        have = {**have, **probe(shape, missing)}
        elapsed = time.perf_counter() - t0
        busy1, own = busy_cpu_s(), own_cpu_s() - own0
        others = None if busy0 is None or busy1 is None else max(0.0, busy1 - busy0 - own) / elapsed
        source = "probe"
        # Judged over a second or more (/proc/stat counts in 10 ms ticks); shorter probes (tiny
        # models) are too short to tell, and too short to matter.
        if others is not None and elapsed >= 1.0 and others > PROBE_MAX_OTHERS:
            source = f"probe, disturbed: other processes kept {others:.1f} cores busy; not cached"
            _MEMO[digest] = have
            return {n: have[n] for n in names}, source
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".tmp{os.getpid()}")
            tmp.write_text(json.dumps({"key": key, "ms": have}, indent=1))
            tmp.replace(path)
        except OSError:
            pass
    _MEMO[digest] = have
    return {n: have[n] for n in names}, source


def forget(shape: ModelShape) -> None:
    """Drop this machine's probe of ``shape`` (memory and disk): the next plan probes anew."""
    digest = _digest(machine_key(shape))
    _MEMO.pop(digest, None)
    (cache_dir() / f"{digest}.json").unlink(missing_ok=True)


def plan_for(shape: ModelShape, device: torch.device | str, dtype: torch.dtype | str | None) -> LinearPlan:
    """The plan a model of ``shape`` runs on ``device``: ``F.linear`` on CUDA and in float64;
    on a CPU, probed (cached) for ``dtype``, or for fp32 and bf16 where ``dtype`` is ``auto``
    (or None), the faster of the two chosen."""
    dev = torch.device(device)
    if isinstance(dtype, str) and dtype != "auto":
        dtype = DTYPES.get(dtype_key(dtype)) or _bad_dtype(dtype)
    if dev.type != "cpu":
        return LinearPlan.fixed("aten", dtype_name(dtype) if isinstance(dtype, torch.dtype) else "bf16")
    if dtype == torch.float64:
        return LinearPlan.fixed("aten", "fp64")
    if dtype in (None, "auto"):
        ms, source = timings(shape, [torch.float32, torch.bfloat16])
        return choose(ms, None, source)
    assert isinstance(dtype, torch.dtype)
    ms, source = timings(shape, [dtype])
    return choose(ms, dtype_name(dtype), source)


def _bad_dtype(dtype: str) -> torch.dtype:
    raise ValueError(f"dtype={dtype!r}: must be auto, fp32, bf16 or fp64")
