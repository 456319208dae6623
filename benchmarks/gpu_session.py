"""The one prepared run for a session that is lent a GPU (issue 3's H200 measurements).

A session gets at most 15 minutes of device time, machine start-up included, and one
command may run 10: this script runs every GPU measurement the project needs in one go,
most important first, each stage in its own process with its own time limit, and skips a
stage that would overrun the budget rather than lose the files already written. Everything
lands in ``--out`` (the device tool's ``$OUT``; at most 8 files come back):

0. ``graphs-check.json``: decode graphs give the eager path's tokens (float64, ``tiny``,
   three schedulers; ``check_graphs.py``): a broken capture shows in tokens, not in timings;
   and in bf16 on ``llama-1b``, graphed against eager logits at three buckets, with every
   attention path on a fused kernel (math fails the stage);
1. ``decode-h200-llama-8b.json``: decode efficiency and the knee of the 8B shape in bf16,
   CUDA-graph steps against eager ones (``bench_decode.py``; target efficiency >= 0.80);
2. ``h200-llama-1b.json``: the 1B shape's step-cost profile (``python -m batching measure``);
3. ``fidelity-h200-llama-1b.json``: 200 Azure conversation requests, full lengths, through
   the real engine and the simulator on that profile (``bench_fidelity.py``; targets E2E
   <= 5%, throughput <= 3%), on a device quiet enough to test the cost model itself;
4. ``h200-llama-8b.json``: the 8B shape's profile (one slab length serves the whole grid:
   contexts up to 1,536 and prompts up to 2,048 give 257 slabs of 2,306 positions, 78 GB
   of the H200's 141; longer prompts are extrapolated);
5. ``stall-h200-llama-1b.json``: 7.1's padding and 7.3's stall on the 1B shape
   (``bench_stall.py``: 30 running decodes, a 4,000-token prompt, 512-token chunks), quoted
   by those pages beside their live CPU runs; the one stage beyond the 8-minute plan: it
   starts only if the others finished a minute early;
6. ``session.json`` (each stage's command, exit status, seconds) and ``log.txt``.

Each stage writes its file as results come (a profile after every round and every ten
seconds, the fidelity run after each scheduler, the stall run after its padding half),
marked ``partial`` until it finishes: a stage cut by its limit keeps what it measured, and
``--install`` refuses partial files. Temporary files are removed after every stage, so at
most the 8 files above come back.

Needs only torch, numpy and tqdm (what the GPU machine has) and the Azure conversation trace:
the copy the repository ships (``data/traces``, which travels with the working tree), or the
one ``make gpu-prep`` copies into ``.gpu/traces`` (whichever ``find_trace`` picks here, e.g.
``../shared``'s, which does not travel), read first when present.
With the device tool::

    run(command="python3 benchmarks/gpu_session.py --out $OUT", carry=[".gpu"], timeout_s=560)

then ``python benchmarks/gpu_session.py --install <the fetched folder>`` puts each file where
the project keeps it (profiles in ``data/profiles/``, the rest in ``benchmarks/results/``),
refusing any that was not measured on a GPU. ``--dry-run`` runs the same stages with the
``tiny`` model on the CPU in seconds (the test suite does).
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (name, seconds allowed, argv with {out} for the output folder); in order of importance.
#: The time limits of all but the last add up to under 8 minutes, with the machine's start
#: inside the 15; a stage starts only if its limit fits in what is left of ``--budget-s``.
STAGES: list[tuple[str, int, list[str]]] = [
    (
        "check-graphs",
        55,
        shlex.split(
            "benchmarks/check_graphs.py --device cuda --bf16-model llama-1b --out {out}/graphs-check.json"
        ),
    ),
    (
        "decode-8b",
        100,
        shlex.split(
            "benchmarks/bench_decode.py --model llama-8b --device cuda --batches "
            "1,2,4,8,16,32,64,128,256 --reps 10 --rounds 2 --out {out}/decode-h200-llama-8b.json"
        ),
    ),
    (
        "profile-1b",
        90,
        shlex.split(
            "-m batching measure --model llama-1b --device cuda --ctxs 128,1024,4096 --prefill "
            "16,64,256,512,1024,2048,4096,8192 --mixed-chunks 64,256,512,1024,2048,4096 "
            "--mixed-rows 1,8,32 --reps 5 --rounds 2 --no-progress --out {out}/h200-llama-1b.json"
        ),
    ),
    (
        "fidelity-1b",
        145,
        shlex.split(
            "benchmarks/bench_fidelity.py --model llama-1b --device cuda --profile "
            "{out}/h200-llama-1b.json --requests 200 --scale-lengths 1 --time-scale 8 --slots 32 "
            "--max-len 4352 --token-budget 512 --real-runs 2 --out "
            "{out}/fidelity-h200-llama-1b.json"
        ),
    ),
    (
        "profile-8b",
        90,
        shlex.split(
            "-m batching measure --model llama-8b --device cuda --ctxs 128,512,1536 --prefill "
            "16,64,256,512,1024,2048 --mixed-chunks 64,256,512,1024,2048 --mixed-rows 1,8,32 "
            "--prefill-rows 4x512,16x128 --reps 5 --rounds 1 --no-progress --out "
            "{out}/h200-llama-8b.json"
        ),
    ),
    (
        "stall-1b",
        60,
        shlex.split("benchmarks/bench_stall.py --device cuda --out {out}/stall-h200-llama-1b.json"),
    ),
]

#: The same stages, small enough for a CPU in seconds (``--dry-run``): the pipeline's test.
DRY: dict[str, list[str]] = {
    "check-graphs": shlex.split(
        "benchmarks/check_graphs.py --device cpu --requests 8 --max-len 64 --bf16-model tiny "
        "--bf16-buckets 1x16,4x40 --out {out}/graphs-check.json"
    ),
    "decode-8b": shlex.split(
        "benchmarks/bench_decode.py --model tiny --device cpu --ctx 16 --batches 1,2 --reps 2 "
        "--rounds 1 --out {out}/decode-h200-llama-8b.json"
    ),
    "profile-1b": shlex.split(
        "-m batching measure --model tiny --device cpu --batches 1,2,16 --ctxs 16,128 "
        "--prefill 16,64 --mixed-chunks 16,64 --mixed-rows 1,4 --prefill-rows 4x16 --reps 1 "
        "--rounds 1 --no-progress --out {out}/h200-llama-1b.json"
    ),
    "fidelity-1b": shlex.split(
        "benchmarks/bench_fidelity.py --model tiny --device cpu --profile "
        "{out}/h200-llama-1b.json --requests 12 --scale-lengths 32 --time-scale 8 --slots 4 "
        "--max-len 256 --token-budget 32 --real-runs 2 --out "
        "{out}/fidelity-h200-llama-1b.json"
    ),
    "profile-8b": shlex.split(
        "-m batching measure --model tiny --device cpu --batches 1,2 --ctxs 16 --prefill 16 "
        "--mixed-chunks 16 --mixed-rows 1 --prefill-rows '' --reps 1 --rounds 1 --no-progress "
        "--out {out}/h200-llama-8b.json"
    ),
    "stall-1b": shlex.split(
        "benchmarks/bench_stall.py --device cpu --model tiny --short 8 --long 300 --reps 1 "
        "--running 4 --prompt 300 --chunk 32 --out {out}/stall-h200-llama-1b.json"
    ),
}


#: Where each file a GPU session brings back is kept in the repository.
INSTALL: dict[str, str] = {
    "graphs-check.json": "benchmarks/results/graphs-check-h200.json",
    "decode-h200-llama-8b.json": "benchmarks/results/decode-h200-llama-8b.json",
    "fidelity-h200-llama-1b.json": "benchmarks/results/fidelity-h200-llama-1b.json",
    "h200-llama-1b.json": "data/profiles/h200-llama-1b.json",
    "h200-llama-8b.json": "data/profiles/h200-llama-8b.json",
    "stall-h200-llama-1b.json": "benchmarks/results/stall-h200-llama-1b.json",
    "session.json": "benchmarks/results/gpu-session-h200.json",
}


def _device_of(doc: dict) -> str:
    """The device a result file says it was measured on."""
    if "meta" in doc and "device_name" in doc["meta"]:  # a profile
        return doc["meta"]["device_name"]
    return str(doc.get("device_name") or doc.get("device") or "")


def _graphs_failure(doc: dict) -> str | None:
    """Why a GPU profile's decode graphs do not stand for a server's steps, or None."""
    g = doc["meta"].get("decode_graphs")
    if not g:
        return "decode graphs were off"
    if g.get("error") or g.get("failed"):
        return f"decode graphs failed: {g.get('error') or g.get('failed')}"
    if not g.get("replayed_as_graphs"):
        return "decode steps were not replayed as graphs"
    return None


def install(src: Path, root: Path = ROOT) -> list[Path]:
    """Copy a GPU session's files from ``src`` to their places under ``root``; profiles are
    checked by loading them as the simulator does. Refuses (ValueError, naming the file,
    before anything is written) anything measured on a CPU, such as a dry run's output, a
    file its stage left partial, a profile whose decode graphs failed or were off (its
    decode steps were timed eagerly, not as a server runs them), and a folder with none
    of the files."""
    from batching.costs.profile import ProfileCost

    texts = {n: (src / n).read_text() for n in INSTALL if (src / n).is_file()}
    if not texts:
        raise ValueError(f"{src}: none of {', '.join(INSTALL)}")
    for name, text in texts.items():
        doc = json.loads(text)
        if doc.get("partial") or doc.get("meta", {}).get("partial"):
            raise ValueError(f"{src / name}: partial (its stage did not finish); not installed")
        if name.startswith("h200-"):
            ProfileCost.from_dict(doc, source=str(src / name))
            if (why := _graphs_failure(doc)) is not None:
                raise ValueError(f"{src / name}: {why}; not installed")
        if name == "session.json":
            if doc.get("dry_run"):
                raise ValueError(f"{src / name}: a dry run's session; not installed")
        elif "H200" not in _device_of(doc).upper():
            raise ValueError(f"{src / name}: measured on {_device_of(doc)!r}, not an H200; not installed")
    done = []
    for name, text in texts.items():
        dest = root / INSTALL[name]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(text)
        done.append(dest)
    return done


def headline(out: Path) -> dict:
    """The figures a session reads first, from whichever result files exist in ``out``."""
    h: dict = {}

    def load(name: str) -> dict | None:
        f = out / name
        return json.loads(f.read_text()) if f.is_file() else None

    if (c := load("graphs-check.json")) is not None:
        h["graphs_check_ok"] = c.get("ok")
    if (d := load("decode-h200-llama-8b.json")) is not None:
        h["decode_8b"] = {
            k: d.get(k)
            for k in (
                "efficiency_vs_matvec",
                "efficiency_best_vs_best",
                "efficiency_paired_median",
                "efficiency_vs_matvec_eager",
                "knee",
                "bstar_roofline",
                "attention",
            )
        }
        h["decode_8b"]["step_ms_batch1"] = d["step_ms"]["1"]["median_ms"]
        h["decode_8b"]["graphs_failed"] = (d.get("decode_graphs_info") or {}).get("failed")
    for name in ("h200-llama-1b.json", "h200-llama-8b.json"):
        if (prof := load(name)) is not None:
            h[name] = {
                "decode_ms_batch1": prof["decode"]["ms"][0],
                "wall_s": prof["meta"]["wall_s"],
                "decode_graphs": prof["meta"].get("decode_graphs", {})
                and {k: v for k, v in prof["meta"]["decode_graphs"].items() if k != "buckets"},
            }
    if (f := load("fidelity-h200-llama-1b.json")) is not None:
        h["fidelity_1b"] = {
            k: {
                m: r.get(m)
                for m in (
                    "e2e_median_abs_rel_err",
                    "throughput_rel_err",
                    "real_vs_real_e2e_median_abs_rel_err",
                    "sim_vs_real_median_e2e_median_abs_rel_err",
                    "step_median_abs_rel_err",
                )
            }
            for k, r in f["results"].items()
        }
    if (s := load("stall-h200-llama-1b.json")) is not None and "stall" in s:  # not its partial file
        n = s["stall"]["numbers"]
        h["stall_1b"] = {
            "mixed_itl_max_ms": n["mix_itl_max_ms"],
            "chunked_itl_max_ms": n["chk_itl_max_ms"],
            "decode_ms": s["stall"]["decode_ms"],
            "ttft_mixed_ms": n["mix_ttft_ms"],
            "ttft_chunked_ms": n["chk_ttft_ms"],
            "padding_time_ratio_short": s["padding"]["time_ratio_short"],
        }
    h["partial"] = [
        n
        for n in INSTALL
        if (d := load(n)) is not None and (d.get("partial") or d.get("meta", {}).get("partial"))
    ]
    return h


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "gpu-out")))
    p.add_argument("--budget-s", type=float, default=480, help="stop starting stages after this many seconds")
    p.add_argument("--only", help="comma-separated stage names (default: all)")
    p.add_argument("--dry-run", action="store_true", help="the same stages with the tiny model on the CPU")
    p.add_argument(
        "--install",
        type=Path,
        metavar="DIR",
        help="instead of measuring: copy a fetched session's files into data/ and benchmarks/results/",
    )
    a = p.parse_args()
    if a.install is not None:
        sys.path.insert(0, str(ROOT))
        for dest in install(a.install):
            print(f"installed {dest.relative_to(ROOT)}")
        return 0
    a.out = a.out.resolve()
    a.out.mkdir(parents=True, exist_ok=True)
    traces = ROOT / ".gpu" / "traces"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    shipped = ROOT / "data" / "traces"
    if traces.is_dir():
        env["BATCHING_TRACES"] = str(traces)
    elif not a.dry_run and not shipped.is_dir():
        print(
            f"warning: neither {traces} (make gpu-prep) nor {shipped} is here: "
            "the fidelity stage needs the Azure trace",
            file=sys.stderr,
        )
    only = set(a.only.split(",")) if a.only else None
    t0 = time.perf_counter()
    summary: dict = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "dry_run": a.dry_run,
        "stages": [],
    }
    log = (a.out / "log.txt").open("w")
    for name, limit, argv in STAGES:
        if only is not None and name not in only:
            continue
        if a.dry_run:  # a shared CPU, perhaps busy: the GPU's limits do not apply
            argv, limit = DRY[name], 300
        left = a.budget_s - (time.perf_counter() - t0)
        cmd = [sys.executable] + [x.format(out=a.out) for x in argv]
        rec = {"stage": name, "command": " ".join(cmd[1:]), "limit_s": limit}
        if left < limit and not a.dry_run:
            rec["skipped"] = f"{left:.0f} s of the budget left, the stage may take {limit}"
        else:
            print(f"== {name}: {rec['command']}", file=log, flush=True)
            s0 = time.perf_counter()
            try:
                r = subprocess.run(
                    cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit
                )
                rec["rc"] = r.returncode
            except subprocess.TimeoutExpired:
                rec["rc"] = "timeout"
            rec["wall_s"] = round(time.perf_counter() - s0, 1)
            log.flush()
            for tmp in a.out.glob("*.tmp"):  # a stage killed while saving: at most 8 files come back
                tmp.unlink()
        summary["stages"].append(rec)
        print(json.dumps(rec), flush=True)
        (a.out / "session.json").write_text(json.dumps(summary, indent=1) + "\n")
    log.close()
    summary["headline"] = headline(a.out)
    (a.out / "session.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["headline"], indent=1))
    return 0 if all(s.get("rc") == 0 for s in summary["stages"] if "skipped" not in s) else 1


if __name__ == "__main__":
    sys.exit(main())
