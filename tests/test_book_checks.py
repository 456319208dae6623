"""The numbers, verdicts and figures behind the real engine's runs and the simulator's measured error (batching/book/checks.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import pytest

from batching.book import (
    checks,
)
from batching.costs.profile import profile_measured_here
from batching.real.session import compare_schedulers
from batching.workloads import Workload


def test_crosscheck_agrees_only_when_every_step_and_iteration_count_matches():
    per = {"static": {"steps_sim": 40, "steps_real": 40, "iters_sim": [5.0, 5.0], "iters_real": [5.0, 5.0]}}
    assert checks.crosscheck_agrees({"available": True, "per": per})
    per["static"]["iters_real"] = [5.0, 6.0]
    assert not checks.crosscheck_agrees({"available": True, "per": per})
    assert not checks.crosscheck_agrees({"available": False, "reason": "no torch"})


def _fidelity_run(dev: str, err: float, requests: int = 200, time_scale: float = 2.0) -> dict:
    return {
        "model": "cpu-s" if dev == "cpu-here" else "llama-1b",
        "device": dev,
        "date": "2026-12-01T08:00:00+00:00",
        "real_runs": 5,
        "workload": {"requests": requests, "time_scale": time_scale},
        "results": {
            "continuous": {
                "throughput_rel_err": err,
                "e2e_median_abs_rel_err": 2 * err,
                "step_median_abs_rel_err": 0.1,
                "busy_pred_over_real": 1 + err,
            }
        },
    }


def test_gpu_fidelity_files_count_only_the_gpu_runs(tmp_path) -> None:
    """The CPU check validates the profile-driven simulator, not the GPU roofline figures: the
    measured page counts the committed GPU runs (0: the GPU figures are unchecked), and a CPU
    variant of the benchmark (fidelity-600.json) is not one."""
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    (res / "fidelity.json").write_text(json.dumps(_fidelity_run("cpu-here", 0.01)))
    (res / "fidelity-600.json").write_text(json.dumps(_fidelity_run("cpu-here", 0.5, 600)))
    assert checks.gpu_fidelity_files(str(tmp_path)) == []
    (res / "fidelity-h200-llama-1b.json").write_text(json.dumps(_fidelity_run("h200", 0.03)))
    assert [f.name for f in checks.gpu_fidelity_files(str(tmp_path))] == ["fidelity-h200-llama-1b.json"]


def test_fidelity_rows_one_per_run_and_scheduler_cpu_first(tmp_path) -> None:
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    (res / "fidelity-h200-llama-1b.json").write_text(json.dumps(_fidelity_run("h200", 0.03)))
    (res / "fidelity-time4.json").write_text(json.dumps(_fidelity_run("cpu-here", 0.02, 200, 4.0)))
    (res / "fidelity.json").write_text(json.dumps(_fidelity_run("cpu-here", 0.01)))
    old = _fidelity_run("cpu-here", 0.04, 600)
    old["results"]["chunked"] = {"throughput_rel_err": 0.005, "e2e_median_abs_rel_err": 0.2}  # older file
    (res / "fidelity-600.json").write_text(json.dumps(old))
    recs = checks.fidelity_records(str(tmp_path))
    assert [(r["file"].split("/")[-1], r["scheduler"]) for r in recs] == [
        ("fidelity.json", "continuous"),  # 200 requests at 2x
        ("fidelity-time4.json", "continuous"),  # 200 at 4x
        ("fidelity-600.json", "continuous"),
        ("fidelity-600.json", "chunked"),
        ("fidelity-h200-llama-1b.json", "continuous"),  # the GPU last
    ]
    assert recs[0]["e2e_err"] == 0.02 and recs[0]["busy_ratio"] == pytest.approx(1.01)
    assert recs[3]["noise"] is None and recs[3]["busy_ratio"] is None and recs[3]["real_runs"] == 5
    # Files that do not record their machine are no machine's; recorded, they name it.
    assert all(r["machine"] is None for r in recs)
    assert checks.fidelity_machine(
        recs[:4], here={"device_name": "AMD EPYC", "device": "cpu", "threads": 2}
    ) == {
        "label": None,
        "same_machine": False,
    }
    rows, header = checks.fidelity_rows(str(tmp_path))
    assert len(header) == len(rows[0]) == 7
    assert rows[0] == ["200 at 2x", "continuous", "2%", "-", "-", "1.0%", "1.01"]
    assert rows[3][1:] == ["chunked", "20%", "-", "-", "0.5%", "-"]
    assert rows[4][0] == "200 at 2x, llama-1b on h200"
    # The committed runs: the four CPU results, two schedulers each, every field present.
    committed = checks.fidelity_records()
    assert len(committed) >= 8 and all(r["noise"] is not None for r in committed)
    assert all(0 <= r["tput_err"] < 1 for r in committed)


def test_fidelity_runs_name_the_machine_they_ran_on_and_are_this_ones_only_if_it_matches(tmp_path) -> None:
    import json

    res = tmp_path / "benchmarks" / "results"
    res.mkdir(parents=True)
    epyc = {"kind": "cpu", "name": "AMD EPYC", "threads": 2}
    (res / "fidelity.json").write_text(json.dumps({**_fidelity_run("cpu-here", 0.01), "machine": epyc}))
    (res / "fidelity-600.json").write_text(
        json.dumps({**_fidelity_run("cpu-here", 0.02, 600), "machine": epyc})
    )
    recs = checks.fidelity_records(str(tmp_path))
    assert checks.fidelity_machine(recs, here={"machine": epyc}) == {
        "label": "AMD EPYC (2 threads)",
        "same_machine": True,
    }
    xeon = {"device": "cpu-here", "device_type": "cpu", "device_name": "Intel Xeon", "threads": 2}
    assert checks.fidelity_machine(recs, here=xeon) == {
        "label": "AMD EPYC (2 threads)",
        "same_machine": False,
    }
    assert checks.fidelity_rows(str(tmp_path))[0][0][0] == "200 at 2x"  # one machine: the page names it
    # Runs of two machines: none is named for all, and each row names its own.
    other = {**epyc, "threads": 8}
    (res / "fidelity-600.json").write_text(
        json.dumps({**_fidelity_run("cpu-here", 0.02, 600), "machine": other})
    )
    recs = checks.fidelity_records(str(tmp_path))
    assert checks.fidelity_machine(recs, here={"machine": epyc}) == {"label": None, "same_machine": False}
    rows = checks.fidelity_rows(str(tmp_path))[0]
    assert [r[0] for r in rows] == [
        "200 at 2x, cpu-s on AMD EPYC (2 threads)",
        "600 at 2x, cpu-s on AMD EPYC (8 threads)",
    ]


@pytest.mark.model
def test_real_schedulers_measure_the_first_finisher_and_meet_a_profile_of_this_machine(tmp_path):
    import json

    pytest.importorskip("torch")
    import torch

    from batching.costs.devices import Machine
    from batching.real.hardware import machine

    # r0 wants 30 tokens, r1..r5 five each, all at t = 0, two slots. Static: batches
    # (r0, r1) for 30 steps, then (r2, r3) and (r4, r5) for 5 each: 40 steps, 55 tokens
    # in 80 slot-steps. Continuous: r1..r5 follow each other through the second slot while
    # r0 runs: 30 steps, 55 of 60 slot-steps.
    w = Workload.from_arrays([0.0] * 6, [8] * 6, [30] + [5] * 5, name="mini")
    configs = {
        "static": dict(scheduler="static", slots=2),
        "continuous": dict(scheduler="continuous", slots=2),
    }
    rs = compare_schedulers(w, configs, model="tiny", device="cpu", threads=1, profile=None)
    assert "sim" not in rs and rs["model"] == "tiny"
    assert rs["cpus"] >= 1 and rs["busy"] == (rs["load"] > rs["cpus"])  # the machine, recorded
    assert (rs["real"]["static"]["steps"], rs["real"]["continuous"]["steps"]) == (40, 30)
    assert rs["real"]["static"]["slot_util"] == pytest.approx(55 / 80)
    assert rs["real"]["continuous"]["slot_util"] == pytest.approx(55 / 60)
    # The capacity search's stability rule, per run: six requests at t = 0 queue for
    # milliseconds, far below the growth the rule needs (capacity.queue_growth).
    assert rs["real"]["static"]["stable"] == rs["real"]["continuous"]["stable"] == 1.0
    rows, header = checks.real_schedulers_rows(rs)
    assert header == ["measured", "static", "continuous"] and rows[0] == ["slot utilization", "69%", "92%"]
    # A profile of this machine (its CPU at the runs' one thread, written before profiles
    # recorded ``machine``): every step 10 ms, whatever it holds.
    here = machine(torch.device("cpu"))
    assert here.threads == 1
    prof = {
        "schema": 1,
        "meta": {
            "device": "cpu-here",
            "device_name": here.name,
            "threads": 1,
            "machine": here.to_dict(),
            "model": "tiny",
            "dtype": "fp32",
            "date": "2026-11-30",
        },
        "decode": {"batch": [1, 2], "ctx": [8, 64], "ms": [[10.0, 10.0], [10.0, 10.0]]},
        "prefill": {"tokens": [1, 64], "ms": [10.0, 10.0]},
    }
    (tmp_path / "cpu-here-tiny.json").write_text(json.dumps(prof))
    assert profile_measured_here("tiny", here, str(tmp_path)) == str(tmp_path / "cpu-here-tiny.json")
    # A profile that recorded no CPU flags (written before they were kept) may be of another CPU
    # of this name: it is not this machine's.
    del prof["meta"]["machine"]
    (tmp_path / "cpu-here-tiny.json").write_text(json.dumps(prof))
    assert here.flags is None or profile_measured_here("tiny", here, str(tmp_path)) is None
    prof["meta"]["machine"] = here.to_dict()
    (tmp_path / "cpu-here-tiny.json").write_text(json.dumps(prof))
    # Another CPU, or this one at other threads, is another machine: its profile is not this one's.
    assert profile_measured_here("tiny", Machine("cpu", "another CPU", 1), str(tmp_path)) is None
    assert profile_measured_here("tiny", Machine("cpu", here.name, 8), str(tmp_path)) is None
    assert profile_measured_here("cpu-s", here, str(tmp_path)) is None
    rs = compare_schedulers(
        w, configs, model="tiny", device="cpu", threads=1, profile=str(tmp_path / "cpu-here-tiny.json")
    )
    assert {n: m["steps"] for n, m in rs["sim"].items()} == {"static": 40, "continuous": 30}
    assert rs["sim"]["static"]["busy_s"] == pytest.approx(0.400) and rs["sim"]["static"]["stable"] == 1.0
    assert checks.real_schedulers_rows(rs)[1][0] == "measured (simulated)"


def test_within_noise_by_hand() -> None:
    assert checks.within_noise([{"e2e_err": 0.05, "noise": 0.07}, {"e2e_err": 0.07, "noise": 0.07}])
    assert not checks.within_noise([{"e2e_err": 0.05, "noise": 0.07}, {"e2e_err": 0.11, "noise": 0.07}])
