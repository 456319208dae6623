"""The per-step log of a run: one :class:`StepRow` per step, or per run of ``n`` identical
decode steps (the engine's fast path), kept as columns (``StepLog.cols``) because metrics
read it column by column over millions of steps."""

from __future__ import annotations

import math
from typing import Any, NamedTuple, Protocol

import numpy as np

from .plan import StepPlan, StepWork
from .request import Request


class SchedulerState(NamedTuple):
    """What a scheduler reports of itself (``Scheduler.snapshot``): requests waiting for a
    slot (in whatever queues it keeps), requests holding one, KV tokens reserved and KV
    tokens written."""

    waiting: int
    running: int
    kv_reserved: float
    kv_used: int


class StepRow(NamedTuple):
    """One row of the log. ``kv_*``, ``waiting`` and ``running`` are the state during the
    row's first step (after its reservations and writes, before finished requests leave);
    in a run KV used grows by ``decode`` per step, and so does KV reserved under ``exact``."""

    t: float  # when the row's first step started (s)
    dur: float  # the row's duration, all its steps (s)
    n: int  # steps in the row
    prefill: int  # prompt tokens computed per step
    pad: int  # padding tokens computed beside them (static batching)
    decode: int  # decode rows, each emitting a token
    dead: int  # a static batch's finished rows, computed and thrown away
    emitted: int  # tokens emitted per step (decodes and completed prefills)
    slots: int  # the capacity slot utilization counts against
    kv_reserved: float
    kv_used: int
    waiting: int
    running: int
    attn: int  # (query, key) pairs of the prefill chunks' causal attention
    ctx: int  # KV tokens the decode and dead rows read, first step

    @classmethod
    def of(cls, plan: StepPlan, state: SchedulerState, slots: int, t: float, dur: float, n: int) -> StepRow:
        """The row of ``plan`` (its cost inputs, which the plan took when it was made) run
        ``n`` times from ``t`` for ``dur`` seconds, with the scheduler's ``state`` during it."""
        work = plan.work()
        pre = plan.prefills
        return cls(
            t=t,
            dur=dur,
            n=n,
            prefill=sum(c.n for c in pre),
            pad=sum(c.pad for c in pre),
            decode=len(plan.decodes),
            dead=len(plan.dead),
            emitted=sum(c.completes for c in pre) + len(plan.decodes),
            slots=slots,
            kv_reserved=state.kv_reserved,
            kv_used=state.kv_used,
            waiting=state.waiting,
            running=state.running,
            attn=work.prefill_attn,
            ctx=work.decode_ctx,
        )


class Accounting(Protocol):
    """FLOPs and bytes of steps given as float64 arrays of prefill tokens, attention pairs,
    rows and summed context (a :class:`~batching.costs.models.ModelShape`)."""

    def flops_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any: ...

    def bytes_arrays(self, pt: Any, pa: Any, rows: Any, ctx: Any) -> Any: ...


Occupant = tuple[int, int, str, int, int]

#: What a batch row does during a step (:meth:`StepLog.timeline`), in drawing order.
KINDS = ("prefill", "padding", "decode", "dead", "idle")
#: An :func:`occupancy` code as the timeline's kind of row.
_OCC_KIND = {"P": "prefill", "D": "decode", "X": "dead"}


class Segment(NamedTuple):
    """One stretch of one batch row doing one thing: ``kind`` is one of :data:`KINDS`,
    ``rid`` None for idle rows, ``steps`` the engine steps spanned (a prefill split into
    prefill and padding counts its step in both)."""

    slot: int
    rid: int | None
    kind: str
    t0: float
    t1: float
    steps: int


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-12, abs_tol=1e-12)


