"""7.3's trade-off on a bursty trace: where continuous batching without chunks sits among the
chunk sizes (hand-made sweeps)."""

from __future__ import annotations

import numpy as np

from batching.book import chunked


def _load(ttft: list[float], itl: list[float], none_ttft: float, none_itl: float) -> dict[str, np.ndarray]:
    return {
        "chunk": np.array([128.0, 512.0, 2048.0]),
        "ttft_p99": np.array(ttft),
        "itl_p99": np.array(itl),
        "continuous_ttft_p99": np.array([none_ttft]),
        "continuous_itl_p99": np.array([none_itl]),
    }


def test_no_chunks_at_the_far_end_of_the_curve():
    # Worst ITL (0.15 s against at most 0.04) and the best TTFT (0.7 s against at least 0.8).
    p = chunked.nochunk_place({1.0: _load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.7, 0.15)})
    assert p["off_curve_loads"] == []


def test_no_chunks_off_the_curve_where_chunks_beat_its_ttft_too():
    sweep = {
        1.0: _load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.9, 0.15),  # only 2,048 beats 0.9 s
        2.0: _load([6.0, 3.5, 3.6], [0.01, 0.02, 0.04], 3.9, 0.03),  # not the worst ITL here
        4.0: _load([9.0, 7.4, 7.2], [0.01, 0.02, 0.04], 7.8, 0.20),
    }
    p = chunked.nochunk_place(sweep)
    assert p["off_curve_loads"] == [1.0, 2.0, 4.0]


def test_tradeoff_rows_by_hand():
    sweep = {
        1.0: {
            **_load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.7, 0.15),
            "itl_p50": np.array([0.005, 0.005, 0.005]),
        },
        4.0: {
            **_load([30.0, 7.7, 7.4], [0.01, 0.02, 0.04], 8.0, 0.2),
            "itl_p50": np.array([0.005, 0.0083, 0.031]),
        },
    }
    rows, header = chunked.tradeoff_rows(sweep, [128, 2048], 4.0)
    assert header == ["chunk (tokens)", "median ITL, 4x (ms)", "p99 TTFT, 4x (s)"]
    assert rows == [["128", "5.0", "30.0"], ["2,048", "31.0", "7.4"]]


def test_capacity_numbers_by_hand():
    rows = [
        {"config": "continuous, mixed prefill", "slo": "strict", "rate": 14.7, "itl_p99_ms": 49.1},
        {"config": "chunked, budget 2048", "slo": "relaxed", "rate": 39.0, "itl_p99_ms": 32.5},
        {"config": "static", "slo": "strict", "rate": 1.6, "itl_p99_ms": 40.0},  # not on this page
        {"config": "chunked, budget 512", "slo": "strict", "rate": 0.0, "itl_p99_ms": float("nan")},
    ]
    assert chunked.capacity_numbers(rows) == {
        "mix_strict": 14.7,
        "mix_strict_itl_ms": 49.1,
        "b2048_relaxed": 39.0,
        "b2048_relaxed_itl_ms": 32.5,
        "b512_strict": 0.0,
    }
    # 49.1 ms against a 50 ms target: the ITL binds; 39.0 req/s under both SLOs: the same.
    cap = {"mix_strict_itl_ms": 49.1, "b2048_strict": 39.0, "b2048_relaxed": 39.0}
    assert chunked.capacity_limits(cap, 50.0) == {"mix_itl_bound": True, "budget_same": True}
    cap = {"b2048_strict": 30.0, "b2048_relaxed": 39.0}  # no strict ITL at capacity: the queue
    assert chunked.capacity_limits(cap, 50.0) == {"mix_itl_bound": False, "budget_same": False}
