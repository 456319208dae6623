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
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import Any, Protocol

import numpy as np

from .plan import StepPlan
from .request import Request
from .schedulers.base import Scheduler


@dataclass
class StepResult:
    duration: float  # seconds, predicted or measured
    token_ids: dict[int, int] | None = None  # rid -> token emitted (real executors)


class Accounting(Protocol):
    """The peak FLOP/s and bandwidth hardware utilization is judged against; with a ``model``
    (a ``ModelShape``) also each step's FLOPs and bytes."""

    peak_flops: float
    bandwidth: float


class Executor(Protocol):
    """What the engine loop reads from an executor; ``hardware`` is the accounting hardware
    utilization is reported with (None: not reported)."""

    @property
    def hardware(self) -> Accounting | None: ...

    def execute(self, plan: StepPlan) -> StepResult: ...

    def decode_run(self, plan: StepPlan, k: int) -> np.ndarray | None:
        """Durations of ``k`` consecutive decode-only steps of ``plan``'s batch, or None."""
        ...

    def describe(self) -> dict[str, Any]: ...


class SimExecutor:
    """Executes a plan on a simulated clock: the duration comes from a cost model."""

    def __init__(self, cost: Any) -> None:
        self.cost = cost

    @property
    def hardware(self) -> Any:
        return self.cost

    def execute(self, plan: StepPlan) -> StepResult:
        return StepResult(self.cost.step_time(plan.work()))

    def decode_run(self, plan: StepPlan, k: int) -> np.ndarray | None:
        w = plan.work()
        return self.cost.decode_run(w.decode_rows, w.decode_ctx, len(plan.decodes), k)

    def describe(self) -> dict[str, Any]:
        return {"executor": "simulated", **self.cost.describe()}


class StepLog:
    """Per-step log, one row per step or per run of identical decode steps (``n``).

    ``kv_*``, ``waiting`` and ``running`` are the state during the row's first step (after its
    reservations and writes, before finished requests leave); in a run KV used grows by
    ``decode`` per step, and so does KV reserved under ``exact``.
    """

    COLUMNS = (
        "t",
        "dur",
        "n",
        "prefill",
        "pad",
        "decode",
        "dead",
        "emitted",
        "slots",
        "kv_reserved",
        "kv_used",
        "waiting",
        "running",
        "attn",
        "ctx",
    )

    def __init__(self, record_slots: bool = False) -> None:
        self.cols: dict[str, list] = {c: [] for c in self.COLUMNS}
        self._lists = list(self.cols.values())
        self.record_slots = record_slots
        self.occupancy: list[list[tuple[int, int, str, int, int]]] = []

    def add(self, row: tuple) -> None:
        """Append one row, its values in ``COLUMNS`` order."""
        for col, v in zip(self._lists, row):
            col.append(v)

    def arrays(self) -> dict[str, np.ndarray]:
        return {c: np.asarray(v, dtype=float) for c, v in self.cols.items()}

    def kv_series(self, policy: str) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Per row: KV reserved and used, each as (mean over the row's steps, peak)."""
        L = self.arrays()
        grow = L["decode"] * (L["n"] - 1)
        res_grow = grow if policy == "exact" else 0 * grow
        return (
            L["kv_reserved"] + res_grow / 2,
            L["kv_reserved"] + res_grow,
            L["kv_used"] + grow / 2,
            L["kv_used"] + grow,
        )

    def hardware(self, model: Any) -> tuple[np.ndarray, np.ndarray]:
        """FLOPs and bytes of each row (a run: its total; both are affine in the context,
        which grows by ``decode`` per step, so n x the mean of first and last)."""
        L = self.arrays()
        pt, pa, rows = L["prefill"] + L["pad"], L["attn"], L["decode"] + L["dead"]
        first, last = L["ctx"], L["ctx"] + (L["n"] - 1) * L["decode"]
        out = []
        for f in (model.flops_arrays, model.bytes_arrays):
            out.append(L["n"] * (f(pt, pa, rows, first) + f(pt, pa, rows, last)) / 2)
        return out[0], out[1]

    def records(self) -> list[dict[str, Any]]:
        rows = [dict(zip(self.COLUMNS, vals)) for vals in zip(*self.cols.values())]
        if self.record_slots:
            for row, occ in zip(rows, self.occupancy):
                row["slots_detail"] = [list(o) for o in occ]
        return rows

    def __len__(self) -> int:
        return len(self.cols["t"])


def occupancy(plan: StepPlan) -> list[tuple[int, int, str, int, int]]:
    """(slot, rid, kind, tokens, pad) for every busy row: P prefill chunk, D decode, X dead row."""

    def slot(r: Request) -> int:
        assert r.slot is not None, f"request {r.rid} is in a plan without a slot"
        return r.slot

    occ = [(slot(c.req), c.req.rid, "P", c.n, c.pad) for c in plan.prefills]
    occ += [(slot(r), r.rid, "D", 1, 0) for r in plan.decodes]
    occ += [(slot(r), r.rid, "X", 1, 0) for r in plan.dead]
    return sorted(occ)


@dataclass
class RunResult:
    requests: list[Request]
    log: StepLog
    scheduler: dict[str, Any]
    executor: dict[str, Any]
    preemptions: int
    wall_s: float
    fast_steps: int = 0
    cost: Any = None  # the executor's ``hardware``: the accounting of FLOPs and bytes (Executor)

    @property
    def num_steps(self) -> int:
        return int(sum(self.log.cols["n"]))


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

    cost = executor.hardware
    log = StepLog(record_slots)
    bar = None
    if progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=len(reqs), unit="req", mininterval=0.5)
    wall0 = time.perf_counter()
    n, i, t = len(reqs), 0, reqs[0].arrival
    fast_steps = 0
    while True:
        while i < n and reqs[i].arrival <= t:
            scheduler.on_arrival(reqs[i])
            i += 1
        plan = scheduler.schedule(t)
        if plan is None:
            if i == n and not scheduler.has_work:
                break
            nxt = min(reqs[i].arrival if i < n else math.inf, scheduler.wakeup() or math.inf)
            if not nxt > t:
                raise RuntimeError(
                    f"scheduler {scheduler.name} is stuck at t={t}: "
                    f"{len(scheduler.waiting)} waiting, {len(scheduler.running)} running"
                )
            t = nxt
            continue
        work = plan.work()
        t0 = t
        occ = occupancy(plan) if record_slots else None
        # The KV and queue state *during* the step: after its reservations and writes,
        # before finished requests are released (for a run: during its first step).
        pre = plan.prefills
        state = (
            scheduler.kv.reserved,
            scheduler.kv.used + sum(c.n + c.pad for c in pre) + len(plan.decodes),
            len(scheduler.waiting),
            len(scheduler.running),
        )
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
        log.add(
            (
                t0,
                t - t0,
                k,
                sum(c.n for c in pre),
                sum(c.pad for c in pre),
                len(plan.decodes),
                len(plan.dead),
                sum(c.completes for c in pre) + len(plan.decodes),
                plan.slots,
                *state,
                work.prefill_attn,
                work.decode_ctx,
            )
        )
        if occ is not None:  # record_slots
            log.occupancy.append(occ)
        if bar is not None:
            bar.n = scheduler.num_finished
            bar.refresh() if bar.n == n else bar.update(0)
    if bar is not None:
        bar.close()
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
        cost=cost,
    )
