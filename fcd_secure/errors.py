"""The root of every exception the package raises: ``except FcdError`` catches ours and nothing else.

One hierarchy, in the manner of ``cryptography.exceptions``: each layer keeps its errors beside the code that raises
them (``data.spec.DataError``, ``aggregation.secagg.errors``, ``privacy.errors``, ``audit.signing``, ...), every one
of them derives from :class:`FcdError`, and no two share a name (``tests/test_errors.py``). Each also keeps the
builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a state that cannot go on), so callers
that catch those keep working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - only the annotation; the callers hold the pydantic error
    from pydantic import ValidationError

__all__ = ["FcdError", "first_invalid"]


class FcdError(Exception):
    """An error of fcd_secure (every exception class of the package derives from it)."""


def first_invalid(exc: ValidationError, top: str = "") -> tuple[str, str]:
    """Where and why a pydantic validation failed first: the field's dotted location (``top`` when the error is the
    document's own, with no location) and pydantic's message, for an error message that names the field
    (pydantic docs, "Validation Errors": ``ValidationError.errors()`` lists ``loc`` and ``msg`` per error)."""
    err = exc.errors()[0]
    return ".".join(str(p) for p in err["loc"]) or top, str(err["msg"])
