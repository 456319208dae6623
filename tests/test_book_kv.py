"""The numbers, verdicts and figures behind the KV page (batching/book/kv.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import numpy as np
from helpers import H100_8B, small_trace

from batching.book import kv as kvbook


# ------------------------------------------------------------------------------ KV
def test_kv_over_time_slab_reserves_whole_slabs_and_exact_reserves_what_is_held():
    w = small_trace(80, rate=10.0)
    kv = kvbook.kv_runs(w, H100_8B, slots=64)
    slab, exact = kv["series"]["slab"], kv["series"]["exact"]
    np.testing.assert_array_equal(slab["reserved"], slab["running"] * H100_8B.model.max_context)
    np.testing.assert_array_equal(exact["reserved"], exact["used"])
    assert np.all(slab["used"] <= slab["reserved"])
    assert kv["numbers"]["slab_unused"] > 0.8 and kv["numbers"]["exact_unused"] == 0


def test_kv_fit_for_llama_8b_on_h100():
    w = small_trace(200)
    fit = kvbook.kv_fit(H100_8B, w)
    assert H100_8B.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert fit["slab"] == H100_8B.kv_capacity() // 8192 == 52
    assert fit["exact_avg"] > fit["exact_final"] > fit["slab"]


def test_kv_budget_sweep_exact_beats_slab_when_memory_binds():
    w = small_trace(120, rate=50.0)
    sw = kvbook.kv_budget_sweep(w, H100_8B, [16384, 65536], slots=128)
    slab, exact = sw["slab"], sw["exact"]
    assert np.all(slab["preemptions"] == 0)
    assert list(slab["running_peak"]) == [2, 8]
    assert np.all(exact["running_peak"] > slab["running_peak"])
    assert np.all(exact["throughput_tok"] > slab["throughput_tok"])
    assert np.all(np.diff(slab["throughput_tok"]) > 0)
    assert kvbook.budget_numbers(sw, 16384)["gain"] > 1
