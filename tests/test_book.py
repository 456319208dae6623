"""The book: every chapter notebook runs, the book builds with -W, and it works offline.

(a) Each `chapters/*.ipynb` is executed by papermill in smoke mode (`smoke=True`), with the
    venv's python3 kernel and the repository root as working directory; a failing cell
    fails the test with papermill's error. No notebooks, no test items (not a skip).
(b) The `make book` pipeline (tools/build_book.py) runs with smoke parameters into
    `_build/test/`, then every built page is opened in headless Chromium
    (tools/browser_check.py): title and heading rendered, every image decoded, no console
    error, and no request to anything but the local server. Screenshots land in
    `_build/test/screens/`.
"""

from __future__ import annotations

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

# Parametrizing over an empty list would add a skipped item; with no notebook yet there
# is simply no such test.
if NOTEBOOKS:

    @pytest.mark.notebook
    @pytest.mark.parametrize("nb", NOTEBOOKS, ids=[p.name for p in NOTEBOOKS])
    def test_notebook_runs_in_smoke_mode(nb: Path, tmp_path: Path) -> None:
        build_book.execute_notebook(nb, tmp_path / nb.name, parameters=SMOKE, kernel="python3", cwd=REPO)


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
def test_book_builds_and_renders_offline() -> None:
    html = build_book.build_book(BUILD, parameters=SMOKE)

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
