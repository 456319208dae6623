"""The numbers, verdicts and figures behind the real engine's runs and the simulator's measured error (batching/book/checks.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")

import pytest
from helpers import LinearCost

from batching.book import (
    checks,
    static,
)
from batching.costs import get_cost_model
from batching.engine import SimExecutor
from batching.workload import LogNormal, Workload, synthetic

UNIT = SimExecutor(LinearCost(1.0))
H100_8B = get_cost_model("llama-8b", "h100")
Seg = static.Segment


def small_trace(n: int = 120, rate: float = 8.0, seed: int = 3) -> Workload:
    """A long-tailed synthetic workload, small enough for unit tests."""
    return synthetic(
        n,
        rate,
        LogNormal(median=300, sigma=0.9, lo=8, hi=3000),
        LogNormal(median=60, sigma=1.0, lo=2, hi=800),
        seed=seed,
    )


def test_crosscheck_agrees_only_when_every_step_and_iteration_count_matches():
    per = {"static": {"steps_sim": 40, "steps_real": 40, "iters_sim": [5.0, 5.0], "iters_real": [5.0, 5.0]}}
    assert checks.crosscheck_agrees({"available": True, "per": per})
    per["static"]["iters_real"] = [5.0, 6.0]
    assert not checks.crosscheck_agrees({"available": True, "per": per})
    assert not checks.crosscheck_agrees({"available": False, "reason": "no torch"})


def test_fidelity_summary_takes_the_worst_scheduler(tmp_path) -> None:
    """Every simulated figure quotes this: the worst of the schedulers, and the noise floor."""
    import json

    doc = {
        "model": "cpu-s",
        "date": "2026-11-30T08:00:00+00:00",
        "workload": {"requests": 200},
        "results": {
            "continuous": {
                "throughput_rel_err": 0.002,
                "e2e_median_abs_rel_err": 0.10,
                "step_median_abs_rel_err": 0.13,
                "real_vs_real_e2e_median_abs_rel_err": 0.18,
            },
            "chunked": {
                "throughput_rel_err": 0.001,
                "e2e_median_abs_rel_err": 0.13,
                "step_median_abs_rel_err": 0.26,
                "real_vs_real_e2e_median_abs_rel_err": 0.24,
            },
        },
    }
    f = tmp_path / "fidelity.json"
    f.write_text(json.dumps(doc))
    s = checks.fidelity_summary(str(f))
    assert (s["tput_err"], s["e2e_err"], s["step_err"], s["noise"]) == (0.002, 0.13, 0.26, 0.24)
    assert s["requests"] == 200 and s["date"] == "2026-11-30" and s["schedulers"] == "continuous, chunked"
    assert "0.2%" in s["text"] and "13%" in s["text"] and "24%" in s["text"]
    assert s["e2e_vs_median"] is None and "median over the real runs" not in s["text"]
    for r, x in zip(doc["results"].values(), (0.06, 0.08)):
        r["sim_vs_real_median_e2e_median_abs_rel_err"] = x
    f.write_text(json.dumps(doc))
    s = checks.fidelity_summary(str(f))
    assert (
        s["e2e_vs_median"] == 0.08
        and "(two real runs differ by 24%; against each request's median over the real runs, 8%)" in s["text"]
    )
    assert s["busy_err"] is None and "busy time" not in s["text"]
    for r, x in zip(doc["results"].values(), (1.04, 0.93)):
        r["busy_pred_over_real"] = x
    f.write_text(json.dumps(doc))
    s = checks.fidelity_summary(str(f))
    assert s["busy_err"] == pytest.approx(0.07)  # the worse of +4% and -7%
    assert "its steps summed to within 7% of the measured busy time (median step 26%)" in s["text"]
    # The committed measurement is readable and has the noise floor the pages quote.
    committed = checks.fidelity_summary()
    assert committed["noise"] is not None and 0 <= committed["tput_err"] < 1


def test_fidelity_summary_says_the_gpu_figures_are_unchecked_until_a_gpu_run_lands(tmp_path) -> None:
    """The CPU check validates the profile-driven simulator, not the GPU roofline figures it is
    quoted under: the sentence says so while no GPU fidelity run is committed, and reports the
    GPU run (and drops "not yet checked") once one is."""
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    run = lambda dev, err: {
        "model": "cpu-s" if dev == "cpu-here" else "llama-1b",
        "device": dev,
        "date": "2026-12-01T08:00:00+00:00",
        "workload": {"requests": 200},
        "results": {
            "continuous": {
                "throughput_rel_err": err,
                "e2e_median_abs_rel_err": 2 * err,
                "step_median_abs_rel_err": 0.1,
            }
        },
    }
    (res / "fidelity.json").write_text(json.dumps(run("cpu-here", 0.01)))
    (res / "fidelity-600.json").write_text(json.dumps(run("cpu-here", 0.5)))  # a CPU variant: not a GPU check
    s = checks.fidelity_summary(root=str(tmp_path))
    assert s["gpu_checks"] == 0 and checks.gpu_fidelity_files(str(tmp_path)) == []
    assert s["text"].startswith("Simulator checked on the book's CPU only: driven by a step profile")
    assert (
        "median per-request latency came within 2%, and output throughput, which these arrivals mostly set, "
        "within 1.0%."
    ) in s["text"]
    assert s["text"].endswith("roofline predictions from datasheet constants, not yet checked against a GPU.")
    assert s["gpu"] in s["text"]
    (res / "fidelity-h200-llama-1b.json").write_text(json.dumps(run("h200", 0.03)))
    s = checks.fidelity_summary(root=str(tmp_path))
    assert s["gpu_checks"] == 1
    assert [f.name for f in checks.gpu_fidelity_files(str(tmp_path))] == ["fidelity-h200-llama-1b.json"]
    assert "not yet checked" not in s["text"] and "CPU only" not in s["text"]
    assert (
        "h200 (llama-1b, 200 requests, 2026-12-01): output throughput within 3.0%, "
        "median per-request latency 6%"
    ) in s["text"]
    assert s["tput_err"] == 0.01  # the CPU numbers still come from the CPU file


@pytest.mark.model
def test_real_schedulers_measure_the_first_finisher_and_meet_a_profile_of_this_machine(tmp_path):
    import json

    pytest.importorskip("torch")
    import torch

    from batching.real.executor import device_name

    # r0 wants 30 tokens, r1..r5 five each, all at t = 0, two slots. Static: batches
    # (r0, r1) for 30 steps, then (r2, r3) and (r4, r5) for 5 each: 40 steps, 55 tokens
    # in 80 slot-steps. Continuous: r1..r5 follow each other through the second slot while
    # r0 runs: 30 steps, 55 of 60 slot-steps.
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    configs = {
        "static": dict(scheduler="static", slots=2),
        "continuous": dict(scheduler="continuous", slots=2),
    }
    rs = checks.real_schedulers(w, configs, model="tiny", device="cpu", threads=1, profile=None)
    assert "sim" not in rs and rs["model"] == "tiny" and rs["requests"] == 6
    assert (rs["real"]["static"]["steps"], rs["real"]["continuous"]["steps"]) == (40, 30)
    assert rs["real"]["static"]["slot_util"] == pytest.approx(55 / 80)
    assert rs["real"]["continuous"]["slot_util"] == pytest.approx(55 / 60)
    header, rows = checks.real_schedulers_rows(rs)
    assert header == ["measured", "static", "continuous"] and rows[0] == ["slot utilization", "69%", "92%"]
    # A profile of this machine: every step 10 ms, whatever it holds.
    here = device_name(torch.device("cpu"))
    prof = {
        "schema": 1,
        "meta": {
            "device": "cpu-here",
            "device_name": here,
            "model": "tiny",
            "dtype": "fp32",
            "date": "2026-11-30",
        },
        "decode": {"batch": [1, 2], "ctx": [8, 64], "ms": [[10.0, 10.0], [10.0, 10.0]]},
        "prefill": {"tokens": [1, 64], "ms": [10.0, 10.0]},
    }
    (tmp_path / "cpu-here-tiny.json").write_text(json.dumps(prof))
    assert checks.profile_measured_here("tiny", here, str(tmp_path)) == str(tmp_path / "cpu-here-tiny.json")
    assert checks.profile_measured_here("tiny", "another CPU", str(tmp_path)) is None
    assert checks.profile_measured_here("cpu-s", here, str(tmp_path)) is None
    rs = checks.real_schedulers(
        w, configs, model="tiny", device="cpu", threads=1, profile=str(tmp_path / "cpu-here-tiny.json")
    )
    assert {n: m["steps"] for n, m in rs["sim"].items()} == {"static": 40, "continuous": 30}
    assert rs["sim"]["static"]["busy_s"] == pytest.approx(0.400)
    assert set(rs["steps_pred_over_real"]["static"]) == {"prefill", "decode"}
    assert checks.real_schedulers_rows(rs)[0][0] == "measured (simulated)"
