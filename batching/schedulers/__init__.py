"""The four schedulers of chapter 7, all torch-free (see ``base.py`` for the contract)."""
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

__all__ = ["SCHEDULERS", "Scheduler", "StaticScheduler", "DynamicScheduler",
           "ContinuousScheduler", "ChunkedPrefillScheduler"]
