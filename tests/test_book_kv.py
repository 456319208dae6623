"""The numbers, verdicts and figures behind the KV page (batching/book/kv.py): the KV cache over
time, static batching beside both reservation policies under one budget, in the simulator and
on the real model, and the verdicts the page words. Hand-computed cases, and sweeps that must
move the way theory says they do."""

from __future__ import annotations

import math

import numpy as np
import pytest
from helpers import H100_8B, small_trace

from batching.book import checks, common
from batching.book import kv as kvbook
from batching.real.session import DEFAULT_MODELS, default_model
from batching.workloads import Workload, synthetic, trace_workload
from batching.workloads.lengths import LogNormal


# ------------------------------------------------------------------------------ KV
def test_kv_over_time_slab_reserves_whole_slabs_and_exact_reserves_what_is_held():
    w = small_trace(80, rate=10.0)
    kv = kvbook.kv_runs(w, H100_8B, slots=64)
    slab, exact = kv["series"]["slab"], kv["series"]["exact"]
    np.testing.assert_array_equal(slab["reserved"], slab["running"] * H100_8B.model.max_context)
    np.testing.assert_array_equal(exact["reserved"], exact["used"])
    assert np.all(slab["used"] <= slab["reserved"])
    assert kv["numbers"]["slab_unused"] > 0.8 and kv["numbers"]["exact_unused"] == 0


def test_kv_time_figure_gives_each_policy_its_panel_so_both_written_series_show():
    import matplotlib.pyplot as plt
    from matplotlib.collections import PolyCollection

    from batching.book import figures

    w = small_trace(80, rate=10.0)
    kv = kvbook.kv_runs(w, H100_8B, slots=64)
    fig = figures.kv.kv_time_figure(kv["series"], H100_8B.kv_capacity())
    slab_ax, exact_ax, running_ax = fig.axes[:3]
    for ax, pol in ((slab_ax, "slab"), (exact_ax, "exact")):
        labels = [t.get_text() for t in ax.get_legend().get_texts()]
        assert labels == [f"{pol}: reserved", f"{pol}: written"]
        # Written is a shaded area under the reserved line: visible where the two coincide.
        fills = [c for c in ax.collections if isinstance(c, PolyCollection)]
        assert len(fills) == 1 and fills[0].get_label() == f"{pol}: written"
    assert slab_ax.get_ylim() == exact_ax.get_ylim()  # one scale: the panels compare
    assert [t.get_text() for t in running_ax.get_legend().get_texts()] == ["slab", "exact"]
    plt.close(fig)


def test_kv_fit_for_llama_8b_on_h100():
    w = small_trace(200)
    fit = kvbook.kv_fit(H100_8B, w)
    assert H100_8B.model.kv_bytes_per_token == 2 * 32 * 8 * 128 * 2
    assert fit["slab"] == H100_8B.kv_capacity() // 8192 == 52
    assert fit["exact_avg"] > fit["exact_final"] > fit["slab"]
    assert fit["bstar"] == H100_8B.bstar()
    assert fit["slab_over_bstar"] == pytest.approx(52 / H100_8B.bstar())
    assert fit["exact_over_bstar"] == pytest.approx(fit["exact_final"] / H100_8B.bstar())


def test_fit_verdict_thresholds():
    def v(slab: float, exact: float) -> str:
        return kvbook.fit_verdict({"slab_over_bstar": slab, "exact_over_bstar": exact})

    assert v(0.18, 1.06) == v(0.49, 0.5) == "holds"  # slabs far below B*, exact not
    assert v(0.18, 0.3) == "partly"  # the memory caps both layouts far below B*
    assert v(0.5, 1.2) == v(0.9, 3.0) == "does not hold"  # slabs reach half of B* or more
    assert kvbook.fit_verdict({"slab_over_bstar": 0.3, "exact_over_bstar": 0.5}, far=0.25) == "does not hold"
    with pytest.raises(ValueError, match="far=1"):
        kvbook.fit_verdict({"slab_over_bstar": 0.1, "exact_over_bstar": 1.0}, far=1.0)


def _reserved(**kw: float) -> dict[str, float]:
    """kv_runs numbers where the claim holds: slabs stop at 52 with 85% unwritten, exact runs 86
    without preempting, p99 TTFT 19x shorter; ``kw`` overrides."""
    n = {
        "slab_count": 52.0,
        "slab_running_peak": 52.0,
        "slab_unused": 0.85,
        "exact_running_peak": 86.0,
        "exact_preemptions": 0.0,
        "ttft_gain": 19.0,
    }
    return {**n, **kw}


