"""One engine loop for every scheduler and executor: plan, execute, advance the virtual clock
by the step's duration, commit. With nothing to run the clock jumps to the next arrival or
the scheduler's wake-up; it never sleeps.

Fast path: between two events (an admissible arrival, a finish, a KV limit) every step is a
decode step of the same batch. If the executor can predict such a run (``decode_run``), the
loop advances it in one go, with the same timestamps, bit for bit, as stepping one at a time.
"""

from __future__ import annotations

import math
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol, runtime_checkable

import numpy as np

from .plan import StepPlan, StepWork
from .request import Request
from .schedulers.base import Scheduler
from .steplog import Accounting, StepLog, StepRow, occupancy


@dataclass
class StepResult:
    duration: float  # seconds, predicted or measured
    token_ids: dict[int, int] | None = None  # rid -> token emitted (real executors)


class Hardware(Protocol):
    """What hardware utilization is judged against: peak FLOP/s and bandwidth summed over the
    devices a step runs on, and the ``model`` whose FLOPs and bytes each step costs (None: not
    known, so no utilization is reported)."""

    peak_flops: float
    bandwidth: float

    @property
    def model(self) -> Accounting | None: ...


class Executor(Protocol):
    """What the engine loop reads from an executor, simulated or real; ``utilization_basis``
    is what the run's hardware utilization is reported against: a simulated run's own cost
    model, a real run's registry roofline of its device (None: not reported)."""

    @property
    def utilization_basis(self) -> Hardware | None: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def decode_run(self, plan: StepPlan, k: int) -> np.ndarray | None:
        """Durations of ``k`` consecutive decode-only steps of ``plan``'s batch, or None."""
        ...

    def describe(self) -> dict[str, Any]: ...


@runtime_checkable
class StepCost(Hardware, Protocol):
    """What the simulated clock asks of a cost model (:mod:`batching.costs`: the roofline or
    a measured profile)."""

    def step_time(self, work: StepWork) -> float: ...

    def decode_run(self, rows: int, ctx0: int, growth: int, k: int) -> np.ndarray: ...

    def describe(self) -> dict[str, Any]: ...


class SimExecutor:
    """Executes a plan on a simulated clock: the duration comes from a cost model."""

    def __init__(self, cost: StepCost) -> None:
        self.cost = cost

    @property
    def utilization_basis(self) -> StepCost:
        return self.cost

    def execute(self, plan: StepPlan) -> StepResult:
        return StepResult(self.cost.step_time(plan.work()))

    def decode_run(self, plan: StepPlan, k: int) -> np.ndarray | None:
        w = plan.work()
        return self.cost.decode_run(w.decode_rows, w.decode_ctx, len(plan.decodes), k)

    def describe(self) -> dict[str, Any]:
        return {"executor": "simulated", **self.cost.describe()}


@dataclass
class RunResult:
    requests: list[Request]
    log: StepLog
    scheduler: dict[str, Any]
    executor: dict[str, Any]
    preemptions: int
    wall_s: float
    fast_steps: int = 0
    utilization_basis: Hardware | None = None  # the executor's (Executor.utilization_basis)

    @property
    def num_steps(self) -> int:
        return int(sum(self.log.cols["n"]))


def check_fresh(requests: Sequence[Request], scheduler: Scheduler) -> list[Request]:
    """``requests`` as a list, refused with one clear error if they cannot be run: empty, not
    sorted by arrival, already run, or one the scheduler could never serve."""
    reqs = list(requests)
    if not reqs:
        raise ValueError("empty workload: nothing to run")
    for a, b in zip(reqs, reqs[1:]):
        if b.arrival < a.arrival:
            raise ValueError(
                f"arrivals must be sorted: request {b.rid} arrival={b.arrival} "
                f"comes after request {a.rid} arrival={a.arrival}"
            )
    for r in reqs:
        if r.generated or r.num_computed or r.slot is not None:
            raise ValueError(f"request {r.rid} has already run: pass fresh requests (Workload.fresh())")
        scheduler.validate(r)  # refuse up front what could never run
    return reqs


