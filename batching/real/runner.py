"""Run any :class:`~batching.plan.StepPlan` as one forward pass over the slab KV cache.

A step packs its tokens into one ``[T, hidden]`` matrix: decode (and dead) rows sorted by
slot, then prefill chunks with their padding. Attention is one SDPA call for all decode rows
and one per chunk. Prompts come from the seed (:func:`prompt_ids`); generated ids are the
request's own (``Request.token_ids``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import Tensor

from ..costs.models import ModelShape
from ..plan import StepPlan
from ..request import Request
from .attention import DecodeKernel, decode_kernel, decode_kernel_status
from .cache import SlabCache, kv_cache_bytes
from .graphs import DecodeGraphs
from .hardware import available_bytes, check_fits
from .kernels import LinearPlan
from .model import PAD_ID, Llama, ModelConfig, default_dtype, form_copy_params, gqa_chunk, gqa_decode, sdpa
from .model import sdpa_backend as _backend

#: The largest prefill :meth:`ModelRunner.warmup` runs, in tokens (about a second of cpu-s).
WARMUP_TOKENS_MAX = 2048


def check_model_fits(
    shape: ModelShape,
    slots: int,
    device: torch.device,
    dtype: torch.dtype,
    max_len: int | None = None,
    mem_available: int | None = None,
    graphs: bool | None = None,
) -> int:
    """Refuse (:class:`DeviceMemoryError`) a model and its KV slabs that would not fit
    ``device``, before allocating; returns the weights' bytes (on a CPU with one extra form of
    each, which its kernels' ``split`` or ``dnnl`` paths keep; decode graphs, default on CUDA,
    add a slab)."""
    cfg = ModelConfig.from_shape(shape)
    elem = dtype.itemsize
    copies = form_copy_params(cfg) if device.type == "cpu" else 0
    weights = (cfg.params + copies) * elem
    slabs = slots + (1 if (device.type == "cuda" if graphs is None else graphs) else 0)
    kv = kv_cache_bytes(cfg, slabs, cfg.max_context if max_len is None else max_len, dtype)
    avail = available_bytes(device) if mem_available is None else mem_available
    check_fits(
        weights + kv,
        avail,
        f"{shape.name} in {dtype}: {weights / 1e9:.2f} GB of weights"
        f"{' (a copy for the CPU kernels included)' if copies else ''} + "
        f"{kv / 1e9:.2f} GB of KV slabs ({slots} slots)",
        device,
    )
    return weights


def prompt_ids(seed: int, rid: int, prompt_len: int, vocab: int) -> list[int]:
    """Seeded prompt of request ``rid`` (ids 1..vocab-1: 0 is padding)."""
    return np.random.default_rng([seed, rid]).integers(1, vocab, prompt_len).tolist()


@dataclass
class StepOutput:
    """Each emitting request's token and its logits row."""

    token_ids: dict[int, int] = field(default_factory=dict)
    logits: dict[int, Tensor] = field(default_factory=dict)


#: Decode rows read their slabs as one view, holes included, while their slot span is at most
#: this many slots per row; wider spans gather a copy (read, write, read again). 16 rows in
#: slots 0-16 but one: ``cpu-s`` 31.3 ms as a view, 37.0 gathered, 28.3 for slots 0-15.
#: Nearly every mixed step has such a hole: the slot being prefilled.
SPAN_PER_ROW = 2


#: Decode rows split into a short and a long group (each read to its own longest context, in
#: its own attention call) where that reads fewer positions than one group read to the
#: longest, by more than a call's fixed cost, counted in positions (cpu-s: an SDPA call and
#: its gathers ~50 us; a position of a layer ~50 ns). Long-tailed traffic keeps a few long
#: contexts beside many short ones: the peer benchmark's steps read 2.7x the positions they
#: attend to in one group, 1.6x in two.
GROUP_COST_POSITIONS = 1024


def split_by_length(row_slots: list[int], row_pos: list[int]) -> tuple[list[int], list[int]] | None:
    """The rows (indices, in slot order) of a short and a long group, or None where one group
    is cheaper: positions read, a gathered group counted twice (read, write, read again
    against a view's once), plus :data:`GROUP_COST_POSITIONS` per extra call."""
    n = len(row_slots)
    if n < 4:
        return None
    lens = [p + 1 for p in row_pos]
    span = row_slots[-1] - row_slots[0] + 1
    longest = max(lens)
    single = span * longest if span <= SPAN_PER_ROW * n else 2 * n * longest
    order = sorted(range(n), key=lambda i: lens[i])
    best, cut = single, 0
    for j in range(1, n):  # rows order[:j] short, order[j:] long
        cost = 2 * (j * lens[order[j - 1]] + (n - j) * longest) + GROUP_COST_POSITIONS
        if cost < best:
            best, cut = cost, j
    if cut == 0:
        return None
    return sorted(order[:cut]), sorted(order[cut:])


