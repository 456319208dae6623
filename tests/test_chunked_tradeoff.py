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
    sweep = {1.0: _load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.7, 0.15)}
    assert chunked.nochunk_text(sweep) == (
        "Without chunks, continuous batching has the worst p99 ITL at every load, "
        "and the best p99 TTFT: the far end of the curve."
    )


def test_no_chunks_off_the_curve_where_chunks_beat_its_ttft_too():
    sweep = {
        1.0: _load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.9, 0.15),  # only 2,048 beats 0.9 s
        2.0: _load([6.0, 3.5, 3.6], [0.01, 0.02, 0.04], 3.9, 0.03),  # 512 and 2,048 beat 3.9 s
        4.0: _load([9.0, 7.4, 7.2], [0.01, 0.02, 0.04], 7.8, 0.20),
    }
    t = chunked.nochunk_text(sweep)
    assert t.startswith(
        "Without chunks, continuous batching has the worst p99 ITL at 1x and 4x, and it does not"
    )
    assert "chunks of 2,048 tokens (1x); 512-token chunks and larger (2x and 4x) have a lower p99 TTFT" in t
    assert "(at 4x, 7.20 s with 2,048-token chunks against 7.80 s)" in t
    never = {1.0: _load([3.0, 1.0, 0.8], [0.01, 0.02, 0.04], 0.9, 0.03)}
    assert chunked.nochunk_text(never).startswith(
        "Without chunks, continuous batching never has the worst p99 ITL here"
    )
