"""Decode-only steps as CUDA graphs (the runner's fast path on a GPU).

Eagerly, an 8B decode step on an H200 is ~650 kernel launches from Python at ~10-15 us each
for ~4 ms of weight streaming: the step measures the host. A graph replays them in one launch
(as vLLM and SGLang do), at fixed shapes, so a step is fitted to a bucket:

- rows: :func:`batch_bucket` of its rows *and of its highest slot + 1*; padding rows decode
  :data:`~batching.real.model.PAD_ID` into a scratch slab no request owns, logits dropped;
- context: every slab read up to :func:`ctx_bucket` of the longest context, tails masked;
- slabs: ``R`` rows read slabs ``0 .. R-1`` as one view, each query at its slot, so what a
  step reads does not depend on the runner's slots (the lowest free slot fills first).

A bucket is captured on first use or by :meth:`DecodeGraphs.capture_all`; one whose capture
fails is recorded and runs eagerly. With ``capture=False`` (CPU) the fixed-shape step runs
eagerly, which is how the tests check it against the eager path.
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

#: Row buckets double up to this (1, 2, 4, 8), then step by it (16, 24, ...), as vLLM's capture
#: sizes: padding 17 rows to 24 costs little in a weight-streaming step, and graphs stay few.
BATCH_STEP = 8
#: Context buckets: powers of two from 64 to 1024, then multiples of 512: at most half a short
#: context's slab reads wasted (little of a weight-bound step), at most 511 positions of a long one.
CTX_MIN, CTX_POW2_MAX, CTX_STEP = 64, 1024, 512


def batch_bucket(rows: int, limit: int) -> int:
    """Rows a decode step of ``rows`` rows replays, at most ``limit`` (the slots)."""
    if rows < 1 or rows > limit:
        raise ValueError(f"rows={rows}: a decode graph holds 1..{limit} rows")
    b = 1 if rows == 1 else 2 if rows == 2 else 4 if rows <= 4 else -(-rows // BATCH_STEP) * BATCH_STEP
    return min(b, limit)


def ctx_bucket(length: int, limit: int) -> int:
    """Positions a decode graph reads for a longest context of ``length``, at most ``limit`` (the slab)."""
    if length < 1 or length > limit:
        raise ValueError(f"length={length}: a decode graph reads 1..{limit} positions")
    if length <= CTX_POW2_MAX:
        b = max(CTX_MIN, 1 << (length - 1).bit_length())
    else:
        b = -(-length // CTX_STEP) * CTX_STEP
    return min(b, limit)


class GraphCaptureError(RuntimeError):
    """Capturing a decode graph failed (that bucket then runs eagerly, recorded)."""


@dataclass
class _Graph:
    """One bucket: static input [4, rows] (ids, positions, slots written, query slots), static
    logits [rows, V] and its ``torch.cuda.CUDAGraph`` (both None where nothing is captured)."""

    inp: Tensor
    logits: Tensor | None
    graph: Any


class DecodeGraphs:
    """Fixed-shape decode steps over a model and its slab cache, replayed as CUDA graphs. It
    holds no runner: no reference cycle keeps a dropped runner's memory alive until a GC."""

    def __init__(self, model: Llama, cache: SlabCache, capture: bool) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {model.device}")
        if cache.scratch is None:
            raise ValueError("decode graphs need a cache with a scratch slab (SlabCache(scratch=True))")
        self.model, self.cache, self.capture = model, cache, capture
        self.scratch: int = cache.scratch
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self.failed: dict[tuple[int, int], str] = {}  # bucket -> why its capture failed
        self.eager_steps = 0  # steps of failed buckets
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0

    @property
    def keys(self) -> list[tuple[int, int]]:
        """The (rows, context) buckets made so far."""
        return sorted(self._graphs)

    def _step(self, inp: Tensor, length: int) -> Tensor:
        """inp [4, R] (ids, positions, slots written, query slots: a permutation of 0..R-1) ->
        logits [R, V], reading slabs 0..R-1 up to ``length``."""
        m, c = self.model, self.cache
        ids, pos, slot, qslot = inp[0], inp[1], inp[2], inp[3]
        R = inp.shape[1]
        vpos = torch.zeros(R, dtype=pos.dtype, device=m.device).index_copy_(0, qslot, pos)  # [R]
        seen = torch.arange(length, device=m.device)[None, :] <= vpos[:, None]  # [R, L]
        # Additive, once per step: SDPA converts a boolean mask in every layer.
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
        """A bucket's static input and, on CUDA, its graph; captured on padding rows, which write
        only the scratch slab."""
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
        """``step``'s kernels as a CUDA graph, and its static output."""
        dev = self.model.device
        # Warm up on a side stream first: lazy cuBLAS/allocator set-up must not be recorded.
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(s):
            for _ in range(2):
                step()
        torch.cuda.current_stream(dev).wait_stream(s)
        g = torch.cuda.CUDAGraph()
        # One pool for all buckets: steps never overlap, and logits are copied out per replay.
        with torch.cuda.graph(g, pool=self._pool):
            out = step()
        return g, out

    def _inputs(self, ids: list[int], pos: list[int], slot: list[int], rows: int) -> Tensor:
        """[4, rows]: the step's rows, then padding rows (PAD_ID at distinct scratch positions,
        queries at the slots the real rows leave free)."""
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
        """The bucket's graph, captured on first use; None if that failed (warned once, recorded)."""
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
        """Make every bucket up to ``max_rows`` rows and ``max_ctx`` positions (default: all),
        skipping failures; returns how many exist."""
        c = self.cache
        top_r = c.slots if max_rows is None else max(1, min(max_rows, c.slots))
        top_n = c.max_len if max_ctx is None else max(1, min(max_ctx, c.max_len))
        rows = sorted({batch_bucket(b, c.slots) for b in range(1, top_r + 1)})
        lens = sorted({ctx_bucket(n, c.max_len) for n in range(1, top_n + 1)})
        # Largest first, as vLLM does: the shared pool is sized by the largest step.
        for b, n in sorted(((b, n) for b in rows for n in lens), reverse=True):
            self.graph(b, n)
        return len(self._graphs)

    def run(self, ids: list[int], pos: list[int], slot: list[int]) -> Tensor | None:
        """One decode-only step (rows in any slot order): logits [len(ids), V], or None if its
        bucket failed (the caller runs it eagerly)."""
        n = len(ids)
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
        assert g.logits is not None
        # A copy: the next replay overwrites it (a few MB at most).
        return g.logits[:n].clone()

    def info(self) -> dict[str, Any]:
        """What the graphs did (failed buckets as ``"ROWSxCTX": error``)."""
        return {
            "captured": self.captures,
            "replayed_as_graphs": self.capture,
            "buckets": [list(k) for k in self.keys],
            "failed": {f"{r}x{n}": e for (r, n), e in sorted(self.failed.items())},
            "eager_steps": self.eager_steps,
        }
