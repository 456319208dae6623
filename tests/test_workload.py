"""Tests for batching.workloads.workload and batching.workloads.lengths: containers, arrivals, length distributions,
presets."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching.request import Request, RequestError
from batching.workloads import PRESETS, Workload, gamma_arrivals, poisson_arrivals, preset, synthetic
from batching.workloads.errors import WorkloadError
from batching.workloads.lengths import Empirical, Fixed, LogNormal, quantile_table


def _spec(w: Workload | list[Request]) -> list[tuple[int, float, int, int]]:
    return [(r.rid, r.arrival, r.prompt_len, r.output_len) for r in w]


def _w(arrivals: list[float], prompts: list[int], outputs: list[int], **kw: object) -> Workload:
    return Workload.from_arrays(arrivals, prompts, outputs, **kw)


# ----------------------------------------------------------------- Workload
def test_empty_workload_refused() -> None:
    with pytest.raises(WorkloadError, match="empty workload"):
        Workload([])


def test_unsorted_arrivals_name_request_and_value() -> None:
    reqs = [Request(0, 0.0, 5, 5), Request(7, 2.5, 5, 5), Request(9, 1.25, 5, 5)]
    with pytest.raises(WorkloadError, match=r"request 9: arrival=1\.25 .*earlier.*2\.5"):
        Workload(reqs)


def test_duplicate_rid_refused() -> None:
    with pytest.raises(WorkloadError, match="request id 3 appears twice"):
        Workload([Request(3, 0.0, 5, 5), Request(3, 1.0, 5, 5)])


def test_mutated_bad_arrival_refused() -> None:
    r = Request(4, 0.0, 5, 5)
    r.arrival = math.nan
    with pytest.raises(WorkloadError, match=r"request 4: arrival=nan"):
        Workload([r])
    r.arrival = -1.0
    with pytest.raises(WorkloadError, match=r"request 4: arrival=-1\.0"):
        Workload([r])


def test_non_request_refused() -> None:
    with pytest.raises(WorkloadError, match="not a Request"):
        Workload([(0, 0.0, 5, 5)])  # type: ignore[list-item]


def test_properties() -> None:
    w = _w([1.0, 2.0, 4.5], [10, 20, 30], [1, 2, 3], name="x", info={"a": 1})
    assert len(w) == 3 and w.name == "x"
    assert w.total_prompt_tokens == 60 and w.total_output_tokens == 6
    assert w.duration == 3.5
    assert w.rids == (0, 1, 2)
    assert w[1].prompt_len == 20 and [r.rid for r in w[1:]] == [1, 2]


def test_fresh_gives_new_pristine_requests() -> None:
    w = _w([0.0, 0.5], [4, 6], [3, 2])
    used = w.requests
    # A run mutates the workload's own objects; fresh() must not see it.
    used[0].on_admit(0, 0.0)
    used[0].on_prefill(4)
    used[0].on_token(0.1)
    f1, f2 = w.fresh(), w.fresh()
    assert _spec(f1) == _spec(f2) == [(0, 0.0, 4, 3), (1, 0.5, 6, 2)]
    assert all(a is not b for a, b in zip(f1, f2))
    assert all(a is not b for a, b in zip(f1, used))
    assert all(
        r.generated == 0 and r.num_computed == 0 and r.slot is None and r.token_times == [] for r in f1
    )
    assert isinstance(f1[0].arrival, float) and isinstance(f1[0].prompt_len, int)


def test_requests_and_info_are_copies() -> None:
    w = _w([0.0], [4], [3], info={"nested": {"k": 1}})
    w.requests.append(Request(5, 9.0, 1, 1))
    w.info["nested"]["k"] = 2
    assert len(w) == 1 and w.info == {"nested": {"k": 1}}
    with pytest.raises(ValueError):
        w.arrivals[0] = 3.0


def test_cap_error_mode_names_request_field_value() -> None:
    w = _w([0, 0, 1], [100, 90, 10], [10, 40, 10])
    with pytest.raises(
        RequestError, match=r"request 1: prompt_len \+ output_len = 90 \+ 40 = 130 exceeds max_context=120"
    ):
        w.cap_to_context(120)
    same, n = w.cap_to_context(130, mode="error")
    assert n == 0 and _spec(same) == _spec(w)


def test_cap_mode_shortens_prompt_then_output() -> None:
    w = _w([0, 0, 1, 2], [100, 10, 5, 50], [50, 200, 5, 120], info={"source": "t"})
    capped, n = w.cap_to_context(120, mode="cap")
    assert n == 3
    assert capped.prompt_lens.tolist() == [70, 1, 5, 1]
    assert capped.output_lens.tolist() == [50, 119, 5, 119]
    info = capped.info
    assert info["source"] == "t"
    assert info["capped"]["n_capped"] == 3 and info["capped"]["max_context"] == 120
    assert info["capped"]["n_output_capped"] == 2
    assert info["capped"]["prompt_tokens_removed"] == 30 + 9 + 49
    assert info["capped"]["output_tokens_removed"] == 81 + 1
    assert all(p + o <= 120 for p, o in zip(capped.prompt_lens, capped.output_lens))


def test_cap_rejects_bad_arguments() -> None:
    w = _w([0], [4], [3])
    with pytest.raises(WorkloadError, match="max_context=1"):
        w.cap_to_context(1, mode="cap")
    with pytest.raises(WorkloadError, match="mode='trim'"):
        w.cap_to_context(100, mode="trim")  # type: ignore[arg-type]


@settings(deadline=None, max_examples=150, derandomize=True)
@given(
    st.lists(st.tuples(st.integers(1, 64), st.integers(1, 64)), min_size=1, max_size=12), st.integers(2, 80)
)
def test_cap_property(lengths: list[tuple[int, int]], max_context: int) -> None:
    w = _w([0.0] * len(lengths), [p for p, _ in lengths], [o for _, o in lengths])
    capped, n = w.cap_to_context(max_context, mode="cap")
    assert n == sum(p + o > max_context for p, o in lengths)
    for (p, o), r in zip(lengths, capped):
        assert r.prompt_len >= 1 and r.output_len >= 1 and r.prompt_len + r.output_len <= max_context
        if p + o <= max_context:
            assert (r.prompt_len, r.output_len) == (p, o)
        elif o < max_context:
            assert r.output_len == o  # the output is kept whenever it can be


def test_scale_lengths_and_time() -> None:
    w = _w([2.0, 3.0, 6.0], [100, 3, 12], [20, 4, 1], info={"seed": 1})
    s = w.scale(lengths=8, time=2)
    assert s.arrivals.tolist() == [2.0, 2.5, 4.0]  # gaps halved, first arrival kept
    assert s.prompt_lens.tolist() == [13, 1, 2]  # 12.5 rounds up; 0.375 floors at 1
    assert s.output_lens.tolist() == [3, 1, 1]
    assert s.info["scale_lengths"] == 8 and s.info["time_scale"] == 2 and s.info["seed"] == 1
    s2 = s.scale(time=3)
    assert s2.info["time_scale"] == 6 and s2.info["scale_lengths"] == 8
    assert _spec(w.scale()) == _spec(w)
    with pytest.raises(WorkloadError, match="lengths=0"):
        w.scale(lengths=0)
    with pytest.raises(WorkloadError, match="time=inf"):
        w.scale(time=math.inf)


# ----------------------------------------------------------------- arrivals
def test_poisson_mean_rate() -> None:
    a = poisson_arrivals(20000, 5.0, np.random.default_rng(1))
    assert a[0] == 0.0 and np.all(np.diff(a) >= 0)
    assert (len(a) - 1) / a[-1] == pytest.approx(5.0, rel=0.03)
    gaps = np.diff(a)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.05)


@pytest.mark.parametrize("burstiness", [0.25, 1.0, 4.0])
def test_gamma_burstiness_sets_cv(burstiness: float) -> None:
    a = gamma_arrivals(20000, 2.0, burstiness, np.random.default_rng(2))
    gaps = np.diff(a)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.08)
    assert (len(a) - 1) / a[-1] == pytest.approx(2.0, rel=0.05)  # rate independent of burstiness


def test_infinite_rate_all_at_zero() -> None:
    assert gamma_arrivals(5, math.inf, 0.5, np.random.default_rng(0)).tolist() == [0.0] * 5


@pytest.mark.parametrize(
    "kw, msg",
    [
        ({"rate": 0}, "rate=0"),
        ({"rate": -2.0}, "rate=-2.0"),
        ({"rate": math.nan}, "rate=nan"),
        ({"burstiness": 0}, "burstiness=0"),
        ({"burstiness": math.inf}, "burstiness=inf"),
        ({"n": -1}, "n=-1"),
    ],
)
def test_arrival_validation(kw: dict[str, float], msg: str) -> None:
    args = {"n": 3, "rate": 1.0, "burstiness": 1.0} | kw
    with pytest.raises(WorkloadError, match=msg):
        gamma_arrivals(args["n"], args["rate"], args["burstiness"], np.random.default_rng(0))  # type: ignore[arg-type]


# ------------------------------------------------------------------ lengths
def test_fixed() -> None:
    rng = np.random.default_rng(0)
    assert Fixed(7).sample(4, rng).tolist() == [7] * 4
    with pytest.raises(WorkloadError, match="value=0"):
        Fixed(0)


def test_lognormal_clip_and_median() -> None:
    rng = np.random.default_rng(3)
    x = LogNormal(median=300, sigma=1.5, lo=50, hi=1000).sample(20000, rng)
    assert x.min() == 50 and x.max() == 1000  # sigma 1.5 reaches both clips
    assert x.dtype.kind == "i"
    y = LogNormal(median=300, sigma=0.5).sample(20000, rng)
    assert np.median(y) == pytest.approx(300, rel=0.03)
    for kw, msg in [
        ({"median": 0, "sigma": 1}, "median=0"),
        ({"median": 10, "sigma": -1}, "sigma=-1"),
        ({"median": 10, "sigma": 1, "lo": 9, "hi": 3}, "hi=3 < lo=9"),
        ({"median": 10, "sigma": 1, "lo": 0}, "lo=0"),
    ]:
        with pytest.raises(WorkloadError, match=msg):
            LogNormal(**kw)  # type: ignore[arg-type]


def test_empirical_interpolates_between_quantiles() -> None:
    e = Empirical((0.0, 0.5, 1.0), (10.0, 20.0, 40.0))
    assert e.quantile(0.25) == 15.0 and e.quantile(0.75) == 30.0
    x = e.sample(40000, np.random.default_rng(4))
    assert x.min() >= 10 and x.max() <= 40
    assert np.median(x) == pytest.approx(20, abs=0.5)
    # Samples round half-up, so x <= 14 means the interpolated value fell below 14.5: q < 0.225.
    assert np.mean(x <= 14) == pytest.approx(0.225, abs=0.01)


@pytest.mark.parametrize(
    "q, v, msg",
    [
        ((0.0, 1.0), (5.0,), "need >= 2 quantiles"),
        ((0.1, 1.0), (5.0, 6.0), "from 0 to 1"),
        ((0.0, 0.5, 0.5, 1.0), (1.0, 2.0, 3.0, 4.0), "q=0.5 does not exceed"),
        ((0.0, 0.5, 1.0), (1.0, 3.0, 2.0), "value 2.0 at q=1.0 is below"),
        ((0.0, 1.0), (0.0, 2.0), "value 0.0 at q=0"),
    ],
)
def test_empirical_validation(q: tuple[float, ...], v: tuple[float, ...], msg: str) -> None:
    with pytest.raises(WorkloadError, match=msg):
        Empirical(q, v)


def test_empirical_from_csv_skips_comments(tmp_path) -> None:  # type: ignore[no-untyped-def]
    p = tmp_path / "t.csv"
    p.write_text("# source: test\n#   more\nq,prompt,output\n0,1,2\n# mid comment\n0.5,11,3\n1,21,4\n")
    e = Empirical.from_csv(p, "prompt")
    assert e.q == (0.0, 0.5, 1.0) and e.values == (1.0, 11.0, 21.0)
    assert Empirical.from_csv(p, "output").values == (2.0, 3.0, 4.0)
    with pytest.raises(WorkloadError, match=r"line 3: no column 'latency'"):
        Empirical.from_csv(p, "latency")
    p.write_text("q,prompt\n0,1\n0.5,x\n1,3\n")
    with pytest.raises(WorkloadError, match=r"line 3, column 'prompt': 'x' is not a number"):
        Empirical.from_csv(p, "prompt")


# ----------------------------------------------------------------- synthetic
def test_same_seed_same_workload_different_seed_differs() -> None:
    args = (200, 3.0, LogNormal(300, 0.8, 16, 2048), LogNormal(50, 0.5, 10, 200))
    a, b, c = synthetic(*args, seed=5), synthetic(*args, seed=5), synthetic(*args, seed=6)
    assert _spec(a) == _spec(b)
    assert a.info == b.info and a.info["seed"] == 5
    assert _spec(a) != _spec(c)
    assert not np.array_equal(a.prompt_lens, c.prompt_lens)
    assert not np.array_equal(a.arrivals, c.arrivals)


def test_synthetic_accepts_ints_and_rejects_junk() -> None:
    w = synthetic(3, math.inf, 128, 20)
    assert _spec(w) == [(0, 0.0, 128, 20), (1, 0.0, 128, 20), (2, 0.0, 128, 20)]
    with pytest.raises(WorkloadError, match="prompt='long'"):
        synthetic(3, 1.0, "long", 20)  # type: ignore[arg-type]
    with pytest.raises(WorkloadError, match="n=0"):
        synthetic(0, 1.0, 1, 1)


# ------------------------------------------------------------------- presets
def test_padding_pair() -> None:
    w = preset("padding-pair")
    assert _spec(w) == [(0, 0.0, 50, 20), (1, 0.0, 4000, 20)]


def test_first_finisher() -> None:
    w = preset("first-finisher")
    assert len(w) == 32
    assert sorted(w.output_lens.tolist()) == [20] * 31 + [2000]
    assert set(w.prompt_lens.tolist()) == {128} and set(w.arrivals.tolist()) == {0.0}
    with pytest.raises(WorkloadError, match="fixed size"):
        preset("first-finisher", n=10)


def test_chat_rag_mix() -> None:
    w = preset("chat-rag", seed=0)
    assert len(w) == 500 and w.info["seed"] == 0
    n_rag = w.info["n_rag"]
    assert 70 <= n_rag <= 130  # 20% of 500, +-3 sd
    rag = w.prompt_lens >= 1024
    assert rag.sum() >= n_rag  # every RAG prompt is >= 1024 (chat prompts rarely are)
    chat_p = np.median(w.prompt_lens[~rag])
    assert 200 <= chat_p <= 400
    assert 2500 <= np.median(w.prompt_lens[w.prompt_lens >= 2048]) <= 3500
    assert w.output_lens.max() <= 1000
    assert (len(w) - 1) / w.duration == pytest.approx(4.0, rel=0.15)
    assert _spec(preset("chat-rag", seed=0)) == _spec(w)
    assert _spec(preset("chat-rag", seed=1)) != _spec(w)
    assert len(preset("chat-rag", n=40, rate=1.0)) == 40


@pytest.mark.parametrize(
    "name, p50_prompt, p50_output", [("azure-conv-like", 1020, 129), ("azure-code-like", 1469, 13)]
)
def test_azure_like_presets(name: str, p50_prompt: int, p50_output: int) -> None:
    w = preset(name, n=4000)
    assert len(w) == 4000 and len(preset(name)) == 500
    assert np.median(w.prompt_lens) == pytest.approx(p50_prompt, rel=0.1)
    assert np.median(w.output_lens) == pytest.approx(p50_output, rel=0.1)
    assert w.info["table"].endswith(name.replace("-like", "") + ".csv")


def test_every_preset_builds_and_unknown_lists_names() -> None:
    for name in PRESETS:
        assert len(preset(name)) >= 2
    with pytest.raises(
        WorkloadError, match="unknown preset 'nope'; valid presets: padding-pair, first-finisher, chat-rag"
    ):
        preset("nope")


def test_quantile_table_missing() -> None:
    with pytest.raises(WorkloadError, match="no quantile table 'nope'.*azure-code, azure-conv"):
        quantile_table("nope", "prompt")
