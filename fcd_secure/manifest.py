"""The Θc / Θs contract: which parameters are shared and which stay on a site (paper §III-A, "Θ = Θc ∪ {Θs_i}").

This module is the bottom of the package: it imports neither torch nor Flower, so secure aggregation, the egress
gate, the audit and the federation all read one typed description of the partition. The model builds it
(:func:`fcd_secure.model.manifest.build_manifest`); everyone else only reads it.

Parts:

* ``theta_c`` (:data:`THETA_C`): shared causal parameters, the only ones DSS synchronises (paper §III-B);
* ``theta_s`` (:data:`THETA_S`): site-local confounding parameters; they never leave a site;
* ``full`` (:data:`FULL`): every parameter but the site-bound ones, the "w/o DSS" full-synchronisation ablation of
  paper Table III.

A Θs entry may be *site-bound* (``ManifestEntry.site_bound``): it stays on its site even under full
synchronisation, because it is the site's model of its own logging policy (the behaviour head of inverse-propensity
weighting, which encodes the logged propensities) and not part of the paper's Θ.

Example:
    >>> m = Manifest.from_entries([ManifestEntry(name="dec.w", shape=(2, 3), dtype="float32", part="theta_c")])
    >>> m.specs("theta_c")
    {'dec.w': ((2, 3), 'float32')}
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from typing import Literal, get_args

import numpy as np
from pydantic import BaseModel, ConfigDict, field_validator, model_validator
from fcd_secure.errors import FcdError

#: A manifest part: one side of the partition, or every parameter but the site-bound ones.
Part = Literal["theta_c", "theta_s", "full"]
#: The side of the partition a single parameter belongs to.
Side = Literal["theta_c", "theta_s"]
THETA_C: Side = "theta_c"
THETA_S: Side = "theta_s"
FULL: Part = "full"
PARTS: tuple[str, ...] = get_args(Part)
SIDES: tuple[str, ...] = get_args(Side)
MANIFEST_VERSION = 1


class ManifestError(FcdError, ValueError):
    """Parameters offered to or requested from a model, or a manifest read from disk, do not match the contract."""


def dtype_name(dtype: object) -> str:
    """Canonical numpy dtype name (``"float32"``) of a numpy or torch dtype, or of its string."""
    text = str(dtype)
    if text.startswith("torch."):
        text = text[len("torch."):]
    try:
        return np.dtype(text).name
    except TypeError:
        return text


def check_part(part: str) -> Part:
    """``part`` if it is one of :data:`PARTS`; :class:`ManifestError` otherwise."""
    if part not in PARTS:
        raise ManifestError(f"unknown part {part!r}; expected one of {PARTS}")
    return part  # type: ignore[return-value]


class ManifestEntry(BaseModel):
    """One parameter tensor: its state_dict name, shape, numpy dtype name, side of the partition and whether it is
    site-bound (a Θs tensor no synchronisation ever sends, :data:`FULL` included)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    name: str
    shape: tuple[int, ...]
    dtype: str
    part: Side
    site_bound: bool = False

    @model_validator(mode="after")
    def _bound_is_site_local(self) -> "ManifestEntry":
        if self.site_bound and self.part != THETA_S:
            raise ValueError(f"{self.name}: only a theta_s entry can be site-bound")
        return self

    @field_validator("dtype", mode="before")
    @classmethod
    def _canonical_dtype(cls, v: object) -> str:
        return dtype_name(v)

    @property
    def size(self) -> int:
        """Number of scalars."""
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 1

    @property
    def nbytes(self) -> int:
        return self.size * np.dtype(self.dtype).itemsize

    def in_part(self, part: Part) -> bool:
        return not self.site_bound if part == FULL else self.part == part


