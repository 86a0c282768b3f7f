"""One exception hierarchy (``fcd_secure/errors.py``): every exception class of the package derives from
``FcdError`` and keeps its builtin base, and no two exception classes share a name (there were two ``LedgerError``s,
one in ``privacy`` and one in ``audit``; a caller could catch the wrong one)."""

from __future__ import annotations

import importlib
import inspect
from collections import defaultdict
from pathlib import Path

from fcd_secure.errors import FcdError

PACKAGE = Path(__file__).resolve().parents[1] / "fcd_secure"
#: entry-point modules that replace ``sys.argv``/start processes on import are still importable (their work is in
#: ``main()``); every module is imported here
MODULES = sorted(
    ".".join(p.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    for p in PACKAGE.rglob("*.py")
)


def _exception_classes() -> list[type]:
    out = []
    for name in MODULES:
        mod = importlib.import_module(name)
        for _, obj in inspect.getmembers(mod, inspect.isclass):
            if obj.__module__ == name and issubclass(obj, BaseException) and not issubclass(obj, Warning):
                out.append(obj)
    return out


def test_every_exception_of_the_package_derives_from_fcd_error():
    classes = _exception_classes()
    assert len(classes) >= 30
    orphans = [f"{c.__module__}.{c.__qualname__}" for c in classes if not issubclass(c, FcdError)]
    assert not orphans, orphans


def test_no_two_exception_classes_share_a_name():
    by_name: dict[str, list[str]] = defaultdict(list)
    for c in _exception_classes():
        by_name[c.__name__].append(c.__module__)
    twins = {k: v for k, v in by_name.items() if len(v) > 1}
    assert not twins, twins


def test_the_builtin_bases_are_kept():
    from fcd_secure.audit.signing import AuditLedgerError
    from fcd_secure.data.spec import DataError
    from fcd_secure.privacy.errors import BudgetExceeded, PrivacyLedgerError

    assert issubclass(DataError, ValueError) and issubclass(PrivacyLedgerError, RuntimeError)
    assert issubclass(AuditLedgerError, RuntimeError) and issubclass(BudgetExceeded, FcdError)
    assert not issubclass(PrivacyLedgerError, AuditLedgerError) and not issubclass(AuditLedgerError, PrivacyLedgerError)
