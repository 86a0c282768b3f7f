"""The root of every exception the package raises: ``except FcdError`` catches ours and nothing else.

One hierarchy, in the manner of ``cryptography.exceptions``: each layer keeps its errors beside the code that raises
them (``data.spec.DataError``, ``aggregation.secagg.errors``, ``privacy.errors``, ``audit.signing``, ...), every one
of them derives from :class:`FcdError`, and no two share a name (``tests/test_errors.py``). Each also keeps the
builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a state that cannot go on), so callers
that catch those keep working.
"""

from __future__ import annotations

__all__ = ["FcdError"]


class FcdError(Exception):
    """An error of fcd_secure (every exception class of the package derives from it)."""
