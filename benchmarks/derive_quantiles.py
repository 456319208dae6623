"""Derive data/length_quantiles/azure-{conv,code}.csv from the Azure 2023 traces.

The ``azure-*-like`` presets (workloads for every section) sample prompt and output
lengths from these tables, so a preset needs no trace file. Run from the repository root:

    .venv/bin/python benchmarks/derive_quantiles.py [--traces DIR] [--out DIR]

``--traces data/traces`` reads the compressed copies the repository ships; either copy
gives the same tables (the same uncompressed text: the sha256 each table records).
"""

from __future__ import annotations

import argparse
import datetime
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from batching.workloads.trace_files import GZ, TRACES  # noqa: E402
from batching.workloads.traces import AZURE_ATTRIBUTION, load_azure  # noqa: E402

QS = np.round(np.arange(101) / 100, 2)


def _fmt(x: float) -> str:
    # np.percentile interpolates (e.g. 2734.5); 3 decimals keep it exact without float noise.
    return format(round(float(x), 3), ".10g")


def derive(trace: str, path: Path, out: Path, command: str) -> Path:
    """Write ``q,prompt,output`` at q = 0, 0.01, ..., 1 (linear interpolation, numpy default)."""
    w = load_azure(path)
    plain = Path(TRACES[trace]["path"]).name  # the same header from the plain file and its .gz
    prompt = np.percentile(w.prompt_lens, QS * 100)
    output = np.percentile(w.output_lens, QS * 100)
    header = [
        f"# Length quantiles of the Azure LLM inference trace 2023, {plain} ({len(w)} requests).",
        f"# Source: github.com/Azure/AzurePublicDataset, data/, commit b469a11; sha256 {w.info['sha256']}.",
        "# Licence: Creative Commons Attribution 4.0 International (CC BY 4.0).",
        f"# Attribution: {AZURE_ATTRIBUTION}",
        "# q = quantile; prompt = ContextTokens, output = GeneratedTokens; percentiles with linear",
        "# interpolation (numpy default). Prompt and output are marginal distributions (independent).",
        f"# Generated {datetime.date.today().isoformat()} by: {command}",
    ]
    out.mkdir(parents=True, exist_ok=True)
    dest = out / f"{trace}.csv"
    rows = ["q,prompt,output"] + [f"{q:.2f},{_fmt(p)},{_fmt(o)}" for q, p, o in zip(QS, prompt, output)]
    dest.write_text("\n".join(header + rows) + "\n", encoding="utf-8")
    return dest


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--traces",
        type=Path,
        default=ROOT.parent / "shared" / "traces",
        help="directory laid out like data/traces, plain or .gz files, e.g. data/traces "
        "(default: %(default)s)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "length_quantiles")
    args = ap.parse_args(argv)
    command = "python benchmarks/derive_quantiles.py" + "".join(
        f" {a}" for a in (argv if argv is not None else sys.argv[1:])
    )
    for trace in ("azure-conv", "azure-code"):
        path = args.traces / TRACES[trace]["path"]
        if not path.is_file():
            path = path.with_name(path.name + GZ)
        dest = derive(trace, path, args.out, command)
        print(f"wrote {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")


if __name__ == "__main__":
    main()
