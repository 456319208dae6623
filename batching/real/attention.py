"""Decode attention on a CPU that reads each row's own tokens from its slab.

torch's SDPA takes a dense batch: decode rows of different lengths are read to the longest
context of their group and masked, and rows in scattered slots are first gathered (a copy).
On this project's CPUs its kernel then streams the KV at about 10 GB/s, half the rate the
linear layers stream their weights at, and the peer benchmark's steps spend about a third
of their time there. ``csrc/decode_attention.cpp`` computes each (row, kv head) straight
from its slot, only to its own length: no gather, no padding, no mask.

The kernel is C++ compiled on first use (``torch.utils.cpp_extension``: a compiler and
ninja; about 25 s on a 2-core machine) into ``~/.cache/batching/ext`` and loaded from there afterwards,
keyed by its source, torch's version and the CPU's flags (it is built for this CPU,
``-march=native``). Where it cannot be built, :func:`decode_kernel` says why and the runner
keeps SDPA. ``BATCHING_DECODE_ATTENTION=sdpa`` keeps SDPA regardless.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Callable
from functools import cache
from pathlib import Path

import torch
from torch import Tensor

from .hardware import cpu_flags
from .kernels import user_cache

SOURCE = Path(__file__).resolve().parent / "csrc" / "decode_attention.cpp"
#: Floating-point reassociation lets the compiler vectorize the dot products and the
#: softmax's exp (glibc's vector math); the kernel never produces an infinity or a NaN.
CFLAGS = ("-O3", "-march=native", "-ffast-math")

#: q [R, H, D], kc, vc [S, K, L, D], slots, lens [R] int64 -> [R, H, D]
DecodeKernel = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], Tensor]


def ext_dir() -> Path:
    """Where compiled kernels are kept: ``$BATCHING_EXT_CACHE``, else ``~/.cache/batching/ext``."""
    return user_cache("ext", "BATCHING_EXT_CACHE")


def build_key() -> str:
    """What a build is valid for: the source, the flags, torch and the CPU's instructions."""
    h = hashlib.sha256()
    for part in (
        SOURCE.read_bytes(),
        " ".join(CFLAGS).encode(),
        torch.__version__.encode(),
        cpu_flags().encode(),
    ):
        h.update(part + b"\0")
    return h.hexdigest()[:16]


@cache
def _load() -> tuple[DecodeKernel | None, str]:
    if os.environ.get("BATCHING_DECODE_ATTENTION", "").lower() == "sdpa":
        return None, "BATCHING_DECODE_ATTENTION=sdpa"
    try:
        from torch.utils import cpp_extension

        key = build_key()
        where = ext_dir() / key
        where.mkdir(parents=True, exist_ok=True)
        mod = cpp_extension.load_inline(
            name=f"batching_decode_attention_{key}",
            cpp_sources=[SOURCE.read_text()],
            functions=["decode_attention"],
            extra_cflags=list(CFLAGS),
            build_directory=str(where),
            verbose=False,
        )
        return mod.decode_attention, f"built for this CPU ({key})"
    except Exception as e:  # no compiler, no ninja, headers missing: SDPA still works
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return None, f"not built: {type(e).__name__}: {first[:200]}"


def decode_kernel() -> DecodeKernel | None:
    """The compiled decode-attention kernel, or None where it cannot be built here."""
    return _load()[0]


def decode_kernel_status() -> str:
    """Whether the kernel runs here, and why not (what results record)."""
    return _load()[1]


def decode_reference(q: Tensor, kc: Tensor, vc: Tensor, slots: Tensor, lens: Tensor) -> Tensor:
    """What the kernel computes, row by row through SDPA (the tests' reference):
    q [R, H, D] -> [R, H, D]."""
    from .model import gqa_decode

    out = []
    for r in range(q.shape[0]):
        s, n = int(slots[r]), int(lens[r])
        out.append(gqa_decode(q[r : r + 1], kc[s : s + 1, :, :n], vc[s : s + 1, :, :n], None))
    return torch.cat(out)
