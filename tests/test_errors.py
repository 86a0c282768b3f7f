"""One exception hierarchy (``fcd_secure/errors.py``): every exception class of the package derives from
``FcdError`` and keeps its builtin base, and no two exception classes share a name (there were two ``LedgerError``s,
one in ``privacy`` and one in ``audit``; a caller could catch the wrong one).

The classes are found in the source, like ``tests/test_layers.py`` reads the imports: every ``class`` statement of
every module (``ast``), then each is looked up in its imported module and checked with ``issubclass``. Warning
categories (``evaluation.ope.SupportWarning``) are issued, never raised, and stay outside the hierarchy.
"""

from __future__ import annotations

import ast
import importlib
from collections import defaultdict
from pathlib import Path

import pytest

from fcd_secure.errors import FcdError

PACKAGE = Path(__file__).resolve().parents[1] / "fcd_secure"


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")


def _classes_in(tree: ast.AST) -> list[tuple[str, ast.ClassDef]]:
    """``(qualified name, node)`` of every ``class`` statement under ``tree``; a class inside a function comes back
    with ``<locals>`` in its name (it cannot be looked up, and an exception-looking one is refused below)."""
    out: list[tuple[str, ast.ClassDef]] = []

    def walk(node: ast.AST, prefix: str, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.ClassDef):
                qual = f"{prefix}{'<locals>.' if in_function else ''}{child.name}"
                out.append((qual, child))
                walk(child, qual + ".", in_function)
            else:
                walk(child, prefix, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    walk(tree, "", False)
    return out


def _class_statements() -> list[tuple[str, str, ast.ClassDef]]:
    """``(module, qualified name, node)`` of every ``class`` statement in the package."""
    return [(_module_name(path), qual, node) for path in sorted(PACKAGE.rglob("*.py"))
            for qual, node in _classes_in(ast.parse(path.read_text(encoding="utf-8")))]


def _twins(where: list[tuple[str, str]]) -> dict[str, list[str]]:
    """``{class name: [where, ...]}`` for the names that ``(class name, where)`` pairs hold more than once."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for name, at in where:
        by_name[name].append(at)
    return {k: v for k, v in by_name.items() if len(v) > 1}


STATEMENTS = _class_statements()


def _lookup(mod: str, qual: str) -> object:
    obj: object = importlib.import_module(mod)
    for part in qual.split("."):
        obj = getattr(obj, part)
    return obj


def _exception_classes() -> list[tuple[str, str, type]]:
    """``(module, qualified name, class)`` of every exception class defined in the package (warnings left out)."""
    out = []
    for mod, qual, _ in STATEMENTS:
        if "<locals>" in qual:
            continue
        cls = _lookup(mod, qual)
        if isinstance(cls, type) and issubclass(cls, BaseException) and not issubclass(cls, Warning):
            out.append((mod, qual, cls))
    return out


EXCEPTIONS = _exception_classes()


def test_every_class_statement_is_found_and_none_is_hidden_in_a_function():
    """A class defined inside a function escapes the checks below, so an exception-looking one is refused."""
    assert len(STATEMENTS) > 100 and len(EXCEPTIONS) >= 30
    hidden = [f"{m}.{q}" for m, q, node in STATEMENTS if "<locals>" in q
              and any(t in ast.unparse(b) for b in node.bases for t in ("Error", "Exception", "Exceeded"))]
    assert not hidden, f"define exception classes at module level: {hidden}"


@pytest.mark.parametrize("where", sorted(f"{m}.{q}" for m, q, _ in EXCEPTIONS))
def test_every_exception_of_the_package_derives_from_fcd_error(where):
    cls = next(c for m, q, c in EXCEPTIONS if f"{m}.{q}" == where)
    assert issubclass(cls, FcdError), f"{where} does not derive from fcd_secure.errors.FcdError"


def test_no_two_exception_classes_share_a_name():
    twins = _twins([(cls.__name__, f"{mod}.{qual}") for mod, qual, cls in EXCEPTIONS])
    assert not twins, twins


def test_the_checks_can_fail():
    """The walk finds a class hidden in a function and the name check finds twins (guards against a test that passes
    everything)."""
    tree = ast.parse("class A(ValueError):\n    class C: pass\ndef f():\n    class B(RuntimeError):\n        pass\n")
    assert [q for q, _ in _classes_in(tree)] == ["A", "A.C", "<locals>.B"]
    assert _twins([("LedgerError", "privacy.ledger"), ("LedgerError", "audit.ledger"), ("X", "y")]) == {
        "LedgerError": ["privacy.ledger", "audit.ledger"]}


def test_the_builtin_bases_are_kept():
    from fcd_secure.audit.signing import AuditLedgerError
    from fcd_secure.data.spec import DataError
    from fcd_secure.privacy.errors import BudgetExceeded, PrivacyLedgerError

    assert issubclass(DataError, ValueError) and issubclass(PrivacyLedgerError, RuntimeError)
    assert issubclass(AuditLedgerError, RuntimeError) and issubclass(BudgetExceeded, FcdError)
    assert not issubclass(PrivacyLedgerError, AuditLedgerError) and not issubclass(AuditLedgerError, PrivacyLedgerError)
