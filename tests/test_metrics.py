"""Metrics and results files, checked against hand-computed runs (1 s per step)."""

from __future__ import annotations

import csv
import json

import pytest
from helpers import UNIT, LinearCost, reqs

from batching import results
from batching.costs import get_cost_model
from batching.engine import SimExecutor, run
from batching.metrics import SLO, request_record, summarize
from batching.plan import StepWork
from batching.schedulers import ContinuousScheduler, StaticScheduler, make_scheduler


def test_latencies_by_hand():
    # A at t=0 (3 tokens), B at t=0.5 (1 token), one slot: A's tokens at 1, 2, 3; B
    # admitted at 3, its only token at 4.
    a, b = R = reqs((0, 8, 3), (0.5, 8, 1))
    res = run(R, ContinuousScheduler(1, 64), UNIT)
    ra, rb = (request_record(r) for r in R)
    assert (ra["queue"], ra["ttft"], ra["e2e"], ra["tpot"], ra["itl_max"]) == (0, 1, 3, 1, 1)
    assert (rb["queue"], rb["ttft"], rb["e2e"]) == (2.5, 3.5, 3.5)
    assert rb["tpot"] is None and rb["itl_max"] is None  # one token: TPOT is null, not 0
    s = summarize(res)
    assert s["duration_s"] == 4.0 and s["output_throughput"] == 1.0 and s["request_throughput"] == 0.5
    assert s["ttft"]["p50"] == pytest.approx(2.25) and s["ttft"]["max"] == 3.5
    assert s["tpot"]["mean"] == 1.0 and s["itl"]["max"] == 1.0
    assert s["slot_utilization"] == 1.0 and s["busy_s"] == 4.0


def test_time_weighted_utilization_weights_steps_by_duration():
    # Static batch of 2 (prompts 10): prefill step costs 1 + 0.1*20 = 3 s, decode steps
    # 1 + 0.1*2 = 1.2 s; outputs 1 and 3 tokens.
    R = reqs((0, 10, 1), (0, 10, 3))
    res = run(R, StaticScheduler(2, 64), SimExecutor(LinearCost(1.0, 0.1)))
    s = summarize(res)
    assert s["slot_utilization"] == pytest.approx(4 / 6)  # 2 + 1 + 1 tokens over 3 x 2 slots
    assert s["slot_utilization_time_weighted"] == pytest.approx((1.0 * 3 + 0.5 * 2.4) / 5.4)


def test_goodput_counts_requests_meeting_every_slo():
    R = reqs((0, 8, 3), (0.5, 8, 1))
    s = summarize(run(R, ContinuousScheduler(1, 64), UNIT), slo=SLO.parse("ttft:2000 tpot:1000"))
    assert s["goodput"]["requests_ok"] == 1 and s["goodput"]["request_goodput"] == 0.25
    with pytest.raises(ValueError, match="'ttft:abc'"):
        SLO.parse("ttft:abc")
    with pytest.raises(ValueError, match="expected ttft"):
        SLO.parse("latency:5")
    with pytest.raises(ValueError, match="tpot_ms=-1"):
        SLO(tpot_ms=-1)


def test_hardware_utilization_of_a_roofline_decode_step():
    cost = get_cost_model("llama-8b", "h100")
    (r,) = R = reqs((0, 1, 2))
    res = run(R, ContinuousScheduler(4, 8192), SimExecutor(cost))
    steps = [StepWork(1, 1, 0, 0), StepWork(0, 0, 1, 2)]  # prefill 1 token, then one decode at ctx 1+1
    busy = sum(cost.step_time(w) for w in steps)
    s = summarize(res)
    assert s["busy_s"] == pytest.approx(busy)
    assert s["hw_bandwidth_utilization"] == pytest.approx(
        sum(cost.bytes_moved(w) for w in steps) / busy / cost.bandwidth
    )
    assert s["hw_compute_utilization"] == pytest.approx(
        sum(cost.flops(w) for w in steps) / busy / cost.peak_flops
    )
    assert (
        0.5 < s["hw_bandwidth_utilization"] < 1 and s["hw_compute_utilization"] < 0.01
    )  # batch 1 is memory-bound


