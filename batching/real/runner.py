"""Run any :class:`~batching.plan.StepPlan` as one forward pass of the torch model (chapter 7).

The KV cache is the naive layout the chapter ends on: one slab of ``max_len`` positions per
slot, ``k_cache, v_cache: [layers, slots, kv_heads, max_len, head_dim]``, allocated up
front whether a slot's request uses 10 positions or 2,000 (the ``slab`` policy of
``kv.py`` counts exactly this reservation).

A step packs every token of the plan into one ``[T, hidden]`` matrix, in this order:

- decode rows (and static batching's dead rows), one token each, sorted by slot;
- prefill chunks, each ``n`` prompt tokens plus its ``pad`` padding tokens.

Every linear layer runs once on all ``T`` tokens (the weights are read once per step:
"Why batching"). Attention is the only per-sequence part: one batched SDPA call for all
decode rows and one call per prefill chunk.

The workload only has lengths, so token ids are made up: a request's prompt is
``numpy.random.default_rng([seed, rid]).integers(1, vocab, prompt_len)`` (id 0 is left for
padding) and the runner keeps each request's history (prompt + generated ids), from which
a recompute after preemption reads its prompt and generated tokens again.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from ..costs import MEM_RESERVE
from ..models import ModelShape
from ..plan import StepPlan
from ..request import Request
from .graphs import DecodeGraphs, GraphCaptureError
from .model import Llama, ModelConfig, batch1_copy_params, default_dtype, sdpa

#: Token id of static batching's padding (7.1); prompts never contain it.
PAD_ID = 0
#: The largest prefill :meth:`ModelRunner.warmup` runs (tokens): about a second of cpu-s.
WARMUP_TOKENS_MAX = 2048


class DeviceMemoryError(MemoryError):
    """The weights or the KV slabs would not fit the device's free memory."""


def available_bytes(device: torch.device) -> int | None:
    """Free memory of ``device`` now (7.2's slab sizing): CUDA's free bytes, or the CPU's MemAvailable.

    None if the platform does not say (then nothing is checked).
    """
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))
    except (ValueError, OSError, AttributeError):
        return None


def check_fits(needed: int, available: int | None, what: str, device: torch.device) -> None:
    """Raise :class:`DeviceMemoryError` with both numbers unless ``needed`` fits (7.2, slab KV).

    Only ``1 - MEM_RESERVE`` of what is available counts, the headroom ``costs.py`` keeps
    too (activations, allocator fragmentation, the rest of the process).
    """
    if available is None:
        return
    usable = int(available * (1 - MEM_RESERVE))
    if needed > usable:
        raise DeviceMemoryError(
            f"{what} needs {needed / 1e9:.2f} GB (needed={needed:,} bytes) but {device} has "
            f"{available / 1e9:.2f} GB available (available={available:,} bytes, "
            f"{1 - MEM_RESERVE:.0%} of it usable): use fewer slots, a smaller max_len or a smaller model"
        )


def check_model_fits(
    shape: ModelShape,
    slots: int,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None = None,
    mem_available: int | None = None,
    wx: bool | None = None,
    graphs: bool | None = None,
) -> int:
    """Refuse (:class:`DeviceMemoryError`) a model and its KV slabs that would not fit
    ``device`` together, before anything is allocated (7.1-7.3); returns the weights' bytes.

    A CPU model (``wx``) also keeps transposed copies of its weights for one-token
    steps; a runner with decode graphs (``graphs``, default on CUDA) one more slab."""
    cfg = ModelConfig.from_shape(shape)
    elem = torch.empty(0, dtype=dtype).element_size()
    copies = batch1_copy_params(cfg) if (device.type == "cpu" if wx is None else wx) else 0
    weights = (cfg.params + copies) * elem
    slabs = slots + (1 if (device.type == "cuda" if graphs is None else graphs) else 0)
    kv = kv_cache_bytes(cfg, slabs, cfg.max_context if max_len is None else max_len, dtype)
    avail = available_bytes(device) if mem_available is None else mem_available
    check_fits(
        weights + kv,
        avail,
        f"{shape.name} in {dtype}: {weights / 1e9:.2f} GB of weights"
        f"{' (batch-1 copies included)' if copies else ''} + "
        f"{kv / 1e9:.2f} GB of KV slabs ({slots} slots)",
        device,
    )
    return weights


def kv_cache_bytes(cfg: ModelConfig, slots: int, max_len: int, dtype: torch.dtype) -> int:
    """Bytes of the K and V slabs (7.2, the slab layout): 2 x layers x slots x kv_heads x max_len x head_dim x elem."""
    elem = torch.empty(0, dtype=dtype).element_size()
    return 2 * cfg.layers * slots * cfg.kv_heads * max_len * cfg.head_dim * elem


