"""``python -m batching measure`` and ``run``: a profile the simulator can load, real runs
in the same results format as simulated ones (torch, CPU, the ``tiny`` shape)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from batching.book import decode
from batching.cli import main
from batching.costs.profile import ProfileCost
from batching.plan import StepWork
from batching.real import sweep
from batching.real.measure import measure

GRID = dict(
    batches=[1, 2, 4],
    ctxs=[8, 32],
    prefill_tokens=[8, 32],
    mixed=[(16, 2, 16)],
    reps=2,
    bandwidth_bytes=1 << 22,
    peak_n=128,
)


def test_measured_profile_loads_and_interpolates_its_own_points():
    doc = measure("tiny", "cpu", **GRID)
    assert doc["meta"]["device"] == "cpu-here" and doc["meta"]["model"] == "tiny"
    assert doc["meta"]["dtype"] == "fp32" and doc["meta"]["torch"]
    assert len(doc["decode"]["ms"]) == 3 and all(len(row) == 2 for row in doc["decode"]["ms"])
    assert all(p["min_ms"] <= p["median_ms"] <= p["max_ms"] for row in doc["decode"]["spread"] for p in row)
    assert (
        doc["device"]["bandwidth"]["copy"]["GBps_best"] > 0
        and doc["device"]["matmul_peak"]["TFLOPs_best"] > 0
    )
    bw = doc["device"]["bandwidth"]
    # The efficiency reference is the best of the layouts a linear layer can store, the
    # thread-split product of one-token steps and oneDNN's prepacked one (where it runs) included.
    layouts = tuple(k for k in ("matvec_wx", "matvec_xwt", "matvec_split", "matvec_dnnl") if k in bw)
    assert {"matvec_wx", "matvec_xwt", "matvec_split"} <= set(layouts)
    assert bw["matvec"]["GBps_best"] == max(bw[k]["GBps_best"] for k in layouts)
    assert bw["matvec"]["layout"] in layouts
    cost = ProfileCost.from_dict(json.loads(json.dumps(doc)))
    # At a measured grid point the cost model returns the measured median exactly.
    got = cost.step_time(StepWork(decode_rows=2, decode_ctx=2 * 32))
    assert got == pytest.approx(doc["decode"]["ms"][1][1] / 1e3, rel=1e-12)
    assert cost.step_time(StepWork(prefill_tokens=32, prefill_attn=32 * 33 // 2)) == pytest.approx(
        doc["prefill"]["ms"][1] / 1e3, rel=1e-12
    )
    assert cost.extrapolated == 0
    assert "prefill_rows" not in doc and cost.attn_s == 0.0


def test_equal_prompts_side_by_side_are_measured_for_the_attention_fit():
    doc = measure("tiny", "cpu", **{**GRID, "prefill_rows": [(4, 8), (2, 16)]})
    pr = doc["prefill_rows"]
    assert (pr["rows"], pr["tokens"]) == ([4, 2], [8, 16]) and all(m > 0 for m in pr["ms"])
    assert all(p["reps"] == 2 for p in pr["spread"])
    cost = ProfileCost.from_dict(json.loads(json.dumps(doc)))
    assert cost.attn_s >= 0.0 and cost.describe()["attn_s_per_pair"] == cost.attn_s
    with pytest.raises(ValueError, match=r"prefill_rows \(1, 8\)"):
        measure("tiny", "cpu", **{**GRID, "prefill_rows": [(1, 8)]})


def test_rounds_pool_every_repetition_of_each_point():
    doc = measure("tiny", "cpu", **{**GRID, "reps": 2, "rounds": 3})
    assert doc["meta"]["rounds"] == 3 and doc["meta"]["reps"] == 2
    spreads = (
        [p for row in doc["decode"]["spread"] for p in row]
        + doc["prefill"]["spread"]
        + doc["mixed"]["spread"]
    )
    assert len(spreads) == 3 * 2 + 2 + 1 and all(p["reps"] == 6 for p in spreads)
    for bad in ({"rounds": 0}, {"reps": 0}):
        with pytest.raises(ValueError, match=f"{next(iter(bad))}=0"):
            measure("tiny", "cpu", **{**GRID, **bad})


def test_a_measurement_hands_out_what_it_has_as_it_goes(tmp_path):
    """A GPU stage cut by its time limit keeps its points: after each round (and every
    ``partial_every_s``) the profile so far, marked partial, unmeasured points null; the
    file written last is always whole JSON (results.write_json)."""
    from batching.results import write_json

    seen: list[dict] = []
    out = tmp_path / "p.json"

    def keep(doc: dict) -> None:
        seen.append(json.loads(json.dumps(doc)))
        write_json(doc, out, allow_nan=True)

    doc = measure("tiny", "cpu", **{**GRID, "reps": 1, "rounds": 2}, partial=keep, partial_every_s=1e9)
    points = 3 * 2 + 2 + 1
    assert [d["meta"]["points_done"] for d in seen] == [points]  # the end of round 1 (of 2)
    assert all(d["meta"]["partial"] and d["meta"]["points"] == 2 * points for d in seen)
    assert all(p["reps"] == 1 for row in seen[0]["decode"]["spread"] for p in row)
    assert "partial" not in doc["meta"] and json.loads(out.read_text())["meta"]["partial"]
    assert not list(tmp_path.glob("*.tmp"))
    seen.clear()
    measure("tiny", "cpu", **{**GRID, "reps": 1}, partial=keep, partial_every_s=0.0)
    done = [d["meta"]["points_done"] for d in seen]
    assert done == list(range(1, points))  # after every point but the last (the final document)
    assert seen[0]["decode"]["ms"][0][0] is not None and seen[0]["decode"]["ms"][0][1] is None


def test_measure_refuses_lengths_beyond_the_context():
    with pytest.raises(ValueError, match="exceeds tiny's max_context=512"):
        measure("tiny", "cpu", **{**GRID, "prefill_tokens": [8, 4096]})


def test_run_and_simulate_write_the_same_results_shape(tmp_path, capsys):
    common = [
        "--preset",
        "chat-rag",
        "-n",
        "6",
        "--rate",
        "100",
        "--scale-lengths",
        "40",
        "--cap",
        "--scheduler",
        "continuous",
        "--slots",
        "4",
        "--model",
        "tiny",
        "--no-progress",
    ]
    real = tmp_path / "real.json"
    assert main(["run", *common, "--device", "cpu", "--out", str(real)]) == 0
    prof = tmp_path / "p.json"
    assert (
        main(
            [
                "measure",
                "--model",
                "tiny",
                "--device",
                "cpu",
                "--batches",
                "1,2,4",
                "--ctxs",
                "8,64",
                "--prefill",
                "8,64",
                "--mixed-rows",
                "1",
                "--mixed-chunks",
                "8",
                "--mixed-ctx",
                "8",
                "--prefill-rows",
                "2x32",
                "--reps",
                "2",
                "--rounds",
                "1",
                "--out",
                str(prof),
                "--no-progress",
            ]
        )
        == 0
    )
    assert json.loads(prof.read_text())["prefill_rows"]["rows"] == [2]
    sim = tmp_path / "sim.json"
    assert main(["simulate", *common, "--device", "cpu", "--profile", str(prof), "--out", str(sim)]) == 0
    r, s = json.loads(real.read_text()), json.loads(sim.read_text())
    assert set(r) == set(s) and set(r["summary"]) == set(s["summary"])
    assert [q["output_len"] for q in r["requests"]] == [q["output_len"] for q in s["requests"]]
    assert r["config"]["executor"]["executor"] == "real" and s["config"]["executor"]["kind"] == "profile"


def test_scattered_decode_rows_really_make_the_runner_gather_their_slabs():
    # "Why batching" times a gathered path: a permutation of slots 0..B-1 would be sorted
    # back into one range and read as a view, so the rows must span > SPAN_PER_ROW x B slots.
    import torch

    from batching.costs.models import get_model
    from batching.real.measure import StepTimer
    from batching.real.runner import SPAN_PER_ROW, ModelRunner

    runner = ModelRunner.from_shape(
        get_model("tiny"), SPAN_PER_ROW * 4 + 1, max_len=32, decode_attention="sdpa"
    )
    seen = []
    index = runner._decode_index
    runner._decode_index = lambda slots, pos: seen.append(index(slots, pos)) or seen[-1]  # type: ignore[method-assign]
    timer = StepTimer(runner, reps=1, warmup=0)
    timer.decode(4, 8, scattered=True)
    assert isinstance(seen[-1].sel, torch.Tensor) and seen[-1].sel.tolist() == [0, 3, 5, 8]
    timer.decode(4, 8)
    assert seen[-1].sel == slice(0, 4)
    with pytest.raises(ValueError, match="more than 10 slots"):
        StepTimer(ModelRunner.from_shape(get_model("tiny"), 10, max_len=32), reps=1).decode(
            5, 8, scattered=True
        )


@pytest.mark.parametrize("threads", [1, 2])
def test_every_matvec_reference_computes_the_same_product(threads: int) -> None:
    """The efficiency reference's layouts are one product over the same bytes: the split
    one (one-token steps' kernel) sums its pieces back to the plain result."""
    from batching.real import kernels as K
    from batching.real.measure import _matvecs

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        src = torch.rand(4096 * 6, dtype=torch.float64)
        fns = _matvecs(src)
        w = src.view(-1, 4096)
        xwt, split = fns["matvec_xwt"][0](), fns["matvec_split"][0]()
        assert split.shape == xwt.shape == (1, 6)
        torch.testing.assert_close(split, xwt, rtol=1e-12, atol=1e-12)
        assert fns["matvec_split"][1] == fns["matvec_xwt"][1] == fns["matvec_wx"][1] == w.nbytes
        assert "matvec_dnnl" not in fns  # oneDNN runs no float64
        if K.dnnl_available(torch.float32):  # oneDNN's prepacked product: the same numbers in fp32
            f32 = _matvecs(src.float())
            torch.testing.assert_close(f32["matvec_dnnl"][0](), f32["matvec_xwt"][0](), rtol=1e-4, atol=1e-4)
            assert f32["matvec_dnnl"][1] == w.nbytes // 2
    finally:
        torch.set_num_threads(before)


def test_live_defaults():
    assert sweep.live_defaults("cpu") == ("cpu-m", [1, 2, 4, 8, 16, 32, 64, 128])
    assert sweep.live_defaults("cuda", free_bytes=100e9) == ("llama-8b", [2**i for i in range(9)])
    assert sweep.live_defaults("cuda", free_bytes=20e9)[0] == "llama-1b"
    assert sweep.live_defaults("cuda", model="tiny", free_bytes=1e9)[0] == "tiny"
    with pytest.raises(ValueError):
        sweep.live_defaults("cpu", batches=[2, 4])


def test_the_live_decode_sweep_measures_every_path_on_the_cpu():
    sw = sweep.decode_sweep(
        model="tiny",
        device="cpu",
        batches=[1, 2, 4],
        ctx=16,
        reps=2,
        peak_n=128,
        bandwidth_bytes=1 << 20,
        dtype="fp32",
    )
    # The gathered path only where the runner gathers: SDPA's, not the CPU decode kernel's.
    gathers = sw["meta"]["decode_attention"] == "sdpa"
    assert sw["paths"] == ["uniform", "mixed"] + ["gathered"] * gathers
    assert list(sweep.decode_paths()) == ["uniform", "mixed", "gathered"]
    assert list(sweep.decode_paths(gathers=False)) == ["uniform", "mixed"]
    assert list(sweep.decode_paths(graphs=True)) == ["uniform", "mixed"]  # CUDA graphs: no gathered path
    assert sw["meta"]["device"] == "cpu-here" and sw["meta"]["device_type"] == "cpu"
    assert sw["meta"]["model"] == "tiny" and sw["meta"]["dtype"] == "fp32"
    assert isinstance(sw["meta"]["linear_split"], bool) and sw["meta"]["threads"] >= 1
    for p in sw["paths"]:
        assert sw[f"{p}_ms"].shape == (3,) and np.all(sw[f"{p}_ms"] > 0)
        assert np.all(sw[f"{p}_p25_ms"] <= sw[f"{p}_p75_ms"])
    assert sw["matvec_gbs"] > 0 and sw["peak_tflops"] > 0
    n = decode.live_numbers(sw)
    assert n["efficiency"] > 0 and n["bmax"] == 4
    assert sw["meta"]["kernels"]["dtype"] == "fp32" and sw["meta"]["kernels"]["dtype_reason"] == "asked for"
    with pytest.raises(ValueError):
        sweep.decode_sweep(model="tiny", device="cpu", batches=[1, 2], ctx=1000)
    # auto: the dtype this machine's probe chose, and why; `only` times the paths named.
    auto = sweep.decode_sweep(
        model="tiny",
        device="cpu",
        batches=[1, 2],
        ctx=16,
        reps=1,
        peak_n=64,
        bandwidth_bytes=1 << 20,
        only=["uniform"],
    )
    k = auto["meta"]["kernels"]
    assert auto["paths"] == ["uniform"] and k["dtype"] == auto["meta"]["dtype"] in ("fp32", "bf16")
    assert k["dtype_reason"] != "asked for" and set(k["geomean_ms"]) == {"fp32", "bf16"}
    with pytest.raises(ValueError, match="only="):
        sweep.decode_sweep(model="tiny", device="cpu", batches=[1, 2], ctx=16, only=["nope"])


def test_linear_replay_runs_each_steps_products_on_its_rows_and_head_rows(monkeypatch):
    """The floor of a run's matrix products: every layer's linear layers on the step's rows,
    the head on its logit rows only, one time per step."""
    from batching.costs.models import get_model
    from batching.real.kernels import LinearPlan
    from batching.real.measure import linear_replay
    from batching.real.model import Llama, ModelConfig

    model = Llama(ModelConfig.from_shape(get_model("tiny")), kernels=LinearPlan.fixed("aten"))
    seen: list[tuple[int, bool]] = []
    real = Llama.linear

    def spy(self, x, w):
        seen.append((x.shape[0], w is self.lm_head))
        return real(self, x, w)

    monkeypatch.setattr(Llama, "linear", spy)
    times = linear_replay(model, [(6, 2), (1, 1), (3, 0)])
    assert len(times) == 3 and all(t > 0 for t in times)
    per_layer = 4 * model.cfg.layers
    assert (
        seen
        == [(6, False)] * per_layer
        + [(2, True)]
        + [(1, False)] * per_layer
        + [(1, True)]
        + [(3, False)] * per_layer
    )


def test_matmul_peak_halves_its_size_where_one_product_would_take_too_long(monkeypatch):
    """bf16 on a CPU without bf16 arithmetic runs ~1 GFLOP/s: a 2,048-cubed product would take
    minutes, so the probe measures the largest size within its budget (and says which)."""
    import torch

    from batching.real import measure

    cpu = torch.device("cpu")
    monkeypatch.setattr(measure, "PEAK_BUDGET_S", 1e-9)
    assert measure.matmul_peak(cpu, torch.float32, 1024, reps=1)["n"] == measure.PEAK_MIN_N
    monkeypatch.setattr(measure, "PEAK_BUDGET_S", 1e9)
    p = measure.matmul_peak(cpu, torch.float32, 512, reps=1)
    assert p["n"] == 512 and p["TFLOPs_best"] > 0
