"""A Llama-style decoder in one readable file (the real engine of chapter 7; "Why batching").

RMSNorm, rotary positions (RoPE), grouped-query attention through
``scaled_dot_product_attention``, a SwiGLU MLP, tied or untied lm head: the architecture of
Llama 3, built from a registry :class:`~batching.models.ModelShape` with seeded random
weights. No checkpoint is loaded: what batching costs and whether it changes a request's
tokens do not depend on what the weights know.

The model does not own a KV cache. :meth:`Llama.forward` runs every linear layer on all
``T`` tokens of a step packed into one ``[T, hidden]`` matrix, so the weights are streamed
once per step whatever the batch holds, and hands each layer's queries, keys and values to
an ``attend`` callback: the runner (``runner.py``) writes them into its slabs and decides
who attends to what. :meth:`Llama.forward_full` is the cache-free reference that tests
compare against.

Shapes in comments: T packed tokens, H query heads, K kv heads, D head dim, V vocab.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..models import ModelShape

#: Query, key, value of one layer for the packed tokens -> attention output [T, H, D].
AttendFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ModelConfig(ModelShape):
    """A registry shape plus what only the torch model needs (sizes, parameter count and
    head_dim are ModelShape's: one registry, no second copy of the numbers)."""

    # Llama 3 trains with theta 500,000 so that rotations stay distinguishable over 128K
    # positions; the small demo shapes serve at most 2,048 positions, for which the
    # original RoPE's 10,000 (RoFormer, Llama 1/2) is the usual choice.
    rope_theta: float = 10_000.0
    # Llama 3's rms_norm_eps.
    norm_eps: float = 1e-5
    # Embedding (and untied lm head) init, as Llama/GPT-2 initialize. The matrices inside
    # the blocks are scaled by fan-in instead: see Llama._init_weights.
    embed_std: float = 0.02

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelConfig:
        """The config of a registry shape (``tiny``, ``cpu-m``, ``llama-8b``, ...): every real run of 7.1-7.3."""
        theta = 500_000.0 if shape.name.startswith("llama") else 10_000.0
        return cls(**{f.name: getattr(shape, f.name) for f in fields(ModelShape)}, rope_theta=theta)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU (bf16 matmuls are ~6x slower on this project's CPU, which has no bf16
    instructions: shared/notes/cpu-decode-measurements.md), bf16 on CUDA."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm (every real run, 7.1-7.3): x [T, d] -> [T, d], in at least fp32 as Llama does for bf16.

    fp32 and fp64 go through ``F.rms_norm`` (torch >= 2.4, the ``model`` extra's floor), one
    call where the bf16 formula is six: on CPU a one-token norm costs ~25 us that way
    against ~39 us (its arithmetic is ~1 us). So does everything on CUDA, where torch >= 2.8
    runs it as one fused kernel (``_fused_rms_norm``) that accumulates bf16 in fp32 and
    multiplies by the weight before rounding (Llama's formula rounds first): one kernel
    where a decode step has ~20 per layer, each a few microseconds of a ~4 ms step (8B, H200)."""
    if x.dtype in (torch.bfloat16, torch.float16) and x.device.type != "cuda":
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * weight
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE (7.1-7.3): x [T, n, D] rotated by its token's angles; cos, sin_signed [T, 1, D]. Positions
    come from the plan, so a token's rotation does not depend on what else is in the batch.

    The Hugging Face Llama convention, ``x * cos + rotate_half(x) * sin`` with
    rotate_half((x1, x2)) = (-x2, x1), in three ops instead of six: rotate_half(x) is x
    rolled by D/2 with its first half negated, and that sign is folded into
    ``sin_signed`` (Llama.sin_signed). A decode step is a few dozen small ops per layer
    on CPU, each costing more in dispatch than in arithmetic."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)


def _gqa_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, dict[str, bool]]:
    """k, v and the keywords to call SDPA with, q having H heads and k, v K: as they are, with
    ``enable_gqa`` where H != K; on torch < 2.5, which has no enable_gqa, each kv head copied H/K times."""
    if q.shape[1] == k.shape[1]:
        return k, v, {}
    if _SDPA_HAS_GQA:
        return k, v, {"enable_gqa": True}
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), {}


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """Grouped-query attention (7.2 decode rows, 7.3 chunks): q [B, H, Tq, D], k, v [B, K, Tk, D] -> [B, H, Tq, D].

    ``mask`` is boolean, True where a query may attend, or a float bias added to the scores
    (decode graphs: 0 or -inf); broadcast to [B, H, Tq, Tk].
    """
    k, v, gqa = _gqa_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **gqa)


#: Token id of static batching's padding (7.1) and of decode graphs' padding rows; prompts never contain it.
PAD_ID = 0


def gqa_decode(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """One query per row against its slab (decode, eager and graphed): q [B, H, D], k, v
    [B, K, L, D], mask [B, 1, 1, L] (boolean, or added to the scores; None: all seen) -> [B, H, D].

    Grouped-query packing: query heads h = j*G .. j*G + G - 1 share kv head j (the
    repeat_interleave convention of ``enable_gqa``), so as G queries of head j they are
    plain multi-head attention, which every SDPA backend runs with a mask; masked
    ``enable_gqa`` falls back to the math kernel on CUDA (fp32 upcast, K/V expanded to all
    heads, scores materialized) in torch 2.11."""
    B, H, D = q.shape
    K = k.shape[1]
    return sdpa(q.view(B, K, H // K, D), k, v, mask).reshape(B, H, D)  # [B, K, G, D] -> [B, H, D]


def gqa_chunk(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """A prefill chunk after cached context, grouped-query packed as :func:`gqa_decode`:
    q [m, H, D] (the chunk's queries), k, v [1, K, L, D] (its slot), mask [m, L] (boolean)
    -> [m, H, D]. The chunk's G heads per kv head become G x m queries of that head."""
    m, H, D = q.shape
    K = k.shape[1]
    G = H // K
    qp = q.view(m, K, G, D).permute(1, 2, 0, 3).reshape(1, K, G * m, D)  # query g*m + i: position i
    o = sdpa(qp, k, v, mask.repeat(G, 1))  # [1, K, G*m, D]
    return o.view(K, G, m, D).permute(2, 0, 1, 3).reshape(m, H, D)


def sdpa_backend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> str:
    """The SDPA kernel torch picks for these inputs (``flash_attention``, ``efficient_attention``,
    ``cudnn_attention``, ``math``...), as :func:`sdpa` would call it: recorded with every profile
    and real run, since a step timed on the math kernel is timed on a kernel no server runs."""
    from torch.nn.attention import SDPBackend

    k, v, gqa = _gqa_kv(q, k, v)
    # A private API: where it fails, say so, never fail a run.
    try:
        return str(SDPBackend(int(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, **gqa))).name).lower()
    except (AttributeError, RuntimeError, TypeError, ValueError) as e:
        return f"unknown ({type(e).__name__})"


#: Largest token count for which Llama.linear uses ``(W @ x.T).T`` on CPU. Measured here
#: on whole prefill steps (quiet machine, best of 2 x 5): faster at 128 tokens (cpu-s 71.7
#: vs 81.3 ms with F.linear, cpu-m 281 vs 306 ms) and slower at 255 (cpu-s 156 vs 130 ms,
#: cpu-m 700 vs 553 ms).
WX_MAX_TOKENS = 128


def padded_tokens(T: int) -> int:
    """How many rows a ``(W @ x.T).T`` product of ``T`` tokens runs on (CPU, 7.2's odd batch sizes).

    MKL's kernels for this product are fast for row counts that are multiples of 8 (and
    4), slow in between: measured here on whole ``cpu-m`` decode steps (median of 4
    interleaved rounds), 3 rows 55.6 ms against 38.9 for 4, 7 rows 84.4 against 70.2 for 8,
    13-15 rows 126-148 against 87.9 for 16; on the 6656x768 matrix alone, 9-15 rows
    3.0-5.3 ms against 2.9 for 16, 25-31 rows 4.8-6.6 against 4.2 for 32. Zero rows are
    therefore added up to the next multiple of 8 (3 -> 4, 7 -> 8, 9..15 -> 16, ...), except
    for 1, 2, 5 and 6 rows, which cost less than the padded size (5 rows 57 ms, 8 rows 70)."""
    if T <= 8:
        return {3: 4, 7: 8}.get(T, T)
    return -(-T // 8) * 8


#: How a CPU model (``wx``) multiplies by its weights (:attr:`Llama.linear_form`).
LINEAR_CPU = (
    "(W @ x.T).T; batch 1: x @ W.T stored transposed, input dimension split one piece per thread "
    "(one bmm, summed)"
)


def split_ways(in_features: int, threads: int) -> int:
    """Into how many pieces a one-token step's matrix-vector product splits its input
    dimension on CPU (:meth:`Llama.linear`, "Why batching"): one piece per thread, as many
    as divide ``in_features`` evenly."""
    return max(s for s in range(1, max(threads, 1) + 1) if in_features % s == 0)


def batch1_copy_params(cfg: ModelConfig) -> int:
    """Elements of the transposed copies a CPU model keeps for one-token steps (the memory
    check of ``runner.py`` counts them): every linear weight, the lm head included."""
    H, K, D, d = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden
    per_layer = (H + 2 * K) * D * d + d * H * D + 2 * cfg.ffn * d + d * cfg.ffn
    return cfg.layers * per_layer + cfg.vocab * d


class Block(nn.Module):
    """One decoder layer (7.1-7.3): x + attention(norm(x)), then + SwiGLU(norm(x))."""

    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        d, hd = cfg.hidden, cfg.head_dim
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.attn_norm = nn.Parameter(torch.ones(d, **kw), requires_grad=False)
        # q, k and v share one matrix (and gate and up another): one matmul call each
        # instead of three and two, which matters where per-call overhead is ~ms (CPU).
        self.wqkv = nn.Parameter(
            torch.empty((cfg.heads + 2 * cfg.kv_heads) * hd, d, **kw), requires_grad=False
        )
        self.wo = nn.Parameter(torch.empty(d, cfg.heads * hd, **kw), requires_grad=False)
        self.mlp_norm = nn.Parameter(torch.ones(d, **kw), requires_grad=False)
        self.w_gate_up = nn.Parameter(torch.empty(2 * cfg.ffn, d, **kw), requires_grad=False)
        self.w_down = nn.Parameter(torch.empty(d, cfg.ffn, **kw), requires_grad=False)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        layer: int,
        attend: AttendFn,
        linear: Callable[[Tensor, Tensor], Tensor],
    ) -> Tensor:
        cfg, T = self.cfg, x.shape[0]
        H, K, D = cfg.heads, cfg.kv_heads, cfg.head_dim
        qkv = linear(rms_norm(x, self.attn_norm, cfg.norm_eps), self.wqkv)  # [T, (H + 2K) D]
        # q and k heads sit side by side in qkv: rotate them in one go (half the small ops
        # of a decode step's RoPE, which on CPU cost as much as their arithmetic).
        qk = apply_rope(qkv[:, : (H + K) * D].view(T, H + K, D), cos, sin)  # [T, H + K, D]
        q, k = qk.narrow(1, 0, H), qk.narrow(1, H, K)  # [T, H, D], [T, K, D]
        a = attend(layer, q, k, qkv[:, (H + K) * D :].view(T, K, D))  # [T, H, D]
        x = x + linear(a.reshape(T, H * D), self.wo)  # [T, d]
        gate, up = linear(rms_norm(x, self.mlp_norm, cfg.norm_eps), self.w_gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate).mul_(up), self.w_down)  # [T, d]


class Llama(nn.Module):
    """A Llama-style decoder with seeded random weights (the real engine of 7.1-7.3, "Why batching").

    ``wx`` picks how a linear layer is computed (see :meth:`linear`); it defaults to
    ``(W @ x.T).T`` on CPU and ``F.linear`` elsewhere.
    """

    # Buffers (register_buffer) and the lm head (a parameter, or the embedding when tied).
    cos: Tensor
    sin_signed: Tensor
    lm_head: Tensor

    def __init__(
        self,
        cfg: ModelConfig,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
        wx: bool | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        dtype = dtype or default_dtype(device)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self.wx = device.type == "cpu" if wx is None else wx
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.embed = nn.Parameter(torch.empty(cfg.vocab, cfg.hidden, **kw), requires_grad=False)  # [V, d]
        self.blocks = nn.ModuleList(Block(cfg, device, dtype) for _ in range(cfg.layers))
        self.norm = nn.Parameter(torch.ones(cfg.hidden, **kw), requires_grad=False)
        self.lm_head = (
            self.embed
            if cfg.tied_embeddings
            else nn.Parameter(torch.empty(cfg.vocab, cfg.hidden, **kw), requires_grad=False)
        )
        self._init_weights(seed)
        # RoPE angles for every servable position, computed in float64 once.
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
        ang = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64), inv_freq)  # [P, D/2]
        ang = torch.cat((ang, ang), dim=-1)  # [P, D]
        self.register_buffer("cos", ang.cos().to(**kw), persistent=False)
        sign = torch.cat((-torch.ones(cfg.head_dim // 2), torch.ones(cfg.head_dim // 2))).to(torch.float64)
        self.register_buffer("sin_signed", (ang.sin() * sign).to(**kw), persistent=False)  # see apply_rope
        self._b1: dict[int, Tensor] = {}
        self._b1_state: tuple[tuple[int, int], ...] = ()
        self.refresh_batch1()

    @property
    def layers(self) -> list[Block]:
        """The decoder layers, typed (``blocks`` is the ``nn.ModuleList`` that registers them)."""
        return cast("list[Block]", list(self.blocks))

    # ------------------------------------------------------------------ batch-1 copies
    def linear_weights(self) -> list[Tensor]:
        """Every matrix a forward pass multiplies by (the lm head last)."""
        return [w for b in self.layers for w in (b.wqkv, b.wo, b.w_gate_up, b.w_down)] + [self.lm_head]

    def _weights_state(self) -> tuple[tuple[int, int], ...]:
        # Identity and in-place version of each weight: a checkpoint copied in, or a
        # model moved to another dtype, changes one of them.
        return tuple((id(w), w._version) for w in self.linear_weights())

    @torch.no_grad()
    def refresh_batch1(self) -> None:
        """(Re)build the transposed copies of every weight that one-token steps use on CPU
        (see :meth:`linear`); ``forward`` calls this itself when a weight has changed."""
        self._b1 = {id(w): w.T.contiguous() for w in self.linear_weights()} if self.wx else {}
        self._b1_state = self._weights_state()

    @property
    def linear_form(self) -> str:
        """How this model multiplies by its weights (:meth:`linear`), recorded with every real
        run and benchmark."""
        return LINEAR_CPU if self.wx else "F.linear"

    def batch1_bytes(self) -> int:
        """Memory held by the batch-1 copies (reported with every real run)."""
        return sum(t.numel() * t.element_size() for t in self._b1.values())

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """Seeded normal weights, drawn in fp32 on the target device and then cast, so a
        float64 model holds exactly the fp32 model's weights (tests compare the two).

        Embeddings (and an untied lm head) use std 0.02. Matrices inside the blocks use
        std 1/sqrt(fan_in) (residual outputs further / sqrt(2 x layers), GPT-2's scaling):
        with 0.02 everywhere, a random block's output is far smaller than the token's own
        embedding, the tied lm head then scores the input token highest, and greedy
        decoding repeats one token forever. Scaled by fan-in the blocks dominate the
        residual stream. q and k get twice that, so attention scores spread by ~4 rather
        than ~1: near-uniform attention averages the context into a slowly changing state
        and about half the greedy tokens repeat their predecessor (measured on ``tiny``:
        0.49); sharp attention, as in a trained model, brings that to ~0.03. Greedy tokens
        then depend on the context and vary across positions, which the batch-invariance
        tests need.
        """
        g = torch.Generator(device=self.device).manual_seed(seed)

        def fill(p: Tensor, std: float) -> None:
            p.copy_(torch.randn(p.shape, generator=g, device=self.device, dtype=torch.float32) * std)

        cfg = self.cfg
        fill(self.embed, cfg.embed_std)
        resid = 1.0 / math.sqrt(2 * cfg.layers)
        qk = cfg.heads * cfg.head_dim + cfg.kv_heads * cfg.head_dim  # rows of q and k in wqkv
        for b in self.layers:
            fill(b.wqkv, 1.0 / math.sqrt(cfg.hidden))
            b.wqkv[:qk] *= 2.0
            fill(b.wo, resid / math.sqrt(cfg.heads * cfg.head_dim))
            fill(b.w_gate_up, 1.0 / math.sqrt(cfg.hidden))
            fill(b.w_down, resid / math.sqrt(cfg.ffn))
        if not cfg.tied_embeddings:
            fill(self.lm_head, cfg.embed_std)

    def num_params(self) -> int:
        """Parameters held (a tied head counted once), reported by the real runs of 7.1-7.3."""
        return sum(p.numel() for p in self.parameters())

    def linear(self, x: Tensor, w: Tensor) -> Tensor:
        """x [T, in] @ W[out, in].T -> [T, out] ("Why batching": the decode step's cost).

        On this project's CPU, ``F.linear`` (``x @ W.T``) leaves MKL's fast
        matrix-vector kernel as soon as T = 2, so batch 2 costs ~1.9x batch 1 and the
        flat region that makes batching pay disappears; ``(W @ x.T).T`` keeps the weights
        as the left operand and the step flat up to batch ~4
        (shared/notes/cpu-decode-measurements.md). GPUs have no such cliff: F.linear.

        The result is made contiguous because the *next* linear's fast path needs a
        row-major input: fed the transposed layout that ``(W @ x.T).T`` returns, the same
        product took 2-3x longer (6656x768 at T=2: 4.1 vs 1.4 ms). Above
        :data:`WX_MAX_TOKENS` tokens (prefill) both kernels are compute-bound and that copy
        costs more than it saves, so F.linear runs there. Below it, zero rows pad the token
        count to a size MKL's kernel handles fast (:func:`padded_tokens`: 13 rows cost ~1.4x
        16 rows unpadded).

        One-token steps (a batch of one decode) use both cores. MKL runs a matrix-vector
        product on one thread, which streams ~14-22 GB/s here whatever the layout; a batched
        product runs one matrix per thread. So the weight is kept a second time, transposed
        ([in, out] row-major), and its rows are split into :func:`split_ways` pieces (one per
        thread): x's matching pieces times each piece, one ``bmm``, summed. Measured here
        (24 copies of each shape streamed from DRAM, median of 11, split against the better
        unsplit layout): 25.8 GB/s against 13.2 for 768x768, 25.3 against 21.2 for
        768x3328, 20.2 against 15.8 for 1280x768, 27.2 against 21.7 for 6656x768; whole
        steps alternated with the previous kernel (tall weights transposed, others
        ``torch.mv``, four rounds): cpu-m 21.4-28.9 ms against 32.6-36.0, cpu-s 6.5-8.7
        against 7.9-9.9. The copies cost memory (+100% of the weights) but no bandwidth:
        each step still reads every weight once. From two tokens the batched product's
        per-thread kernel is slower than ``(W @ x.T).T`` (6656x768 at T=4: 10.2 against
        15.4 GB/s), so only batch 1 uses it.
        """
        T = x.shape[0]
        if self.wx and T == 1:
            wt = self._b1[id(w)]  # [in, out]
            n, out = wt.shape
            s = split_ways(n, torch.get_num_threads())
            if s == 1:
                return x @ wt  # [1, in] @ [in, out]
            # [s, 1, in/s] @ [s, in/s, out] -> [s, 1, out], one piece per thread; summed -> [1, out]
            return torch.bmm(x.reshape(s, 1, n // s), wt.view(s, n // s, out)).sum(0)
        if self.wx and T <= WX_MAX_TOKENS:
            P = padded_tokens(T)
            if P == T:
                return (w @ x.T).T.contiguous()
            xp = F.pad(x, (0, 0, 0, P - T))  # [P, in]: zero rows, see padded_tokens
            return (w @ xp.T).T[:T].contiguous()
        return F.linear(x, w)

    def token_buckets(self) -> list[int] | None:
        """The row counts a step's linear layers actually run on (:func:`padded_tokens`): a
        step of T tokens costs what the smallest bucket >= T costs. Profiles record them
        so that the simulator charges the same (``ProfileCost``); None when nothing is padded."""
        if not self.wx:
            return None
        return [t for t in range(1, WX_MAX_TOKENS + 1) if padded_tokens(t) == t]

    def forward(self, ids: Tensor, pos: Tensor, attend: AttendFn, rows: Tensor | None = None) -> Tensor:
        """One forward pass over ``T`` packed tokens of any number of sequences (7.1-7.3).

        ids, pos [T] (int64); ``attend(layer, q, k, v)`` does attention (and caching);
        ``rows`` [R] selects the tokens that need logits (the lm head is the largest
        single matrix of a small model: never spend it on tokens nobody samples).
        Returns logits [R, V] (all T rows if ``rows`` is None).
        """
        if self.wx and self._weights_state() != self._b1_state:
            self.refresh_batch1()
        x = self.embed[ids]  # [T, d]
        cos, sin = self.cos[pos, None], self.sin_signed[pos, None]  # [T, 1, D]: broadcast over heads
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, i, attend, self.linear)
        if rows is not None:
            x = x[rows]  # [R, d]
        return self.linear(rms_norm(x, self.norm, self.cfg.norm_eps), self.lm_head)  # [R, V]

    @torch.inference_mode()
    def forward_full(self, ids: Tensor) -> Tensor:
        """Reference for the 7.3 chunked-prefill and batch-invariance tests: logits [T, V] of one
        whole sequence, causal attention, no cache."""
        T = ids.shape[0]

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            o = sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True)
            return o[0].transpose(0, 1)  # [T, H, D]

        return self.forward(ids.to(self.device), torch.arange(T, device=self.device), attend)

    @torch.inference_mode()
    def generate_full(self, prompt: list[int], n: int) -> list[int]:
        """Greedy tokens of one sequence alone, recomputing everything each token (tests of 7.1-7.3)."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(self.forward_full(torch.tensor(seq))[-1].argmax()))
        return seq[len(prompt) :]
