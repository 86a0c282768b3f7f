"""The root of every exception the package raises: ``except FcdError`` catches ours and nothing else.

One hierarchy, in the manner of ``cryptography.exceptions``: each layer keeps its errors beside the code that raises
them (``data.spec.DataError``, ``aggregation.secagg.errors``, ``privacy.errors``, ``audit.signing``, ...), every one
of them derives from :class:`FcdError`, and no two share a name (``tests/test_errors.py``). Each also keeps the
builtin base it always had (``ValueError`` for bad input, ``RuntimeError`` for a state that cannot go on), so callers
that catch those keep working.
"""

from __future__ import annotations

import difflib
import typing
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # pragma: no cover - only the annotation; the callers hold the pydantic error
    from pydantic import BaseModel, ValidationError

__all__ = ["FcdError", "first_invalid", "invalid_field"]


class FcdError(Exception):
    """An error of fcd_secure (every exception class of the package derives from it)."""


def _models_in(annotation: Any) -> list[type]:
    """The pydantic models an annotation holds (through ``Annotated``, ``Union``, ``Optional``, ``list``, ``dict``)."""
    from pydantic import BaseModel  # noqa: PLC0415 (pydantic is loaded by whoever holds a ValidationError)

    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    return [m for arg in typing.get_args(annotation) for m in _models_in(arg)]


def _keys_at(model: "type[BaseModel]", loc: tuple) -> list[str]:
    """The field names a document may hold at ``loc`` of ``model``. A part that is no field is a tag pydantic
    inserts (a discriminated union's value, a list index): it picks the union members whose ``Literal`` fields
    hold it, or is passed over."""
    models: list[type] = [model]
    for part in loc:
        fields = [m.model_fields[part] for m in models if isinstance(part, str) and part in m.model_fields]
        if fields:
            models = [m for f in fields for m in _models_in(f.annotation)]
            continue
        tagged = [m for m in models if any(typing.get_origin(f.annotation) is typing.Literal
                                           and part in typing.get_args(f.annotation)
                                           for f in m.model_fields.values())]
        models = tagged or models
    return sorted({k for m in models for k in m.model_fields})


def invalid_field(exc: ValidationError, model: "type[BaseModel] | None" = None) -> tuple[tuple, str]:
    """Where and why a pydantic validation failed: the location of the error to report and its message (pydantic
    docs, "Validation Errors": ``ValidationError.errors()`` lists ``loc``, ``type`` and ``msg`` per error).

    A key the model does not have (``extra_forbidden``) is reported first, whatever else failed, since it is
    usually a typo whose consequence is the other errors (``acton`` leaves ``action`` missing): the message names
    the key and the closest valid one at that place (a missing sibling first, else any field of ``model`` there).
    Otherwise the first error, with the count of the others.
    """
    errs = exc.errors()
    extra = next((e for e in errs if e["type"] == "extra_forbidden"), None)
    if extra is None:
        more = f" (and {len(errs) - 1} more)" if len(errs) > 1 else ""
        return tuple(errs[0]["loc"]), f"{errs[0]['msg']}{more}"
    loc = tuple(extra["loc"])
    key, parent = str(loc[-1]), loc[:-1]
    missing = [str(e["loc"][-1]) for e in errs if e["type"] == "missing" and tuple(e["loc"][:-1]) == parent]
    valid = _keys_at(model, parent) if model is not None else []
    close = (difflib.get_close_matches(key, missing, n=1, cutoff=0.6)
             or difflib.get_close_matches(key, valid, n=1, cutoff=0.6))
    near = (f"; did you mean '{close[0]}'?" if close
            else f"; valid keys here: {', '.join(valid)}" if valid else "")
    return loc, f"unknown key '{key}'{near}"


def first_invalid(exc: ValidationError, top: str = "", model: "type[BaseModel] | None" = None) -> tuple[str, str]:
    """:func:`invalid_field` as a dotted location (``top`` when the error is the document's own, with no location)
    and a message, for an error message that names the field."""
    loc, msg = invalid_field(exc, model)
    return ".".join(str(p) for p in loc) or top, msg
