"""Decode steps as CUDA graphs (the runner's fast path on a GPU).

Run eagerly, an 8B decode step on an H200 is ~650 kernel launches from Python at ~10-15 us
each for ~4 ms of weight streaming: the step measures the host, not bandwidth. A CUDA
graph records the step's kernels once and replays them with one launch (as vLLM and
SGLang do for every decode batch size).

A graph replays fixed shapes at fixed addresses, so a step is fitted to a bucket:

- rows: padded to :func:`batch_bucket` of its rows *and of its highest slot + 1*; padding
  rows decode :data:`~batching.real.model.PAD_ID` into a scratch slab no request owns, and
  their logits are dropped;
- context: attention reads every slab up to :func:`ctx_bucket` of the longest context and
  masks each row's tail;
- slabs: a bucket of ``R`` rows reads slabs ``0 .. R-1`` as one view, each row's query at
  its slot, so what a step reads never depends on how many slots the runner has (the
  schedulers fill the lowest free slot, so the highest slot stays close to the batch size).

Only decode-only plans replay graphs. A bucket is captured on first use or by the warm-up
(:meth:`DecodeGraphs.capture_all`); one whose capture fails is recorded and runs eagerly.
With ``capture=False`` (CPU) the same fixed-shape step runs eagerly, which is how the tests
check it against the eager path.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .cache import SlabCache
from .model import PAD_ID, Llama, gqa_decode

#: Rows of the largest batch bucket below which buckets double (1, 2, 4, 8), then steps of 8
#: (16, 24, 32, ...), as vLLM's capture sizes: padding 17 rows to 24 costs little where the
#: step streams weights, and the number of graphs stays small.
BATCH_STEP = 8
#: Context buckets: powers of two from 64 to 1024, then multiples of 512. Reading up to
#: the bucket wastes at most half of a short context's slab reads (a small share of a
#: weight-bound step) and at most 511 positions of a long one.
CTX_MIN, CTX_POW2_MAX, CTX_STEP = 64, 1024, 512


def batch_bucket(rows: int, limit: int) -> int:
    """Rows a decode step of ``rows`` rows replays (see module doc); ``limit`` caps it (the slots)."""
    if rows < 1 or rows > limit:
        raise ValueError(f"rows={rows}: a decode graph holds 1..{limit} rows")
    b = 1 if rows == 1 else 2 if rows == 2 else 4 if rows <= 4 else -(-rows // BATCH_STEP) * BATCH_STEP
    return min(b, limit)


def ctx_bucket(length: int, limit: int) -> int:
    """Positions a decode graph's attention reads for a longest context of ``length``; ``limit`` caps it (the slab)."""
    if length < 1 or length > limit:
        raise ValueError(f"length={length}: a decode graph reads 1..{limit} positions")
    if length <= CTX_POW2_MAX:
        b = max(CTX_MIN, 1 << (length - 1).bit_length())
    else:
        b = -(-length // CTX_STEP) * CTX_STEP
    return min(b, limit)


class GraphCaptureError(RuntimeError):
    """Capturing a decode graph failed; that bucket's steps then run eagerly, and it is recorded."""


@dataclass
class _Graph:
    """One bucket: its static input [4, rows] (ids, positions, the slots written, the slots
    the queries sit at), its static output logits [rows, V] and its ``torch.cuda.CUDAGraph``
    (both None where nothing is captured: CPU, tests)."""

    inp: Tensor
    logits: Tensor | None
    graph: Any


class DecodeGraphs:
    """Fixed-shape decode steps over one model and its slab cache, replayed as CUDA graphs.
    It holds the model and the cache, not the runner: no reference cycle keeps a dropped
    runner's memory alive until a garbage collection."""

    def __init__(self, model: Llama, cache: SlabCache, capture: bool) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {model.device}")
        if cache.scratch is None:
            raise ValueError("decode graphs need a cache with a scratch slab (SlabCache(scratch=True))")
        self.model, self.cache, self.capture = model, cache, capture
        self.scratch: int = cache.scratch  # the extra slab padding rows write into
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.failed: dict[tuple[int, int], str] = {}  # buckets whose capture failed, and why
        self.eager_steps = 0  # decode-only steps that ran eagerly because their bucket failed
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0

    @property
    def keys(self) -> list[tuple[int, int]]:
        """The (rows, context) buckets made so far (captured, or on a CPU prepared)."""
        return sorted(self._graphs)

    def _step(self, inp: Tensor, length: int) -> Tensor:
        """The fixed-shape step: inp [4, R] (ids, positions, slots written, query slots: a
        permutation of 0..R-1) -> logits [R, V], reading slabs 0..R-1 up to ``length``."""
        m, c = self.model, self.cache
        ids, pos, slot, qslot = inp[0], inp[1], inp[2], inp[3]
        R = inp.shape[1]
        # The position each view row's query has: view row qslot[i] holds row i.
        vpos = torch.zeros(R, dtype=pos.dtype, device=m.device).index_copy_(0, qslot, pos)  # [R]
        seen = torch.arange(length, device=m.device)[None, :] <= vpos[:, None]  # [R, L]
        # Additive, made once per step: a boolean mask is converted inside every layer's SDPA call.
        bias = torch.zeros(seen.shape, dtype=m.dtype, device=m.device).masked_fill_(~seen, float("-inf"))
        mask = bias[:, None, None, :]  # [R, 1, 1, L]

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            kc, vc = c.layers[layer]  # [S+1, K, max_len, D]
            kc[slot, :, pos] = k  # k [R, K, D]
            vc[slot, :, pos] = v
            qs = torch.empty_like(q).index_copy_(0, qslot, q)  # [R, H, D], in slot order
            o = gqa_decode(
                qs, kc.narrow(0, 0, R).narrow(2, 0, length), vc.narrow(0, 0, R).narrow(2, 0, length), mask
            )
            return o.index_select(0, qslot)  # [R, H, D], in row order

        return m(ids, pos, attend)

    def _make(self, rows: int, length: int) -> _Graph:
        """A bucket's static input and, on CUDA, its captured graph."""
        # Capture-time inputs are padding rows: warm-up and capture write only the scratch slab.
        inp = self._inputs([], [], [], rows).to(self.model.device)
        if not self.capture:
            return _Graph(inp, None, None)
        try:
            g, logits = self._capture(lambda: self._step(inp, length))
        except RuntimeError as e:  # an op that cannot be captured, or out of memory
            raise GraphCaptureError(
                f"capturing the decode graph of {rows} rows x {length} positions failed: {e}"
            ) from e
        self.captures += 1
        return _Graph(inp, logits, g)

    def _capture(self, step: Callable[[], Tensor]) -> tuple[Any, Tensor]:
        """Record ``step``'s kernels as a CUDA graph: (the graph, its static output)."""
        dev = self.model.device
        # Warm-up on a side stream before capturing (lazy cuBLAS/allocator set-up must not
        # be recorded), as torch.cuda.graphs' documentation does.
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        # One memory pool for every bucket: steps never run concurrently, and each
        # replay's logits are copied out before the next replay.
        with torch.cuda.graph(g, pool=self._pool):
            out = step()
        return g, out

    def _inputs(self, ids: list[int], pos: list[int], slot: list[int], rows: int) -> Tensor:
        """[4, rows]: the step's rows, then padding rows (PAD_ID at distinct positions of the
        scratch slab, their queries at the slots 0..rows-1 the real rows leave free)."""
        n = len(ids)
        out = np.empty((4, rows), dtype=np.int64)
        out[0, :n], out[1, :n], out[2, :n], out[3, :n] = ids, pos, slot, slot
        out[0, n:] = PAD_ID
        out[1, n:] = np.arange(n, rows) % self.cache.max_len
        out[2, n:] = self.scratch
        free = np.ones(rows, dtype=bool)
        free[slot] = False
        out[3, n:] = np.flatnonzero(free)
        return torch.from_numpy(out)

    def graph(self, rows: int, length: int) -> _Graph | None:
        """The bucket's graph, captured on first use; None if its capture failed (then its
        steps run eagerly: warned once, recorded in :meth:`info`)."""
        key = (rows, length)
        if key in self.failed:
            return None
        if key not in self._graphs:
            try:
                self._graphs[key] = self._make(rows, length)
            except GraphCaptureError as e:
                self.failed[key] = str(e)
                warnings.warn(f"{e}; steps of this bucket run eagerly", RuntimeWarning, stacklevel=3)
                return None
        return self._graphs[key]

    def capture_all(self, max_rows: int | None = None, max_ctx: int | None = None) -> int:
        """Make every bucket of up to ``max_rows`` rows (default: the slots) and ``max_ctx``
        positions (default: the slab), skipping failures; returns how many graphs exist."""
        c = self.cache
        top_r = c.slots if max_rows is None else max(1, min(max_rows, c.slots))
        top_n = c.max_len if max_ctx is None else max(1, min(max_ctx, c.max_len))
        rows = sorted({batch_bucket(b, c.slots) for b in range(1, top_r + 1)})
        lens = sorted({ctx_bucket(n, c.max_len) for n in range(1, top_n + 1)})
        # Largest first, as vLLM captures: the shared pool is then sized by the largest step.
        for b, n in sorted(((b, n) for b in rows for n in lens), reverse=True):
            self.graph(b, n)
        return len(self._graphs)

    def run(self, ids: list[int], pos: list[int], slot: list[int]) -> Tensor | None:
        """One decode-only step (rows in any slot order): logits [len(ids), V], or None if
        its bucket's capture failed (the caller runs the step eagerly)."""
        n = len(ids)
        # The rows bucket holds the rows and every slot up to the highest (module doc, "slabs").
        rows = batch_bucket(max(n, max(slot) + 1), self.cache.slots)
        length = ctx_bucket(max(pos) + 1, self.cache.max_len)
        g = self.graph(rows, length)
        if g is None:
            self.eager_steps += 1
            return None
        g.inp.copy_(self._inputs(ids, pos, slot, rows))
        if g.graph is None:
            return self._step(g.inp, length)[:n]
        g.graph.replay()
        assert g.logits is not None  # captured with the graph
        # A copy: the next replay overwrites the graph's output (a few MB at most).
        return g.logits[:n].clone()

    def info(self) -> dict[str, Any]:
        """What the graphs did, for results' executor records and profiles' metadata (the
        failed buckets as ``"ROWSxCTX": error``)."""
        return {
            "captured": self.captures,
            "replayed_as_graphs": self.capture,
            "buckets": [list(k) for k in self.keys],
            "failed": {f"{r}x{n}": e for (r, n), e in sorted(self.failed.items())},
            "eager_steps": self.eager_steps,
        }
