"""The real engine's slab KV cache: one slab of ``max_len`` positions per slot,
``k, v: [layers, slabs, kv_heads, max_len, head_dim]``, allocated up front (what the ``slab``
policy of ``kv.py`` counts). With decode graphs one more slab, the scratch slab no request
owns, takes the writes of a graph's padding rows.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .hardware import available_bytes, check_fits
from .model import ModelConfig


def kv_cache_bytes(cfg: ModelConfig, slots: int, max_len: int, dtype: torch.dtype) -> int:
    """Bytes of the K and V slabs."""
    return 2 * cfg.layers * slots * cfg.kv_heads * max_len * cfg.head_dim * dtype.itemsize


class SlabCache:
    """K and V slabs for ``slots`` slots of ``max_len`` positions (plus the scratch slab if
    ``scratch``), checked against the device's free memory before they are allocated."""

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
        #: The slab a decode graph's padding rows write into (None without graphs).
        self.scratch: int | None = slots if scratch else None
        self.nbytes = kv_cache_bytes(cfg, slabs, max_len, dtype)
        shape = (cfg.layers, slabs, cfg.kv_heads, max_len, cfg.head_dim)
        check_fits(
            self.nbytes,
            available_bytes(device) if mem_available is None else mem_available,
            f"KV cache {list(shape)} x 2 (K, V) in {dtype}",
            device,
        )
        # Zeros, not empty: a decode batch reads every row's slab up to the batch's longest
        # context and masks the rest; masked garbage that happened to be NaN would still
        # poison the output (0 x NaN), so every position must hold a finite value.
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        # Per-layer views made once: indexing the slab anew in every layer of every step is
        # two more dispatches per layer, which a one-token CPU step pays in full.
        self.layers: list[tuple[Tensor, Tensor]] = list(zip(self.k.unbind(0), self.v.unbind(0)))