def test_reserved_verdict_by_hand():
    assert kvbook.reserved_verdict(_reserved()) == "holds"
    assert kvbook.reserved_verdict(_reserved(ttft_gain=2.0)) == "holds"  # the factor itself is enough
    # The first half holds, the second not: exact preempts, runs no more at once, or no queue.
    assert kvbook.reserved_verdict(_reserved(exact_preemptions=3.0)) == "partly"
    assert kvbook.reserved_verdict(_reserved(exact_running_peak=52.0)) == "partly"
    assert kvbook.reserved_verdict(_reserved(ttft_gain=1.5)) == "partly"
    # Slabs never filled the memory, or what they reserved was mostly written.
    assert kvbook.reserved_verdict(_reserved(slab_running_peak=40.0)) == "does not hold"
    assert kvbook.reserved_verdict(_reserved(slab_unused=0.5)) == "does not hold"
    with pytest.raises(ValueError, match="factor=1"):
        kvbook.reserved_verdict(_reserved(), factor=1.0)


def test_both_verdicts_hold_on_the_pages_setup():
    # The KV page's roofline H100 and the first 300 requests of its trace at 4x their rate.
    w = trace_workload("azure-conv", limit=300, max_context=H100_8B.model.max_context)
    fit = kvbook.kv_fit(H100_8B, w)
    assert fit["slab"] == 52 and fit["slab_over_bstar"] < 0.2 and fit["exact_over_bstar"] > 1
    assert kvbook.fit_verdict(fit) == common.Claim.HOLDS
    n = kvbook.kv_runs(w.scale(time=4.0), H100_8B, slots=256)["numbers"]
    assert n["slab_count"] == n["slab_running_peak"] == 52
    assert n["slab_unused"] > 0.8 and n["exact_running_peak"] > 52 and n["exact_preemptions"] == 0
    assert n["ttft_gain"] == pytest.approx(n["slab_ttft_p99"] / n["exact_ttft_p99"]) and n["ttft_gain"] > 2
    assert kvbook.reserved_verdict(n) == common.Claim.HOLDS


def test_kv_budget_sweep_exact_beats_slab_and_slab_beats_static_when_memory_binds():
    w = small_trace(120, rate=50.0)
    sw = kvbook.kv_budget_sweep(w, H100_8B, [16384, 65536], slots=128)
    assert set(sw) == {"slab", "exact", "static"}
    slab, exact, st = sw["slab"], sw["exact"], sw["static"]
    assert np.all(slab["preemptions"] == 0) and np.all(st["preemptions"] == 0)
    # One slab per row under both: 16384 / 8192 and 65536 / 8192 rows.
    assert list(slab["running_peak"]) == [2, 8] and list(st["running_peak"]) == [2, 8]
    assert np.all(exact["running_peak"] > slab["running_peak"])
    assert np.all(exact["throughput_tok"] > slab["throughput_tok"])
    # Same concurrency cap as slab reservations, but no refill until the batch ends.
    assert np.all(slab["throughput_tok"] > st["throughput_tok"])
    assert np.all(np.diff(slab["throughput_tok"]) > 0)
    assert kvbook.budget_numbers(sw, 16384)["gain"] > 1
    assert "static" not in kvbook.kv_budget_sweep(w, H100_8B, [16384], slots=128, static_timeout=None)


# ------------------------------------------------------------------------------ budget
def test_budget_numbers_by_hand():
    one = {k: np.array([0.0]) for k in kvbook.BUDGET_KEYS if k != "throughput_tok"}
    sweep = {
        pol: {**one, "budget": np.array([1000.0]), "throughput_tok": np.array([t])}
        for pol, t in (("static", 100.0), ("slab", 200.0), ("exact", 500.0))
    }
    n = kvbook.budget_numbers(sweep, 1000)
    assert n["gain"] == pytest.approx(2.5)
    assert n["slab_kept"] == pytest.approx(0.25)  # gains over static 2.0 and 5.0: (2 - 1) / (5 - 1)
    del sweep["static"]
    assert "slab_kept" not in kvbook.budget_numbers(sweep, 1000)
    from batching.book.kv import gain_kept

    with pytest.raises(ValueError, match="exact_gain=1.0"):
        gain_kept(1.5, 1.0)  # no gain to keep a share of


