"""Named model shapes, the one registry of ``simulate``, ``run`` and ``measure``: what a cost
model needs of a Llama-style decoder (parameters, bytes a step streams, FLOPs it does)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import cached_property
from typing import Any

import numpy as np

from ..plan import StepWork

#: Bytes per element of each dtype the project uses.
DTYPE_BYTES: dict[str, int] = {"fp32": 4, "bf16": 2, "fp8": 1}
_DTYPE_ALIASES: dict[str, str] = {
    "float32": "fp32",
    "bfloat16": "bf16",
    "float64": "fp64",
    "float8": "fp8",
    "float8_e4m3fn": "fp8",
    "e4m3": "fp8",
}
_BYTES_DTYPE: dict[int, str] = {b: d for d, b in DTYPE_BYTES.items()}


def dtype_key(dtype: str) -> str:
    """A dtype's short name, whichever way it is spelled (``'bfloat16'`` -> ``'bf16'``,
    ``'float64'`` -> ``'fp64'``), unchecked: the registry's dtypes are :data:`DTYPE_BYTES`'
    (:func:`canonical_dtype`), the real engine's its torch table's."""
    return _DTYPE_ALIASES.get(str(dtype).lower(), str(dtype).lower())


def canonical_dtype(dtype: str) -> str:
    """``'bfloat16'`` -> ``'bf16'`` etc.; ValueError naming the valid dtypes otherwise."""
    d = dtype_key(dtype)
    if d not in DTYPE_BYTES:
        raise ValueError(f"unknown dtype {dtype!r}; valid: {', '.join(DTYPE_BYTES)}")
    return d


@dataclass(frozen=True)
class ModelShape:
    """A Llama-style decoder's shape and storage dtypes.

    ``bytes_per_param`` is the weight dtype (2 bf16, 4 fp32, 1 fp8); ``kv_bytes`` the KV
    cache's bytes per element. ``max_context`` is the serving context limit: it sets the
    slab a ``slab`` KV policy reserves per request.
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    ffn: int
    vocab: int
    max_context: int
    bytes_per_param: int = 2
    kv_bytes: int = 2
    tied_embeddings: bool = False

    def __post_init__(self) -> None:
        for f in ("layers", "hidden", "heads", "kv_heads", "ffn", "vocab", "max_context"):
            v = getattr(self, f)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{self.name}: {f}={v!r} must be a positive integer")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(
                f"{self.name}: hidden {self.hidden}, heads {self.heads}, kv_heads "
                f"{self.kv_heads}: heads must divide hidden and kv_heads divide heads"
            )
        for f in ("bytes_per_param", "kv_bytes"):
            if getattr(self, f) not in _BYTES_DTYPE:
                raise ValueError(
                    f"{self.name}: {f}={getattr(self, f)!r} must be one of {sorted(_BYTES_DTYPE)}"
                )

    # ------------------------------------------------------------------ sizes
    @property
    def dtype(self) -> str:
        """Weight dtype name (``fp32``, ``bf16``, ``fp8``)."""
        return _BYTES_DTYPE[self.bytes_per_param]

    @property
    def kv_dtype(self) -> str:
        return _BYTES_DTYPE[self.kv_bytes]

    # cached: the simulator asks for these on every step
    @cached_property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @cached_property
    def layer_matmul_params(self) -> int:
        """q, k, v, o projections + gate, up, down of one layer."""
        q_o = 2 * self.hidden * self.heads * self.head_dim
        k_v = 2 * self.hidden * self.kv_heads * self.head_dim
        return q_o + k_v + 3 * self.hidden * self.ffn

    @cached_property
    def params(self) -> int:
        """Exact parameter count: embeddings, layers (+2 RMSNorm weights each), final norm, lm head unless tied."""
        emb = self.vocab * self.hidden
        per_layer = self.layer_matmul_params + 2 * self.hidden
        head = 0 if self.tied_embeddings else emb
        return emb + self.layers * per_layer + self.hidden + head

    @cached_property
    def weight_bytes(self) -> int:
        """Bytes the weights occupy in memory."""
        return self.params * self.bytes_per_param

    @cached_property
    def weight_read_bytes(self) -> int:
        """Bytes of weights one forward pass streams: all but an *untied* input embedding,
        of which a step gathers only its tokens' rows (llama-8b: 15.0 GB of its 16.1 GB)."""
        unread = 0 if self.tied_embeddings else self.vocab * self.hidden
        return (self.params - unread) * self.bytes_per_param

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """K and V of every layer for one token."""
        return 2 * self.layers * self.kv_heads * self.head_dim * self.kv_bytes

    @cached_property
    def attn_flops_per_pair(self) -> int:
        """FLOPs per (query, key) pair: QK^T and PV, 2 each per head dimension."""
        return 4 * self.layers * self.heads * self.head_dim

    # ------------------------------------------------------- per-step totals
    def flops_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        """FLOPs of steps as float64 arrays (see :meth:`flops`), elementwise; logits for decode
        rows only (a prefill chunk samples at most one position: ignored)."""
        body = 2.0 * float(self.layers * self.layer_matmul_params)
        head = 2.0 * float(self.vocab * self.hidden)
        return body * (pt + rows) + head * rows + float(self.attn_flops_per_pair) * (pa + ctx)

    def bytes_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any:
        """Bytes moved by steps given as float64 arrays (see :meth:`bytes_moved`)."""
        kv = float(self.kv_bytes_per_token)
        # Keys before a prefill chunk, read once per chunk: exact for one chunk, since
        # pa = n*start + n(n+1)/2; with several chunks it undercounts (clamped at 0).
        earlier = _max(pa - pt * (pt + 1.0) / 2.0, 0.0) / _max(pt, 1.0)
        weights = float(self.weight_read_bytes) * ((pt + rows) > 0)
        return weights + kv * (ctx + earlier) + kv * (pt + rows)

    def flops(self, work: StepWork) -> float:
        """Model FLOPs of one step, all devices together: 2 x matmul params per token, plus
        :attr:`attn_flops_per_pair` per (query, key) pair."""
        return float(self.flops_arrays(*_as_f64(work)))

    def bytes_moved(self, work: StepWork) -> float:
        """Bytes one step moves, all devices together: the weights once (if it computes
        anything), the KV decode rows read, the KV before each prefill chunk once, the KV
        written for every token. Activations (MBs against GBs) are ignored, and so are a
        chunk's own keys (they stay on chip in a fused attention kernel)."""
        return float(self.bytes_arrays(*_as_f64(work)))

    def with_dtype(self, weights: str) -> ModelShape:
        """The same shape stored in another dtype, KV too, except that fp8 weights keep the KV
        dtype (as vLLM does unless told otherwise)."""
        w = canonical_dtype(weights)
        k = self.kv_dtype if w == "fp8" else w
        return replace(self, bytes_per_param=DTYPE_BYTES[w], kv_bytes=DTYPE_BYTES[k])


