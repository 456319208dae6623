"""A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU, tied or untied
head) of a registry :class:`~batching.costs.models.ModelShape`, with seeded random weights.

It owns no KV cache: :meth:`Llama.forward` runs every linear layer once on a step's ``T``
packed tokens and hands each layer's q, k, v to an ``attend`` callback (the runner's slabs).

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

from ..costs.models import ModelShape
from .kernels import LinearPlan, apply, plan_for, prepare

#: Query, key, value of one layer for the packed tokens -> attention output [T, H, D].
AttendFn = Callable[[int, Tensor, Tensor, Tensor], Tensor]


@dataclass(frozen=True)
class ModelConfig(ModelShape):
    """A registry shape plus what only the torch model needs."""

    # Llama 3's 500,000 keeps rotations apart over 128K positions; the demo shapes serve at
    # most 2,048, for which RoPE's original 10,000 is usual.
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5  # Llama 3's
    embed_std: float = 0.02  # embedding (and untied head) init; blocks: see Llama._init_weights

    @classmethod
    def from_shape(cls, shape: ModelShape) -> ModelConfig:
        """The config of a registry shape (``tiny``, ``cpu-m``, ``llama-8b``, ...)."""
        # Llama 3.x 500,000; Llama 2 (and every CPU shape) 10,000; CodeLlama 1,000,000.
        name = shape.name
        theta = 1e6 if name.startswith("codellama") else 10_000.0
        if name.startswith("llama") and not name.startswith("llama-2"):
            theta = 500_000.0
        return cls(**{f.name: getattr(shape, f.name) for f in fields(ModelShape)}, rope_theta=theta)


def default_dtype(device: str | torch.device) -> torch.dtype:
    """fp32 on CPU, bf16 on CUDA; ``auto`` (:func:`~batching.real.kernels.plan_for`) picks a
    CPU's by timing both."""
    return torch.bfloat16 if torch.device(device).type == "cuda" else torch.float32


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm: x [T, d] -> [T, d], one call (CPU one-token norm: ~14 us against ~18 for the
    six ops written out).

    In bf16 it computes in fp32, as Llama does, and rounds once at the end (Llama rounds
    before multiplying by the weight; the two differ only where the weight is not 1): on
    this CPU (torch 2.13) its largest error against float64 is half the written-out form's."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def apply_rope(x: Tensor, cos: Tensor, sin_signed: Tensor) -> Tensor:
    """RoPE: x [T, n, D] rotated by its token's angles; cos, sin_signed [T, 1, D].

    ``x * cos + rotate_half(x) * sin`` in three ops, not six (on CPU a small op costs more in
    dispatch than arithmetic): rotate_half is a roll by D/2, its sign folded into ``sin_signed``."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), sin_signed)


_SDPA_HAS_GQA = tuple(int(p) for p in torch.__version__.split(".")[:2] if p.isdigit()) >= (2, 5)


def _gqa_kv(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor, dict[str, bool]]:
    """k, v and SDPA's keywords: ``enable_gqa`` where H != K (torch < 2.5: kv heads repeated)."""
    if q.shape[1] == k.shape[1]:
        return k, v, {}
    if _SDPA_HAS_GQA:
        return k, v, {"enable_gqa": True}
    rep = q.shape[1] // k.shape[1]
    return k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1), {}


def sdpa(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> Tensor:
    """q [B, H, Tq, D], k, v [B, K, Tk, D] -> [B, H, Tq, D]; ``mask``: boolean (True attends)
    or a float bias, broadcast to [B, H, Tq, Tk]."""
    k, v, gqa = _gqa_kv(q, k, v)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal, **gqa)


#: Token id of static batching's padding and of decode graphs' padding rows; never in a prompt.
PAD_ID = 0