def test_slab_growth_by_hand():
    w = Workload.from_arrays([0.0, 0.0], [100, 300], [100, 300], name="two")  # life: 150, 450 -> 300
    sweep = {
        "slab": {
            "budget": np.array([8192.0, 16384.0, 32768.0]),
            "throughput_tok": np.array([1.0, 10.0, 15.0]),
            "running_peak": np.array([1.0, 2.0, 4.0]),
        }
    }
    g = kvbook.slab_growth(sweep, H100_8B, w)
    assert (g["budget_ratio"], g["tput_ratio"]) == (2.0, 1.5)
    assert (g["rows_lo"], g["rows_hi"], g["ctx"]) == (2, 4, 300)
    assert g["step_lo_ms"] == pytest.approx(H100_8B.decode_step(2, 300) * 1e3)
    assert g["step_hi_ms"] > g["step_lo_ms"]
    kv = 4 * 300 * H100_8B.model.kv_bytes_per_token
    assert g["kv_share_hi"] == pytest.approx(kv / (kv + H100_8B.model.weight_read_bytes))
    with pytest.raises(ValueError, match="two budgets"):
        kvbook.slab_growth({"slab": {k: v[:1] for k, v in sweep["slab"].items()}}, H100_8B, w)


def test_kv_runs_peak_share_is_the_reserved_peak_over_the_capacity():
    w = synthetic(
        60,
        8.0,
        LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=800),
        seed=3,
    )
    n = kvbook.kv_runs(w, H100_8B, slots=16, kv_tokens=65536)["numbers"]
    assert n["slab_peak_share"] == 1.0  # 8 slabs of 8192 reserve all 65,536 tokens
    assert n["slab_count"] == 8 == n["slab_running_peak"]
    assert 0 < n["exact_peak_share"] < 1


def test_real_kv_configs_spend_one_budget_three_ways():
    c = kvbook.real_kv_configs(8192, 2048, slots=32)
    assert c["static"] == {"scheduler": "static", "slots": 4, "max_wait": 1.0, "kv_capacity": 8192}
    assert c["continuous, slab"] == {
        "scheduler": "continuous",
        "slots": 32,
        "kv_policy": "slab",
        "kv_capacity": 8192,
    }
    assert c["continuous, exact"]["kv_policy"] == "exact" and c["continuous, exact"]["slots"] == 32
    assert kvbook.real_kv_configs(8192, 2048, slots=2)["static"]["slots"] == 2
    with pytest.raises(ValueError, match="budget=1000"):
        kvbook.real_kv_configs(1000, 2048, slots=4)


def test_real_model_is_the_named_one_or_the_devices_default():
    assert default_model("tiny", "cpu") == "tiny"
    assert default_model(None, "cpu") == DEFAULT_MODELS["cpu"] == "cpu-s"


def test_real_kv_on_the_tiny_model_by_hand():
    pytest.importorskip("torch")
    # tiny's context is 512: a budget of 2 slabs = 1,024 tokens. r0 wants 30 tokens, r1..r5 five
    # each, 8-token prompts, all at t = 0. Static: 2 rows, batches (r0, r1) for 30 steps, then
    # (r2, r3) and (r4, r5): 40 steps. Continuous with slabs: 2 at a time, r1..r5 through the
    # second slab while r0 runs: 30 steps. Exact: each holds <= 38 tokens, so all 4 slots fill
    # (r0..r3, then r4, r5): 30 steps, 4 running at once.
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    rk = kvbook.real_kv(w, budget_slabs=2, slots=4, model="tiny", device="cpu", threads=1, profile=None)
    assert (rk["budget"], rk["max_context"], rk["slots"]) == (1024, 512, 4)
    real = rk["real"]
    assert [real[n]["steps"] for n in ("static", "continuous, slab", "continuous, exact")] == [40, 30, 30]
    assert [real[n]["running_peak"] for n in ("static", "continuous, slab", "continuous, exact")] == [2, 2, 4]
    assert real["continuous, slab"]["kv_reserved_peak"] == 1024
    assert real["continuous, exact"]["kv_reserved_peak"] <= 4 * 38
    assert all(m["preemptions"] == 0 for m in real.values())
    rows, header = checks.real_schedulers_rows(rk, kvbook.REAL_KV_ROWS)
    assert header == ["measured", "static", "continuous, slab", "continuous, exact"]
    assert rows[0] == ["most requests running at once", "2", "2", "4"]
    n = kvbook.real_kv_numbers(rk)
    assert n["exact_running_peak"] == 4
    assert n["exact_slot_bound"] == 1.0  # all 4 slots ran: the slots, not the 1,024 tokens, bound


