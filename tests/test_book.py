"""The book: every chapter notebook runs, the book builds with -W, and it works offline.

The `make book` pipeline (tools/build_book.py) runs once, with smoke parameters
(`smoke=True`), into `_build/test/`: papermill executes each `chapters/*.ipynb` with the
venv's python3 kernel and the repository root as working directory (a failing cell fails
the build with papermill's error), then `jupyter-book build -W` builds the HTML. From that
one build:
(a) each notebook's executed copy is checked on its own (one test item per notebook; no
    notebooks, no items, not a skip);
(b) every built page is opened in headless Chromium (tools/browser_check.py): title and
    heading rendered, every image decoded, no console error, and no request to anything but
    the local server. Screenshots land in `_build/test/screens/`.
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

import browser_check
import build_book

NOTEBOOKS = build_book.notebooks()
SMOKE = {"smoke": True}
BUILD = REPO / "_build" / "test"


@pytest.fixture(scope="module")
def smoke_book() -> Path:
    """The book built once in smoke mode: the HTML folder (every notebook executed once)."""
    return build_book.build_book(BUILD, parameters=SMOKE)


# Parametrizing over an empty list would add a skipped item; with no notebook yet there
# is simply no such test.
if NOTEBOOKS:

    @pytest.mark.notebook
    @pytest.mark.book
    @pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
    def test_notebook_runs_in_smoke_mode(nb: Path, smoke_book: Path) -> None:
        executed = BUILD / "src" / "chapters" / nb.name
        meta = json.loads(executed.read_text())["metadata"]["papermill"]
        assert meta["parameters"] == SMOKE and not meta.get("exception"), meta
        assert (smoke_book / "chapters" / f"{nb.stem}.html").is_file()
        # A warning or log line on stderr would be printed on the page for the reader.
        cells = json.loads(executed.read_text())["cells"]
        stderr = [
            "".join(o["text"])[:200]
            for c in cells
            for o in c.get("outputs", [])
            if o.get("output_type") == "stream" and o.get("name") == "stderr"
        ]
        assert not stderr, stderr


def _external_refs(html: Path) -> list[str]:
    """Static complement to the browser check: scripts, styles, fonts or images named by a
    non-local URL in the built HTML (plain <a href> links are fine: they load nothing)."""
    tag = re.compile(r"<(?:script|link|img|iframe|source)\b[^>]*?\b(?:src|href)=[\"']([^\"']+)[\"']", re.I)
    bad = []
    for page in html.rglob("*.html"):
        for url in tag.findall(page.read_text(encoding="utf-8", errors="replace")):
            if re.match(r"(?:https?:)?//", url) and not browser_check.is_local(url):
                bad.append(f"{page.relative_to(html)}: {url}")
    return bad


@pytest.mark.book
@pytest.mark.slow
def test_book_builds_and_renders_offline(smoke_book: Path) -> None:
    html = smoke_book

    expected = ["chapters/intro.html"] + [f"chapters/{nb.stem}.html" for nb in NOTEBOOKS]
    missing = [p for p in expected if not (html / p).is_file()]
    assert not missing, f"pages not built (missing from _toc.yml?): {missing}"
    assert (html / "_static" / "mathjax" / "tex-chtml.js").is_file(), "MathJax is not shipped locally"
    external = _external_refs(html)
    assert not external, "the built HTML loads from the network:\n" + "\n".join(external)

    results = browser_check.check_site(html, screens=BUILD / "screens")
    checked = {r.page for r in results}
    assert set(expected) <= checked, f"browser check skipped pages: {set(expected) - checked}"
    report = "\n".join(f"{r.page}:\n  " + "\n  ".join(r.problems) for r in results if r.problems)
    assert not report, "pages with problems in headless Chromium:\n" + report
