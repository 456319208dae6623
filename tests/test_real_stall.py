"""7.3's measured stall on the real model: a run whose running requests finished before the long
prompt's first token showed no stall, and real_stall recalibrates instead of reporting it."""

from __future__ import annotations

from helpers import LinearCost

from batching.book import chunked, chunked_real
from batching.engine import SimExecutor, run
from batching.schedulers import ContinuousScheduler


def test_stall_overlaps_only_when_every_running_request_outlives_the_newcomers_first_token():
    """7.3's real stall is placed by a calibrated step time; a run in which the running
    requests finished before the long prompt's first token saw no stall (real_stall retries)."""

    def served(running_output: int) -> object:
        # Unit steps: 2 running requests prefill at t = 0 (step 1), the long prompt arrives at
        # t = 3.5 and is prefilled in the step from 4 to 5 (its first token at t = 5).
        w = chunked.long_prompt_among_decodes(
            running=2, prompt=64, at=3.5, running_prompt=8, running_output=running_output, output=4
        )
        return run(w.fresh(), ContinuousScheduler(3, 512), SimExecutor(LinearCost(1.0)))

    assert chunked_real.stall_overlaps(served(10), range(2), 2)  # last tokens at t = 10 > 5
    assert not chunked_real.stall_overlaps(served(4), range(2), 2)  # last tokens at t = 4 < 5
    assert chunked_real.STALL_ATTEMPTS >= 2
