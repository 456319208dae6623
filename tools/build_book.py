"""Execute the chapter notebooks with papermill, then build the book from a staging copy.

Used by `make book` (full parameters) and by tests/test_book.py (smoke parameters), so
both build the book the same way:

1. `<build>/src` is made afresh with `_config.yml`, `_toc.yml`, `chapters/` (every file
   but the notebooks) and the book's Sphinx extension `tools/offline_book.py`.
2. Every `chapters/*.ipynb` is executed by papermill into `<build>/src/chapters/`, with the
   repository root as working directory (notebooks read `data/` and import `batching`
   from there). A failing cell stops everything and prints papermill's error.
3. `jupyter-book build -W --keep-going` builds the staging tree; `_config.yml` has
   `execute_notebooks: off`, so nothing runs twice. The HTML ends in `<build>/html`.

Staging keeps the build away from `.venv`, caches and the executed copies away from the
sources (executed notebooks never go to `data/` or back into `chapters/`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from batching.book import runs
from batching.parallel import WORKERS_ENV

REPO = Path(__file__).resolve().parent.parent


def notebooks(repo: Path = REPO) -> list[Path]:
    """The chapter notebooks, in a stable order (the toc, not this order, sets the book's)."""
    return sorted(p for p in (repo / "chapters").glob("*.ipynb") if p.is_file())


def stage_sources(src: Path, repo: Path = REPO) -> None:
    """Fresh staging tree: config, toc and every chapters/ file except the notebooks."""
    if src.exists():
        shutil.rmtree(src)
    src.mkdir(parents=True)
    for name in ("_config.yml", "_toc.yml"):
        shutil.copy2(repo / name, src / name)
    # The book's own CSS (glued values in normal weight), named in _config.yml.
    shutil.copytree(repo / "_static", src / "_static")
    # The book's local Sphinx extension, at the same relative path as in the repository.
    (src / "tools").mkdir()
    shutil.copy2(repo / "tools" / "offline_book.py", src / "tools" / "offline_book.py")
    # Notebooks are written by papermill below; checkpoints are editor litter.
    shutil.copytree(
        repo / "chapters",
        src / "chapters",
        ignore=shutil.ignore_patterns("*.ipynb", ".ipynb_checkpoints", "__pycache__"),
    )


def execute_notebook(
    nb: Path,
    out: Path,
    parameters: dict[str, Any] | None = None,
    kernel: str = "python3",
    cwd: Path = REPO,
) -> None:
    """Run one notebook with papermill; raises papermill's PapermillExecutionError on a failing cell."""
    import papermill as pm  # imported here so `--help` works without the book extra

    out.parent.mkdir(parents=True, exist_ok=True)
    pm.execute_notebook(
        str(nb),
        str(out),
        parameters=parameters or {},
        kernel_name=kernel,
        cwd=str(cwd),
        progress_bar=False,
        # Keep the book's output readable: a notebook's stdout stays in the notebook.
        log_output=False,
    )


def execute_all(
    src: Path,
    parameters: dict[str, Any] | None = None,
    kernel: str = "python3",
    repo: Path = REPO,
) -> None:
    """Execute every chapter notebook into the staging tree (zero notebooks is fine)."""
    nbs = notebooks(repo)
    # Each live measurement runs once per build and is shared by its page and the measured
    # page (batching/book/runs.py): drop what an earlier build or test run kept.
    runs.clear()
    print(f"[book] executing {len(nbs)} notebook(s) with parameters {parameters or {}}", flush=True)
    for nb in nbs:
        t0 = time.perf_counter()
        out = src / "chapters" / nb.name
        try:
            execute_notebook(nb, out, parameters, kernel, repo)
        except Exception:
            print(
                f"[book] FAILED {nb.relative_to(repo)} (executed copy with the error: {out})",
                file=sys.stderr,
                flush=True,
            )
            raise
        print(f"[book]   {nb.relative_to(repo)}: {time.perf_counter() - t0:.1f} s", flush=True)


def build_html(src: Path, build: Path) -> Path:
    """`jupyter-book build -W` of the staging tree; returns the HTML folder `<build>/html`."""
    jb_out = build / "jb"
    cmd = [
        sys.executable,
        "-c",
        "from jupyter_book.cli.main import main; main()",
        "build",
        str(src),
        "--path-output",
        str(jb_out),
        # -W: a warning (broken reference, page missing from the toc) fails the build;
        # --keep-going lists all of them first; --all: no stale pages from an old build.
        "-W",
        "--keep-going",
        "--all",
        "--quiet",
    ]
    # Warnings go to stderr and show as they come; stdout is only Jupyter Book's banner,
    # which names the temporary jb/ folder, so it is shown only if the build fails.
    run = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if run.returncode != 0:
        print(run.stdout, flush=True)
        raise subprocess.CalledProcessError(run.returncode, cmd)
    html = build / "html"
    if html.exists():
        shutil.rmtree(html)
    # Jupyter Book always writes to <path-output>/_build/html; move it where the README says.
    shutil.move(str(jb_out / "_build" / "html"), str(html))
    return html


def build_book(
    build: Path,
    parameters: dict[str, Any] | None = None,
    kernel: str = "python3",
    repo: Path = REPO,
) -> Path:
    """The whole pipeline; returns the HTML folder."""
    src = build / "src"
    stage_sources(src, repo)
    execute_all(src, parameters, kernel, repo)
    return build_html(src, build)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--build-dir",
        type=Path,
        default=REPO / "_build",
        help="where src/ (staging) and html/ go (default: _build)",
    )
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="pass smoke=True to every notebook (tests only; the book uses full parameters)",
    )
    ap.add_argument("--kernel", default="python3", help="Jupyter kernel name (default: python3)")
    args = ap.parse_args(argv)

    from papermill.exceptions import PapermillExecutionError

    if not args.smoke:
        # The pages' capacity searches and sweeps run one configuration per core
        # (batching.parallel): the same numbers, sooner. Smoke runs are too small to gain.
        os.environ.setdefault(WORKERS_ENV, str(os.cpu_count() or 1))
    t0 = time.perf_counter()
    try:
        html = build_book(args.build_dir.resolve(), {"smoke": True} if args.smoke else None, args.kernel)
    except PapermillExecutionError as exc:
        # papermill's message names the cell and carries the traceback.
        print(f"[book] notebook failed:\n{exc}", file=sys.stderr)
        return 1
    except subprocess.CalledProcessError as exc:
        print(f"[book] jupyter-book build failed (exit {exc.returncode})", file=sys.stderr)
        return 1
    print(f"[book] HTML in {html} ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
