"""7.2's server section (batching/book/serve.py): rows, ratios and verdicts from a hand-made
bench_serve result, the simulator's row, and a live replay against the fake server."""

from __future__ import annotations

import functools
import json

import pytest

from batching.book import serve
from batching.book.common import Versus
from batching.costs.models import canonical_dtype

COLS = serve.COLUMNS


def row(ttft: float, itl: float, e2e: float, tok_s: float) -> dict:
    return {
        "ttft_p50": ttft,
        "ttft_p99": 2 * ttft,
        "itl_p50": itl,
        "itl_p99": 3 * itl,
        "e2e_p50": e2e,
        "e2e_p99": 2 * e2e,
        "output_throughput": tok_s,
    }


def bench_doc() -> dict:
    rounds = {
        m: [{"loadavg_1m": la}]
        for m, la in [("ours-continuous", 1.5), ("ours-chunked", 2.5), ("hf-serve", 4.0)]
    }
    return {
        "date": "2026-12-01T14:00:00+00:00",
        "workload": {
            "source": {"preset": "chat-rag", "n": 12, "seed": 0},
            "scale_lengths": 16,
            "time_scale": 8,
        },
        "modes_config": {"ours-continuous": {"slots": 64}},
        "round_order": [["a"], ["b"], ["c"]],
        "loadavg_before": [1.0, 1.0, 1.0],
        "loadavg_after": [2.0, 1.0, 1.0],
        "rounds": rounds,
        "median": {
            "ours-continuous": row(0.1, 0.02, 0.5, 200.0),
            "ours-chunked": row(0.12, 0.015, 0.55, 190.0),
            "hf-serve": row(0.3, 0.04, 1.5, 100.0),
        },
    }


def test_the_profile_engine_says_what_the_simulator_prices_against_the_benchmark():
    from batching.book.serve import _profile_engine

    fp32_1 = {"threads": 1, "model": {"dtype": "fp32"}}
    assert _profile_engine(fp32_1, {"threads": 1, "dtype": "fp32"}) == "same"
    assert _profile_engine(fp32_1, {"threads": 2, "dtype": "float32"}) == "faster"
    assert (
        _profile_engine({"threads": 4, "model": {"dtype": "fp32"}}, {"threads": 2, "dtype": "fp32"})
        == "slower"
    )
    assert _profile_engine(fp32_1, {"threads": 1, "dtype": "bf16"}) == "other"
    assert _profile_engine({}, {}) == "same"  # neither recorded: fp32, one thread


def test_numbers_by_hand():
    n = serve.numbers(bench_doc())
    r = n["server_over_ours"]
    assert r["ttft_p50"] == pytest.approx(3.0) and r["e2e_p50"] == pytest.approx(3.0)
    assert r["output_throughput"] == pytest.approx(0.5)
    assert n["server_slower_e2e"]
    assert not n["same_throughput"]  # 100 vs 200 tok/s
    assert n["requests"] == 12 and n["rounds"] == 3 and n["max_loadavg"] == 4.0 and n["live"] is None
    assert n["cpus"] == 1.0 and n["busy"]  # no cpu_count in the file: one core, under a load of 4
    # No threads in the file: one per process; the committed cpu-s profile says its own.
    assert n["threads"] == 1 and n["profile_threads"] == serve.committed(serve.PROFILE)["meta"]["threads"]
    # No dtype in the file: fp32, as bench_serve runs; the profile's own, and what it prices.
    assert n["dtype"] == "fp32" and n["profile_dtype"] == canonical_dtype(
        serve.committed(serve.PROFILE)["meta"]["dtype"]
    )
    assert n["profile_engine"] == (
        "other" if n["profile_dtype"] != "fp32" else "faster" if n["profile_threads"] > 1 else "same"
    )
    sim = n["rows"]["simulated"]
    assert all(sim[c] is not None and sim[c] > 0 for c in COLS)
    assert sim["ttft_p50"] <= sim["e2e_p50"] and sim["ttft_p99"] >= sim["ttft_p50"]
    rows = serve.table_rows(n)
    assert [x[0] for x in rows] == ["simulated", "ours-continuous", "ours-chunked", "hf-serve"]
    assert rows[1][1:] == pytest.approx([100.0, 200.0, 20.0, 60.0, 500.0, 1000.0, 200.0])