def test_fast_path_hardware_totals_match_stepping():
    cost = get_cost_model("llama-8b", "h100")
    spec = [(0, 100, 50), (0, 300, 80), (0.01, 20, 30)]
    a = summarize(run(reqs(*spec), ContinuousScheduler(4, 8192), SimExecutor(cost)))
    b = summarize(run(reqs(*spec), ContinuousScheduler(4, 8192), SimExecutor(cost), fast=False))
    assert a["steps"] == b["steps"]
    assert a["hw_bandwidth_utilization"] == pytest.approx(b["hw_bandwidth_utilization"], rel=1e-12)
    assert a["hw_compute_utilization"] == pytest.approx(b["hw_compute_utilization"], rel=1e-12)


def test_results_files_roundtrip(tmp_path):
    R = reqs((0, 8, 3), (0.5, 8, 1))
    res = run(R, ContinuousScheduler(1, 64), UNIT, record_slots=True)
    doc = results.build(res, {"workload": "hand"}, include_token_times=True)
    assert set(doc) == {"schema", "meta", "config", "summary", "requests", "steps"}
    back = json.loads(results.write_json(doc, tmp_path / "r.json").read_text())
    assert back["requests"][1]["tpot"] is None and back["config"]["scheduler"]["max_slots"] == 1
    assert back["requests"][0]["token_times"] == [1.0, 2.0, 3.0] and back["requests"][1]["token_times"] == [
        4.0
    ]
    assert back["steps"][0]["slots_detail"] == [[0, 0, "P", 8, 0]]
    assert sum(s["n"] for s in back["steps"]) == back["summary"]["steps"] == 4
    rows = list(csv.DictReader(results.write_requests_csv(doc, tmp_path / "r.csv").open()))
    assert (
        [r["rid"] for r in rows] == ["0", "1"] and rows[0]["ttft"] == "1.0" and "token_times" not in rows[0]
    )


def test_kv_means_cover_whole_runs_of_steps():
    # A static batch holds its two slabs from its prefill to its last step, and a run of
    # identical decode steps is logged as one row: the mean must still be the two slabs.
    R = reqs((0, 10, 5), (0, 10, 300))
    s = summarize(run(R, StaticScheduler(2, 512), UNIT))
    assert s["kv_reserved_mean"] == 2 * 512 and s["kv_reserved_peak"] == 2 * 512
    # Used: (10 + 10) after the prefill, +1 per live row per step; the dead row stays at 14.
    assert s["kv_used_peak"] == 10 + 299 + 14
    slow = summarize(run(reqs((0, 10, 5), (0, 10, 300)), StaticScheduler(2, 512), UNIT, fast=False))
    assert (
        s["kv_used_mean"] == pytest.approx(slow["kv_used_mean"]) and s["kv_used_peak"] == slow["kv_used_peak"]
    )


def test_step_work_fresh_prices_whole_prompts_and_decodes():
    # Two prompts of 3 and 5 tokens: 8 tokens, 6 + 15 causal pairs; 4 decode rows of 10 tokens.
    w = StepWork.fresh([3, 5], decodes=4, ctx=10)
    assert w == StepWork(prefill_tokens=8, prefill_attn=21, decode_rows=4, decode_ctx=40)
    assert StepWork.fresh() == StepWork()


def test_the_log_gives_each_rows_work_as_the_executor_priced_it():
    """StepLog.works: what the simulator's cost model was asked for each logged step."""
    cost = LinearCost(per_token=0.01, base=0.1)
    sched = make_scheduler("static", max_context=64, slots=2)
    res = run(reqs((0.0, 4, 3), (0.0, 6, 2)), sched, SimExecutor(cost), fast=False)
    works = res.log.works()
    # The padded prefill: 2 x 6 positions; then the decode steps (one live row and one dead).
    assert works[0] == StepWork(12, 2 * 21, 0, 0)
    assert [cost.step_time(w) for w in works] == pytest.approx(res.log.cols["dur"], rel=1e-12)
