"""7.2's replay of one trace slice against a production-style server: numbers and verdicts
from the committed ``bench_serve.py`` run, the simulator's prediction of the slice and,
when asked, a live replay (a reader's server, or ``transformers serve`` started here)."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..costs.devices import machine_of
from ..costs.models import canonical_dtype
from ..costs.profile import PROFILE_DIR, ProfileCost
from ..engine import RunResult
from ..metrics import request_records, summarize
from ..results import machine_busy
from ..simulate import simulate
from ..workloads import Workload, preset
from ..workloads.traces import load_trace
from .common import ROOT, Versus, same_machine_as, versus

RESULT = ROOT / "benchmarks" / "results" / "serve-cpu-here-cpu-s.json"
PROFILE = PROFILE_DIR / "cpu-here-cpu-s.json"

#: The columns of the section's table, all from a results file's summary (seconds, tok/s).
COLUMNS = ("ttft_p50", "ttft_p99", "itl_p50", "itl_p99", "e2e_p50", "e2e_p99", "output_throughput")
#: Rows in table order: the prediction, this engine's two schedulers, the servers, a live run.
ROWS = ("simulated", "ours-continuous", "ours-chunked", "hf-serve", "vllm-serve", "live")
#: The benchmark's modes a results file may hold (``vllm-serve`` only where vLLM was built).
MODES = ("ours-continuous", "ours-chunked", "hf-serve", "vllm-serve")
#: Throughputs within this fraction of each other count as the same (run-to-run noise here).
SAME = 0.05


def committed(path: str | Path | None = None) -> dict[str, Any]:
    return json.loads(Path(path or RESULT).read_text())


def summary_row(summary: Mapping[str, Any]) -> dict[str, float | None]:
    """The table's columns from a results file's ``summary`` (simulate, run, replay alike)."""
    split = {c: c.split("_") for c in COLUMNS if c != "output_throughput"}  # "ttft_p50": ttft, p50
    return {c: summary[split[c][0]][split[c][1]] if c in split else summary[c] for c in COLUMNS}


def slice_workload(doc: Mapping[str, Any]) -> Workload:
    """The benchmark's slice, rebuilt from its provenance (trace, limit, scaling)."""
    src = doc["workload"].get("source") or {
        "trace": doc["workload"]["info"]["trace"],
        "limit": doc["workload"]["info"]["limit"],
    }
    if "preset" in src:
        w = preset(str(src["preset"]), seed=int(src["seed"]), n=int(src["n"]))
    else:
        w = load_trace(str(src["trace"]), limit=int(src["limit"]))
    return w.scale(lengths=float(doc["workload"]["scale_lengths"]), time=float(doc["workload"]["time_scale"]))


def simulated_row(w: Workload, slots: int, cost: ProfileCost) -> dict[str, float | None]:
    """The simulator's prediction of the slice: continuous batching on ``cost`` (the committed
    cpu-s profile, :data:`PROFILE`) with the real runs' slots."""
    res: RunResult = simulate(w, cost, "continuous", slots=slots, kv_tokens=None)
    return summary_row(summarize(res, request_records(res.requests)))


def live_row(
    w: Workload,
    server_url: str | None = None,
    served_model: str | None = None,
    model: str = "cpu-s",
    threads: int = 1,
) -> tuple[dict[str, float | None], dict[str, Any]]:
    """Replay ``w`` live against ``server_url`` (OpenAI-compatible ``.../v1``, token-id prompts,
    its first listed model unless ``served_model``) or, without, a ``transformers serve`` of
    ``model`` started here. Returns the row and the model and requests it completed."""
    from ..servers import served, transformers_serve
    from ..servers.replay import ReplayOptions, replay

    if server_url is not None:
        if served_model is None:
            import httpx

            served_model = httpx.get(f"{server_url.rstrip('/')}/models", timeout=10).json()["data"][0]["id"]
        reqs, meta = replay(w, ReplayOptions(url=server_url, model=served_model))
    else:
        folder = Path(tempfile.gettempdir()) / "batching-serve" / f"{model}-seed0"
        ckpt = transformers_serve.prepare_checkpoint(folder, model, seed=0)
        with transformers_serve.transformers_serve(ckpt, threads=threads) as srv:
            served_model = srv.model
            opts = ReplayOptions(url=srv.url, model=srv.model, prompt="text", tokenizer=str(ckpt))
            replay(Workload.from_arrays([0.0], [4], [2], name="warm-up"), opts)  # not timed
            reqs, meta = replay(w, opts)
    doc = served.build(reqs, {}, meta)
    s = doc["summary"]
    return summary_row(s), {"model": served_model, "completed": s["completed"], "requests": s["num_requests"]}


