"""The package's layers (docs/ARCHITECTURE.md "Layers of the package"): imports run one way.

Every module of thunder_memfuse/ is parsed with `ast`; every import it holds counts, at module
level or inside a function (a lazy import is still a dependency), relative or absolute, and
importlib.import_module / __import__ of a constant "thunder_memfuse..." name.  Each module belongs
to one layer, by its folder:

    1 base          errors, _options, _versions, _memo, _plan, _C, _symbols   (no other layer)
    2 regions       regions/            region compilers
    3 integration   integration/        the Thunder transform, executor and fusion pass
    4 reports       reports/            measurement, compare, savings, report, plots
    5 api           __init__ and the public re-export modules (measure, savings, plot, attention)

A module may import its own layer or a lower one, never a higher one, and no two modules import
each other, directly or around a circle.  MEMFUSE_LAYERS_PACKAGE=/path/to/thunder_memfuse checks
another copy of the package (the layout before the layers fails it).
"""
from __future__ import annotations

import ast
import os
from pathlib import Path

import pytest

PKG = "thunder_memfuse"
ROOT = Path(os.environ.get("MEMFUSE_LAYERS_PACKAGE") or Path(__file__).resolve().parent.parent / PKG)

LAYERS = ("base", "regions", "integration", "reports", "api")
BASE = {"errors", "_options", "_versions", "_memo", "_plan", "_C", "_symbols"}
FOLDERS = {"regions": "regions", "integration": "integration", "reports": "reports"}
API = {"measure", "savings", "plot", "attention"}  # thunder_memfuse.<name>: documented paths, re-exports only


def _modules() -> dict:
    """{dotted name: (path, is a package __init__)} for every .py under the package, and _C."""
    out = {f"{PKG}._C": (None, False)}
    for p in sorted(ROOT.rglob("*.py")):
        parts = list(p.relative_to(ROOT).with_suffix("").parts)
        ispkg = parts[-1] == "__init__"
        if ispkg:
            parts = parts[:-1]
        out[".".join([PKG] + parts)] = (p, ispkg)
    return out


MODULES = _modules()


def layer(mod: str) -> str | None:
    parts = mod.split(".")[1:]
    if not parts or (len(parts) == 1 and parts[0] in API):
        return "api"
    if parts[0] in FOLDERS:
        return FOLDERS[parts[0]]
    if len(parts) == 1 and parts[0] in BASE:
        return "base"
    return None


def _targets(mod: str, ispkg: bool, node) -> list:
    """The package modules an import statement loads (a name imported from a package that is a
    module of its own counts as that module)."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name == PKG or a.name.startswith(PKG + ".")]
    if node.level:
        base = mod.split(".") if ispkg else mod.split(".")[:-1]
        base = base[:len(base) - (node.level - 1)]
        src = ".".join(base + ([node.module] if node.module else []))
    else:
        src = node.module or ""
        if src != PKG and not src.startswith(PKG + "."):
            return []
    return [f"{src}.{a.name}" if f"{src}.{a.name}" in MODULES else src for a in node.names]


def _dynamic(node) -> list:
    """importlib.import_module("thunder_memfuse.x") / __import__("thunder_memfuse.x")."""
    f = node.func
    name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", None)
    if name not in ("import_module", "__import__") or not node.args:
        return []
    a = node.args[0]
    if isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith(PKG):
        return [a.value]
    return []


def imports() -> dict:
    """{module: {imported module: first line}}, every import of the package's own modules."""
    out = {}
    for mod, (path, ispkg) in MODULES.items():
        edges = out.setdefault(mod, {})
        if path is None:
            continue
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                found = _targets(mod, ispkg, node)
            elif isinstance(node, ast.Call):
                found = _dynamic(node)
            else:
                continue
            for t in found:
                if t != mod:
                    edges.setdefault(t, node.lineno)
    return out


def _where(mod, line):
    path = MODULES[mod][0]
    return f"{path.relative_to(ROOT.parent) if path else mod}:{line}"


