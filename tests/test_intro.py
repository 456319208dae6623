"""The intro page's references: chapters/references.bib parses, every `{cite}` on a page names
one of its entries, every entry is cited, and the bibliography is listed once, in the intro
(sphinxcontrib-bibtex renders it; the book build runs with -W, so an unknown key would also
fail there, but only in the slow smoke build)."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
CHAPTERS = REPO / "chapters"
BIB = CHAPTERS / "references.bib"

#: `{cite}`, `{cite:p}`, `{cite:t}`, ... roles and their comma-separated keys.
CITE = re.compile(r"\{cite(?::\w+)?\}`([^`]+)`")
BIBLIOGRAPHY = re.compile(r"^(```|:::)\{bibliography\}", re.M)


def pages() -> dict[str, str]:
    """Each chapter page's MyST text: a .md file whole, a notebook's markdown cells."""
    out = {p.name: p.read_text() for p in sorted(CHAPTERS.glob("*.md"))}
    for nb in sorted(CHAPTERS.glob("*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        out[nb.name] = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
    return out


def cited() -> dict[str, set[str]]:
    return {
        name: {k.strip() for m in CITE.finditer(text) for k in m.group(1).split(",")}
        for name, text in pages().items()
    }


def entries() -> dict:
    pybtex = pytest.importorskip("pybtex.database")  # comes with sphinxcontrib-bibtex (book extra)
    return dict(pybtex.parse_file(str(BIB)).entries)


def test_the_config_names_the_bib_file_where_the_staged_book_finds_it() -> None:
    # tools/build_book.py stages every file of chapters/ but the notebooks, from the repository
    # root, which is the book's root: the path in _config.yml must point there.
    config = (REPO / "_config.yml").read_text()
    assert re.search(r"^bibtex_bibfiles:\n  - chapters/references\.bib$", config, re.M), config
    assert BIB.is_file()


def test_every_entry_has_what_the_bibliography_prints() -> None:
    bib = entries()
    assert len(bib) >= 8
    for key, e in bib.items():
        assert e.persons.get("author"), key
        assert {"title", "year"} <= set(e.fields), key
        assert int(e.fields["year"]) in range(2020, 2027), key
        where = "booktitle" if e.type == "inproceedings" else "howpublished"
        assert e.fields.get(where), (key, where)


def test_every_cite_names_an_entry_and_every_entry_is_cited() -> None:
    bib = set(entries())
    by_page = cited()
    unknown = {page: keys - bib for page, keys in by_page.items() if keys - bib}
    assert not unknown, unknown
    uncited = bib - set().union(*by_page.values())
    assert not uncited, f"entries no page cites (the bibliography would not list them): {uncited}"
    # The papers issue 23 asks the chapter to cite where it uses them.
    for key in (
        "yu2022orca",
        "kwon2023vllm",
        "agrawal2024sarathi",
        "holmes2024fastgen",
        "zhong2024distserve",
        "patel2024splitwise",
        "qin2025mooncake",
        "agrawal2024vidur",
    ):
        assert key in by_page["intro.md"], key


def test_the_bibliography_is_listed_once_in_the_intro() -> None:
    where = {page: len(BIBLIOGRAPHY.findall(text)) for page, text in pages().items()}
    assert where.pop("intro.md") == 1
    assert not any(where.values()), where


def test_the_cite_pattern_reads_the_roles_the_pages_use() -> None:
    text = "as {cite:p}`a2024x, b2023y` and {cite}`c2022` showed; not `{cite}` alone"
    assert {k.strip() for m in CITE.finditer(text) for k in m.group(1).split(",")} == {
        "a2024x",
        "b2023y",
        "c2022",
    }


@pytest.mark.model
def test_running_it_yourself_quotes_the_models_as_the_registry_and_the_sweep_have_them() -> None:
    # The intro is not executed: its GPU paragraph names the live models' sizes and the free
    # memory at which the why page's sweep falls back to the small model, as typed numbers.
    pytest.importorskip("torch")  # batching.real.sweep imports it
    from batching.costs.models import get_model
    from batching.real.sweep import live_defaults

    intro = " ".join((CHAPTERS / "intro.md").read_text().split())
    big, small = get_model("llama-8b"), get_model("llama-1b")
    for quoted in (
        f"llama-8b ({big.params / 1e9:.1f}B parameters, {big.weight_bytes / 1e9:.1f} GB of bf16 weights)",
        f"llama-1b ({small.params / 1e9:.1f}B parameters, {small.weight_bytes / 1e9:.1f} GB)",
        "where the GPU has 40 GB free",
    ):
        assert quoted in intro, quoted
    assert big.dtype == small.dtype == "bf16"
    assert live_defaults("cuda", free_bytes=41e9)[0] == "llama-8b"
    assert live_defaults("cuda", free_bytes=39e9)[0] == "llama-1b"
    assert live_defaults("cpu")[0] != "llama-8b"


#: `{glue:text}`page.ipynb::key:format`` in the intro: a value another page computed.
PASTE = re.compile(r"\{glue(?::\w+)?\}`([\w.-]+\.ipynb)::(\w+)(?::[^`]*)?`")


def glued_keys(nb: Path) -> tuple[set[str], list[re.Pattern[str]]]:
    """The glue keys ``nb``'s code can set, read from its source without running it: string
    keys of the dicts it builds (``plots.glue_values({...})``, comprehensions too), ``common.flat("prefix", d,
    [names])``'s ``prefix_name`` (any ``prefix_*`` without names) and f-string keys such as
    ``f"{g}_gpu_{k}"`` as patterns."""
    exact: set[str] = set()
    patterns: list[re.Pattern[str]] = []
    for cell in json.loads(nb.read_text())["cells"]:
        if cell["cell_type"] != "code":
            continue
        for node in ast.walk(ast.parse("".join(cell["source"]))):
            if isinstance(node, (ast.Dict, ast.DictComp)):
                for k in node.keys if isinstance(node, ast.Dict) else [node.key]:
                    if isinstance(k, ast.Constant) and isinstance(k.value, str):
                        exact.add(k.value)
                    elif isinstance(k, ast.JoinedStr):
                        parts = [
                            re.escape(v.value) if isinstance(v, ast.Constant) else r"\w+" for v in k.values
                        ]
                        patterns.append(re.compile("".join(parts) + "$"))
            elif (
                isinstance(node, ast.Call)
                and getattr(node.func, "attr", getattr(node.func, "id", None)) == "flat"
                and node.args
                and isinstance(node.args[0], ast.Constant)
            ):
                prefix = node.args[0].value
                names = node.args[2] if len(node.args) > 2 else None
                if isinstance(names, ast.List):
                    exact |= {f"{prefix}_{n.value}" for n in names.elts if isinstance(n, ast.Constant)}
                else:
                    patterns.append(re.compile(rf"{re.escape(prefix)}_\w+$"))
    return exact, patterns


def test_every_value_the_intro_pastes_is_glued_by_its_page() -> None:
    # The findings table pastes numbers and verdicts from the pages (the intro is not executed);
    # a key a page stops gluing fails the -W book build, and here without running anything.
    pasted = PASTE.findall((CHAPTERS / "intro.md").read_text())
    assert len(pasted) >= 20
    missing = []
    for page, key in sorted(set(pasted)):
        nb = CHAPTERS / page
        assert nb.is_file(), page
        exact, patterns = glued_keys(nb)
        if key not in exact and not any(p.match(key) for p in patterns):
            missing.append(f"{page}::{key}")
    assert not missing, f"the intro pastes keys these pages no longer glue: {missing}"


def test_the_glue_reader_finds_keys_the_way_the_pages_set_them(tmp_path: Path) -> None:
    code = (
        'plots.glue_values({"a_verdict": v, **common.flat("h100", h), **common.flat("rp", r, ["short"]),\n'
        '                   **{f"{g}_gpu_{k}": x for g, k in z}})'
    )
    nb = tmp_path / "p.ipynb"
    nb.write_text(json.dumps({"cells": [{"cell_type": "code", "source": [code]}]}))
    exact, patterns = glued_keys(nb)
    assert exact == {"a_verdict", "rp_short"}
    found = {
        k
        for k in ("h100_bstar", "a100_gpu_ratio", "rp_long", "gpu_verdict")
        if any(p.match(k) for p in patterns)
    }
    assert found == {"h100_bstar", "a100_gpu_ratio"}
    assert PASTE.findall("x {glue:text}`why.ipynb::h100_bstar:.0f` and {glue:text}`kv.ipynb::v:s`") == [
        ("why.ipynb", "h100_bstar"),
        ("kv.ipynb", "v"),
    ]
