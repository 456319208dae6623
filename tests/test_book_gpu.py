"""The GPU numbers the pages quote (batching/book/gpu.py, issue 22), from the committed profiles
derived from Vidur's tables: the values the issue states, checked here, and the helpers on
hand-made curves."""

from __future__ import annotations

import numpy as np
import pytest

from batching.book import gpu
from batching.book.common import Claim
from batching.costs.knee import first_reaching


def test_first_reaching_is_the_first_batch_at_or_above_the_factor():
    b = [1, 2, 4, 8, 16]
    t = [10.0, 11.0, 12.5, 12.0, 30.0]
    assert first_reaching(b, t, 1.25) == 4  # 12.5 reaches it; the dip after does not count
    assert first_reaching(b, t, 2.0) == 16
    assert first_reaching(b, t, 5.0) is None
    with pytest.raises(ValueError):
        first_reaching(b, t, 0.5)
    with pytest.raises(ValueError):
        first_reaching(b, t[:3], 2.0)


def test_h100_llama_2_7b_linear_layers_against_batch():
    """5.6 ms at 1 token, 5.9 at 64, 6.4 at 128, 9.2 at 256, 12 at 512; 1.25x at 72 tokens;
    1.7x at the datasheet B* of 295; the batch-1 stream at ~69% of 3.35 TB/s."""
    n = gpu.decode_numbers(gpu.load_gpu_profile(gpu.BOOK_PROFILES["h100"]))
    assert (n["model"], n["device"], n["tp"]) == ("llama-2-7b", "H100-SXM", 1)
    want = {1: 5.6, 64: 5.9, 128: 6.4, 256: 9.2, 512: 12.0}
    for tokens, ms in want.items():
        assert n["linear_ms"][tokens] == pytest.approx(ms, abs=0.05), tokens
    assert n["reach"][1.25] == 72 and n["knee"][1.25] == 64
    assert n["reach"][2.0] == 376 and n["knee"][2.0] == 368
    assert n["bstar"] == pytest.approx(295.2, abs=0.1)
    assert n["ratio_bstar"] == pytest.approx(1.73, abs=0.01)
    assert n["bandwidth_fraction"] == pytest.approx(0.69, abs=0.005)
    assert n["achieved_gbs"] == pytest.approx(2312, abs=1) and n["datasheet_gbs"] == 3350
    # The whole modelled step (KV at 128 tokens per row, head, overhead) rises faster than
    # the linear layers alone: Llama-2-7B reads 0.5 MB of KV per token.
    assert n["step_fits"] and n["step_ratio_bstar"] > n["ratio_bstar"]


def test_a100_llama_3_8b_linear_layers_against_batch():
    """1.25x at ~72 tokens, 1.9x at B* = 153, the batch-1 stream at ~70% of 2.04 TB/s."""
    n = gpu.decode_numbers(gpu.load_gpu_profile(gpu.BOOK_PROFILES["a100"]))
    assert (n["model"], n["device"]) == ("llama-8b", "A100-SXM")
    assert n["linear_ms"][1] == pytest.approx(9.7, abs=0.01)
    assert n["reach"][1.25] == 72 and n["reach"][2.0] == 240
    assert n["bstar"] == pytest.approx(153.0, abs=0.1)
    assert n["ratio_bstar"] == pytest.approx(1.87, abs=0.01)
    assert n["bandwidth_fraction"] == pytest.approx(0.706, abs=0.005)


def test_per_token_cost_against_chunk_size_and_the_fill_verdict():
    """A 512-token chunk's token costs within 4% of the cheapest on the A100 (Llama-3-8B),
    18% above it on the H100 (Llama-2-7B), where it takes ~1,000 tokens to come within 10%."""
    h = gpu.chunk_numbers(gpu.load_gpu_profile(gpu.BOOK_PROFILES["h100"]))
    a = gpu.chunk_numbers(gpu.load_gpu_profile(gpu.BOOK_PROFILES["a100"]))
    assert set(h["per_token_us"]) == set(gpu.CHUNKS)
    assert h["per_token_us"][512] == pytest.approx(12.0 / 512 * 1e3, abs=0.1)  # 23.4 us
    assert h["per_token_us"][128] > h["per_token_us"][256] > h["per_token_us"][512] > h["per_token_us"][1024]
    assert h["floor_us"] == pytest.approx(19.8, abs=0.05) and h["floor_tokens"] == 2048
    assert h["ratio_floor"][512] == pytest.approx(1.19, abs=0.01)
    assert h["fill_chunk"] == 960
    assert gpu.fill_verdict(h) is Claim.PARTLY and gpu.fill_verdict(h, 1024) is Claim.HOLDS
    assert a["per_token_us"][512] == pytest.approx(67.7, abs=0.1)
    assert a["ratio_floor"][512] == pytest.approx(1.036, abs=0.005) and a["fill_chunk"] == 496
    assert gpu.fill_verdict(a) is Claim.HOLDS and gpu.fill_verdict(a, 128) is Claim.DOES_NOT_HOLD
    both = gpu.gpu_numbers()
    assert set(both) == {"h100", "a100"}
    assert both["h100"]["fill"] is Claim.PARTLY and both["a100"]["fill"] is Claim.HOLDS
    assert both["a100"]["chunks"] == a


def test_chunk_curve_is_the_per_token_cost_over_the_whole_profiles_cheapest():
    """The figure's curves: 128 to 4,096 tokens, never below the cheapest (1x), and at 512
    tokens the ratio the verdict reads (H100 1.19x, A100 1.04x)."""
    for g, r512 in (("h100", 1.19), ("a100", 1.036)):
        doc = gpu.load_gpu_profile(gpu.BOOK_PROFILES[g])
        c, n = gpu.chunk_curve(doc), gpu.chunk_numbers(doc)
        assert c["tokens"][0] == 128 and c["tokens"][-1] == 4096
        assert c["ratio_floor"].min() >= 1.0 - 1e-12
        assert c["per_token_us"] == pytest.approx(c["ratio_floor"] * n["floor_us"])
        i = int(np.flatnonzero(c["tokens"] == 512)[0])
        assert c["ratio_floor"][i] == pytest.approx(n["ratio_floor"][512]) == pytest.approx(r512, abs=0.005)
    # The H100's cheapest token is inside the curve (2,048); the A100's (3,328) too.
    assert gpu.chunk_curve(doc)["ratio_floor"].min() == pytest.approx(1.0)
    with pytest.raises(ValueError):
        gpu.chunk_curve(doc, lo=10**6, hi=2 * 10**6)
    assert set(gpu.gpu_numbers()["a100"]["chunk_curve"]) == {"tokens", "per_token_us", "ratio_floor"}
