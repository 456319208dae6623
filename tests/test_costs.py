"""Model shapes, devices and step-cost models (batching/costs/: models.py, devices.py, base.py, roofline.py,
profile.py, knee.py, unit.py)."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.costs import RooflineCost, get_cost_model
from batching.costs.devices import DEVICES, get_device
from batching.costs.models import get_model
from batching.costs.profile import ProfileCost, ProfileError
from batching.engine import StepCost
from batching.plan import StepWork

H100, H200 = get_device("h100"), get_device("h200")


# ------------------------------------------------------------------------- models
@pytest.mark.parametrize(
    "name, published",
    [
        ("llama-1b", 1.24e9),
        ("llama-8b", 8.03e9),
        ("llama-70b", 70.6e9),  # model cards
        ("cpu-s", 26.4e6),
        ("cpu-m", 117.2e6),
        ("cpu-l", 392.2e6),  # the CPU measurements' configs (batching/costs/models.py)
    ],
)
def test_param_counts_match_published(name: str, published: float) -> None:
    assert get_model(name).params == pytest.approx(published, rel=0.01)


def test_tiny_params_by_hand() -> None:
    m = get_model("tiny")
    # head_dim 16; per layer: q,o 64x64 each, k,v 64x32 each, gate/up/down 64x176, 2 norms.
    layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176 + 2 * 64
    assert m.head_dim == 16
    assert m.params == 256 * 64 + 2 * layer + 64  # tied: no separate lm head
    assert m.weight_bytes == 4 * m.params
    assert m.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4
    assert m.attn_flops_per_pair == 4 * 2 * 4 * 16


def test_llama_8b_sizes() -> None:
    m = get_model("llama-8b")
    assert m.params == 8_030_261_248
    assert m.weight_bytes == pytest.approx(16.06e9, rel=1e-3)
    assert m.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2 == 131_072
    # The untied input embedding (128256 x 4096) is gathered, not streamed.
    assert m.weight_read_bytes == m.weight_bytes - 2 * 128256 * 4096
    assert m.max_context == 8192 and m.dtype == "bf16"


def test_flops_and_bytes_by_hand() -> None:
    m = get_model("tiny")
    w = StepWork(prefill_tokens=10, prefill_attn=10 * 5 + 55, decode_rows=3, decode_ctx=30)
    body = 2 * (2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 176)
    assert m.flops(w) == 2 * body * 13 + 2 * 256 * 64 * 3 + m.attn_flops_per_pair * (105 + 30)
    # weights + KV: decode reads 30, the chunk reads its 5 earlier tokens, 13 tokens written
    assert m.bytes_moved(w) == m.weight_read_bytes + m.kv_bytes_per_token * (30 + 5 + 13)
    assert m.flops(StepWork()) == 0 and m.bytes_moved(StepWork()) == 0


def test_with_dtype() -> None:
    m = get_model("llama-70b")
    f8 = m.with_dtype("fp8")
    assert (f8.bytes_per_param, f8.kv_bytes, f8.params) == (1, 2, m.params)
    assert m.with_dtype("float32").kv_bytes == 4
    with pytest.raises(ValueError, match="fp32, bf16, fp8"):
        m.with_dtype("int3")


def test_unknown_names_list_valid_ones() -> None:
    with pytest.raises(ValueError, match="'gpt-9'.*tiny.*llama-70b"):
        get_model("gpt-9")
    with pytest.raises(ValueError, match="'b200'.*H100-SXM.*cpu-here"):
        get_device("b200")
    with pytest.raises(ValueError, match="'gpt-9'.*llama-8b"):
        get_cost_model("gpt-9", "h100")


def test_device_aliases_and_sources() -> None:
    assert get_device("h100").name == "H100-SXM" and get_device("H200").name == "H200-SXM"
    assert get_device("a100") is DEVICES["A100-SXM"] and get_device("cpu").name == "cpu-here"
    for d in DEVICES.values():
        assert d.source and d.bandwidth > 0 and d.peak_flops


# ----------------------------------------------------------------------- roofline
def test_llama_8b_h100_batch1_by_hand() -> None:
    c = RooflineCost(get_model("llama-8b"), H100)
    w = StepWork(decode_rows=1, decode_ctx=1000)
    # 15.01e9 weight bytes streamed + 1001 KV tokens x 131072 B, at 3.35 TB/s, + 0.3 ms
    expected = (15_009_849_344 + 1001 * 131_072) / 3.35e12 + 300e-6
    assert c.step_time(w) == pytest.approx(expected, rel=1e-12)
    assert c.step_time(w) == pytest.approx(4.82e-3, rel=1e-3)
    assert c.terms(w)["bound"] == "memory"
    prefill = StepWork(prefill_tokens=8192, prefill_attn=8192 * 8193 // 2)
    t = c.terms(prefill)
    assert t["bound"] == "compute"
    assert t["compute_s"] == pytest.approx(
        (2 * 6_979_321_856 * 8192 + 4 * 32 * 32 * 128 * (8192 * 8193 // 2)) / 989e12, rel=1e-12
    )


@pytest.mark.parametrize(
    "device, dtype, bstar",
    [("h100", None, 295.2), ("h200", None, 206.0), ("a100", None, 153.0), ("h200", "fp8", 206.1)],
)
def test_bstar(device: str, dtype: str | None, bstar: float) -> None:
    assert RooflineCost(get_model("llama-8b"), get_device(device), dtype=dtype).bstar() == pytest.approx(
        bstar, abs=0.1
    )


def test_bstar_cpu_fp32_is_twice_peak_over_bandwidth() -> None:
    c = RooflineCost(get_model("cpu-m"), get_device("cpu"))
    assert c.bstar() == pytest.approx(2 * 110e9 / 18.5e9)
    assert 7 <= c.bstar() <= 12  # the CPU note's range


def test_empty_step_costs_nothing() -> None:
    assert RooflineCost(get_model("tiny"), H100).step_time(StepWork()) == 0.0


def test_tp_halves_memory_term() -> None:
    m, w = get_model("llama-8b"), StepWork(decode_rows=8, decode_ctx=8000)
    one, two = RooflineCost(m, H100).terms(w), RooflineCost(m, H100, tp=2).terms(w)
    assert two["memory_s"] == pytest.approx(one["memory_s"] / 2, rel=1e-12)
    assert two["compute_s"] == pytest.approx(one["compute_s"] / 2, rel=1e-12)
    # 2 all-reduces x 32 layers of 8 tokens x 4096 x 2 B, ring factor 1 at tp=2
    assert two["allreduce_s"] == pytest.approx(64 * (8 * 4096 * 2 / 450e9 + 10e-6), rel=1e-12)
    assert one["allreduce_s"] == 0.0


@pytest.mark.parametrize("device, usable", [("h100", "72.0"), ("h200", "126.9")])
def test_70b_bf16_refused_on_one_gpu(device: str, usable: str) -> None:
    with pytest.raises(ValueError) as e:
        get_cost_model("llama-70b", device)
    msg = str(e.value)
    assert "141.1 GB" in msg and f"{usable} GB usable" in msg and "tp >= 2" in msg and "fp8" in msg


@pytest.mark.parametrize("device, tp, dtype", [("h100", 4, None), ("h200", 2, None), ("h200", 1, "fp8")])
def test_70b_accepted(device: str, tp: int, dtype: str | None) -> None:
    c = get_cost_model("llama-70b", device, tp=tp, dtype=dtype)
    assert c.kv_capacity() > get_model("llama-70b").max_context


def test_kv_capacity_and_kv_check() -> None:
    m = get_model("llama-70b")
    c = RooflineCost(m, H200, tp=2)
    assert c.kv_capacity() == int((2 * 141e9 * 0.9 - m.weight_bytes) // 327_680)
    RooflineCost(m, H200, tp=2, kv_capacity_tokens=c.kv_capacity())
    with pytest.raises(ValueError, match="KV tokens"):
        RooflineCost(m, H200, tp=2, kv_capacity_tokens=c.kv_capacity() + 1)


def test_bad_tp_refused() -> None:
    with pytest.raises(ValueError, match="tp=3"):
        RooflineCost(get_model("llama-8b"), H100, tp=3)
    with pytest.raises(ValueError, match="interconnect"):
        RooflineCost(get_model("cpu-s"), get_device("cpu"), tp=2)
    with pytest.raises(ValueError, match="no fp8"):
        RooflineCost(get_model("llama-8b"), get_device("a100"), dtype="fp8")


# ----------------------------------------------------------------------- profile
def _profile() -> dict[str, Any]:
    return {
        "schema": 1,
        "meta": {
            "device": "cpu-here",
            "model": "cpu-s",
            "dtype": "float32",
            "date": "2026-11-30",
            "torch": "2.13.0+cpu",
            "host": "test",
        },
        "decode": {"batch": [1, 3], "ctx": [100, 300], "ms": [[10, 12], [14, 20]]},
        "prefill": {"tokens": [100, 300], "ms": [50, 130]},
        "mixed": {"prefill_tokens": [200], "decode_rows": [1], "decode_ctx": [100], "ms": [100.0]},
    }


def _dec(rows: int, ctx_per_row: int) -> StepWork:
    return StepWork(decode_rows=rows, decode_ctx=rows * ctx_per_row)


def test_profile_interpolation() -> None:
    p = ProfileCost.from_dict(_profile())
    assert [p.step_time(_dec(b, c)) for b, c in [(1, 100), (1, 300), (3, 100), (3, 300)]] == [
        0.010,
        0.012,
        0.014,
        0.020,
    ]  # grid points, exactly
    assert p.step_time(_dec(2, 200)) == pytest.approx(0.014, rel=1e-12)  # mean of the 4 corners
    assert p.step_time(_dec(1, 200)) == pytest.approx(0.011, rel=1e-12)
    assert p.step_time(StepWork(prefill_tokens=100)) == 0.050
    assert p.step_time(StepWork(prefill_tokens=200)) == pytest.approx(0.090, rel=1e-12)
    # mixed: prefill + decode - the cheapest measured step (weights and overhead paid once)
    assert p.step_time(StepWork(prefill_tokens=200, decode_rows=3, decode_ctx=900)) == pytest.approx(0.100)
    assert p.step_time(StepWork()) == 0.0
    assert (p.queries, p.extrapolated) == (9, 0)
    assert p.describe()["mixed_max_rel_err"] == pytest.approx(0.1)  # 90 ms estimated, 100 measured
    assert p.describe()["queries"] == 9  # the check is not counted


def test_profile_mixed_grid_interpolates_and_follows_context() -> None:
    """A full chunk x rows grid of mixed steps replaces the additive estimate (hand-computed)."""
    doc = _profile()
    doc["mixed"] = {
        "prefill_tokens": [100, 100, 300, 300],
        "decode_rows": [1, 3, 1, 3],
        "decode_ctx": [100, 100, 100, 100],
        "ms": [60.0, 70.0, 140.0, 160.0],
    }
    p = ProfileCost.from_dict(doc)
    assert p.describe()["mixed_estimate"] == "grid"
    mixed = lambda t, r, c: p.step_time(StepWork(prefill_tokens=t, decode_rows=r, decode_ctx=r * c))
    assert mixed(100, 1, 100) == pytest.approx(0.060) and mixed(300, 3, 100) == pytest.approx(0.160)
    assert mixed(200, 2, 100) == pytest.approx((60 + 70 + 140 + 160) / 4e3)  # centre: mean of the corners
    # At ctx 300 per row the decode grid adds 12-10 = 2 ms for one row, 20-14 = 6 ms for three.
    assert mixed(100, 1, 300) == pytest.approx(0.062) and mixed(300, 3, 300) == pytest.approx(0.166)
    assert p.extrapolated == 0
    mixed(400, 2, 100)  # beyond the grid's chunks: counted
    assert p.extrapolated == 1
    assert p.describe()["mixed_max_rel_err"] == pytest.approx(0.0, abs=1e-12)
    # Not a grid (a combination missing): the additive estimate, as before.
    doc["mixed"] = {k: v[:3] for k, v in doc["mixed"].items()}
    assert ProfileCost.from_dict(doc).describe()["mixed_estimate"] == "additive"


#: The attention tests' machine: single prompts cost 10 ms + 0.1 ms/token + 0.1 us per pair.
ATTN_S = 1e-7


def _pairs(n: float) -> float:
    return n * (n + 1) / 2


def _cost(tokens: float, pairs: float) -> float:
    return 10e-3 + 0.1e-3 * tokens + ATTN_S * pairs


def _attention_profile() -> dict[str, Any]:
    """_profile() with single prompts of 100-400 tokens and 2, 4 and 16 equal 100-token
    prompts side by side (1,600 positions: beyond the longest single prompt), all on _cost."""
    doc = _profile()
    doc["prefill"] = {"tokens": [100, 200, 400], "ms": [_cost(t, _pairs(t)) * 1e3 for t in (100, 200, 400)]}
    doc["prefill_rows"] = {
        "rows": [2, 4, 16],
        "tokens": [100, 100, 100],
        "ms": [_cost(r * 100, r * _pairs(100)) * 1e3 for r in (2, 4, 16)],
    }
    return doc


def test_profile_mixed_step_beyond_the_grid_pays_its_own_attention() -> None:
    """Single prompts cost 10 ms + 0.1 ms/token + 0.1 us per pair, a mixed step 2 ms more per
    decode row; the grid holds chunks of 200 and 400 tokens. A step of 16 short prompts
    (1,600 positions) and one decode is priced as the grid's edge without its attention, the
    prefill curve's cost of the 1,200 positions beyond it, and its own pairs: 180.08 ms.
    (A line through the grid's two fresh prompts, less a 1,600-token prompt's attention,
    gave 96.08 ms: below the same positions prefilled alone.)"""
    cost, pairs = _cost, _pairs
    doc = _attention_profile()
    doc["mixed"] = {
        "prefill_tokens": [200, 200, 400, 400],
        "decode_rows": [1, 3, 1, 3],
        "decode_ctx": [100] * 4,
        "ms": [(cost(t, pairs(t)) + 2e-3 * r) * 1e3 for t, r in ((200, 1), (200, 3), (400, 1), (400, 3))],
    }
    p = ProfileCost.from_dict(doc)
    assert p.describe()["mixed_estimate"] == "grid"
    mixed = lambda t, a, r: p.step_time(
        StepWork(prefill_tokens=t, prefill_attn=a, decode_rows=r, decode_ctx=r * 100)
    )
    assert mixed(400, pairs(400), 3) == pytest.approx(cost(400, pairs(400)) + 6e-3)  # a grid point
    assert mixed(200, 2 * pairs(100), 1) == pytest.approx(
        cost(200, 2 * pairs(100)) + 2e-3
    )  # two short chunks
    short16 = 16 * pairs(100)
    assert mixed(1600, short16, 1) == pytest.approx(cost(1600, short16) + 2e-3) == pytest.approx(0.18008)
    assert mixed(1600, short16, 1) > p.step_time(StepWork(prefill_tokens=1600, prefill_attn=short16))


def test_profile_reads_padded_steps_at_their_bucket() -> None:
    """meta.token_buckets (CPU runner pads a step's tokens): a decode of 2 rows is read at
    the 3-row bucket, a 150-token prefill at 300; beyond the last bucket, as measured."""
    doc = _profile()
    doc["meta"]["token_buckets"] = [1, 3, 300]
    p = ProfileCost.from_dict(doc)
    assert p.step_time(_dec(2, 100)) == pytest.approx(0.014)  # rows 2 -> 3
    assert p.step_time(_dec(3, 300)) == pytest.approx(0.020)  # a bucket: as is
    assert p.step_time(StepWork(prefill_tokens=150)) == pytest.approx(0.130)  # 150 -> 300
    assert p.step_time(StepWork(prefill_tokens=400)) == pytest.approx(0.170)  # beyond: unpadded
    assert ProfileCost.from_dict(_profile()).step_time(_dec(2, 100)) == pytest.approx(0.012)  # no buckets
    doc["meta"]["token_buckets"] = [4, 2]
    with pytest.raises(ProfileError, match="meta.token_buckets"):
        ProfileCost.from_dict(doc)


def test_profile_prices_attention_from_equal_prompts_side_by_side() -> None:
    """Single prompts cost 10 ms + 0.1 ms/token + 0.1 us per attention pair; prefill_rows
    points (equal prompts in one pass) let the profile find the 0.1 us and price any step's
    pairs: a padded static batch of short prompts, a chunk after cached context (by hand)."""
    b, cost, pairs = ATTN_S, _cost, _pairs
    doc = _attention_profile()
    p = ProfileCost.from_dict(doc)
    assert p.attn_s == pytest.approx(b, rel=1e-9) and p.describe()["attn_s_per_pair"] == pytest.approx(b)
    pre = lambda t, a: p.step_time(StepWork(prefill_tokens=t, prefill_attn=a))
    assert pre(200, pairs(200)) == pytest.approx(cost(200, pairs(200)))  # a grid point, as measured
    assert pre(300, pairs(300)) == pytest.approx(cost(300, pairs(300)))  # 44.515 ms, not 45.015
    assert pre(100, 100 * 300 + pairs(100)) == pytest.approx(0.023505)  # after 300 cached tokens
    # The 16 x 100 point (1,600 positions, beyond the longest single prompt) extends the
    # curve without attention: a padded 8 x 100 batch is interpolated, not extrapolated.
    assert pre(800, 8 * pairs(100)) == pytest.approx(cost(800, 8 * pairs(100)))  # 94.04 ms
    assert p.extrapolated == 0
    # Without the point beyond, the same estimate by extrapolating that curve (counted).
    doc["prefill_rows"] = {k: v[:2] for k, v in doc["prefill_rows"].items()}
    p = ProfileCost.from_dict(doc)
    assert p.step_time(StepWork(prefill_tokens=800, prefill_attn=8 * pairs(100))) == pytest.approx(
        cost(800, 8 * pairs(100))
    )
    assert p.extrapolated == 1 and p.attn_s == pytest.approx(b, rel=1e-9)
    # Without prefill_rows the same step is priced as one prompt of all its positions.
    del doc["prefill_rows"]
    q = ProfileCost.from_dict(doc)
    assert q.attn_s == 0.0
    assert q.step_time(StepWork(prefill_tokens=300, prefill_attn=pairs(300))) == pytest.approx(
        (cost(200, pairs(200)) + cost(400, pairs(400))) / 2
    )
    doc["prefill_rows"] = {"rows": [1], "tokens": [100], "ms": [5.0]}
    with pytest.raises(ProfileError, match="prefill_rows.rows"):
        ProfileCost.from_dict(doc)


def test_profile_extrapolation_counted() -> None:
    p = ProfileCost.from_dict(_profile())
    assert p.step_time(StepWork(prefill_tokens=400)) == pytest.approx(0.170)  # 0.4 ms/token
    assert p.step_time(_dec(5, 300)) == pytest.approx(0.028)  # 4 ms/row at ctx 300
    p.step_time(_dec(2, 50))
    p.step_time(_dec(2, 150))
    assert (p.queries, p.extrapolated) == (4, 3)
    p.decode_run(rows=2, ctx0=500, growth=2, k=60)  # ctx/row 250..309: 301..309 are beyond
    assert (p.queries, p.extrapolated) == (64, 12)
    d = p.describe()
    assert (d["queries"], d["extrapolated"], d["meta"]["torch"]) == (64, 12, "2.13.0+cpu")


def _set(path: str, value: Any) -> Callable[[dict[str, Any]], None]:
    def f(d: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        for k in parents:
            d = d[k]
        if value is KeyError:
            del d[last]
        else:
            d[last] = value

    return f


@pytest.mark.parametrize(
    "mutate, field",
    [
        (_set("schema", KeyError), "'schema'"),
        (_set("schema", 2), "'schema'"),
        (_set("meta.device", KeyError), "'meta.device'"),
        (_set("meta.model", "gpt-9"), "'meta.model'"),
        (_set("meta.dtype", "int4"), "'meta.dtype'"),
        (_set("decode", [1, 2]), "'decode'"),
        (_set("decode.batch", [3, 1]), "'decode.batch'"),
        (_set("decode.ctx", [100]), "'decode.ctx'"),
        (_set("decode.ms", [[10, 12]]), "'decode.ms'"),
        (_set("decode.ms", [[10, 12], [14]]), "'decode.ms[1]'"),
        (_set("decode.ms", [[10, -1], [14, 20]]), "'decode.ms[0]'"),
        (_set("prefill.ms", KeyError), "'prefill.ms'"),
        (_set("prefill.tokens", [100, "300"]), "'prefill.tokens'"),
        (_set("mixed.decode_rows", [1, 2]), "'mixed.decode_rows'"),
    ],
)
def test_malformed_profile_names_field(mutate: Callable[[dict[str, Any]], None], field: str) -> None:
    d = copy.deepcopy(_profile())
    mutate(d)
    with pytest.raises(ProfileError, match=field.replace("[", r"\[").replace("]", r"\]")):
        ProfileCost.from_dict(d)


def test_profile_from_json_and_factory(tmp_path: Path) -> None:
    f = tmp_path / "cpu-here-cpu-s.json"
    f.write_text(json.dumps(_profile()))
    p = get_cost_model("cpu-s", "cpu", profile=str(f))
    assert isinstance(p, ProfileCost) and p.describe()["source"] == str(f)
    assert p.peak_flops == 110e9 and p.bandwidth == 18.5e9
    assert p.kv_capacity() == int((25.3e9 * 0.9 - get_model("cpu-s").weight_bytes) // 8192)
    with pytest.raises(ValueError, match="measured for cpu-s on cpu-here, not cpu-m"):
        get_cost_model("cpu-m", "cpu", profile=str(f))
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(ProfileError, match="not JSON"):
        ProfileCost.from_json(bad)


# ------------------------------------------------------------------ shared contract
def _models() -> list[StepCost]:
    return [
        RooflineCost(get_model("llama-8b"), H100),
        RooflineCost(get_model("llama-70b"), H200, tp=2),
        RooflineCost(get_model("cpu-m"), get_device("cpu")),
        ProfileCost.from_dict(_profile()),
    ]


def test_cost_models_follow_protocol() -> None:
    for c in _models():
        assert isinstance(c, StepCost)
        assert isinstance(c.describe(), dict) and c.peak_flops > 0 and c.bandwidth > 0


@settings(derandomize=True, deadline=None, max_examples=60)
@given(
    rows=st.integers(0, 300), ctx0=st.integers(0, 200_000), growth=st.integers(0, 300), k=st.integers(0, 40)
)
def test_decode_run_equals_step_time(rows: int, ctx0: int, growth: int, k: int) -> None:
    for c in _models():
        run = c.decode_run(rows, ctx0, growth, k)
        assert run.shape == (k,) and run.dtype == np.float64
        one = [c.step_time(StepWork(decode_rows=rows, decode_ctx=ctx0 + j * growth)) for j in range(k)]
        assert run.tolist() == one  # bit-identical, not approx


@settings(derandomize=True, deadline=None, max_examples=60)
@given(
    rows=st.integers(1, 512), ctx=st.integers(1, 8192), d_rows=st.integers(0, 64), d_ctx=st.integers(0, 4096)
)
def test_step_time_monotone_in_rows_and_ctx(rows: int, ctx: int, d_rows: int, d_ctx: int) -> None:
    for c in _models():
        base = c.step_time(_dec(rows, ctx))
        assert c.step_time(_dec(rows + d_rows, ctx)) >= base
        assert c.step_time(_dec(rows, ctx + d_ctx)) >= base
        assert c.step_time(StepWork(decode_rows=rows, decode_ctx=rows * ctx + d_ctx)) >= base


def test_no_step_is_estimated_below_the_cheapest_measured_step() -> None:
    """A noisy edge that slopes down (batch 3 measured faster than batch 1) extrapolates
    below zero by batch 7; the estimate stops at the cheapest measured step (10 ms here,
    the fastest point of the profile) instead of handing the engine a zero duration."""
    doc = _profile()
    doc["decode"]["ms"] = [[30, 32], [18, 20]]  # -6 ms per row at ctx 100
    doc["prefill"]["ms"] = [150, 10]  # -0.7 ms per token
    p = ProfileCost.from_dict(doc)
    assert p.floor_s == pytest.approx(0.010)
    assert p.step_time(_dec(2, 100)) == pytest.approx(0.024)  # inside: as interpolated
    assert p.step_time(_dec(7, 100)) == pytest.approx(0.010)  # 30 - 6 x 6 = -6 ms -> floor
    assert p.step_time(StepWork(prefill_tokens=400)) == pytest.approx(0.010)
    assert p.step_time(StepWork()) == 0.0  # an empty step costs nothing


def test_the_intro_quotes_the_roofline_assumptions_as_the_code_has_them() -> None:
    # chapters/intro.md names the roofline's unmeasured constants in prose (a .md page has
    # no glue): if one changes here, the sentence must change with it.
    from batching.costs.base import MEM_RESERVE

    intro = " ".join((Path(__file__).resolve().parent.parent / "chapters" / "intro.md").read_text().split())
    gpus = [d for d in DEVICES.values() if d.name != "cpu-here"]
    assert {d.step_overhead_s for d in gpus} == {0.3e-3}
    assert {d.allreduce_latency_s for d in gpus} == {10e-6}
    assert MEM_RESERVE == 0.10
    for quoted in (
        "0.3 ms per GPU engine step",
        "10 µs per all-reduce",
        "10% of device memory kept back",
        "the other 90%",
    ):
        assert quoted in intro, quoted


# ------------------------------------------------------------------ one B*, one decode curve
def test_curve_is_the_roofline_decode_step_bit_for_bit():
    """RooflineCost.curve and decode_step are one formula: each batch's time equals the
    step_time of that decode step exactly (a page's curve and the simulator's clock agree)."""
    from batching.costs import RooflineCost, get_device, get_model
    from batching.costs.roofline import bstar

    cost = RooflineCost(get_model("llama-8b"), get_device("h100"))
    batches = [1, 2, 16, 128, 295, 1024]
    cur = cost.curve(batches, 2048)
    assert cur["time_s"].tolist() == [cost.decode_step(b, 2048) for b in batches]
    # At 2,048 tokens a row the KV read keeps even 1,024 rows memory-bound; at 128 it does not.
    assert cur["bound"].tolist() == [0.0] * 6
    assert cost.curve(batches, 128)["bound"].tolist() == [0.0] * 5 + [1.0]
    assert cost.bstar() == bstar(cost.device_peak, cost.device.bandwidth, 2)
    # B* = 989 TFLOP/s x 2 bytes / (2 x 3.35 TB/s) = 295.2
    assert cost.bstar() == pytest.approx(989e12 * 2 / (2 * 3.35e12))
    with pytest.raises(ValueError, match="single-device"):
        RooflineCost(get_model("llama-70b"), get_device("h100"), tp=4).curve(batches, 128)
    with pytest.raises(ValueError):
        bstar(0.0, 1.0, 2)


def test_knee_and_first_reaching_read_a_curve_from_its_first_batch():
    from batching.costs.knee import first_reaching, knee

    b, t = [1, 2, 4, 8, 16], [10.0, 12.0, 19.0, 21.0, 15.0]
    assert knee(b, t) == 4  # 21 > 20 ends it; the dip back to 15 does not count
    assert first_reaching(b, t, 2.0) == 8 and first_reaching(b, t, 1.2) == 2
    assert first_reaching(b, t, 3.0) is None
    with pytest.raises(ValueError):
        knee(b, t[:3])


def test_the_unit_step_clock_takes_one_second_per_step():
    from batching.costs.unit import STEP_S, UnitStep
    from batching.engine import SimExecutor, run
    from batching.schedulers import make_scheduler
    from batching.workloads import Workload

    w = Workload.from_arrays([0.0, 0.0], [4, 4], [3, 1])
    res = run(w.fresh(), make_scheduler("continuous", max_context=64, slots=2), SimExecutor(UnitStep()))
    assert res.num_steps == 3 and sum(res.log.cols["dur"]) == 3 * STEP_S
