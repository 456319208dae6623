"""7.3's measured stall on the real model: a run whose running requests finished before the long
prompt's first token showed no stall; and the step clock that places the long prompt by step
count, then puts the measured seconds back."""

from __future__ import annotations

import pytest
from helpers import LinearCost

from batching.book import chunked
from batching.engine import SimExecutor, run
from batching.schedulers import ContinuousScheduler
from batching.workloads import Workload


def test_stall_overlaps_only_when_every_running_request_outlives_the_newcomers_first_token():
    """A run in which the running requests finished before the long prompt's first token saw
    no stall (real_stall refuses to report one)."""

    def served(running_output: int) -> object:
        # Unit steps: 2 running requests prefill at t = 0 (step 1), the long prompt arrives at
        # t = 3.5 and is prefilled in the step from 4 to 5 (its first token at t = 5).
        w = chunked.long_prompt_among_decodes(
            running=2, prompt=64, at=3.5, running_prompt=8, running_output=running_output, output=4
        )
        return run(w.fresh(), ContinuousScheduler(3, 512), SimExecutor(LinearCost(1.0)))

    assert chunked.stall_overlaps(served(10), range(2), 2)  # last tokens at t = 10 > 5
    assert not chunked.stall_overlaps(served(4), range(2), 2)  # last tokens at t = 4 < 5


def test_retime_puts_measured_seconds_on_the_step_clock():
    """Two requests on the step clock (one nominal second per step), the second arriving at
    step 1.5; measured steps of 2, 3, 5 and 7 s: every time moves to the measured clock, an
    arrival inside a step in proportion."""
    pytest.importorskip("torch")
    from batching.real.executor import retime

    w = Workload.from_arrays([0.0, 1.5], [4, 4], [3, 1])
    res = run(w.fresh(), ContinuousScheduler(2, 64), SimExecutor(LinearCost(1.0)))
    assert res.log.cols["t"] == [0.0, 1.0, 2.0]  # prefill r0; decode r0; prefill r1 + decode r0
    retime(res, [2.0, 3.0, 5.0])
    a, b = res.requests
    assert res.log.cols["t"] == [0.0, 2.0, 5.0] and res.log.cols["dur"] == [2.0, 3.0, 5.0]
    assert a.token_times == [2.0, 5.0, 10.0] and b.arrival == 2.0 + 0.5 * 3.0 and b.token_times == [10.0]
    assert b.admit_time == 5.0 and a.finish_time == 10.0
    with pytest.raises(ValueError, match="idled"):
        gap = Workload.from_arrays([0.0, 9.0], [4, 4], [1, 1])
        retime(run(gap.fresh(), ContinuousScheduler(2, 64), SimExecutor(LinearCost(1.0))), [1.0, 1.0])
