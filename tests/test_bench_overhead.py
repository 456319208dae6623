"""The overhead benchmark's bookkeeping (benchmarks/bench_overhead.py): its split of the wall clock must add up."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from helpers import load_benchmark

from batching.costs.models import get_model
from batching.real.runner import ModelRunner

pytestmark = pytest.mark.model


@pytest.mark.parametrize("scheduler", ["continuous", "chunked", "static"])
def test_split_adds_up_and_counts_steps(scheduler: str) -> None:
    bench = load_benchmark("bench_overhead")
    runner = ModelRunner.from_shape(get_model("tiny"), 4, max_len=16)
    out = bench.timed_run(runner, scheduler, slots=4, prompt=3, output=5)
    # Four requests at t=0 in four slots: one step prefills all four (their first token),
    # four more decode the remaining tokens, whichever scheduler.
    assert out["steps"] == 5
    assert out["forward_s"] > 0 and out["runner_s"] >= 0 and out["engine_s"] >= 0
    assert out["forward_s"] + out["runner_s"] + out["engine_s"] == pytest.approx(out["wall_s"])
    assert 0 < out["overhead_frac"] < 1
    # The wrapper is removed: the runner is left as it was.
    assert "_forward_packed" not in vars(runner)
