"""The fidelity benchmark's drift probe (benchmarks/bench_fidelity.py): it compares like with like."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from helpers import load_benchmark

from batching.costs.models import get_model
from batching.costs.profile import ProfileCost
from batching.plan import StepWork
from batching.real.measure import StepTimer, measure
from batching.real.runner import ModelRunner

pytestmark = pytest.mark.model


@pytest.fixture(scope="module")
def profile() -> dict:
    return json.loads(
        json.dumps(
            measure(
                "tiny",
                "cpu",
                batches=[1, 16],
                ctxs=[8, 128],
                prefill_tokens=[8, 64],
                mixed=[(8, 1, 128), (64, 4, 128)],
                reps=2,
                bandwidth_bytes=1 << 22,
                peak_n=128,
            )
        )
    )


def test_probe_times_the_profiles_own_points(profile: dict) -> None:
    bench = load_benchmark("bench_fidelity")
    timer = StepTimer(ModelRunner.from_shape(get_model("tiny"), 17, max_len=256), reps=3)
    out = bench.probe(timer, profile)
    assert set(out["ratios"]) == {"decode(1, 128)", "decode(16, 128)", "prefill(64,)", "mixed(64, 4, 128)"}
    assert all(r > 0 for r in out["ratios"].values())
    mid = sorted(out["ratios"].values())[1:3]
    assert out["speed"] == pytest.approx(sum(mid) / 2)  # the median of four
    # The drift-corrected profile: every measured time scaled by the factor.
    slow = bench.scaled_profile(profile, 2.0)
    assert slow.step_time(StepWork(decode_rows=16, decode_ctx=16 * 128)) == pytest.approx(
        2 * ProfileCost.from_dict(profile).step_time(StepWork(decode_rows=16, decode_ctx=16 * 128))
    )
    # The profile document itself is left as it was.
    assert ProfileCost.from_dict(profile).step_time(StepWork(prefill_tokens=64)) == pytest.approx(
        profile["prefill"]["ms"][1] / 1e3
    )


def test_probe_points_move_to_the_nearest_measured_steps(profile: dict) -> None:
    """A GPU-like grid has no decode(16, 128) or prefill(64): the probe takes the nearest
    points on a log scale, so that any profile can be probed."""
    bench = load_benchmark("bench_fidelity")
    assert bench.probe_points(profile) == list(bench.PROBE)  # the CPU grid has them all
    gpu = {
        **profile,
        "decode": {**profile["decode"], "batch": [1, 8, 32, 128], "ctx": [128, 1024, 4096]},
        "prefill": {**profile["prefill"], "tokens": [256, 1024]},
        "mixed": {
            **profile["mixed"],
            "prefill_tokens": [256, 256, 2048],
            "decode_rows": [1, 32, 1],
            "decode_ctx": [128, 128, 128],
        },
    }
    assert bench.probe_points(gpu) == [
        ("decode", (1, 128)),
        ("decode", (8, 128)),
        ("prefill", (256,)),
        ("mixed", (256, 1, 128)),
    ]
    bad = {**profile, "prefill": {**profile["prefill"], "tokens": [8, 32]}}
    assert ("prefill", (32,)) in bench.probe_points(bad)
    with pytest.raises(ValueError, match=r"lacks the probe point prefill\(32,\)"):
        bench.profile_ms(profile, "prefill", (32,))


def test_sim_against_the_real_runs_per_request_median() -> None:
    """Three 'real' runs at speeds 0.8, 1.0 and 1.25 (a drifting machine): each request's
    median is the 1.0 run's, so a simulator at that speed is exact against it, though it
    is off against either other run."""
    from helpers import LinearCost, reqs

    from batching.engine import SimExecutor, run
    from batching.schedulers import make_scheduler

    bench = load_benchmark("bench_fidelity")
    work = [(0.0, 8, 5), (0.5, 4, 9), (1.0, 16, 3), (1.2, 2, 12)]
    go = lambda base: run(
        reqs(*work),
        make_scheduler("continuous", max_context=64, slots=2),
        SimExecutor(LinearCost(base=base, per_token=0.01)),
    )
    reals = [go(0.08), go(0.1), go(0.125)]
    assert bench.sim_vs_real_median(go(0.1), reals) == 0.0
    assert bench.sim_vs_real_median(go(0.11), reals) > 0.0
    assert min(float(np.median(bench.e2e_rel_err(r, go(0.1)))) for r in (reals[0], reals[2])) > 0.05