def prompt_ids(seed: int, rid: int, prompt_len: int, vocab: int) -> list[int]:
    """Deterministic pseudo-random prompt of request ``rid`` (ids 1..vocab-1), for every real run of 7.1-7.3."""
    return np.random.default_rng([seed, rid]).integers(1, vocab, prompt_len).tolist()


@dataclass
class StepOutput:
    """What one step produced: the emitted token of each emitting request, and its logits
    row (kept for tests; the executor only needs the tokens)."""

    token_ids: dict[int, int] = field(default_factory=dict)
    logits: dict[int, Tensor] = field(default_factory=dict)


#: Decode rows whose slots have holes between them (requests that finished left their slots
#: free) read every slab from their lowest slot to their highest, holes included, while that
#: span holds at most this many slots per row; wider spans gather the rows' slabs into a
#: copy. A hole's slab costs one more slab read; the gather costs a read, a write and a
#: second read of every row's slab. Measured here, 16 decode rows at contexts 100-300 in
#: slots 0-16 but one: ``cpu-s`` 31.3 ms read as a view with the hole, 37.0 gathered
#: (28.3 for slots 0-15); ``cpu-m`` 110 / 125 / 105 ms. In a live batch nearly every mixed
#: step has such a hole: the slot of the prompt being prefilled, among the decoding ones.
SPAN_PER_ROW = 2


@dataclass(frozen=True)
class DecodeIndex:
    """How one step's decode rows (7.2) read their slabs, worked out once for all layers.

    ``sel``: the slabs read, a slice of slots (a view) or a tensor of slots (a gather);
    ``length``: positions read, the longest row's context; ``mask`` [N, 1, 1, length]: what
    each slab's query may see (None when every row sees all ``length``); ``place``: where
    each row sits in a slice with holes (None when the rows are the slice)."""

    sel: slice | Tensor
    length: int
    mask: Tensor | None
    place: Tensor | None


@dataclass(frozen=True)
class ChunkSpan:
    """A prefill chunk's place in the packed batch: tokens ``offset .. offset+length-1``
    at positions ``start .. start+length-1`` of ``slot`` (padding included)."""

    offset: int
    slot: int
    start: int
    length: int


