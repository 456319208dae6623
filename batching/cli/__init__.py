"""Command line: ``python -m batching simulate ...``, ``run``, ``measure`` and the server commands.

``commands``: simulate, run, measure; ``servers``: replay, export, import-vllm; ``options``:
the workload, scheduler and output options and the summary table they share.

Example::

    python -m batching simulate --trace azure-conv --scheduler continuous \\
        --model llama-70b --device h200 --tp 2 --slots 64 --out results.json
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from . import commands, servers


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m batching", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    commands.add_parsers(sub)
    servers.add_parsers(sub)
    return p


def main(argv: Sequence[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    try:
        return a.func(a)
    except (ValueError, FileNotFoundError) as e:  # bad input: one clear line, no traceback
        print(f"error: {e}", file=sys.stderr)
        return 2
