"""The package's architecture, read from its source: imports point down the layers, never in a circle.

Layers (``docs/design.md``), lowest first: ``numerics`` -> ``ops`` -> ``backends`` -> ``training`` ->
``integrations`` -> ``cli``/``bench`` (and the package's ``__init__``, which re-exports). A module may import
its own layer and the ones below. The operator layer reaches the backends only through the registry (by module
path, at run time); the reference backend is reached only through the registry: no module outside it imports
it. No module uses a private name (``_x``) of another top-level module; a sub-package may share its own.
Imports inside functions count like the others.

The graph is built with :mod:`ast` from the files, so a violation fails here before anything runs. Each rule
is also checked on a small synthetic graph, so that a checker that finds nothing cannot pass silently.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import swiglu_ops

PACKAGE = Path(swiglu_ops.__file__).parent
LAYERS = {
    "numerics": 0,
    "ops": 1,
    "backends": 2,
    "training": 3,
    "integrations": 4,
    "cli": 5,
    "bench": 5,
    "__main__": 5,
    "__init__": 5,
}
REFERENCE = "swiglu_ops.backends.reference"


def module_name(path: Path) -> str:
    rel = path.relative_to(PACKAGE.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def area(module: str) -> str:
    """The top-level module or sub-package a module belongs to (``swiglu_ops`` itself: ``__init__``)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def _resolve(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".")
    if not is_package:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)] if node.level > 1 else base
    return ".".join(base + ([node.module] if node.module else []))


def scan(files: dict[str, tuple[str, bool]]):
    """``files``: module -> (source, is_package). Returns (edges, private uses): edges ``(importer, imported,
    line)`` between package modules, private uses ``(module, "owner._name", line)``."""
    modules = set(files)
    edges, private = [], []
    for module, (source, is_package) in files.items():
        tree = ast.parse(source)
        aliases: dict[str, str] = {}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                for a in node.names:
                    if a.name.startswith("swiglu_ops"):
                        edges.append((module, a.name, node.lineno))
                        aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else "swiglu_ops"
            elif isinstance(node, ast.ImportFrom):
                source_mod = _resolve(module, is_package, node)
                if not source_mod.startswith("swiglu_ops"):
                    continue
                for a in node.names:
                    sub = f"{source_mod}.{a.name}"
                    if sub in modules:  # "from . import mx": the module itself
                        edges.append((module, sub, node.lineno))
                        aliases[a.asname or a.name] = sub
                    else:
                        edges.append((module, source_mod, node.lineno))
                        if a.name.startswith("_") and area(source_mod) != area(module):
                            private.append((module, f"{source_mod}.{a.name}", node.lineno))
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id in aliases
                and node.attr.startswith("_")
                and not node.attr.startswith("__")
            ):
                owner = aliases[node.value.id]
                target = f"{owner}.{node.attr}"
                if target in modules:
                    continue  # a private sub-module reached through its package (checked as an edge)
                if area(owner) != area(module):
                    private.append((module, f"{owner}.{node.attr}", node.lineno))
    return edges, private


def violations(files):
    edges, private = scan(files)
    problems = []
    for importer, imported, line in edges:
        a, b = area(importer), area(imported)
        if a != "__init__" and b == "__init__" and imported == "swiglu_ops":
            problems.append(f"{importer}:{line} imports the package root (swiglu_ops): an upward import")
        elif LAYERS.get(b, 0) > LAYERS.get(a, 0):
            problems.append(f"{importer}:{line} imports {imported}: upward ({a} -> {b})")
        if imported.startswith(REFERENCE) and not importer.startswith(REFERENCE):
            problems.append(f"{importer}:{line} imports the reference backend {imported} (use the registry)")
    problems += [f"{m}:{line} uses the private name {name}" for m, name, line in private]
    graph: dict[str, set[str]] = {}
    for importer, imported, _ in edges:
        if imported in files and imported != importer:
            graph.setdefault(importer, set()).add(imported)
    problems += [f"import cycle: {' -> '.join(c)}" for c in _cycles(graph)]
    return problems


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (Tarjan)."""
    index, low, stack, on, out = {}, {}, [], set(), []
    counter = [0]

    def visit(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp) + [sorted(comp)[0]])

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def package_files() -> dict[str, tuple[str, bool]]:
    return {
        module_name(p): (p.read_text(), p.name == "__init__.py")
        for p in sorted(PACKAGE.rglob("*.py"))
        if "__pycache__" not in p.parts
    }


def test_the_package_imports_point_down_without_cycles_or_private_names():
    files = package_files()
    assert len(files) > 20 and "swiglu_ops.ops.table" in files, sorted(files)
    assert violations(files) == []


def test_every_module_is_in_a_layer():
    assert {area(m) for m in package_files()} <= set(LAYERS)


def _synthetic(**sources) -> dict[str, tuple[str, bool]]:
    return {name.replace("__", "."): (src, False) for name, src in sources.items()}


@pytest.mark.parametrize(
    "sources, expected",
    [
        (dict(swiglu_ops__numerics__mx="from ..ops import api\n", swiglu_ops__ops__api=""), "upward"),
        (
            dict(
                swiglu_ops__ops__a="def f():\n    from . import b\n",
                swiglu_ops__ops__b="from . import a\n",
            ),
            "import cycle",
        ),
        (
            dict(swiglu_ops__training__nn="from ..backends.reference import glu\n", swiglu_ops__ops__x=""),
            "reference backend",
        ),
        (
            dict(
                swiglu_ops__training__nn="from ..ops import validate\nvalidate._check(1)\n",
                swiglu_ops__ops__validate="",
            ),
            "private name",
        ),
        (dict(swiglu_ops__training__nn="from ..ops.validate import _check\n"), "private name"),
        (dict(swiglu_ops__ops__api="import swiglu_ops\n"), "package root"),
    ],
    ids=["upward", "cycle in a function", "reference import", "private attribute", "private import", "root"],
)
def test_the_checker_finds_each_kind_of_violation(sources, expected):
    problems = violations(_synthetic(**sources))
    assert any(expected in p for p in problems), problems
