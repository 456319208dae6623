"""Capacity at a latency target (batching/capacity.py): the SLOs by hand, the queue-growth
verdict on hand-made runs, the search against a known boundary, and one small simulated case."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from helpers import H100_8B, _gpu_profile

from batching import capacity as cap
from batching.costs.profile import GPU_PROFILE_DIR, ProfileCost
from batching.workloads import synthetic, trace_workload
from batching.workloads.lengths import LogNormal


def test_slos_are_5x_and_25x_the_decode_step_of_32_rows_at_4096_tokens() -> None:
    s = cap.slos(H100_8B)
    d = H100_8B.decode_step(32, 4096) * 1e3
    assert s["decode_ms"] == pytest.approx(d)
    assert s["strict_ms"] == pytest.approx(5 * d) and s["relaxed_ms"] == pytest.approx(25 * d)
    # memory-bound: 16 GB of weights plus 32 x 4,096 x 128 KiB of KV at 3.35 TB/s, ~8.5 ms + overhead
    assert 8 < d < 12


def test_slos_of_a_measured_profile_come_from_its_own_decode_grid() -> None:
    # helpers' profile: decode ms 4.1 / 4.6 at 8 rows and 4.6 / 8.0 at 64 rows (128 / 1,024
    # tokens each). A grid point is read as measured; midway in both, the corners' mean.
    prof = ProfileCost.from_dict(_gpu_profile())
    assert not hasattr(prof, "decode_step")  # the roofline's helper: slos must not need it
    s = cap.slos(prof, batch=64, ctx=1024)
    assert s["decode_ms"] == pytest.approx(8.0)
    assert (s["strict_ms"], s["relaxed_ms"]) == pytest.approx((40.0, 200.0))
    mid = cap.slos(prof, batch=36, ctx=576)
    assert mid["decode_ms"] == pytest.approx((4.1 + 4.6 + 4.6 + 8.0) / 4)


def _run(queues: list[float]) -> SimpleNamespace:
    reqs = [SimpleNamespace(rid=i, arrival=float(i), admit_time=float(i) + q) for i, q in enumerate(queues)]
    return SimpleNamespace(requests=reqs)


def test_queue_growth_by_hand() -> None:
    # Ten requests: the first two (a fifth) wait 0.1 s, the last two 5 s: grown by 4.9 s and 50x.
    g = cap.queue_growth(_run([0.1, 0.1, 0.2, 0.5, 1, 2, 3, 4, 5, 5]))
    assert g["queue_first_p50"] == pytest.approx(0.1) and g["queue_last_p50"] == pytest.approx(5.0)
    assert g["growing"] == 1.0
    # A steady 3 s wait is long but not growing; 0.5 s -> 2.4 s grows by less than 2 s.
    assert cap.queue_growth(_run([3.0] * 10))["growing"] == 0.0
    assert cap.queue_growth(_run([0.5] * 8 + [2.4, 2.4]))["growing"] == 0.0


def _point(s: float, boundary: float) -> dict:
    # A made-up configuration whose p99 ITL crosses 50 ms exactly at replay speed `boundary`.
    return {
        "time_scale": s,
        "offered_rate": 10.0 * s,
        "stable": True,
        "itl_p99": 0.050 * s / boundary,
        "queue_p50": 0.0,
    }


@pytest.mark.parametrize("boundary", [0.03, 0.7, 1.0, 3.3, 100.0])
def test_capacity_brackets_and_bisects_to_the_known_boundary(monkeypatch, boundary: float) -> None:
    calls: list[float] = []

    def fake(workload, cost, config, s):
        calls.append(s)
        return _point(s, boundary)

    monkeypatch.setattr(cap, "run_point", fake)
    c = cap.capacity(None, None, {}, 50.0, iters=6)
    good, bad = c["bracket"]
    assert good <= boundary < bad
    assert bad / good <= 2 ** (1 / 64) * 1.0000001  # within the stated factor
    assert c["rate"] == pytest.approx(10.0 * good)
    assert len(calls) == len(set(calls))  # no speed run twice


def test_capacity_edges_and_the_shared_cache(monkeypatch) -> None:
    monkeypatch.setattr(cap, "run_point", lambda w, c, cfg, s: _point(s, 1e-6))
    none = cap.capacity(None, None, {}, 50.0)
    assert none["rate"] == 0.0 and none["point"] is None
    monkeypatch.setattr(cap, "run_point", lambda w, c, cfg, s: _point(s, 1e9))
    alls = cap.capacity(None, None, {}, 50.0, hi=8.0)
    assert alls["time_scale"] == 8.0 and alls["bracket"][1] == math.inf
    # An unstable run never meets the SLO, however low its latencies.
    assert not cap.meets({**_point(1.0, 10.0), "stable": False}, 50.0)
    assert not cap.meets({**_point(1.0, 10.0), "queue_p50": 2.5}, 50.0)
    cache: dict = {}
    monkeypatch.setattr(cap, "run_point", lambda w, c, cfg, s: _point(s, 2.0))
    cap.capacity(None, None, {}, 50.0, cache=cache)
    n = len(cache)
    cap.capacity(None, None, {}, 50.0, cache=cache)
    assert len(cache) == n  # the second SLO search reran nothing it had
    with pytest.raises(ValueError, match="start"):
        cap.capacity(None, None, {}, 50.0, start=0.001)


def test_continuous_batching_sustains_more_than_static_on_a_small_trace() -> None:
    w = synthetic(
        150,
        2.0,
        LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=600),
        seed=5,
    )
    configs = {k: cap.CONFIGS[k] for k in ("static", "continuous, mixed prefill", "chunked, budget 512")}
    rows = cap.capacity_table(w, H100_8B, configs, iters=3)
    by = cap.capacity_by_config(rows)
    assert set(by) == set(configs) and all(set(v) == {"strict", "relaxed"} for v in by.values())
    for name in configs:
        # a looser SLO never lowers capacity (shared runs, same search)
        assert by[name]["relaxed"] >= by[name]["strict"]
    assert by["continuous, mixed prefill"]["relaxed"] > by["static"]["relaxed"]
    assert by["chunked, budget 512"]["strict"] >= by["continuous, mixed prefill"]["strict"]
    for r in rows:
        if r["rate"] > 0:
            assert r["itl_p99_ms"] <= r["slo_ms"] and r["queue_p50_s"] <= cap.QUEUE_P50_MAX_S


def test_capacity_figure_draws_one_bar_per_row(tmp_path) -> None:
    from batching.book import figures

    rows = [
        {"config": c, "slo": s, "rate": r}
        for c, s, r in [
            ("static", "strict", 1.5),
            ("static", "relaxed", 1.5),
            ("chunked, budget 512", "strict", 0.0),
        ]
    ]
    fig = figures.continuous.capacity_figure(
        rows, trace_rate=4.7, slo_labels={"strict": "strict", "relaxed": "relaxed"}
    )
    ax = fig.axes[0]
    assert len(ax.patches) == 4  # 2 configs x 2 SLOs (a missing pair is drawn as NaN)
    texts = [t.get_text() for t in ax.texts]
    assert "1.5" in texts and "0 (none met)" in texts
    fig.savefig(tmp_path / "cap.png")


def test_slos_on_vidurs_a100_read_its_decode_grid_at_32_rows() -> None:
    # The profile's decode grid has a row at 32 rows and columns at 2,048 and 8,192 tokens;
    # 4,096 lies a third of the way: the SLO's step is that interpolation, nothing modelled.
    import json

    from batching.book import gpu

    path = GPU_PROFILE_DIR / gpu.BOOK_PROFILES["a100"]
    doc = json.loads(path.read_text())
    dec = doc["decode"]
    row = dec["ms"][dec["batch"].index(32)]
    at_2k, at_8k = row[dec["ctx"].index(2048)], row[dec["ctx"].index(8192)]
    a100 = ProfileCost.from_json(path)
    assert cap.slos(a100)["decode_ms"] == pytest.approx(at_2k + (at_8k - at_2k) / 3, rel=1e-12)


def test_continuous_batching_serves_several_times_dynamics_traffic_on_the_measured_a100() -> None:
    """7.2's claim on Vidur's measured A100 (the smoke slice, 200 conversations): continuous
    batching with mixed prefill sustains at least 3x dynamic batching's rate at the relaxed
    SLO (the full page: about 15x measured, 12x on the H100 roofline)."""
    from batching.book import common, continuous, gpu

    a100 = ProfileCost.from_json(GPU_PROFILE_DIR / gpu.BOOK_PROFILES["a100"])
    w = trace_workload("azure-conv", limit=200, max_context=a100.model.max_context)
    configs = {k: cap.CONFIGS[k] for k in ("dynamic", "continuous, mixed prefill")}
    rows = cap.capacity_table(w, a100, configs, {"relaxed": cap.slos(a100)["relaxed_ms"]}, iters=3)
    g = continuous.capacity_gain(
        cap.capacity_by_config(rows), "continuous, mixed prefill", "dynamic", "relaxed"
    )
    assert g["claim"] is common.Claim.HOLDS and g["gain"] >= continuous.SEVERAL_X
    for r in rows:
        assert r["rate"] > 0 and r["itl_p99_ms"] <= r["slo_ms"]


# ------------------------------------------------------------------ the searches on several cores
def test_searches_give_the_same_results_on_two_workers_as_on_one():
    """A capacity search and a sweep's runs are pure functions of their arguments: spread over
    two spawned processes they give the very same numbers, in the same order."""
    w = trace_workload("azure-conv", limit=40, max_context=H100_8B.model.max_context)
    configs = {k: cap.CONFIGS[k] for k in ("dynamic", "continuous, mixed prefill")}
    one = cap.capacity_table(w, H100_8B, configs, iters=2, workers=1)
    two = cap.capacity_table(w, H100_8B, configs, iters=2, workers=2)
    assert repr(one) == repr(two) and [r["config"] for r in two] == [
        n for n in configs for _ in ("strict", "relaxed")
    ]
    p1 = cap.run_points(w, H100_8B, configs, [0.5, 2.0], workers=1)
    p2 = cap.run_points(w, H100_8B, configs, [0.5, 2.0], workers=2)
    assert repr(p1) == repr(p2) and [p["time_scale"] for p in p2["dynamic"]] == [0.5, 2.0]


def test_workers_default_comes_from_the_environment(monkeypatch):
    from batching.parallel import default_workers, pmap
    from batching.validate import ConfigError

    monkeypatch.delenv("BATCHING_WORKERS", raising=False)
    assert default_workers() == 1
    monkeypatch.setenv("BATCHING_WORKERS", "3")
    assert default_workers() == 3
    for bad in ("0", "two", "1.5"):
        monkeypatch.setenv("BATCHING_WORKERS", bad)
        with pytest.raises(ConfigError, match="BATCHING_WORKERS"):
            default_workers()
    assert pmap(abs, [-1, 2, -3], workers=1) == [1, 2, 3]
