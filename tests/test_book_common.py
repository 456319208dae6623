"""The numbers, verdicts and figures behind every page: glue helpers, colours and every figure (batching/book/common.py, plots.py): hand-computed cases, and
sweeps that must move the way theory says they do."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
from helpers import H100_8B, small_trace

from batching.book import (
    chunked,
    common,
    continuous,
    figures,
    plots,
    static,
)
from batching.book import kv as kvbook
from batching.simulate import offered_rate, simulate
from batching.steplog import KINDS
from batching.workloads import preset


def test_glue_helpers():
    sweep = {"x": np.array([1.0, 2.0]), "y": np.array([10.0, 20.0])}
    assert common.at(sweep, "x", 2.0) == {"x": 2.0, "y": 20.0}
    with pytest.raises(KeyError):
        common.at(sweep, "x", 3.0)
    assert common.flat("p", {"a": np.float64(1.5), "b": "s"}) == {"p_a": 1.5, "p_b": "s"}
    assert common.choose(True, 100, 10) == 10 and common.choose(False, 100, 10) == 100
    assert plots.plain(np.float64(2.5)) == 2.5 and type(plots.plain(np.int64(3))) is int
    # A phrase that names an existing path is pasted as itself, not read as that file.
    for text in (".", "README.md", "", "a *short* phrase"):
        assert plots.markdown(text)._repr_markdown_() == text


def test_a_file_is_this_machines_only_when_its_machine_matches_the_live_runs():
    """Every CPU is filed as cpu-here: a page may call a committed file this machine's only when
    its CPU model and threads (or its GPU) are the live run's; old files say them as
    device_name and threads, and a file that names neither is no machine's."""
    profile = {"device": "cpu-here", "device_name": "AMD EPYC", "threads": 2, "model": "cpu-s"}
    epyc_run = {"device": "cpu", "machine": {"kind": "cpu", "name": "AMD EPYC", "threads": 2}}
    xeon_sweep = {"device": "cpu-here", "device_type": "cpu", "device_name": "Intel Xeon", "threads": 2}
    assert common.same_machine_as(profile, epyc_run)
    assert not common.same_machine_as(profile, xeon_sweep)
    assert not common.same_machine_as(profile, {**epyc_run, "machine": {**epyc_run["machine"], "threads": 8}})
    assert not common.same_machine_as({"device": "cpu-here"}, epyc_run)  # unrecorded: never the same
    assert not common.same_machine_as(profile, None)
    gpu = {"device": "H200-SXM", "device_name": "NVIDIA H200"}
    assert common.same_machine_as(
        gpu, {"device": "cuda:0", "machine": {"kind": "cuda", "name": "NVIDIA H200"}}
    )
    # What tables and legends call them: the machine, never the entry every CPU shares.
    assert common.machine_label(profile) == "AMD EPYC (2 threads)"
    assert common.machine_label({**profile, "threads": 1}) == "AMD EPYC (1 thread)"
    assert common.machine_label(gpu) == "NVIDIA H200"
    assert common.machine_label({"device": "cpu-here"}) == "cpu-here"


def test_phase_colours_are_distinct_and_cover_every_kind():
    assert set(plots.PHASE_COLORS) == set(KINDS)
    assert len(set(plots.PHASE_COLORS.values())) == len(KINDS)


# ---------------------------------------------------------------------------- plots
def test_every_figure_draws_and_saves(tmp_path):
    plots.style()
    w = small_trace(60, rate=4.0)
    ff = simulate(preset("first-finisher"), H100_8B, "static", slots=32, kv_tokens=None, record_slots=True)
    cfg = {
        "static": {"scheduler": "static", "slots": 8, "max_wait": 1.0},
        "continuous": {"scheduler": "continuous", "slots": 8},
    }
    sw = continuous.rate_sweep(w, H100_8B, cfg, [0.5, 2.0])
    wl, probes = continuous.with_probes(w, every=5)
    lp = chunked.long_prompt_among_decodes(running=6, prompt=1000)
    st = chunked.stall_runs(
        lp, H100_8B, {"mix": ("continuous, mixed", "continuous", {})}, range(6), 6, slots=8
    )
    kv = kvbook.kv_runs(w, H100_8B, slots=16)
    rt = chunked.chunk_step_times(H100_8B, [64, 512])
    figs = {
        "padding": figures.static.padding_figure(static.padding_cost(H100_8B)),
        "timeline": figures.static.timeline_figure([("static", ff.log.timeline())], marks=[[(0.1, "mark")]]),
        "batch": figures.static.batch_sweep_figure(static.static_batch_sweep(w, H100_8B, [1, 4])),
        "wait": figures.static.wait_figure(static.wait_sweep(w, H100_8B, [0, 1], slots=4), ceiling=0.4),
        "utilization": figures.continuous.utilization_load_figure(sw, trace_rate=offered_rate(w)),
        "real": figures.continuous.real_schedulers_figure(
            {
                "real": {n: {"slot_util": 0.5, "e2e_p99": 2.0, "throughput_tok": 90.0} for n in cfg},
                "sim": {n: {"slot_util": 0.6, "e2e_p99": 1.5, "throughput_tok": 95.0} for n in cfg},
            }
        ),
        "iters": figures.continuous.iterations_figure(continuous.probe_runs(wl, H100_8B, cfg, probes), 20),
        "itl": figures.chunked.itl_figure(st["series"], 0.5, st["first_token"]),
        "roofline": figures.chunked.chunk_roofline_figure(
            rt["chunk"], rt["step_s"], rt["decode_s"], rt["bstar"]
        ),
        "tradeoff": figures.chunked.chunk_tradeoff_figure(
            {"1x": chunked.chunk_sweep(w, H100_8B, [256, 512], slots=8)[1.0]}
        ),
        "kv_time": figures.kv.kv_time_figure(kv["series"], H100_8B.kv_capacity()),
        "kv_fit": figures.kv.kv_fit_figure(
            w.prompt_lens + w.output_lens, kvbook.kv_fit(H100_8B, w), bstar=10.0
        ),
        "kv_budget": figures.kv.kv_budget_figure(
            kvbook.kv_budget_sweep(w, H100_8B, [16384, 32768], slots=32)
        ),
    }
    for name, fig in figs.items():
        assert fig.axes, name
        png, svg = plots.save(fig, name, tmp_path)
        assert png.stat().st_size > 5000 and svg.read_text().startswith("<?xml"), name
        matplotlib.pyplot.close(fig)
    assert "x" in str(plots.table([[1, "ab"]], ["x", "y"]))
    assert "<th>x</th>" in plots.table([[1, "ab"]], ["x", "y"])._repr_html_()