@contextmanager
def _progress(total: int, show: bool) -> Iterator[Callable[[int], None]]:
    """A callback taking the number of finished requests: a tqdm bar when ``show``."""
    if not show:
        yield lambda done: None
        return
    from tqdm.auto import tqdm

    bar = tqdm(total=total, unit="req", mininterval=0.5)

    def tick(done: int) -> None:
        bar.n = done
        bar.refresh() if done == total else bar.update(0)

    try:
        yield tick
    finally:
        bar.close()


def run(
    requests: Sequence[Request],
    scheduler: Scheduler,
    executor: Executor,
    *,
    record_slots: bool = False,
    fast: bool = True,
    progress: bool = False,
) -> RunResult:
    """Serve ``requests`` (fresh, sorted by arrival) with ``scheduler`` on ``executor``."""
    reqs = check_fresh(requests, scheduler)
    log = StepLog(record_slots)
    wall0 = time.perf_counter()
    with _progress(len(reqs), progress) as tick:
        fast_steps = _loop(reqs, scheduler, executor, log, fast, tick)
    scheduler.check_idle()
    assert all(r.done for r in reqs), "a request did not finish"
    return RunResult(
        requests=reqs,
        log=log,
        scheduler=scheduler.config(),
        executor=executor.describe(),
        preemptions=scheduler.preemptions,
        wall_s=time.perf_counter() - wall0,
        fast_steps=fast_steps,
        utilization_basis=executor.utilization_basis,
    )


def _loop(
    reqs: list[Request],
    scheduler: Scheduler,
    executor: Executor,
    log: StepLog,
    fast: bool,
    tick: Callable[[int], None],
) -> int:
    """The engine loop: deliver arrivals, plan, execute, advance the clock, commit, log.
    Returns how many steps the fast path advanced."""
    n, i, t = len(reqs), 0, reqs[0].arrival
    slots = scheduler.max_slots
    fast_steps = 0
    while True:
        while i < n and reqs[i].arrival <= t:
            scheduler.on_arrival(reqs[i])
            i += 1
        plan = scheduler.schedule(t)
        if plan is None:
            if i == n and not scheduler.has_work:
                return fast_steps
            nxt = min(reqs[i].arrival if i < n else math.inf, scheduler.wakeup() or math.inf)
            if not nxt > t:
                st = scheduler.snapshot()
                raise RuntimeError(
                    f"scheduler {scheduler.name} is stuck at t={t}: {st.waiting} waiting, {st.running} running"
                )
            t = nxt
            continue
        state = scheduler.snapshot(plan)  # during the step (for a run: its first step)
        occ = occupancy(plan) if log.record_slots else None
        t0 = t
        k = plan.steady if (fast and plan.is_decode_only) else 1
        durs = executor.decode_run(plan, k) if k > 1 else None
        if durs is not None:
            # Sequential accumulation from t gives the same floats as stepping one at a time;
            # bounds[j] is when step j starts (and step j-1 ends).
            bounds = list(accumulate(durs.tolist(), initial=t))
            if plan.arrival_sensitive and i < n:
                # Keep the steps that start before the next arrival (step 0 starts at t).
                k = bisect_left(bounds, reqs[i].arrival, 0, k)
            scheduler.commit_run(plan, bounds[1 : k + 1])
            t = bounds[k]
            fast_steps += k
        else:
            k = 1
            res = executor.execute(plan)
            if not (res.duration > 0 and math.isfinite(res.duration)):
                raise RuntimeError(f"executor returned step duration={res.duration!r}")
            t = t0 + res.duration
            scheduler.commit(plan, t, res.token_ids)
        log.add(StepRow.of(plan, state, slots, t0, t - t0, k), occ)
        tick(scheduler.num_finished)