def test_the_package_is_found():
    assert (ROOT / "__init__.py").is_file(), ROOT
    assert len(MODULES) > 10


def test_every_module_has_a_layer():
    missing = sorted(m for m in MODULES if layer(m) is None)
    assert not missing, ("modules outside the layers (put each in base, regions/, integration/ or reports/, "
                         f"or make it a public re-export): {missing}")


def test_imports_go_to_the_same_or_a_lower_layer():
    bad = []
    for mod, edges in imports().items():
        lm = layer(mod)
        for t, line in edges.items():
            lt = layer(t) if t in MODULES or t == PKG else None
            if lm is None or lt is None:
                if t not in MODULES:
                    bad.append(f"{_where(mod, line)}: imports {t}, not a module of the package")
                continue
            if LAYERS.index(lt) > LAYERS.index(lm):
                bad.append(f"{_where(mod, line)}: {mod} ({lm}) imports {t} ({lt})")
    assert not bad, "imports that run upwards:\n  " + "\n  ".join(bad)


def _cycles(graph: dict) -> list:
    """The strongly connected components of more than one node (Tarjan, iterative)."""
    index, low, on, stack, out, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph.get(root, ())))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on.add(root)
        while work:
            v, it = work[-1]
            for w in it:
                if w not in index:
                    index[w] = low[w] = counter[0]
                    counter[0] += 1
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(graph.get(w, ()))))
                    break
                if w in on:
                    low[v] = min(low[v], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[v])
                if low[v] == index[v]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on.discard(w)
                        comp.append(w)
                        if w == v:
                            break
                    if len(comp) > 1:
                        out.append(sorted(comp))
    return out


def test_no_import_cycle_between_modules():
    graph = {m: set(e) for m, e in imports().items()}
    cycles = _cycles(graph)
    assert not cycles, "modules that import each other (around a circle):\n  " + "\n  ".join(map(str, cycles))


def test_no_import_cycle_between_layers():
    graph = {}
    for mod, edges in imports().items():
        for t in edges:
            a, b = layer(mod), layer(t)
            if a and b and a != b:
                graph.setdefault(a, set()).add(b)
    assert not _cycles(graph), graph


def test_the_checker_sees_lazy_and_relative_imports():
    """The parser itself: an import inside a function, relative at each depth, absolute, and
    import_module of a constant name all count."""
    if os.environ.get("MEMFUSE_LAYERS_PACKAGE"):
        pytest.skip("the layout under test is another copy")
    src = ("from .. import _C\n"
           "def f():\n"
           "    from ..integration import transform\n"
           "    from .nvrtc import lowering\n"
           "    from . import base\n"
           "    import thunder_memfuse.reports._report\n"
           "    __import__('importlib').import_module('thunder_memfuse.regions')\n")
    got = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            got += _targets(f"{PKG}.regions.base", False, node)
        elif isinstance(node, ast.Call):
            got += _dynamic(node)
    assert sorted(got) == sorted([f"{PKG}._C", f"{PKG}.integration.transform", f"{PKG}.regions.nvrtc.lowering",
                                  f"{PKG}.regions.base", f"{PKG}.reports._report", f"{PKG}.regions"])


@pytest.mark.parametrize("mod", ["thunder_memfuse.integration.transform", "thunder_memfuse.regions.base",
                                 "thunder_memfuse.reports._compare", "thunder_memfuse.errors",
                                 "thunder_memfuse.measure", "thunder_memfuse"])
def test_layer_of(mod):
    if os.environ.get("MEMFUSE_LAYERS_PACKAGE"):
        pytest.skip("the layout under test is another copy")
    assert layer(mod) == {"thunder_memfuse.integration.transform": "integration",
                          "thunder_memfuse.regions.base": "regions", "thunder_memfuse.reports._compare": "reports",
                          "thunder_memfuse.errors": "base", "thunder_memfuse.measure": "api",
                          "thunder_memfuse": "api"}[mod]
