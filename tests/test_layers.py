"""The package's layering, read from the source (every import, including the ones inside functions).

Imports go one way (docs/architecture.md): cli → experiments → provisioning → engines → apps → queries → federation
→ config → aggregation / privacy / audit → model / evaluation → data, with the torch-free contract (``manifest``,
``_io``) at the bottom and ``_flower`` (Flower's internals, importing only the bottom) beside it. Modules of one
layer never import a sibling layer (model ↛ evaluation, audit ↛ privacy, …), and no two modules import each other,
directly or through others.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "fcd_secure"

#: layer -> the layers it may import (its own layer is always allowed)
ALLOWED: dict[str, set[str]] = {
    "base": set(),  # fcd_secure/__init__.py, manifest.py, _io.py, _versions.py, errors.py, anchor_records.py,
    # fingerprints.py
    "_flower": {"base"},  # every use of Flower internals, pinned to one version (docs/architecture.md)
    "data": {"base"},
    "model": {"base", "data"},
    "evaluation": {"base", "data"},
    "aggregation": {"base"},
    "privacy": {"base", "data", "model"},
    "audit": {"base", "_flower"},  # the exact bytes Flower serializes (_flower.internals.serialized_bytes)
    "config": {"base", "data", "model", "aggregation", "privacy"},
}
#: above config every layer may import every layer below it, in this order (bottom first)
_STACK = ["federation", "queries", "apps", "engines", "provisioning", "experiments", "cli"]
for _i, _name in enumerate(_STACK):
    ALLOWED[_name] = {"base", "_flower", "data", "model", "evaluation", "aggregation", "privacy", "audit", "config",
                      *_STACK[:_i]}
BASE_MODULES = {"fcd_secure", "fcd_secure.manifest", "fcd_secure._io", "fcd_secure._versions", "fcd_secure.errors",
                "fcd_secure.anchor_records", "fcd_secure.fingerprints", "fcd_secure._format"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _layer(module: str) -> str:
    if module in BASE_MODULES:
        return "base"
    return module.split(".")[1]


def _resolve(module: str, node: ast.ImportFrom, is_package: bool) -> str:
    if node.level == 0:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _imports() -> dict[str, set[str]]:
    """module -> project modules it imports (anywhere in its source)."""
    out: dict[str, set[str]] = {}
    known = {_module_name(p) for p in PACKAGE.rglob("*.py")}
    for path in PACKAGE.rglob("*.py"):
        mod = _module_name(path)
        deps: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            names: list[str] = []
            if isinstance(node, ast.Import):
                names = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom):
                target = _resolve(mod, node, path.name == "__init__.py")
                # "from pkg import sub" imports the submodule when one exists
                names = [f"{target}.{a.name}" if f"{target}.{a.name}" in known else target for a in node.names]
            for name in names:
                while name and name not in known:
                    name = name.rpartition(".")[0]
                if name.startswith("fcd_secure") and name != mod:
                    deps.add(name)
        out[mod] = deps
    return out


GRAPH = _imports()


def test_every_layer_is_known():
    assert {_layer(m) for m in GRAPH} <= set(ALLOWED)


@pytest.mark.parametrize("module", sorted(GRAPH))
def test_no_module_imports_a_layer_above_or_beside_it(module):
    layer = _layer(module)
    bad = sorted(d for d in GRAPH[module] if _layer(d) != layer and _layer(d) not in ALLOWED[layer])
    assert not bad, f"{module} ({layer}) imports {bad}"


def test_no_import_cycle():
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in GRAPH.get(v, ()):
            # a package's __init__ importing its own submodules is how a package exposes them, not a cycle
            if v == w.rpartition(".")[0] or w == v.rpartition(".")[0]:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                cycles.append(sorted(comp))

    for v in sorted(GRAPH):
        if v not in index:
            visit(v)
    assert not cycles, f"import cycles: {cycles}"


def test_the_layer_rules_can_fail():
    """The checker sees a forbidden edge when one is planted (guards against a checker that passes everything)."""
    GRAPH.setdefault("fcd_secure.model.networks", set()).add("fcd_secure.evaluation.metrics")
    try:
        with pytest.raises(AssertionError):
            test_no_module_imports_a_layer_above_or_beside_it("fcd_secure.model.networks")
    finally:
        GRAPH["fcd_secure.model.networks"].discard("fcd_secure.evaluation.metrics")


def test_no_module_is_loaded_by_name_with_a_fallback():
    """A missing privacy component must stop the start (fail closed), never be skipped: no ``except ImportError``,
    no ``importlib.import_module`` / ``find_spec`` probing of the project's own modules."""
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ExceptHandler) and node.type is not None:
                caught = ast.unparse(node.type)
                if "ImportError" in caught or "ModuleNotFoundError" in caught:
                    offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} except {caught}")
            if isinstance(node, ast.Attribute) and node.attr in ("import_module", "find_spec"):
                offenders.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders
