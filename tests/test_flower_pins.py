"""Flower is reached into in one place only (``fcd_secure._flower``), for one version, checked when it is imported.

The installed Flower passes every check; a different version, or a patched or copied function whose source changed,
stops the import with a message naming it; the version is written once (``_flower.pins.FLWR_VERSION``) and the wheel's
dependency pins the same one; no other module imports Flower beyond its public API; no test or module silences a
whole warning category.
"""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

import pytest

from fcd_secure._flower import internals, pins, superexec, superlink_main, waits  # noqa: F401 - each runs its checks

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fcd_secure"
#: Flower's public API: what any module may import (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
#: ``flwr.simulation``); everything else of Flower is imported in ``fcd_secure/_flower/`` only
PUBLIC = ("flwr.app", "flwr.serverapp", "flwr.clientapp", "flwr.simulation")


def test_the_installed_flower_is_the_pinned_one_and_every_patched_source_is_unchanged():
    import flwr

    assert flwr.__version__ == pins.FLWR_VERSION
    users = {who for _, who in pins.SOURCES.values()}
    assert users == {"waits", "superlink_main", "superexec"}
    for user in users | {"internals"}:
        pins.require.__wrapped__(user)  # the uncached check, run again: no error
    for key, (want, _) in pins.SOURCES.items():
        assert pins.source_sha256(key) == want, key


def test_a_changed_flower_function_stops_the_start_naming_it(monkeypatch):
    key = "flwr.supernode.runtime.run_clientapp:pull_task_input"
    monkeypatch.setitem(pins.SOURCES, key, ("0" * 64, "superexec"))  # the source we read is no longer the installed one
    with pytest.raises(pins.FlowerVersionError, match=re.escape(key)) as err:
        pins.require.__wrapped__("superexec")
    assert "read it again" in str(err.value)


def test_another_flower_version_stops_the_start_naming_both(monkeypatch):
    import flwr

    monkeypatch.setattr(pins, "FLWR_VERSION", "1.41.0")
    with pytest.raises(pins.FlowerVersionError) as err:
        pins.require.__wrapped__("internals")
    assert "1.41.0" in str(err.value) and flwr.__version__ in str(err.value)


def test_a_missing_flower_object_is_an_error_not_a_skip(monkeypatch):
    monkeypatch.setitem(pins.SOURCES, "flwr.supernode.runtime.run_clientapp:no_such_function", ("0" * 64, "superexec"))
    with pytest.raises(pins.FlowerVersionError, match="no such object"):
        pins.require.__wrapped__("superexec")


def test_the_version_is_written_once_and_the_wheel_pins_it():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    assert f"flwr[simulation]=={pins.FLWR_VERSION}" in deps
    literal = re.compile(re.escape(f'"{pins.FLWR_VERSION}"') + "|" + re.escape(f"=={pins.FLWR_VERSION}"))
    elsewhere = [str(p.relative_to(ROOT)) for p in PACKAGE.rglob("*.py")
                 if p.name != "pins.py" and literal.search(p.read_text(encoding="utf-8"))]
    assert not elsewhere, f"the Flower version is spelled outside _flower/pins.py: {elsewhere}"


def _flower_imports(path: Path) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "flwr"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "flwr":
            out.append((node.lineno, node.module))
    return out


def test_only_the_flower_package_imports_flower_internals():
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        if "_flower" in path.relative_to(PACKAGE).parts:
            continue
        for line, name in _flower_imports(path):
            if not name.startswith(PUBLIC):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {name}")
    assert not offenders, offenders


def test_no_whole_warning_category_is_silenced():
    """Every warning filter names what it filters (a message or a module), in the test settings and in the code."""
    filters = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"].get(
        "filterwarnings", [])
    for f in filters:
        action, message, *_ = f.split(":") + [""]
        assert action != "ignore" or message, f"pyproject.toml filters a whole category: {f!r}"
    offenders = []
    for path in PACKAGE.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                    node.func.attr in ("filterwarnings", "simplefilter"):
                kws = {k.arg for k in node.keywords}
                if node.func.attr == "filterwarnings" and ({"message", "module"} & kws or len(node.args) > 1):
                    continue
                if _inside_catch_warnings(path, node):
                    continue  # scoped to one call
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno} {ast.unparse(node)}")
    assert not offenders, offenders


def _inside_catch_warnings(path: Path, call: ast.Call) -> bool:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and any("catch_warnings" in ast.unparse(i.context_expr) for i in node.items):
            if any(getattr(n, "lineno", -1) == call.lineno for n in ast.walk(node)):
                return True
    return False