def test_vllm_rows_and_ratios_when_the_file_has_them():
    """A file without vLLM (not built where it ran) has no vLLM row and no ratio; one with it
    gets the row after the servers' and vLLM's ratio to this engine's chunked run."""
    n = serve.numbers(bench_doc())
    assert n["vllm_over_chunked"] is n["vllm_e2e_vs_chunked"] is n["server_over_vllm"] is None
    assert n["vllm_same_throughput"] is None
    doc = bench_doc()
    doc["median"]["vllm-serve"] = row(0.06, 0.01, 0.44, 380.0)
    doc["rounds"]["vllm-serve"] = [{"loadavg_1m": 1.0}]
    n = serve.numbers(doc)
    r = n["vllm_over_chunked"]
    assert r["ttft_p50"] == pytest.approx(0.5) and r["output_throughput"] == pytest.approx(2.0)
    assert r["e2e_p50"] == pytest.approx(0.8)
    assert n["vllm_e2e_vs_chunked"] is Versus.LESS  # 0.44 against 0.55 s
    assert n["server_over_vllm"]["e2e_p50"] == pytest.approx(1.5 / 0.44)
    assert not n["vllm_same_throughput"]  # 380 against 200 tok/s
    doc["median"]["vllm-serve"] = row(0.06, 0.01, 0.56, 205.0)  # within 5%: the same
    n = serve.numbers(doc)
    assert n["vllm_e2e_vs_chunked"] is Versus.SAME and n["vllm_same_throughput"]
    doc["median"]["vllm-serve"] = row(0.06, 0.01, 0.63, 205.0)
    assert serve.numbers(doc)["vllm_e2e_vs_chunked"] is Versus.MORE
    doc["median"]["vllm-serve"] = row(0.06, 0.01, 0.44, 380.0)
    n = serve.numbers(doc)
    assert [x[0] for x in serve.table_rows(n)] == [
        "simulated",
        "ours-continuous",
        "ours-chunked",
        "hf-serve",
        "vllm-serve",
    ]


def test_the_run_and_its_profile_are_this_machines_only_when_their_machines_match(tmp_path):
    """A profile measured on an AMD EPYC at 2 threads: a build on an Intel Xeon names it;
    a bench_serve file written before results recorded ``machine`` is no machine's. The
    profile is a copy of the committed one with its machine set, so the test holds whichever
    machine measured the committed file."""
    epyc = {"machine": {"kind": "cpu", "name": "AMD EPYC", "threads": 2}}
    xeon = {"machine": {"kind": "cpu", "name": "Intel Xeon", "threads": 2}}
    prof = serve.committed(serve.PROFILE)
    prof["meta"] = {**prof["meta"], **epyc}
    path = tmp_path / "epyc-cpu-s.json"
    path.write_text(json.dumps(prof))
    numbers = functools.partial(serve.numbers, profile=path)
    n = numbers(bench_doc(), here=epyc)
    assert (n["profile_machine"], n["profile_same_machine"]) == ("AMD EPYC (2 threads)", True)
    assert (n["machine"], n["same_machine"]) == (None, False)
    n = numbers({**bench_doc(), "machine": {"kind": "cpu", "name": "AMD EPYC", "threads": 1}}, here=xeon)
    assert (n["machine"], n["same_machine"], n["profile_same_machine"]) == (
        "AMD EPYC (1 thread)",
        False,
        False,
    )
    n = numbers({**bench_doc(), **xeon}, here=xeon)
    assert n["same_machine"] and not n["profile_same_machine"]
    assert not numbers(bench_doc())["profile_same_machine"]  # no live run: nothing is this machine's


def test_verdicts_flip_with_the_numbers():
    doc = bench_doc()
    doc["median"]["hf-serve"] = row(0.05, 0.01, 0.4, 300.0)
    doc["median"]["ours-chunked"] = row(0.12, 0.03, 0.55, 190.0)
    n = serve.numbers(doc)
    assert not n["server_slower_e2e"]
    doc["median"]["hf-serve"] = row(0.3, 0.04, 1.5, 209.0)  # within 5% of 200: the same
    assert serve.numbers(doc)["same_throughput"]


def test_live_replay_against_a_given_server():
    pytest.importorskip("httpx")
    from fake_openai import FakeOpenAI

    with FakeOpenAI(model="my-vllm") as srv:
        n = serve.numbers(bench_doc(), live=True, server_url=srv.url, smoke=True)
    assert n["live"]["model"] == "my-vllm" and n["live"]["completed"] == 8 == n["live"]["requests"]
    live = n["rows"]["live"]
    assert 0 < live["ttft_p50"] <= live["e2e_p50"] and live["output_throughput"] > 0
    assert [x[0] for x in serve.table_rows(n)][-1] == "live"
    assert all(len(b["prompt"]) > 0 and b["ignore_eos"] for _, b in srv.received)  # token ids, forced length


def test_a_busy_machine_is_the_load_above_the_core_count() -> None:
    from batching.results import machine_busy

    assert machine_busy(2.5, 2) and not machine_busy(2.0, 2) and not machine_busy(None, 2)
    assert machine_busy(1.5, None)  # unknown core count: one


def test_the_serve_figure_draws_a_bar_per_mode_it_is_given_and_has() -> None:
    from batching.book import figures

    doc = bench_doc()
    doc["median"]["vllm-serve"] = row(0.06, 0.01, 0.44, 380.0)
    doc["rounds"]["vllm-serve"] = [{"loadavg_1m": 1.0}]
    labels = {"ours-continuous": "ours", "hf-serve": "hf", "vllm-serve": "vllm", "live": "now"}
    fig = figures.continuous.serve_figure(serve.numbers(doc)["rows"], labels)
    assert [t.get_text() for t in fig.axes[0].get_yticklabels()] == ["ours", "hf", "vllm"]  # no live row
    e2e = fig.axes[2]
    assert [round(p.get_width()) for p in e2e.patches] == [500, 1500, 440]  # ms
    assert [t.get_text() for t in e2e.texts] == ["500", "1500", "440"]