def _max(a: Any, b: float) -> Any:
    """Elementwise max for arrays, plain max for Python floats (the simulator's scalar
    path): the same IEEE operations either way, so both give bit-identical results."""
    return max(a, b) if isinstance(a, float) else np.maximum(a, b)


def _as_f64(work: StepWork) -> tuple[np.float64, np.float64, np.float64, np.float64]:
    return (
        np.float64(work.prefill_tokens),
        np.float64(work.prefill_attn),
        np.float64(work.decode_rows),
        np.float64(work.decode_ctx),
    )


_LLAMA_VOCAB = 128256  # Llama 3 tokenizer (config.json of every Llama 3.x checkpoint)
# CPU shapes run fp32 (bf16 is 6x slower on this CPU) with tied embeddings; max_context 2048
# is the longest prefill measured there, enough for traces divided 8-16x.
_CPU: dict[str, Any] = {
    "vocab": 8192,
    "max_context": 2048,
    "bytes_per_param": 4,
    "kv_bytes": 4,
    "tied_embeddings": True,
}
# Llama 3.x is trained to 131072 tokens; served at 8192, a common limit, so that slab
# reservations stay comparable across models.
_LLAMA: dict[str, Any] = {"vocab": _LLAMA_VOCAB, "max_context": 8192}
# Llama 2 and CodeLlama: the 32000-token SentencePiece vocabulary, trained to 4096 tokens.
_LLAMA2: dict[str, Any] = {"vocab": 32000, "max_context": 4096}

MODELS: dict[str, ModelShape] = {
    m.name: m
    for m in (
        # name, layers, hidden, heads, kv_heads, ffn
        ModelShape("tiny", 2, 64, 4, 2, 176, **{**_CPU, "vocab": 256, "max_context": 512}),  # unit tests
        # S / M / L, the shapes this CPU's device entry was measured on (costs/devices.py,
        # cpu-here): 26.4M / 117.2M / 392.2M params
        ModelShape("cpu-s", 8, 512, 8, 2, 1376, **_CPU),
        ModelShape("cpu-m", 12, 768, 12, 4, 3328, **_CPU),
        ModelShape("cpu-l", 24, 1024, 16, 4, 4352, **_CPU),
        # meta-llama/Llama-3.2-1B and Llama-3.1-{8B,70B} config.json
        ModelShape("llama-1b", 16, 2048, 32, 8, 8192, **_LLAMA, tied_embeddings=True),
        ModelShape("llama-8b", 32, 4096, 32, 8, 14336, **_LLAMA),
        ModelShape("llama-70b", 80, 8192, 64, 8, 28672, **_LLAMA),
        # The shapes of Vidur's published GPU profiles (data/gpu-profiles), from each
        # checkpoint's config.json: meta-llama/Llama-2-{7b,70b}-hf (vocab 32000, 4096 positions)
        # and codellama/CodeLlama-34b-Instruct-hf (vocab 32000, 16384 positions; the 7B and 13B
        # CodeLlamas have 32016). Vidur's tables were measured with vocab_size 32768 (its
        # model_config.py), which only their embedding lookup sees.
        ModelShape("llama-2-7b", 32, 4096, 32, 32, 11008, **_LLAMA2),
        ModelShape("llama-2-70b", 80, 8192, 64, 8, 28672, **_LLAMA2),
        ModelShape("codellama-34b", 48, 8192, 64, 8, 22016, **{**_LLAMA2, "max_context": 16384}),
    )
}


def get_model(name: str) -> ModelShape:
    """The registered shape called ``name``; ValueError listing the valid names otherwise."""
    m = MODELS.get(str(name).lower())
    if m is None:
        raise ValueError(f"unknown model {name!r}; valid: {', '.join(MODELS)}")
    return m
