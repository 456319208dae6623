"""The glued values of a built book, and what changed between two builds.

`make book` executes every chapter notebook into `<build>/src/chapters/`; each value a page
quotes is a `myst_nb.glue` output there, named in its `scrapbook` metadata. This tool reads
them back (text/plain for numbers and strings, text/markdown for glued Markdown, a digest of
the PNG for a glued figure), so a refactor can show that the book says what it said:

    python tools/glue_diff.py dump _build/src/chapters > before.json
    python tools/glue_diff.py diff before.json after.json

`diff` prints one line per key that was added, removed or changed, with both values, and a
count at the end; exit status 0 whatever it finds (read the lines), 2 on a bad input.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def glued(notebook: Path) -> dict[str, str]:
    """``{key: value}`` of every glue output of one executed notebook, as text."""
    nb = json.loads(notebook.read_text())
    out: dict[str, str] = {}
    for cell in nb.get("cells", []):
        for o in cell.get("outputs", []):
            book = o.get("metadata", {}).get("scrapbook", {})
            name = book.get("name")
            if name is None:
                continue
            # glue stores each mime type under its prefix (application/papermill.record/).
            prefix = book.get("mime_prefix", "")
            data = {k[len(prefix) :]: v for k, v in o.get("data", {}).items() if k.startswith(prefix)}
            if "image/png" in data:
                png = data["image/png"]
                out[name] = "png:" + hashlib.sha256("".join(png).encode()).hexdigest()[:12]
            elif "text/markdown" in data:
                out[name] = "md:" + "".join(data["text/markdown"])
            else:
                out[name] = "".join(data.get("text/plain", ""))
    return out


def dump(folder: Path) -> dict[str, dict[str, str]]:
    """Every executed notebook's glue values, by notebook stem."""
    nbs = sorted(folder.glob("*.ipynb"))
    if not nbs:
        raise FileNotFoundError(f"{folder}: no executed notebooks")
    return {nb.stem: glued(nb) for nb in nbs}


def diff(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]]) -> list[str]:
    """One line per glue key added, removed or changed between two dumps."""
    lines = []
    for page in sorted(set(a) | set(b)):
        pa, pb = a.get(page, {}), b.get(page, {})
        for k in sorted(set(pa) | set(pb)):
            if k not in pb:
                lines.append(f"{page}  -{k} = {pa[k]!r}")
            elif k not in pa:
                lines.append(f"{page}  +{k} = {pb[k]!r}")
            elif pa[k] != pb[k]:
                lines.append(f"{page}  ~{k}: {pa[k]!r} -> {pb[k]!r}")
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump", help="print a build's glue values as JSON")
    d.add_argument("folder", type=Path, help="the executed notebooks (<build>/src/chapters)")
    c = sub.add_parser("diff", help="what changed between two dumps")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    try:
        if args.cmd == "dump":
            print(json.dumps(dump(args.folder), indent=1, sort_keys=True))
            return 0
        a, b = (json.loads(p.read_text()) for p in (args.before, args.after))
    except (OSError, ValueError) as e:
        print(f"glue_diff: {e}", file=sys.stderr)
        return 2
    lines = diff(a, b)
    print("\n".join(lines))
    print(f"{len(lines)} difference(s) over {sum(len(v) for v in b.values())} glued value(s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
