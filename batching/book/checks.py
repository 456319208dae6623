"""The real-engine checks of chapter 7: the schedulers on the torch model against the
simulator, and the simulator's measured error (every simulated figure's caption)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ..costs import get_cost_model
from ..costs.devices import machine_of, same_machine
from ..metrics import iterations, run_metrics
from ..schedulers import make_scheduler
from ..simulate import simulate
from ..workloads import Workload
from .common import ROOT, machine_label, same_machine_as

#: Committed runs of ``benchmarks/bench_stall.py`` (7.1's padding, 7.3's stall), relative to the
#: repository root: ``stall-<device>-<model>.json``.
STALL_GLOB = "benchmarks/results/stall-*.json"


def committed_real_runs(
    root: str | None = None, here: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    """7.1, 7.3: every committed ``bench_stall.py`` result (a lent GPU's among them), with the
    ``machine_label`` it ran on, ``gpu`` and ``same_machine`` (it is the machine of ``here``, a
    live run's record); this machine's first, then the CPUs'."""
    base = Path(root) if root else ROOT
    docs = []
    for f in sorted(base.glob(STALL_GLOB)):
        doc = json.loads(f.read_text())
        for k in ("device", "device_name", "model", "dtype", "date", "command", "padding", "stall"):
            if k not in doc:
                raise ValueError(f"{f}: no {k!r} (not a bench_stall.py result?)")
        m = machine_of(doc)
        docs.append(
            {
                **doc,
                "path": str(f.relative_to(base)),
                "machine_label": machine_label(doc),
                "gpu": m is not None and m.kind == "cuda",
                "same_machine": same_machine_as(doc, here),
            }
        )
    return sorted(docs, key=lambda d: (not d["same_machine"], d["gpu"], d["path"]))


def any_gpu(docs: Sequence[Mapping[str, Any]]) -> bool:
    """Whether any :func:`committed_real_runs` result was measured on a GPU."""
    return any(d["gpu"] for d in docs)


def real_crosscheck(
    workload: Workload,
    model: str = "tiny",
    schedulers: Sequence[str] = ("static", "continuous"),
    slots: int = 4,
    threads: int | None = None,
    probe_output: int | None = None,
) -> dict[str, Any]:
    """7.2: ``workload`` on the real engine and in the simulator under each scheduler.

    The scheduler decides which rows each step computes, so step counts and the iterations
    of requests wanting ``probe_output`` tokens (default: the shortest output) must agree
    exactly; durations differ (measured vs the CPU roofline). ``available`` is False, with
    ``reason``, if the real engine does not import or fails."""
    out: dict[str, Any] = {"available": False, "model": model}
    try:
        from ..real.executor import run_real
    except Exception as e:  # the real engine is optional (torch, work in progress)
        out["reason"] = f"batching.real does not import: {type(e).__name__}: {e}"
        return out
    cost = get_cost_model(model, "cpu")
    probe = int(workload.output_lens.min()) if probe_output is None else probe_output
    probes = [rid for rid, o in zip(workload.rids, workload.output_lens) if o == probe]
    per: dict[str, dict[str, Any]] = {}
    try:
        for name in schedulers:
            sim = simulate(workload, cost, name, slots=slots, kv_tokens=None)
            sched = make_scheduler(name, max_context=cost.model.max_context, slots=slots)
            max_len = int((workload.prompt_lens + workload.output_lens).max() + workload.prompt_lens.max())
            real = run_real(
                workload,
                sched,
                model,
                device="cpu",
                dtype="auto",
                threads=threads,
                max_len=min(cost.model.max_context, max_len),
            )
            ms, mr = run_metrics(sim), run_metrics(real)
            its_sim, its_real = iterations(sim, probes), iterations(real, probes)
            per[name] = {
                "steps_sim": int(ms["steps"]),
                "steps_real": int(mr["steps"]),
                "slot_util_sim": ms["slot_util"],
                "slot_util_real": mr["slot_util"],
                "iters_sim": its_sim["from_admission"].tolist(),
                "iters_real": its_real["from_admission"].tolist(),
                "arrival_iters_real": its_real["from_arrival"].tolist(),
                "busy_sim_s": ms["busy_s"],
                "busy_real_s": mr["busy_s"],
            }
    except Exception as e:
        out["reason"] = f"the real engine failed: {type(e).__name__}: {e}"
        return out
    out.update(available=True, per=per)
    return out


#: The rows of 7.2's measured scheduler comparison: (label, metrics key, format).
REAL_SCHEDULER_ROWS: tuple[tuple[str, str, str], ...] = (
    ("slot utilization", "slot_util", "{:.0%}"),
    ("p50 end-to-end (s)", "e2e_p50", "{:.2f}"),
    ("p99 end-to-end (s)", "e2e_p99", "{:.2f}"),
    ("p99 time to first token (s)", "ttft_p99", "{:.2f}"),
    ("output tokens/s", "throughput_tok", "{:.0f}"),
    ("steps", "steps", "{:.0f}"),
    ("busy (s)", "busy_s", "{:.1f}"),
)


def real_schedulers_rows(
    rs: Mapping[str, Any], rows_def: Sequence[tuple[str, str, str]] = REAL_SCHEDULER_ROWS
) -> tuple[list[list[Any]], list[str]]:
    """Rows and header of a measured comparison (:func:`real_schedulers`), one row per
    ``(label, metrics key, format)``; with a profile, each cell reads "measured (simulated)"."""
    names = list(rs["real"])
    sim = rs.get("sim")
    rows = []
    for label, key, fmt in rows_def:
        cells = []
        for n in names:
            cell = fmt.format(rs["real"][n][key])
            if sim is not None:
                cell += f" ({fmt.format(sim[n][key])})"
            cells.append(cell)
        rows.append([label] + cells)
    return rows, ["measured" + (" (simulated)" if sim is not None else "")] + names


def crosscheck_agrees(cc: Mapping[str, Any]) -> bool:
    """Whether :func:`real_crosscheck` ran and every step and probe iteration count agreed."""
    if not cc.get("available"):
        return False
    return all(
        p["steps_sim"] == p["steps_real"] and p["iters_sim"] == p["iters_real"] for p in cc["per"].values()
    )


def crosscheck_rows(cc: Mapping[str, Any]) -> tuple[list[list[Any]], list[str]]:
    """7.2: rows and header of the real-vs-simulated table ("simulated / real" pairs)."""
    header = [
        "scheduler",
        "steps sim/real",
        "slot util sim/real",
        "probe iters adm.",
        "probe iters arr. (mean)",
        "busy s sim/real",
    ]
    rows: list[list[Any]] = []
    for name, p in (cc.get("per") or {}).items():
        its = sorted(set(int(x) for x in p["iters_real"]))
        rows.append(
            [
                name,
                f"{p['steps_sim']}/{p['steps_real']}",
                f"{p['slot_util_sim']:.3f}/{p['slot_util_real']:.3f}",
                "/".join(map(str, its)),
                f"{np.mean(p['arrival_iters_real']):.1f}",
                f"{p['busy_sim_s']:.2f}/{p['busy_real_s']:.2f}",
            ]
        )
    return rows, header


# ------------------------------------------------------------------ fidelity
#: The simulator-vs-real-engine runs (``benchmarks/bench_fidelity.py``), relative to the
#: repository root; a GPU session files ``fidelity-h200-llama-1b.json``, so the device decides.
FIDELITY_GLOBS = ("benchmarks/results/fidelity.json", "benchmarks/results/fidelity-*.json")


def _on_cpu(doc: Mapping[str, Any]) -> bool:
    return str(doc.get("device", "cpu")).startswith("cpu")


def _fidelity_docs(root: str | None = None) -> list[tuple[Path, dict[str, Any]]]:
    """Every committed fidelity run with its file: CPU first, then by device, size and speed."""
    base = Path(root) if root else ROOT
    files = sorted({f for g in FIDELITY_GLOBS for f in base.glob(g)})
    docs = [(f, json.loads(f.read_text())) for f in files]

    def key(fd: tuple[Path, dict[str, Any]]) -> tuple[bool, str, int, float]:
        doc, w = fd[1], fd[1]["workload"]
        return (not _on_cpu(doc), str(doc.get("device")), int(w["requests"]), float(w.get("time_scale", 1.0)))

    return sorted(docs, key=key)


def gpu_fidelity_files(root: str | None = None) -> list[Path]:
    """The committed fidelity runs made on a GPU. The CPU runs drive the simulator with a
    profile of the same CPU: they check the engine loop and schedulers, not the datasheet
    roofline the GPU figures use."""
    return sorted(f for f, doc in _fidelity_docs(root) if not _on_cpu(doc))


def fidelity_records(root: str | None = None) -> list[dict[str, Any]]:
    """One record per committed fidelity run and scheduler: median absolute E2E errors against
    the first real run (``e2e_err``), the real runs' median (``e2e_vs_median``) and between two
    real runs (``noise``, the floor), throughput error, predicted over measured busy time;
    None where an older file lacks the field. ``machine``: the :class:`Machine` it ran on
    (None: a file written before fidelity runs recorded it)."""
    base = Path(root) if root else ROOT
    get = lambda r, k: None if r.get(k) is None else float(r[k])
    out = []
    for f, doc in _fidelity_docs(root):
        if not doc.get("results"):
            raise ValueError(f"{f}: no results")
        for name, r in doc["results"].items():
            out.append(
                {
                    "file": str(f.relative_to(base)),
                    "device": str(doc.get("device", "?")),
                    "machine": machine_of(doc),
                    "model": doc["model"],
                    "requests": int(doc["workload"]["requests"]),
                    "time_scale": float(doc["workload"].get("time_scale", 1.0)),
                    "real_runs": int(doc.get("real_runs", 2)),
                    "scheduler": name,
                    "e2e_err": get(r, "e2e_median_abs_rel_err"),
                    "e2e_vs_median": get(r, "sim_vs_real_median_e2e_median_abs_rel_err"),
                    "noise": get(r, "real_vs_real_e2e_median_abs_rel_err"),
                    "tput_err": get(r, "throughput_rel_err"),
                    "busy_ratio": get(r, "busy_pred_over_real"),
                }
            )
    return out


def fidelity_machine(
    records: Sequence[Mapping[str, Any]], here: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """The machine of a set of :func:`fidelity_records`: ``label``, its name if every record
    names the same one (else None: unrecorded, or several), and ``same_machine``, whether that
    is the machine of ``here`` (a live run's record of this build)."""
    machines = {r["machine"] for r in records}
    one = machines.pop() if len(machines) == 1 else None
    return {
        "label": None if one is None else one.label,
        "same_machine": here is not None and same_machine(one, machine_of(here)),
    }


def fidelity_rows(root: str | None = None) -> tuple[list[list[str]], list[str]]:
    """Rows and header of the measured page's fidelity table (:func:`fidelity_records`)."""
    pct = lambda x: "-" if x is None else f"{x:.0%}"
    header = ["run", "scheduler", "E2E vs first run", "vs median", "real vs real", "tok/s", "busy"]
    rows = []
    records = fidelity_records(root)
    # CPU runs of one machine (or all unrecorded) are named once, by the page; others name theirs.
    cpu_one = len({r["machine"] for r in records if r["device"].startswith("cpu")}) == 1
    for r in records:
        m = r["machine"]
        on = r["device"] if m is None else m.label
        where = "" if r["device"].startswith("cpu") and cpu_one else f", {r['model']} on {on}"
        rows.append(
            [
                f"{r['requests']} at {r['time_scale']:g}x{where}",
                r["scheduler"],
                pct(r["e2e_err"]),
                pct(r["e2e_vs_median"]),
                pct(r["noise"]),
                "-" if r["tput_err"] is None else f"{r['tput_err']:.1%}",
                "-" if r["busy_ratio"] is None else f"{r['busy_ratio']:.2f}",
            ]
        )
    return rows, header


def within_noise(records: Sequence[Mapping[str, Any]]) -> bool:
    """Whether the simulator's error is inside the noise of what it simulates on every
    fidelity record (:func:`fidelity_records`): ``e2e_err`` at most ``noise``, the disagreement
    of two real runs."""
    return all(r["e2e_err"] <= r["noise"] for r in records)