class ModelRunner:
    """A model plus its slab KV cache; :meth:`execute` runs one step plan (7.1, 7.2, 7.3)."""

    def __init__(
        self,
        model: Llama,
        slots: int,
        max_len: int | None = None,
        seed: int = 0,
        mem_available: int | None = None,
        graphs: bool | None = None,
    ) -> None:
        """``mem_available`` overrides the free-memory figure (tests simulate a small device).
        ``graphs``: decode-only steps as CUDA graphs (``graphs.py``); default on CUDA. On a
        CPU, True runs the same fixed-shape step eagerly (tests)."""
        cfg = model.cfg
        max_len = cfg.max_context if max_len is None else max_len
        if not (isinstance(slots, int) and slots >= 1):
            raise ValueError(f"slots={slots!r}: must be an integer >= 1")
        if not (isinstance(max_len, int) and 1 <= max_len <= cfg.max_context):
            raise ValueError(
                f"max_len={max_len!r}: must be an integer in 1..{cfg.max_context} "
                f"({cfg.name}'s max_context; RoPE angles exist up to there)"
            )
        self.model, self.cfg = model, cfg
        self.device, self.dtype = model.device, model.dtype
        self.slots, self.max_len, self.seed = slots, max_len, seed
        self._warm_tokens = 0  # the largest prefill warmup() has run on this runner
        graphs = self.device.type == "cuda" if graphs is None else graphs
        # Decode graphs pad a batch with rows that write into a slab no request owns.
        slabs = slots + 1 if graphs else slots
        self.kv_bytes = kv_cache_bytes(cfg, slabs, max_len, self.dtype)
        shape = (cfg.layers, slabs, cfg.kv_heads, max_len, cfg.head_dim)
        check_fits(
            self.kv_bytes,
            available_bytes(self.device) if mem_available is None else mem_available,
            f"KV cache {list(shape)} x 2 (K, V) in {self.dtype}",
            self.device,
        )
        # Zeros, not empty: a decode batch reads every row's slab up to the batch's longest
        # context and masks the rest; masked garbage that happened to be NaN would still
        # poison the output (0 x NaN), so every position must hold a finite value.
        self.k_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        self.v_cache = torch.zeros(shape, dtype=self.dtype, device=self.device)
        # Per-layer views made once: indexing the slab anew in every layer of every step is
        # two more dispatches per layer, which a one-token CPU step pays in full.
        self._layers = list(zip(self.k_cache.unbind(0), self.v_cache.unbind(0)))
        self.history: dict[int, list[int]] = {}  # rid -> prompt ids + generated ids
        self.graphs = DecodeGraphs(self, capture=self.device.type == "cuda") if graphs else None
        self.graphs_error: str | None = None  # why graphs were turned off, if a capture failed

    @classmethod
    def from_shape(
        cls,
        shape: ModelShape,
        slots: int,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
        max_len: int | None = None,
        mem_available: int | None = None,
        wx: bool | None = None,
        graphs: bool | None = None,
    ) -> ModelRunner:
        """Build the model of a registry shape and its cache, checking first that both fit (7.1-7.3)."""
        device = torch.device(device)
        dtype = dtype or default_dtype(device)
        weights = check_model_fits(shape, slots, device, dtype, max_len, mem_available, wx, graphs)
        model = Llama(ModelConfig.from_shape(shape), device, dtype, seed=seed, wx=wx)
        return cls(
            model, slots, max_len, seed, None if mem_available is None else mem_available - weights, graphs
        )

    # ------------------------------------------------------------------ tokens
    def tokens(self, rid: int) -> list[int]:
        """Request ``rid``'s ids so far: prompt, then generated (7.2 recompute reads them back)."""
        return self.history[rid]

    def _history_for_prefill(self, req: Request) -> list[int]:
        if req.num_computed == 0 and req.generated == 0:
            # A request's first prefill (or a restart before any token): its prompt. This
            # also forgets the same rid from an earlier run through this runner.
            self.history[req.rid] = prompt_ids(self.seed, req.rid, req.prompt_len, self.cfg.vocab)
        hist = self.history.get(req.rid)
        if hist is None or len(hist) < req.prefill_target:
            raise RuntimeError(
                f"request {req.rid}: prefill to {req.prefill_target} tokens but the runner "
                f"holds {0 if hist is None else len(hist)} of its ids"
            )
        return hist

    def _history_for_decode(self, req: Request) -> list[int]:
        hist = self.history.get(req.rid)
        # While decoding, the cache holds every id but the newest, which this step computes.
        if hist is None or len(hist) != req.num_computed + 1:
            raise RuntimeError(
                f"request {req.rid}: decode at position {req.num_computed} but the runner "
                f"holds {0 if hist is None else len(hist)} of its ids"
            )
        return hist

    # ------------------------------------------------------------------ the step
    def execute(self, plan: StepPlan) -> dict[int, int]:
        """Run ``plan`` as one forward pass (7.1-7.3); {rid: greedy token} of every emitting request."""
        return self.forward(plan).token_ids

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> StepOutput:
        """Run ``plan`` as one forward pass (7.1 static padding and dead rows, 7.2 mixed
        prefill + decode, 7.3 chunks) and return the tokens and logits it emits.

        Positions come from the requests before the engine commits the step. Decode and
        dead rows compute the token at position ``num_computed`` (their newest id) and
        write its K/V there; a chunk computes positions ``num_computed .. +n-1`` and its
        ``pad`` padding tokens after them. Logits are computed for decode rows, dead rows
        (a dense batch computes them: their cost is real) and the last token of each chunk
        that completes a prefill; dead rows' tokens are discarded.
        """
        ids: list[int] = []
        pos: list[int] = []
        slot: list[int] = []
        # Decode rows sorted by slot: a batch whose slots form one range then reads its
        # slabs as a view instead of gathering a copy (see _decode_attention).
        rows = sorted(
            [(r, True) for r in plan.decodes] + [(r, False) for r in plan.dead], key=lambda x: x[0].slot
        )
        for r, _ in rows:
            hist = self._history_for_decode(r)
            ids.append(hist[r.num_computed])
            pos.append(r.num_computed)
            slot.append(r.slot)
        chunks: list[ChunkSpan] = []
        logit_rows = list(range(len(rows)))
        emit: list[int | None] = [r.rid if live else None for r, live in rows]
        for c in plan.prefills:
            r, start = c.req, c.req.num_computed
            hist = self._history_for_prefill(r)
            m = c.n + c.pad
            chunks.append(ChunkSpan(len(ids), r.slot, start, m))
            # Right padding: pad tokens sit after the prompt, at positions the request's
            # decode steps will overwrite before any query attends to them.
            ids += hist[start : start + c.n] + [PAD_ID] * c.pad
            pos += range(start, start + m)
            slot += [r.slot] * m
            if c.completes:
                logit_rows.append(len(ids) - c.pad - 1)
                emit.append(r.rid)
        if not ids:
            return StepOutput()
        if max(pos) >= self.max_len or min(slot) < 0 or max(slot) >= self.slots:
            raise RuntimeError(
                f"plan exceeds the cache: positions up to {max(pos)} (max_len {self.max_len}), "
                f"slots {min(slot)}..{max(slot)} (slots {self.slots})"
            )
        logits = None
        if self.graphs is not None and not chunks:  # decode-only: a fixed-shape step (graphs.py)
            try:
                logits = self.graphs.run(ids, pos, slot)  # [R, V]
            except GraphCaptureError as e:
                self._drop_graphs(e)
        if logits is None:
            logits = self._forward_packed(ids, pos, slot, len(rows), chunks, logit_rows)  # [R, V]
        tokens = logits.argmax(dim=-1).tolist()
        out = StepOutput()
        for i, rid in enumerate(emit):
            if rid is not None:
                out.token_ids[rid] = tokens[i]
                out.logits[rid] = logits[i]
                self.history[rid].append(tokens[i])
        return out

    def _forward_packed(
        self,
        ids: list[int],
        pos: list[int],
        slot: list[int],
        n_rows: int,
        chunks: list[ChunkSpan],
        logit_rows: list[int],
    ) -> Tensor:
        """The model over packed tokens (7.1-7.3); decode rows first (``n_rows``), then ``chunks``."""
        dev = self.device
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        slot_t = torch.tensor(slot, dtype=torch.long, device=dev)
        row_slots, row_pos = slot[:n_rows], pos[:n_rows]
        dec = self._decode_index(row_slots, row_pos) if n_rows else None

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            kc, vc = self._layers[layer]  # [S, K, L, D]
            # One scatter writes every token's K/V (decode, prompt, padding) into its slab;
            # a plan holds each request once, so no (slot, position) is written twice.
            kc[slot_t, :, pos_t] = k  # k [T, K, D]
            vc[slot_t, :, pos_t] = v
            outs = []
            if dec is not None:
                outs.append(self._decode_attention(q if n_rows == q.shape[0] else q[:n_rows], kc, vc, dec))
            for c in chunks:
                outs.append(self._chunk_attention(q[c.offset : c.offset + c.length], kc, vc, c))
            return outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, D]

        return self.model(ids_t, pos_t, attend, torch.tensor(logit_rows, dtype=torch.long, device=dev))

    def _decode_index(self, row_slots: list[int], row_pos: list[int]) -> DecodeIndex:
        """How decode rows (7.2) read their slabs (see :class:`DecodeIndex`); ``row_slots`` ascending."""
        n, length = len(row_slots), max(row_pos) + 1
        lo, hi = row_slots[0], row_slots[-1]
        place = None
        if hi - lo + 1 == n:  # one range of slots: a view
            sel: slice | Tensor = slice(lo, hi + 1)
            pos = row_pos
        elif hi - lo + 1 <= SPAN_PER_ROW * n:  # a range with holes: a view, holes read too
            sel = slice(lo, hi + 1)
            place = torch.tensor([s - lo for s in row_slots], dtype=torch.long, device=self.device)
            # A hole's query (zeros) attends to its slab's position 0 alone, so that no
            # softmax row is empty; its output is dropped.
            pos = [0] * (hi - lo + 1)
            for s_, p_ in zip(row_slots, row_pos):
                pos[s_ - lo] = p_
        else:  # scattered wide apart: gather the rows' slabs
            sel = torch.tensor(row_slots, dtype=torch.long, device=self.device)
            pos = row_pos
        mask = None
        if min(pos) != max(pos):
            p = torch.tensor(pos, device=self.device)
            mask = (torch.arange(length, device=self.device)[None, :] <= p[:, None])[
                :, None, None, :
            ]  # [N,1,1,L]
        return DecodeIndex(sel, length, mask, place)

    @staticmethod
    def _decode_attention(q: Tensor, kc: Tensor, vc: Tensor, idx: DecodeIndex) -> Tensor:
        """All decode rows in one SDPA call (7.2): q [R, H, D] -> [R, H, D].

        Each row reads its slab up to the batch's longest context; shorter rows mask the
        tail. With the slab layout that tail is wasted reading, the price of not paging.
        """
        sel, length = idx.sel, idx.length
        if isinstance(sel, slice):  # narrow: a view, in fewer dispatches than kc[sel, :, :length]
            k = kc.narrow(0, sel.start, sel.stop - sel.start).narrow(2, 0, length)  # [N, K, L, D]
            v = vc.narrow(0, sel.start, sel.stop - sel.start).narrow(2, 0, length)
        else:
            k, v = kc[sel, :, :length], vc[sel, :, :length]  # a gather (copy), [R, K, L, D]
        if idx.place is None:
            return sdpa(q.unsqueeze(2), k, v, idx.mask).squeeze(2)  # [R, H, D]
        qn = q.new_zeros((k.shape[0],) + q.shape[1:]).index_copy_(0, idx.place, q)  # [N, H, D]
        return sdpa(qn.unsqueeze(2), k, v, idx.mask).squeeze(2).index_select(0, idx.place)  # [R, H, D]

    @staticmethod
    def _chunk_attention(q: Tensor, kc: Tensor, vc: Tensor, c: ChunkSpan) -> Tensor:
        """One prefill chunk (7.3): causal within the chunk, plus every cached position of
        its slot before it. q [m, H, D] -> [m, H, D]."""
        end = c.start + c.length
        k = kc[c.slot : c.slot + 1, :, :end]  # [1, K, end, D]
        v = vc[c.slot : c.slot + 1, :, :end]
        qh = q.transpose(0, 1)[None]  # [1, H, m, D]
        if c.start == 0:
            o = sdpa(qh, k, v, causal=True)
        else:
            qpos = torch.arange(c.start, end, device=q.device)
            mask = torch.arange(end, device=q.device)[None, :] <= qpos[:, None]  # [m, end]
            o = sdpa(qh, k, v, mask)
        return o[0].transpose(0, 1)  # [m, H, D]

    def graphs_info(self) -> dict | None:
        """What decode graphs did (results' executor record, profiles' meta): None when off,
        the capture error if one turned them off, else buckets captured and whether replayed."""
        if self.graphs_error:
            return {"error": self.graphs_error}
        if self.graphs is None:
            return None
        return {
            "captured": self.graphs.captures,
            "replayed_as_graphs": self.graphs.capture,
            "buckets": [list(k) for k in self.graphs.keys],
        }

    def _drop_graphs(self, e: GraphCaptureError) -> None:
        # Eager steps still give the right tokens; the runner records why it is slower
        # (results' executor record, profiles' meta) and says so once.
        self.graphs, self.graphs_error = None, str(e)
        warnings.warn(f"{e}; decode steps run eagerly from now on", RuntimeWarning, stacklevel=3)

    @torch.inference_mode()
    def warmup(self, capture_graphs: bool = False, tokens: int = 0) -> None:
        """One small mixed step (a decode row and a 4-token chunk) through every layer, so
        that the first timed step doesn't pay one-off costs: kernel selection, thread-pool
        start-up, first-touch allocation. It writes K/V into slots 0 and 1, which any
        request's prefill overwrites before reading. ``capture_graphs``: also capture every
        decode graph this runner can replay (``DecodeGraphs.capture_all``), so that no timed
        step pays a capture (the real executor; a profile sweep captures as it goes).

        ``tokens``: also one prefill step of that many positions (at most
        :data:`WARMUP_TOKENS_MAX` and what the slabs hold; chunks of up to ``max_len`` from
        slot 0 on), once per runner and size, as vLLM runs a maximal dummy step at start-up:
        the first step of a size a process has not run pays for its activations' fresh
        memory (cpu-s: a 2,048-token prefill took 1,251-1,373 ms the first time in a process,
        708-953 ms after), and 7.3's stall, the first long prefill of its runs, paid it."""
        if capture_graphs and self.graphs is not None and self.graphs.capture:
            try:
                self.graphs.capture_all()
            except GraphCaptureError as e:
                self._drop_graphs(e)
        m = min(4, self.max_len)
        if self.slots == 1:  # no second slot for the decode row: the chunk alone
            self._forward_packed([1] * m, list(range(m)), [0] * m, 0, [ChunkSpan(0, 0, 0, m)], [m - 1])
        else:
            self._forward_packed(
                [1] * (m + 1), [0] + list(range(m)), [1] + [0] * m, 1, [ChunkSpan(1, 0, 0, m)], [0, m]
            )
        n = min(int(tokens), WARMUP_TOKENS_MAX, self.slots * self.max_len)
        if n <= self._warm_tokens:
            return
        chunks, pos, slot, off = [], [], [], 0
        for k in range(-(-n // self.max_len)):
            c = min(self.max_len, n - off)
            chunks.append(ChunkSpan(off, k, 0, c))
            pos += range(c)
            slot += [k] * c
            off += c
        self._forward_packed([1] * n, pos, slot, 0, chunks, [n - 1])
        self._warm_tokens = n
