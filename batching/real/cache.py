"""The slab KV cache: ``k, v [layers, slabs, kv_heads, max_len, head_dim]``, one slab per slot
allocated up front (``kv.py``'s ``slab`` policy), plus with decode graphs a scratch slab for
their padding rows."""

from __future__ import annotations

import torch
from torch import Tensor

from .hardware import available_bytes, check_fits
from .model import ModelConfig


def kv_cache_bytes(cfg: ModelConfig, slots: int, max_len: int, dtype: torch.dtype) -> int:
    """Bytes of the K and V slabs."""
    return 2 * cfg.layers * slots * cfg.kv_heads * max_len * cfg.head_dim * dtype.itemsize


class SlabCache:
    """K and V slabs of ``slots`` x ``max_len`` positions (plus a ``scratch`` slab), checked
    against free memory before they are allocated."""

    def __init__(
        self,
        cfg: ModelConfig,
        slots: int,
        max_len: int,
        device: torch.device,
        dtype: torch.dtype,
        scratch: bool = False,
        mem_available: int | None = None,
    ) -> None:
        self.slots, self.max_len, self.device, self.dtype = slots, max_len, device, dtype
        slabs = slots + 1 if scratch else slots
        self.scratch: int | None = slots if scratch else None
        self.nbytes = kv_cache_bytes(cfg, slabs, max_len, dtype)
        shape = (cfg.layers, slabs, cfg.kv_heads, max_len, cfg.head_dim)
        check_fits(
            self.nbytes,
            available_bytes(device) if mem_available is None else mem_available,
            f"KV cache {list(shape)} x 2 (K, V) in {dtype}",
            device,
        )
        # Zeros, not empty: decode reads masked positions too, and a NaN there would still
        # poison the output (0 x NaN).
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # Per-layer views made once: indexing anew costs two dispatches per layer and step.
        self.layers: list[tuple[Tensor, Tensor]] = list(zip(self.k.unbind(0), self.v.unbind(0)))
