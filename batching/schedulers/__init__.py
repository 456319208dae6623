"""The four schedulers, torch-free (the contract: ``base.py``)."""

from typing import Any

from ..validate import ConfigError
from .base import Scheduler
from .chunked import ChunkedPrefillScheduler
from .continuous import ContinuousScheduler
from .dynamic import DynamicScheduler
from .static import StaticScheduler

SCHEDULERS = {
    "static": StaticScheduler,
    "dynamic": DynamicScheduler,
    "continuous": ContinuousScheduler,
    "chunked": ChunkedPrefillScheduler,
}

__all__ = [
    "SCHEDULERS",
    "make_scheduler",
    "Scheduler",
    "StaticScheduler",
    "DynamicScheduler",
    "ContinuousScheduler",
    "ChunkedPrefillScheduler",
]


def make_scheduler(
    name: str,
    *,
    max_context: int,
    slots: int = 32,
    max_wait: float = 0.0,
    prefill_mode: str = "mixed",
    token_budget: int = 512,
    chunk_size: int | None = None,
    kv_capacity: float = float("inf"),
    kv_policy: str = "slab",
) -> Scheduler:
    """A scheduler by name with the CLI's option names (``slots``: static and dynamic batch
    size; ``max_wait``: how long the oldest waiting request may wait for its batch to fill)."""
    kv: dict[str, Any] = {"kv_capacity": kv_capacity, "kv_policy": kv_policy}
    if name == "static":
        return StaticScheduler(slots, max_context, max_wait=max_wait, **kv)
    if name == "dynamic":
        return DynamicScheduler(slots, max_context, max_wait=max_wait, **kv)
    if name == "continuous":
        return ContinuousScheduler(slots, max_context, prefill_mode=prefill_mode, **kv)
    if name == "chunked":
        return ChunkedPrefillScheduler(
            slots, max_context, token_budget=token_budget, chunk_size=chunk_size, **kv
        )
    raise ConfigError(f"scheduler={name!r}: must be one of {', '.join(SCHEDULERS)}")
