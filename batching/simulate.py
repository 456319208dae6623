"""One simulated run in one call: a workload, a cost model, a scheduler by name.

``simulate(workload, cost, "continuous", slots=64)`` builds the scheduler the CLI would
(:func:`~batching.schedulers.make_scheduler`), with the KV capacity the cost model's devices
leave after the weights, and runs the requests on its clock (:class:`~batching.engine.SimExecutor`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from .costs.base import CostModel
from .engine import RunResult, SimExecutor, run
from .request import Request
from .schedulers import make_scheduler
from .workloads import Workload


def simulate(
    workload: Workload | Sequence[Request],
    cost: CostModel,
    scheduler: str,
    *,
    slots: int = 32,
    kv_tokens: int | float | str | None = "device",
    kv_policy: str = "slab",
    record_slots: bool = False,
    fast: bool = True,
    **options: Any,
) -> RunResult:
    """One simulated run. ``kv_tokens="device"`` takes the KV capacity the devices leave after
    the weights, ``None`` none; ``options`` go to :func:`make_scheduler`. ``fast=False`` logs
    every step on its own row (the fast path logs a run of identical decode steps as one,
    with the KV and queue columns as they stand after its last step)."""
    if kv_tokens == "device":
        kv: float = cost.kv_capacity()
    elif kv_tokens is None:
        kv = math.inf
    else:
        kv = kv_tokens  # type: ignore[assignment]
    sched = make_scheduler(
        scheduler,
        max_context=cost.model.max_context,
        slots=slots,
        kv_capacity=kv,
        kv_policy=kv_policy,
        **options,
    )
    reqs = workload.fresh() if isinstance(workload, Workload) else list(workload)
    return run(reqs, sched, SimExecutor(cost), record_slots=record_slots, fast=fast)


def offered_rate(workload: Workload) -> float:
    """Requests per second of a workload: count / span of its arrivals."""
    return len(workload) / workload.duration if workload.duration > 0 else math.inf