class Manifest(BaseModel):
    """Ordered parameter layout with its partition and ``layout_hash`` (sha256 over the sorted layout).

    Build one with :meth:`from_entries` (the hash is computed) or read one with :meth:`from_json` (the hash is
    checked). Everything that decides what may leave a site asks the manifest, never a list of names of its own.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    version: int = MANIFEST_VERSION
    entries: tuple[ManifestEntry, ...]
    layout_hash: str

    # -- construction ------------------------------------------------------------------------------------------
    @classmethod
    def from_entries(cls, entries: Iterable[ManifestEntry]) -> "Manifest":
        entries = tuple(entries)
        names = [e.name for e in entries]
        if len(set(names)) != len(names):
            raise ManifestError("manifest entries must have unique names")
        return cls(entries=entries, layout_hash=layout_hash(entries))

    @classmethod
    def from_json(cls, text: str | bytes) -> "Manifest":
        """Parse and check the layout hash (a manifest edited on disk is refused)."""
        try:
            m = cls.model_validate_json(text)
        except ValueError as exc:
            raise ManifestError(f"not a manifest ({exc})") from None
        if layout_hash(m.entries) != m.layout_hash:
            raise ManifestError("manifest layout_hash does not match its entries")
        return m

    def to_json(self) -> str:
        return self.model_dump_json()

    # -- queries -----------------------------------------------------------------------------------------------
    def select(self, part: Part = FULL) -> list[ManifestEntry]:
        """Entries of ``part``, in manifest order."""
        check_part(part)
        return [e for e in self.entries if e.in_part(part)]

    def names(self, part: Part = FULL) -> list[str]:
        return [e.name for e in self.select(part)]

    def specs(self, part: Part = FULL) -> dict[str, tuple[tuple[int, ...], str]]:
        """``{name: (shape, dtype)}`` of ``part``, in manifest order."""
        return {e.name: (e.shape, e.dtype) for e in self.select(part)}

    def part_of(self, name: str) -> Side | None:
        """The side ``name`` belongs to, or ``None`` if the manifest does not list it."""
        for e in self.entries:
            if e.name == name:
                return e.part
        return None

    def size(self, part: Part = FULL) -> int:
        """Number of scalars in ``part``."""
        return sum(e.size for e in self.select(part))

    def nbytes(self, part: Part = FULL) -> int:
        return sum(e.nbytes for e in self.select(part))

    def part_hash(self, part: Part) -> str:
        return layout_hash(self.select(part))

    def check_arrays(self, arrays: dict[str, np.ndarray], part: Part) -> None:
        """Raise :class:`ManifestError` unless ``arrays`` holds exactly the entries of ``part`` with their shapes.

        The error names the first missing, unexpected or misshapen tensor (and says when an unexpected one belongs
        to the other side of the partition).
        """
        expect = self.specs(part)
        missing = sorted(set(expect) - set(arrays))
        extra = sorted(set(arrays) - set(expect))
        if missing or extra:
            msg = [f"{part} tensors do not match the manifest"]
            if missing:
                msg.append(f"missing {missing[:5]}{' …' if len(missing) > 5 else ''}")
            if extra:
                msg.append(f"unexpected {extra[:5]}{' …' if len(extra) > 5 else ''}")
                other = [n for n in extra if self.part_of(n) is not None]
                if other:
                    msg.append(f"({len(other)} of them belong to another part)")
            raise ManifestError("; ".join(msg))
        for name, (shape, _dtype) in expect.items():
            if tuple(np.shape(arrays[name])) != shape:
                raise ManifestError(f"{name} has shape {tuple(np.shape(arrays[name]))}, the manifest says {shape}")


def layout_hash(entries: Iterable[ManifestEntry]) -> str:
    """sha256 over the sorted ``name|shape|dtype|part[|site-bound]`` lines (independent of entry order)."""
    lines = sorted(f"{e.name}|{','.join(map(str, e.shape))}|{e.dtype}|{e.part}" + ("|site-bound" if e.site_bound else "")
                   for e in entries)
    payload = json.dumps({"version": MANIFEST_VERSION, "layout": lines}, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()