@dataclass(frozen=True)
class DecodeIndex:
    """How one step's decode rows read their slabs, for all layers: ``sel`` a slice (view) or
    tensor (gather) of slots; ``length`` the longest context; ``mask`` [N, 1, 1, length] or
    None (all see all); ``place`` each row's index in a slice with holes (None: no holes)."""

    sel: slice | Tensor
    length: int
    mask: Tensor | None
    place: Tensor | None


@dataclass(frozen=True)
class ChunkSpan:
    """Packed tokens ``offset ..`` of a chunk: positions ``start .. start+length-1`` of ``slot``."""

    offset: int
    slot: int
    start: int
    length: int


class ModelRunner:
    """A model plus its slab KV cache; :meth:`execute` runs one step plan."""

    def __init__(
        self,
        model: Llama,
        slots: int,
        max_len: int | None = None,
        seed: int = 0,
        mem_available: int | None = None,
        graphs: bool | None = None,
        decode_attention: str | None = None,
    ) -> None:
        """``mem_available``: the free memory to check against (tests). ``graphs``: decode-only
        steps as CUDA graphs, default on CUDA; on a CPU True runs the fixed-shape step eagerly.
        ``decode_attention``: ``kernel`` (each row read to its own length in its own slot,
        :mod:`~batching.real.attention`) or ``sdpa`` (rows grouped, padded and masked);
        default: the kernel on a CPU where it builds, else SDPA."""
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
        self._warm_tokens = 0  # the largest prefill warmup() has run
        graphs = self.device.type == "cuda" if graphs is None else graphs
        self.cache = SlabCache(cfg, slots, max_len, self.device, self.dtype, graphs, mem_available)
        self.graphs = DecodeGraphs(model, self.cache, capture=self.device.type == "cuda") if graphs else None
        self._backends: dict[str, str] | None = None
        self.decode_kernel = self._pick_decode_kernel(decode_attention)

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
        graphs: bool | None = None,
        kernels: LinearPlan | None = None,
        decode_attention: str | None = None,
    ) -> ModelRunner:
        """Build a registry shape's model and cache, checking first that both fit; ``kernels``:
        the linear layers' plan (default: this machine's for the dtype, probed once)."""
        device = torch.device(device)
        dtype = dtype or default_dtype(device)
        weights = check_model_fits(shape, slots, device, dtype, max_len, mem_available, graphs)
        model = Llama(ModelConfig.from_shape(shape), device, dtype, seed=seed, kernels=kernels)
        return cls(
            model,
            slots,
            max_len,
            seed,
            None if mem_available is None else mem_available - weights,
            graphs,
            decode_attention,
        )

    def _pick_decode_kernel(self, choice: str | None) -> DecodeKernel | None:
        if choice not in (None, "kernel", "sdpa"):
            raise ValueError(f"decode_attention={choice!r}: must be 'kernel', 'sdpa' or None")
        if choice == "sdpa" or (choice is None and self.device.type != "cpu"):
            return None
        if self.device.type != "cpu":
            raise RuntimeError(f"decode_attention='kernel' on {self.device}: the kernel runs on a CPU only")
        kern = decode_kernel()
        if kern is None and choice == "kernel":
            raise RuntimeError(f"decode_attention='kernel' on {self.device}: {decode_kernel_status()}")
        return kern

    @property
    def decode_attention(self) -> str:
        """``kernel`` or ``sdpa``: how decode rows attend (:class:`ModelRunner`)."""
        return "sdpa" if self.decode_kernel is None else "kernel"

    def tokens(self, req: Request) -> list[int]:
        """Request ``req``'s prompt and generated ids."""
        return self.prompt(req) + req.token_ids

    def prompt(self, req: Request) -> list[int]:
        """Request ``req``'s prompt ids (this runner's seed)."""
        return prompt_ids(self.seed, req.rid, req.prompt_len, self.cfg.vocab)

    @staticmethod
    def _check_ids(req: Request) -> None:
        # A request run on a simulated clock, or committed without its tokens, has no ids.
        if len(req.token_ids) != req.generated:
            raise RuntimeError(
                f"request {req.rid}: {req.generated} tokens generated but {len(req.token_ids)} "
                "of their ids recorded; the real engine reads a request's ids from it"
            )

    def _prefill_ids(self, req: Request, start: int, n: int) -> list[int]:
        """Ids ``start .. start+n-1`` of a prefill (or a recompute, through generated ids)."""
        self._check_ids(req)
        if start + n > req.prompt_len + req.generated:
            raise RuntimeError(
                f"request {req.rid}: prefill to {start + n} tokens but it has "
                f"{req.prompt_len + req.generated} ids (prompt and generated)"
            )
        return self.tokens(req)[start : start + n]

    def _decode_id(self, req: Request) -> int:
        """The id a decode (or dead) row computes: its newest, at position ``num_computed``."""
        self._check_ids(req)
        i = req.num_computed - req.prompt_len
        if req.generated == 0 or i != req.generated - 1:
            raise RuntimeError(
                f"request {req.rid}: decode at position {req.num_computed} but it has "
                f"{req.prompt_len} prompt and {req.generated} generated ids"
            )
        return req.token_ids[i]

    def execute(self, plan: StepPlan) -> dict[int, int]:
        """Run ``plan`` as one forward pass; {rid: greedy token} of every emitting request."""
        return self.forward(plan).token_ids

    @torch.inference_mode()
    def forward(self, plan: StepPlan) -> StepOutput:
        """Run ``plan`` as one forward pass: logits of decode rows, dead rows (real cost, tokens
        dropped) and each chunk that completes a prefill."""
        # Sorted by slot: rows whose slots form one range read their slabs as a view.
        rows = sorted(
            [(r, True) for r in plan.decodes] + [(r, False) for r in plan.dead], key=lambda x: _slot(x[0])
        )
        ids = [self._decode_id(r) for r, _ in rows]
        pos = [r.num_computed for r, _ in rows]
        slot = [_slot(r) for r, _ in rows]
        chunks: list[ChunkSpan] = []
        logit_rows = list(range(len(rows)))
        emit: list[int | None] = [r.rid if live else None for r, live in rows]
        for c in plan.prefills:
            r, start = c.req, c.req.num_computed
            m = c.n + c.pad
            chunks.append(ChunkSpan(len(ids), _slot(r), start, m))
            # Right padding: positions the request's decodes overwrite before anyone reads them.
            ids += self._prefill_ids(r, start, c.n) + [PAD_ID] * c.pad
            pos += range(start, start + m)
            slot += [_slot(r)] * m
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
        if self.graphs is not None and not chunks:
            logits = self.graphs.run(ids, pos, slot)  # [R, V]; None where its bucket failed to capture
        if logits is None:
            logits = self._forward_packed(ids, pos, slot, len(rows), chunks, logit_rows)  # [R, V]
        # In fp32: CPU argmax over bf16 is not vectorized (64 x 8,192 logits: 933 us, 250 in
        # fp32); ties go to the first index either way.
        tokens = logits.float().argmax(dim=-1).tolist()
        out = StepOutput()
        for i, rid in enumerate(emit):
            if rid is not None:
                out.token_ids[rid] = tokens[i]
                out.logits[rid] = logits[i]
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
        """The model over packed tokens: decode rows first (``n_rows``), then ``chunks``."""
        dev = self.device
        ids_t = torch.tensor(ids, dtype=torch.long, device=dev)
        pos_t = torch.tensor(pos, dtype=torch.long, device=dev)
        slot_t = torch.tensor(slot, dtype=torch.long, device=dev)
        row_slots, row_pos = slot[:n_rows], pos[:n_rows]
        kern = self.decode_kernel if n_rows else None
        dec = self._decode_groups(row_slots, row_pos) if n_rows and kern is None else None
        if kern is not None:  # each row to its own length: positions 0 .. pos, its own included
            lens_t = pos_t[:n_rows] + 1
            rslot_t = slot_t[:n_rows]

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            kc, vc = self.cache.layers[layer]  # [S, K, L, D]
            # One scatter for every token's K/V; a plan holds each request once, so no
            # (slot, position) is written twice.
            kc[slot_t, :, pos_t] = k  # k [T, K, D]
            vc[slot_t, :, pos_t] = v
            outs = []
            qd = q if n_rows == q.shape[0] else q[:n_rows]  # the decode rows' queries
            if kern is not None:
                outs.append(kern(qd.contiguous(), kc, vc, rslot_t, lens_t))
            if dec is not None:
                if isinstance(dec, DecodeIndex):
                    outs.append(self._decode_attention(qd, kc, vc, dec))
                else:  # a short and a long group, each its own call; outputs back in row order
                    o = qd.new_empty(qd.shape)
                    for rows_t, idx in dec:
                        o.index_copy_(
                            0, rows_t, self._decode_attention(qd.index_select(0, rows_t), kc, vc, idx)
                        )
                    outs.append(o)
            for c in chunks:
                outs.append(self._chunk_attention(q[c.offset : c.offset + c.length], kc, vc, c))
            return outs[0] if len(outs) == 1 else torch.cat(outs)  # [T, H, D]

        return self.model(ids_t, pos_t, attend, torch.tensor(logit_rows, dtype=torch.long, device=dev))

    def _decode_groups(
        self, row_slots: list[int], row_pos: list[int]
    ) -> DecodeIndex | list[tuple[Tensor, DecodeIndex]]:
        """One :class:`DecodeIndex` of all decode rows, or, where :func:`split_by_length` says
        so, one per group with the group's rows (indices into the decode rows)."""
        groups = split_by_length(row_slots, row_pos)
        if groups is None:
            return self._decode_index(row_slots, row_pos)
        return [
            (
                torch.tensor(g, dtype=torch.long, device=self.device),
                self._decode_index([row_slots[i] for i in g], [row_pos[i] for i in g]),
            )
            for g in groups
        ]

    def _decode_index(self, row_slots: list[int], row_pos: list[int]) -> DecodeIndex:
        """:class:`DecodeIndex` of rows with ascending ``row_slots``."""
        n, length = len(row_slots), max(row_pos) + 1
        lo, hi = row_slots[0], row_slots[-1]
        sel: slice | Tensor = slice(lo, hi + 1)  # one range of slots: a view
        place, pos = None, row_pos
        if hi - lo + 1 > SPAN_PER_ROW * n:  # scattered wide apart: gather the rows' slabs
            sel = torch.tensor(row_slots, dtype=torch.long, device=self.device)
        elif hi - lo + 1 > n:  # a range with holes: a view, holes read too
            place = torch.tensor([s - lo for s in row_slots], dtype=torch.long, device=self.device)
            # A hole's zero query sees position 0 alone (no empty softmax row); its output is dropped.
            pos = [0] * (hi - lo + 1)
            for s_, p_ in zip(row_slots, row_pos):
                pos[s_ - lo] = p_
        mask = None
        if min(pos) != max(pos):
            p = torch.tensor(pos, device=self.device)
            seen = torch.arange(length, device=self.device)[None, :] <= p[:, None]  # [N, L]
            mask = seen[:, None, None, :]  # [N, 1, 1, L]
        return DecodeIndex(sel, length, mask, place)

    @staticmethod
    def _decode_attention(q: Tensor, kc: Tensor, vc: Tensor, idx: DecodeIndex) -> Tensor:
        """All decode rows in one SDPA call, each slab read to the longest context and masked
        (the price of not paging): q [R, H, D] -> [R, H, D]."""
        sel, length = idx.sel, idx.length
        if isinstance(sel, slice):  # narrow: a view, in fewer dispatches than kc[sel, :, :length]
            k = kc.narrow(0, sel.start, sel.stop - sel.start).narrow(2, 0, length)  # [N, K, L, D]
            v = vc.narrow(0, sel.start, sel.stop - sel.start).narrow(2, 0, length)
        else:
            # A gather (copy), [R, K, L, D]: index_select of the narrowed slabs, 4-6x faster than
            # kc[sel, :, :length] (cpu-s slabs, 10-60 rows: 57-83 us against 284-383).
            k, v = kc.narrow(2, 0, length).index_select(0, sel), vc.narrow(2, 0, length).index_select(0, sel)
        if idx.place is None:
            return gqa_decode(q, k, v, idx.mask)  # [R, H, D]
        qn = q.new_zeros((k.shape[0],) + q.shape[1:]).index_copy_(0, idx.place, q)  # [N, H, D]
        return gqa_decode(qn, k, v, idx.mask).index_select(0, idx.place)  # [R, H, D]

    @staticmethod
    def _chunk_attention(q: Tensor, kc: Tensor, vc: Tensor, c: ChunkSpan) -> Tensor:
        """One chunk, causal, after its slot's cached positions: q [m, H, D] -> [m, H, D]."""
        end = c.start + c.length
        k = kc[c.slot : c.slot + 1, :, :end]  # [1, K, end, D]
        v = vc[c.slot : c.slot + 1, :, :end]
        if c.start == 0:  # causal, no mask: SDPA's grouped-query path runs a fused kernel
            return sdpa(q.transpose(0, 1)[None], k, v, causal=True)[0].transpose(0, 1)  # [m, H, D]
        qpos = torch.arange(c.start, end, device=q.device)
        mask = torch.arange(end, device=q.device)[None, :] <= qpos[:, None]  # [m, end]
        return gqa_chunk(q, k, v, mask)  # [m, H, D]

    def attention_backends(self) -> dict[str, str]:
        """The kernel of each attention path here: ``decode`` (SDPA's, masked and packed, or
        ``rows at their own length`` where :attr:`decode_kernel` runs), ``prefill`` (a first
        chunk, causal), ``chunk`` (after cached context, masked)."""
        if self._backends is None:
            cfg, dev, dt = self.cfg, self.device, self.dtype
            H, K, D, L, m = cfg.heads, cfg.kv_heads, cfg.head_dim, min(self.max_len, 128), 8
            G = H // K
            kv = torch.zeros(4, K, L, D, dtype=dt, device=dev)
            one = kv[:1]
            dmask = torch.ones(4, 1, 1, L, dtype=torch.bool, device=dev)
            cmask = torch.ones(G * m, L, dtype=torch.bool, device=dev)
            self._backends = {
                "decode": (
                    _backend(torch.zeros(4, K, G, D, dtype=dt, device=dev), kv, kv, dmask)
                    if self.decode_kernel is None
                    else "rows at their own length (batching.real.attention)"
                ),
                # A first chunk attends to itself alone: as many keys as queries.
                "prefill": _backend(torch.zeros(1, H, L, D, dtype=dt, device=dev), one, one, causal=True),
                "chunk": _backend(torch.zeros(1, K, G * m, D, dtype=dt, device=dev), one, one, cmask),
            }
        return dict(self._backends)

    def graphs_info(self) -> dict[str, Any] | None:
        """:meth:`DecodeGraphs.info`; None without graphs."""
        return None if self.graphs is None else self.graphs.info()

    @torch.inference_mode()
    def warmup(
        self,
        capture_graphs: bool = False,
        tokens: int = 0,
        graph_rows: int | None = None,
        graph_ctx: int | None = None,
    ) -> None:
        """One small mixed step (a decode row, a 4-token chunk into slots 1 and 0), so that no
        timed step pays kernel selection, thread start-up or first-touch allocation.
        ``capture_graphs``: also every decode graph up to ``graph_rows`` x ``graph_ctx``
        (default: all). ``tokens``: also one prefill of that many positions (at most
        :data:`WARMUP_TOKENS_MAX`), once per size, as vLLM's maximal dummy step: a first step
        of a size pays for fresh activation memory (cpu-s, 2,048 tokens: 1,251-1,373 ms, then
        708-953)."""
        if capture_graphs and self.graphs is not None and self.graphs.capture:
            self.graphs.capture_all(graph_rows, graph_ctx)
        m = min(4, self.max_len)
        d = min(1, self.slots - 1)  # the decode row, in slot 1 (none with a single slot)
        ids, pos, slot = [1] * (d + m), [0] * d + list(range(m)), [1] * d + [0] * m
        self._forward_packed(ids, pos, slot, d, [ChunkSpan(d, 0, 0, m)], list(range(d)) + [d + m - 1])
        n = min(int(tokens), WARMUP_TOKENS_MAX, self.slots * self.max_len)
        if n <= self._warm_tokens:
            return
        L = self.max_len  # chunk k fills slot k from position 0
        chunks = [ChunkSpan(off, k, 0, min(L, n - off)) for k, off in enumerate(range(0, n, L))]
        pos = [p for c in chunks for p in range(c.length)]
        slot = [c.slot for c in chunks for _ in range(c.length)]
        self._forward_packed([1] * n, pos, slot, 0, chunks, [n - 1])
        self._warm_tokens = n


def _slot(req: Request) -> int:
    """The slot of an admitted request."""
    assert req.slot is not None, f"request {req.rid} is in a plan without a slot"
    return req.slot
