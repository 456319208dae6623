"""Decode steps as CUDA graphs: the GPU side of "Why batching" (the runner's fast path).

A decode step of an 8B model on an H200 streams 15 GB of weights in ~4 ms; run eagerly it
is ~650 kernel launches from Python (32 layers x ~20 ops), ~10-15 us each on the host, and
the GPU waits for the host: the step measures Python, not bandwidth, and decode
efficiency stays far below the 0.80 that issue 3 asks of the 8B shape. A CUDA graph records
the step's kernels once and replays them with one launch (vLLM and SGLang do this for
every decode batch size; nano-vllm's ``capture_cudagraph`` in 40 lines).

A graph replays fixed shapes at fixed addresses, so a step is fitted to a bucket:

- rows: the batch is padded to :func:`batch_bucket` (1, 2, 4, 8, then multiples of 8);
  padding rows decode token :data:`~batching.runner.PAD_ID` at position 0 of a scratch slab
  that no request owns (the runner allocates one more slab when graphs are on), and their
  logits are dropped;
- context: attention reads every row's slab up to :func:`ctx_bucket` of the longest row's
  context (64 .. 1024 by powers of two, then multiples of 512) and masks each row's
  tail, as the eager path masks up to the longest row exactly;
- slots: a graph cannot take the eager path's slot-range views, whose bounds change every
  step. A small batch gathers its rows' slabs by index (``index_select``: read, write, read
  again; at batch 1 that is 1/1000 of the weights' bytes for 8B at 1K context); a batch
  holding at least a third of the slots (:data:`GATHER_PASSES`) reads every slab as one
  view instead, its queries placed at their slots, as the eager path does with holes.

Attention uses no ``enable_gqa``: the G = H/K query heads that share a kv head become G
query positions of that head (``q.view(B, K, G, D)``), plain multi-head SDPA that every
backend runs, as decode kernels do (FlashDecoding's "GQA packing").

Only decode-only plans (decodes, and static batching's dead rows) replay graphs; plans with
a prefill chunk run eagerly. Graphs are captured lazily, one per (rows bucket, context
bucket), or all up front by :meth:`DecodeGraphs.capture_all` (the real executor's warm-up,
so that no timed step pays a capture). On a CPU there is nothing to capture: with
``capture=False`` the same fixed-shape step runs eagerly, which is how the tests check it
against the eager path.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor

from .model import sdpa

if TYPE_CHECKING:
    from .runner import ModelRunner

#: Rows of the largest batch bucket below which buckets double (1, 2, 4, 8), then steps of 8
#: (16, 24, 32, ...), as vLLM's capture sizes: padding 17 rows to 24 costs little where the
#: step streams weights, and the number of graphs stays small.
BATCH_STEP = 8
#: Context buckets: powers of two from 64 to 1024, then multiples of 512. Reading up to
#: the bucket wastes at most half of a short context's slab reads (a small share of a
#: weight-bound step) and at most 511 positions of a long one.
CTX_MIN, CTX_POW2_MAX, CTX_STEP = 64, 1024, 512
#: Slab passes per row of a gather (read, write, read back): a batch of ``rows`` rows reads
#: every slab as a view instead (one pass over all slots) once rows x this >= the slabs.
GATHER_PASSES = 3


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


def gqa_decode_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """One query per row against its slab (decode): q [B, H, D], k, v [B, K, L, D], mask [B, 1, 1, L]
    (boolean, or added to the scores) -> [B, H, D].

    Query heads h = j*G .. j*G + G - 1 share kv head j (the repeat_interleave convention of
    ``sdpa``'s GQA): as G queries of head j they need no copy of K and V."""
    B, H, D = q.shape
    K = k.shape[1]
    o = sdpa(q.view(B, K, H // K, D), k, v, mask)  # [B, K, G, D]
    return o.reshape(B, H, D)


class GraphCaptureError(RuntimeError):
    """Capturing a decode graph failed; the runner then runs decode steps eagerly and says so."""


@dataclass
class _Graph:
    """One captured bucket: its static input [3, rows] (ids, positions, slots), its output
    logits [rows, V], and the graph (None where nothing is captured: CPU, tests)."""

    inp: Tensor
    logits: Tensor | None
    graph: Any  # torch.cuda.CUDAGraph (replay()), None where nothing is captured


class DecodeGraphs:
    """Fixed-shape decode steps of one runner, replayed as CUDA graphs ("Why batching", 7.2 on a GPU).

    ``capture=False`` runs the same fixed-shape step eagerly (CPU, tests)."""

    def __init__(self, runner: ModelRunner, capture: bool) -> None:
        if capture and runner.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device, not {runner.device}")
        self.r, self.capture = runner, capture
        self.scratch = runner.slots  # the extra slab padding rows write into
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0

    @property
    def keys(self) -> list[tuple[int, int]]:
        """The (rows, context) buckets captured so far."""
        return sorted(self._graphs)

    def bucket(self, rows: int, length: int) -> tuple[int, int]:
        """The (rows, context) bucket a decode step of ``rows`` rows and longest context ``length`` replays."""
        return batch_bucket(rows, self.r.slots), ctx_bucket(length, self.r.max_len)

    def _step(self, inp: Tensor, length: int) -> Tensor:
        """The fixed-shape step: inp [3, N] (ids, positions, slots) -> logits [N, V]."""
        r = self.r
        ids, pos, slot = inp[0], inp[1], inp[2]
        slabs = r.k_cache.shape[1]  # S + 1 (the scratch slab)
        view = inp.shape[1] * GATHER_PASSES >= slabs
        if view:  # every slab's query row: the batch's at its slot, position 0 elsewhere
            pos = torch.zeros(slabs, dtype=pos.dtype, device=r.device).index_copy_(0, slot, pos)  # [S+1]
        seen = torch.arange(length, device=r.device)[None, :] <= pos[:, None]  # [N, L]
        # Additive, made once per step: a boolean mask is converted inside every layer's SDPA call.
        mask = torch.zeros(seen.shape, dtype=r.dtype, device=r.device).masked_fill_(~seen, float("-inf"))[
            :, None, None, :
        ]  # [N, 1, 1, L]

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            kc, vc = r._layers[layer]  # [S+1, K, max_len, D]
            kc[slot, :, inp[1]] = k  # k [N, K, D]
            vc[slot, :, inp[1]] = v
            if view:
                qs = q.new_zeros((slabs,) + q.shape[1:]).index_copy_(0, slot, q)  # [S+1, H, D]
                o = gqa_decode_attention(qs, kc.narrow(2, 0, length), vc.narrow(2, 0, length), mask)
                return o.index_select(0, slot)  # [N, H, D]
            ks = kc.narrow(2, 0, length).index_select(0, slot)  # [N, K, L, D]: a gather
            vs = vc.narrow(2, 0, length).index_select(0, slot)
            return gqa_decode_attention(q, ks, vs, mask)  # [N, H, D]

        return r.model(ids, inp[1], attend)

    def _make(self, rows: int, length: int) -> _Graph:
        """A bucket's static input and, on CUDA, its captured graph."""
        r = self.r
        # Capture-time inputs are padding rows: warm-up and capture write only the scratch slab.
        inp = self._padding(rows).to(r.device)
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
        dev = self.r.device
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

    def _padding(self, rows: int, start: int = 0) -> Tensor:
        """[3, rows - start] of padding rows: PAD_ID at distinct positions of the scratch slab."""
        from .runner import PAD_ID

        n = rows - start
        out = np.empty((3, n), dtype=np.int64)
        out[0] = PAD_ID
        out[1] = np.arange(start, rows) % self.r.max_len
        out[2] = self.scratch
        return torch.from_numpy(out)

    def graph(self, rows: int, length: int) -> _Graph:
        """The bucket's graph, captured on first use."""
        key = (rows, length)
        if key not in self._graphs:
            self._graphs[key] = self._make(rows, length)
        return self._graphs[key]

    def capture_all(self) -> int:
        """Capture every bucket the runner's slots and slab allow; returns how many graphs
        exist. The real executor's warm-up, so that no timed step pays a capture."""
        rows = sorted({batch_bucket(b, self.r.slots) for b in range(1, self.r.slots + 1)})
        lens = sorted({ctx_bucket(n, self.r.max_len) for n in range(1, self.r.max_len + 1)})
        # Largest first, as vLLM captures: the shared pool is then sized by the largest step.
        for b, n in sorted(((b, n) for b in rows for n in lens), reverse=True):
            self.graph(b, n)
        return len(self._graphs)

    def run(self, ids: list[int], pos: list[int], slot: list[int]) -> Tensor:
        """One decode-only step (rows in any slot order): logits [len(ids), V]."""
        n = len(ids)
        rows, length = self.bucket(n, max(pos) + 1)
        g = self.graph(rows, length)
        host = torch.cat((torch.tensor([ids, pos, slot], dtype=torch.long), self._padding(rows, n)), dim=1)
        g.inp.copy_(host)
        if g.graph is None:
            return self._step(g.inp, length)[:n]
        g.graph.replay()
        # A copy: the next replay overwrites the graph's output (a few MB at most).
        return g.logits[:n].clone()
