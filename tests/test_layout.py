"""The package's shape: the data flows one way through its layers (the core at the bottom,
then workloads and costs, metrics and results, the real engine, servers, and the CLI and book
on top), no import goes back up or round in a circle, and everything outside ``batching.real``
imports without torch."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parent.parent / "batching"

#: Layer of each top-level part of the package; an import may only go to its own layer or below.
LAYERS = {
    "request": 0,
    "plan": 0,
    "kv": 0,
    "steplog": 0,
    "engine": 0,
    "validate": 0,
    "parallel": 1,
    "schedulers": 0,
    "workloads": 1,
    "costs": 1,
    "metrics": 2,
    "simulate": 2,
    "capacity": 2,
    "results": 2,
    "real": 3,
    "servers": 4,
    "cli": 5,
    "book": 5,
    "__main__": 6,
}


def module_name(path: Path) -> str:
    parts = path.relative_to(PKG.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """The ``batching`` modules ``path`` imports, at any depth of its code (a lazy import in a
    function is an arrow too): ``from .x import y`` counts as ``x.y`` when that is a module."""
    mod = module_name(path)
    pkg = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("batching")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            elif node.module and node.module.startswith("batching"):
                target = node.module
            else:
                continue
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.add(sub if sub in MODULES else target)
    return {m for m in out if m in MODULES and m != mod}


MODULES = {module_name(p) for p in PKG.rglob("*.py")}
GRAPH = {module_name(p): imports(p) for p in PKG.rglob("*.py")}


def part(mod: str) -> str:
    return mod.split(".")[1] if "." in mod else ""


def test_no_import_goes_back_up() -> None:
    assert {part(m) for m in MODULES} - {""} == set(LAYERS), "a new top-level part needs a layer"
    up = [
        f"{m} -> {t}"
        for m, targets in GRAPH.items()
        for t in targets
        if part(m) and part(t) and LAYERS[part(t)] > LAYERS[part(m)]
    ]
    assert not up, up


def test_the_core_imports_only_the_core() -> None:
    core = {p for p, layer in LAYERS.items() if layer == 0}
    out = [f"{m} -> {t}" for m, ts in GRAPH.items() if part(m) in core for t in ts if part(t) not in core]
    assert not out, out


def test_no_import_circle() -> None:
    state: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(m: str, path: list[str]) -> None:
        state[m] = 1
        for t in sorted(GRAPH[m]):
            if state.get(t) == 1:
                pytest.fail("import circle: " + " -> ".join(path[path.index(t) :] + [t]))
            if t not in state:
                visit(t, path + [t])
        state[m] = 2

    for m in sorted(GRAPH):
        if m not in state:
            visit(m, [m])


#: What every page of the book shares (glue, palette, verdict words, the build's run cache);
#: every other module of ``batching.book`` is one page's experiments or one page's figures.
BOOK_SHARED = {"batching.book", "batching.book.common", "batching.book.plots", "batching.book.runs"}


def test_no_page_module_imports_another() -> None:
    """A page's module (its experiments, or its figures) imports the library and the shared
    book modules, never another page's module: what two pages need is the library's."""
    book = {m for m in MODULES if m.startswith("batching.book.") and m not in BOOK_SHARED}
    figures = {"batching.book.figures"}
    out = [f"{m} -> {t}" for m in sorted(book) for t in sorted(GRAPH[m]) if t in book and m not in figures]
    assert not out, out


def test_the_graph_sees_imports() -> None:
    """The checks above are only as good as the graph: it finds known arrows."""
    assert "batching.plan" in GRAPH["batching.engine"]
    assert "batching.costs.models" in GRAPH["batching.real.executor"]
    assert "batching.servers.replay" in GRAPH["batching.cli.servers"]  # a lazy import in a function


def test_importing_the_library_does_not_import_torch() -> None:
    torch_free = sorted(m for m in MODULES if part(m) not in ("real", "__main__"))
    code = "import sys\n" + "".join(f"import {m}\n" for m in torch_free) + "print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_every_real_module_imports_on_its_own() -> None:
    # One fresh interpreter per module: an import cycle between two of them shows up as an
    # ImportError in whichever is imported first.
    for m in sorted(m for m in MODULES if part(m) == "real"):
        subprocess.run([sys.executable, "-c", f"import {m}"], check=True)