def numbers(
    doc: Mapping[str, Any] | None = None,
    *,
    live: bool = False,
    server_url: str | None = None,
    served_model: str | None = None,
    smoke: bool = False,
    profile: str | Path | None = None,
    here: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """A row per mode (:data:`ROWS`), the server's ratios to this engine (``server_over_ours``)
    and, where the file has vLLM, vLLM's to this engine's chunked run (``vllm_over_chunked``,
    with ``vllm_e2e_vs_chunked``, the :class:`~.common.Versus` of its median end-to-end
    latency) and the server's to vLLM (``server_over_vllm``), the verdicts the
    prose words and the run's conditions; ``live`` adds a replay now (``smoke``: the tiny
    model, 8 requests). ``machine`` and ``profile_machine`` name what the benchmark and the
    profile ran on (``machine`` None: a file that did not record it), ``same_machine`` and
    ``profile_same_machine`` say whether each is the machine of ``here``, a live run's record
    of this build (a sweep's ``meta``, an executor record)."""
    doc = doc if doc is not None else committed()
    med = doc["median"]
    rows: dict[str, dict[str, float | None]] = {}
    w = slice_workload(doc)
    cost = ProfileCost.from_json(str(profile or PROFILE))
    rows["simulated"] = simulated_row(w, int(doc["modes_config"]["ours-continuous"]["slots"]), cost)
    for m in MODES:
        if m in med:
            rows[m] = {c: med[m][c] for c in COLUMNS}
    live_info = None
    if live:
        lw = w if not smoke else Workload.from_arrays(w.arrivals[:8], w.prompt_lens[:8], w.output_lens[:8])
        model = "tiny" if smoke else "cpu-s"
        rows["live"], live_info = live_row(lw, server_url, served_model, model=model)
    ours, hf, vl = rows["ours-continuous"], rows["hf-serve"], rows.get("vllm-serve")
    max_load = max(x["loadavg_1m"] for v in doc["rounds"].values() for x in v)
    ran_on, profiled_on = machine_of(doc), machine_of(cost.meta)
    return {
        "rows": rows,
        "server_over_ours": {k: _ratio(hf[k], ours[k]) for k in COLUMNS},
        "server_slower_e2e": _less(ours["e2e_p50"], hf["e2e_p50"]),
        # vLLM against this engine's chunked run: the same slots and token budget.
        "vllm_over_chunked": None
        if vl is None
        else {k: _ratio(vl[k], rows["ours-chunked"][k]) for k in COLUMNS},
        "vllm_e2e_vs_chunked": None
        if vl is None
        else _versus(vl["e2e_p50"], rows["ours-chunked"]["e2e_p50"]),
        "server_over_vllm": None if vl is None else {k: _ratio(hf[k], vl[k]) for k in COLUMNS},
        # Both kept up with the arrivals: throughput is the offered load, not a capacity.
        "same_throughput": _near(hf["output_throughput"], ours["output_throughput"], SAME),
        "vllm_same_throughput": None
        if vl is None
        else _near(vl["output_throughput"], ours["output_throughput"], SAME),
        "requests": len(w),
        "scale_lengths": float(doc["workload"]["scale_lengths"]),
        "time_scale": float(doc["workload"]["time_scale"]),
        "rounds": len(doc["round_order"]),
        "max_loadavg": max_load,
        "cpus": float(doc.get("cpu_count") or 1),
        # Measured while other work shared the cores (the machine the file was measured on).
        "busy": machine_busy(max_load, doc.get("cpu_count")),
        # The simulator's row prices steps by a profile measured with its own thread count;
        # the benchmark's processes ran with doc["threads"] each (the page says when they differ).
        "threads": int(doc.get("threads") or 1),
        "profile_threads": int(cost.meta.get("threads") or 1),
        # ... and in its own dtype (bench_serve's engines all run fp32).
        "dtype": canonical_dtype(str((doc.get("model") or {}).get("dtype") or "fp32")),
        "profile_dtype": canonical_dtype(str(cost.meta.get("dtype") or "fp32")),
        "profile_engine": _profile_engine(doc, cost.meta),
        "machine": None if ran_on is None else ran_on.label,
        "same_machine": same_machine_as(doc, here),
        "profile_machine": None if profiled_on is None else profiled_on.label,
        "profile_same_machine": same_machine_as(cost.meta, here),
        "live": live_info,
    }


def _profile_engine(doc: Mapping[str, Any], meta: Mapping[str, Any]) -> str:
    """What the profile prices against the benchmark's engine: ``same`` (its threads and
    dtype), ``faster`` or ``slower`` (more or fewer threads, the same dtype), ``other`` (another
    dtype: which is faster depends on the CPU)."""
    threads, pthreads = int(doc.get("threads") or 1), int(meta.get("threads") or 1)
    dt = canonical_dtype(str((doc.get("model") or {}).get("dtype") or "fp32"))
    if canonical_dtype(str(meta.get("dtype") or "fp32")) != dt:
        return "other"
    return "same" if pthreads == threads else ("faster" if pthreads > threads else "slower")


def _ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def _versus(a: float | None, b: float | None) -> Versus | None:
    """:class:`~.common.Versus` of ``a / b`` within :data:`SAME` (None without both)."""
    r = _ratio(a, b)
    return None if r is None else versus(r, SAME)


def _near(a: float | None, b: float | None, tol: float) -> bool:
    r = _ratio(a, b)
    return r is not None and abs(r - 1) <= tol


def _less(a: float | None, b: float | None) -> bool:
    return a is not None and b is not None and a < b


def table_rows(nums: Mapping[str, Any]) -> list[list[Any]]:
    """Rows for ``plots.table``: mode key, then the columns in ms (latencies) and tok/s."""
    out = []
    for m in ROWS:
        r = nums["rows"].get(m)
        if r is None:
            continue
        out.append(
            [m]
            + [None if r[c] is None else (r[c] if c == "output_throughput" else r[c] * 1e3) for c in COLUMNS]
        )
    return out
