"""The one number formatter of everything the package prints (tables, reports, Markdown).

Bottom of the package (no project imports), so that every layer that prints (``audit.report``, the HTML report of
``experiments``, the ``fcd`` command) formats a number the same way. The spec is Python's format specification
mini-language (https://docs.python.org/3/library/string.html#formatspec): ``".4f"``, ``"+.3f"``, ``".0%"``,
``"g"``, ``","`` (thousands separators).
"""

from __future__ import annotations

import numbers
from typing import Any

__all__ = ["MISSING", "fmt"]

#: what stands where an answer has no value (JSON ``null``, a part the run did not compute)
MISSING = "n/a"

#: presentation types that turn an integer into a float (``format(3, ".4f") == "3.0000"``)
_FLOAT_TYPES = frozenset("eEfFgGn%")


def fmt(value: Any, spec: str = ".4f", missing: str = MISSING) -> str:
    """``value`` as printed: ``missing`` for None, a real number in ``spec``, anything else as ``str`` gives it.

    A count stays a count: an integer under a float spec (``rounds`` in a column of ``.4f`` figures) is printed whole;
    under an integer spec (``","``, ``"d"``) it takes the spec. Booleans are words, not numbers.
    """
    if value is None:
        return missing
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return str(value)
    if isinstance(value, numbers.Integral) and spec[-1:] in _FLOAT_TYPES:
        return str(value)
    return format(value, spec)