def _rs(exact_running: float, sim: bool = False) -> dict:
    m = {
        "static": {"running_peak": 4.0, "throughput_tok": 100.0},
        "continuous, slab": {
            "running_peak": 4.0,
            "throughput_tok": 180.0,
            "kv_used_mean": 50.0,
            "kv_reserved_mean": 1000.0,
        },
        "continuous, exact": {
            "running_peak": exact_running,
            "throughput_tok": 260.0,
            "preemptions": 3.0,
            "kv_reserved_peak": 3000.0,
        },
    }
    rs = {"real": m, "budget": 8192, "max_context": 2048, "slots": 32}
    if sim:
        rs["sim"] = {
            n: {"throughput_tok": v["throughput_tok"] * f} for (n, v), f in zip(m.items(), (1.1, 0.9, 1.0))
        }
    return rs


def test_real_kv_numbers_by_hand():
    n = kvbook.real_kv_numbers(_rs(32))
    assert n["slab_over_static"] == pytest.approx(1.8) and n["exact_over_static"] == pytest.approx(2.6)
    assert n["exact_over_slab"] == pytest.approx(260 / 180)
    assert n["slab_kept"] == pytest.approx(0.5)  # (1.8 - 1) / (2.6 - 1)
    assert n["slab_unused"] == pytest.approx(0.95)  # 1 - 50 / 1000
    assert n["exact_peak_share"] == pytest.approx(3000 / 8192)
    assert n["exact_slot_bound"] == 1.0 and n["exact_preemptions"] == 3.0
    assert n["exact_running_peak"] == 32.0
    assert "exact_sim_tput_err" not in n
    n = kvbook.real_kv_numbers(_rs(20, sim=True))
    assert n["exact_slot_bound"] == 0.0  # 20 of 32 slots: the memory was the limit
    assert n["static_sim_tput_err"] == pytest.approx(0.1) and n["slab_sim_tput_err"] == pytest.approx(-0.1)
    assert n["exact_sim_tput_err"] == pytest.approx(0.0)
    rs = _rs(32)
    rs["real"]["continuous, exact"]["throughput_tok"] = 90.0  # no gain over static: no share to keep
    assert np.isnan(kvbook.real_kv_numbers(rs)["slab_kept"])


def test_slab_verdict_thresholds():
    assert kvbook.slab_verdict(0.0) == kvbook.slab_verdict(0.49) == "holds"  # gives back most
    assert kvbook.slab_verdict(0.5) == kvbook.slab_verdict(0.79) == "partly"
    assert kvbook.slab_verdict(0.8) == kvbook.slab_verdict(1.0) == "does not hold"
    assert kvbook.slab_verdict(-0.2) == "holds"  # slabs slower than static: all of the gain given back
    assert kvbook.slab_verdict(1.3) == "does not hold"  # slabs kept more than exact gained
    with pytest.raises(ValueError, match="slab_kept=nan"):
        kvbook.slab_verdict(float("nan"))


def test_policy_roofline_by_hand():
    # Lengths 1000 + 200 and 1400 + 600: mean over life (1100 + 1700) / 2 = 1400 tokens.
    w = Workload.from_arrays([0.0, 0.0], [1000, 1400], [200, 600], name="two")
    m = H100_8B.model
    r = kvbook.policy_roofline(H100_8B, w, 8 * m.max_context, slots=256)
    assert r["ctx"] == 1400 and (r["rows_slab"], r["rows_exact"]) == (8, 8 * 8192 // 1400)
    assert r["tput_slab"] == pytest.approx(8 / H100_8B.decode_step(8, 1400))
    kv = 46 * 1400 * m.kv_bytes_per_token
    assert r["kv_share_exact"] == pytest.approx(kv / (kv + m.weight_read_bytes))
    assert r["gain"] == pytest.approx(r["tput_exact"] / r["tput_slab"])
    assert 1 < r["gain"] < r["rows_exact"] / r["rows_slab"] == 46 / 8  # more rows, each step longer
    assert kvbook.policy_roofline(H100_8B, w, 8 * m.max_context, slots=16)["rows_exact"] == 16
    with pytest.raises(ValueError, match="no slab row"):
        kvbook.policy_roofline(H100_8B, w, 4096, slots=16)


def test_below_roofline_and_kept_kind_by_hand():
    assert kvbook.below_roofline([{"gain": 1.5}, {"gain": 2.0}], [{"gain": 2.0}, {"gain": 2.5}])
    assert not kvbook.below_roofline([{"gain": 1.5}, {"gain": 3.0}], [{"gain": 2.0}, {"gain": 2.5}])
    with pytest.raises(ValueError):
        kvbook.below_roofline([{"gain": 1.5}], [{"gain": 2.0}, {"gain": 2.5}])
    assert kvbook.kept_kind(math.nan) == kvbook.Kept.NO_GAIN
    assert kvbook.kept_kind(1.0) == kvbook.Kept.ALL and kvbook.kept_kind(0.26) == kvbook.Kept.SHARE