class StepLog:
    """The rows of one run as columns, ``COLUMNS`` = :class:`StepRow`'s fields."""

    COLUMNS = StepRow._fields

    def __init__(self, record_slots: bool = False) -> None:
        self.cols: dict[str, list] = {c: [] for c in self.COLUMNS}
        self._lists = list(self.cols.values())
        self.record_slots = record_slots
        self.occupancy: list[list[Occupant]] = []

    def add(self, row: StepRow, occupants: list[Occupant] | None = None) -> None:
        """Append ``row``; with ``record_slots``, also its ``occupants`` (:func:`occupancy` of
        its plan, taken before the step was committed and finished requests left)."""
        for col, v in zip(self._lists, row):
            col.append(v)
        if self.record_slots:
            assert occupants is not None, "record_slots needs each row's occupants"
            self.occupancy.append(occupants)

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

    def hardware(self, model: Accounting) -> tuple[np.ndarray, np.ndarray]:
        """FLOPs and bytes of each row (a run: its total; both are affine in the context,
        which grows by ``decode`` per step, so n x the mean of first and last)."""
        L = self.arrays()
        pt, pa, rows = L["prefill"] + L["pad"], L["attn"], L["decode"] + L["dead"]
        first, last = L["ctx"], L["ctx"] + (L["n"] - 1) * L["decode"]
        out = []
        for f in (model.flops_arrays, model.bytes_arrays):
            out.append(L["n"] * (f(pt, pa, rows, first) + f(pt, pa, rows, last)) / 2)
        return out[0], out[1]

    def works(self) -> list[StepWork]:
        """Each row's first step as a cost model prices it: the prefill tokens with their
        padding, the attention pairs, the decode and dead rows and the context they read."""
        C = self.cols
        return [
            StepWork(int(p + pd), int(a), int(d + x), int(c))
            for p, pd, a, d, x, c in zip(C["prefill"], C["pad"], C["attn"], C["decode"], C["dead"], C["ctx"])
        ]

    def timeline(self) -> list[Segment]:
        """Per-slot timeline of a run recorded with ``record_slots=True``, sorted by slot, then
        time. A padded prefill's step is split between its tokens and its padding in
        proportion to their counts; a static batch's finished but computed row is ``dead``;
        an empty slot, or any slot while the engine waits for arrivals, is ``idle``.
        Consecutive pieces of one slot, request and kind are merged."""
        if not self.record_slots or len(self.occupancy) != len(self):
            raise ValueError("timeline() needs a run recorded with record_slots=True")
        C = self.cols
        rows: dict[int, list[Segment]] = {s: [] for s in range(int(max(C["slots"])))}

        def add(slot: int, rid: int | None, kind: str, t0: float, t1: float, steps: int) -> None:
            segs = rows.setdefault(slot, [])
            if segs and (segs[-1].rid, segs[-1].kind) == (rid, kind) and _close(segs[-1].t1, t0):
                segs[-1] = segs[-1]._replace(t1=t1, steps=segs[-1].steps + steps)
            else:
                segs.append(Segment(slot, rid, kind, t0, t1, steps))

        prev_end = C["t"][0] if len(self) else 0.0
        for i, occupants in enumerate(self.occupancy):
            t0, n = C["t"][i], int(C["n"][i])
            t1 = t0 + C["dur"][i]
            if t0 > prev_end and not _close(t0, prev_end):
                for s in rows:  # the engine waited for an arrival: every slot idle
                    add(s, None, "idle", prev_end, t0, 0)
            busy = set()
            for slot, rid, k, tokens, pad in occupants:
                busy.add(slot)
                if k == "P" and pad:
                    tm = t0 + C["dur"][i] * tokens / (tokens + pad)
                    add(slot, rid, "prefill", t0, tm, n)
                    add(slot, rid, "padding", tm, t1, n)
                else:
                    add(slot, rid, _OCC_KIND[k], t0, t1, n)
            for s in range(int(C["slots"][i])):
                if s not in busy:
                    add(s, None, "idle", t0, t1, n)
            prev_end = t1
        return [seg for s in sorted(rows) for seg in rows[s]]

    def records(self) -> list[dict[str, Any]]:
        rows = [dict(zip(self.COLUMNS, vals)) for vals in zip(*self.cols.values())]
        if self.record_slots:
            for row, occ in zip(rows, self.occupancy):
                row["slots_detail"] = [list(o) for o in occ]
        return rows

    def __len__(self) -> int:
        return len(self.cols["t"])


def occupancy(plan: StepPlan) -> list[Occupant]:
    """(slot, rid, kind, tokens, pad) for every busy row: P prefill chunk, D decode, X dead row."""

    def slot(r: Request) -> int:
        assert r.slot is not None, f"request {r.rid} is in a plan without a slot"
        return r.slot

    occ = [(slot(c.req), c.req.rid, "P", c.n, c.pad) for c in plan.prefills]
    occ += [(slot(r), r.rid, "D", 1, 0) for r in plan.decodes]
    occ += [(slot(r), r.rid, "X", 1, 0) for r in plan.dead]
    return sorted(occ)