def gqa_decode(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None) -> Tensor:
    """One query per row: q [B, H, D], k, v [B, K, L, D], mask [B, 1, 1, L] or None -> [B, H, D].

    The G query heads of kv head j become G queries of head j: plain multi-head attention,
    which every SDPA backend runs masked (masked ``enable_gqa`` is the math kernel on CUDA,
    torch 2.11)."""
    B, H, D = q.shape
    K = k.shape[1]
    return sdpa(q.view(B, K, H // K, D), k, v, mask).reshape(B, H, D)  # [B, K, G, D] -> [B, H, D]


def gqa_chunk(q: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """A prefill chunk after cached context, packed as :func:`gqa_decode`: q [m, H, D],
    k, v [1, K, L, D] (its slot), mask [m, L] -> [m, H, D]; G heads become G x m queries."""
    m, H, D = q.shape
    K = k.shape[1]
    G = H // K
    qp = q.view(m, K, G, D).permute(1, 2, 0, 3).reshape(1, K, G * m, D)  # query g*m + i: position i
    o = sdpa(qp, k, v, mask.repeat(G, 1))  # [1, K, G*m, D]
    return o.view(K, G, m, D).permute(2, 0, 1, 3).reshape(m, H, D)


def sdpa_backend(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, causal: bool = False) -> str:
    """The SDPA kernel torch picks for these inputs (``flash_attention``, ``math``, ...)."""
    from torch.nn.attention import SDPBackend

    k, v, gqa = _gqa_kv(q, k, v)
    # A private API: never fail a run on it.
    try:
        return str(SDPBackend(int(torch._fused_sdp_choice(q, k, v, mask, 0.0, causal, **gqa))).name).lower()
    except (AttributeError, RuntimeError, TypeError, ValueError) as e:
        return f"unknown ({type(e).__name__})"


def form_copy_params(cfg: ModelConfig) -> int:
    """Elements of one extra form of every linear weight and the head (a CPU plan's ``split``
    or ``dnnl`` copies), which the memory check counts before the plan is probed."""
    H, K, D, d = cfg.heads, cfg.kv_heads, cfg.head_dim, cfg.hidden
    per_layer = (H + 2 * K) * D * d + d * H * D + 2 * cfg.ffn * d + d * cfg.ffn
    return cfg.layers * per_layer + cfg.vocab * d


class Block(nn.Module):
    """One decoder layer: x + attention(norm(x)), then + SwiGLU(norm(x))."""

    def __init__(self, cfg: ModelConfig, device: torch.device, dtype: torch.dtype) -> None:
        super().__init__()
        d, hd = cfg.hidden, cfg.head_dim
        kw: dict[str, Any] = {"device": device, "dtype": dtype}
        self.cfg = cfg
        self.attn_norm = nn.Parameter(torch.ones(d, **kw), requires_grad=False)
        # q, k, v in one matrix, gate and up in another: fewer calls where each costs ~ms (CPU).
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
        # q and k heads are adjacent in qkv: one RoPE for both (half its small ops, costly on CPU).
        qk = apply_rope(qkv[:, : (H + K) * D].view(T, H + K, D), cos, sin)  # [T, H + K, D]
        q, k = qk.narrow(1, 0, H), qk.narrow(1, H, K)  # [T, H, D], [T, K, D]
        a = attend(layer, q, k, qkv[:, (H + K) * D :].view(T, K, D))  # [T, H, D]
        x = x + linear(a.reshape(T, H * D), self.wo)  # [T, d]
        gate, up = linear(rms_norm(x, self.mlp_norm, cfg.norm_eps), self.w_gate_up).chunk(2, dim=-1)
        return x + linear(F.silu(gate).mul_(up), self.w_down)  # [T, d]


class Llama(nn.Module):
    """A Llama-style decoder with seeded random weights; its linear layers run the paths of a
    :class:`~batching.real.kernels.LinearPlan` (default: this machine's, probed once)."""

    cos: Tensor
    sin_signed: Tensor
    lm_head: Tensor

    def __init__(
        self,
        cfg: ModelConfig,
        device: str | torch.device = "cpu",
        dtype: torch.dtype | None = None,
        seed: int = 0,
        kernels: LinearPlan | None = None,
    ) -> None:
        super().__init__()
        device = torch.device(device)
        dtype = dtype or default_dtype(device)
        self.cfg, self.device, self.dtype = cfg, device, dtype
        self._kernels = kernels  # None: this machine's, probed at the first forward pass
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
        # RoPE angles of every servable position, in float64.
        inv_freq = cfg.rope_theta ** (-torch.arange(0, cfg.head_dim, 2, dtype=torch.float64) / cfg.head_dim)
        ang = torch.outer(torch.arange(cfg.max_context, dtype=torch.float64), inv_freq)  # [P, D/2]
        ang = torch.cat((ang, ang), dim=-1)  # [P, D]
        self.register_buffer("cos", ang.cos().to(**kw), persistent=False)
        sign = torch.cat((-torch.ones(cfg.head_dim // 2), torch.ones(cfg.head_dim // 2))).to(torch.float64)
        self.register_buffer("sin_signed", (ang.sin() * sign).to(**kw), persistent=False)  # see apply_rope
        self._forms: dict[tuple[int, str], Tensor] = {}
        self._forms_state: tuple[tuple[int, int], ...] | None = None

    @property
    def layers(self) -> list[Block]:
        return cast("list[Block]", list(self.blocks))

    def linear_weights(self) -> list[Tensor]:
        """Every matrix a forward pass multiplies by (the lm head last)."""
        return [w for b in self.layers for w in (b.wqkv, b.wo, b.w_gate_up, b.w_down)] + [self.lm_head]

    def _weights_state(self) -> tuple[tuple[int, int], ...]:
        # A checkpoint copied in, or a move to another dtype, changes one of these.
        return tuple((id(w), w._version) for w in self.linear_weights())

    @property
    def kernels(self) -> LinearPlan:
        """The plan the linear layers run (the first use of the default probes this machine:
        seconds, then cached on disk, see :func:`~batching.real.kernels.plan_for`)."""
        if self._kernels is None:
            self._kernels = plan_for(self.cfg, self.device, self.dtype)
        return self._kernels

    @torch.no_grad()
    def refresh_forms(self) -> None:
        """(Re)build what the plan's paths multiply by besides the weights themselves (a
        transposed copy for ``split``, oneDNN's reordered one for ``dnnl``); ``forward`` does
        on a change of the weights."""
        need = self.kernels.form_paths
        self._forms = {(id(w), p): prepare(p, w) for w in self.linear_weights() for p in need}
        self._forms_state = self._weights_state()

    def ensure_forms(self) -> None:
        """:meth:`refresh_forms` where the weights changed since (or none were built)."""
        if self.kernels.form_paths and self._weights_state() != self._forms_state:
            self.refresh_forms()

    def use_kernels(self, plan: LinearPlan) -> None:
        """Run the linear layers by ``plan`` from now on."""
        self._kernels = plan
        self.refresh_forms()

    @property
    def linear_form(self) -> str:
        """How this model multiplies by its weights (:meth:`LinearPlan.describe`)."""
        return self.kernels.describe()

    def forms_bytes(self) -> int:
        """Bytes of the weights' extra forms (transposed or reordered copies) now held."""
        return sum(t.numel() * t.element_size() for t in self._forms.values())

    @torch.no_grad()
    def _init_weights(self, seed: int) -> None:
        """Seeded normal weights, drawn in fp32 and cast (float64 holds the fp32 weights).

        Block matrices 1/sqrt(fan_in), residual outputs / sqrt(2 x layers) (GPT-2): with 0.02
        everywhere the tied head scores the input token highest and greedy decoding repeats
        it. q and k twice that: near-uniform attention repeats about half the greedy tokens
        (``tiny``: 0.49 vs ~0.03), and batch-invariance tests need context-dependent tokens."""
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
        """Parameters held (a tied head counted once)."""
        return sum(p.numel() for p in self.parameters())

    def linear(self, x: Tensor, w: Tensor) -> Tensor:
        """x [T, in] @ W[out, in].T -> [T, out], by the path the plan gives T rows, padded
        with zero rows where it runs them as more (:meth:`LinearPlan.lookup`)."""
        T = x.shape[0]
        path, P = self.kernels.lookup(T)
        if P > T:
            x = F.pad(x, (0, 0, 0, P - T))  # [P, in]
        y = apply(path, x, w, self._forms.get((id(w), path), w))
        return y[:T] if P > T else y

    def token_buckets(self) -> list[int] | None:
        """Row counts linear layers run on (for ``ProfileCost``); None: no padding."""
        return self.kernels.token_buckets()

    def forward(self, ids: Tensor, pos: Tensor, attend: AttendFn, rows: Tensor | None = None) -> Tensor:
        """ids, pos [T] (int64) -> logits [R, V] of the tokens ``rows`` [R] selects (None: all T);
        ``attend(layer, q, k, v)`` does attention and caching."""
        self.ensure_forms()
        x = self.embed[ids]  # [T, d]
        cos, sin = self.cos[pos, None], self.sin_signed[pos, None]  # [T, 1, D]: broadcast over heads
        for i, block in enumerate(self.blocks):
            x = block(x, cos, sin, i, attend, self.linear)
        if rows is not None:
            x = x[rows]  # [R, d]
        return self.linear(rms_norm(x, self.norm, self.cfg.norm_eps), self.lm_head)  # [R, V]

    @torch.inference_mode()
    def forward_full(self, ids: Tensor) -> Tensor:
        """Logits [T, V] of one whole sequence, causal, no cache (the tests' reference)."""
        T = ids.shape[0]

        def attend(layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
            o = sdpa(q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None], causal=True)
            return o[0].transpose(0, 1)  # [T, H, D]

        return self.forward(ids.to(self.device), torch.arange(T, device=self.device), attend)

    @torch.inference_mode()
    def generate_full(self, prompt: list[int], n: int) -> list[int]:
        """Greedy tokens of one sequence alone, recomputed from scratch each token."""
        seq = list(prompt)
        for _ in range(n):
            seq.append(int(self.forward_full(torch.tensor(seq))[-1].argmax()))
        return seq[len(prompt) :]
