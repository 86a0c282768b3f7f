"""The Θc / Θs partition, declared once (DESIGN.md "Layers"; paper §III-A "Θ = Θc ∪ {Θs_i}").

The model produces the manifest; DSS, secure aggregation, the egress gate and the audit read it. Entries are the
trainable parameters by their state_dict names (stable across processes: DPGRU keeps nn.GRU's names, and an
Opacus ``GradSampleModule`` wrapper's ``_module.`` prefix is stripped).

Parts:

* ``theta_c`` — shared causal parameters: action embedding, GRU trunk, K^(c) head, ε_c, decoder, site
  discriminator (trap 1: the trunk producing K^(c) is shared so ε_c acts in one coordinate system; trap 2: the
  discriminator is shared so it can learn more than one label);
* ``theta_s`` — site-local: K^(s) head, ε_s, parallel head (:data:`networks.THETA_S_MODULES`);
* ``full`` — every trainable parameter (the w/o-DSS "full sync" ablation).
"""

from __future__ import annotations

import hashlib
import json
from typing import Literal

import numpy as np
import torch
from pydantic import BaseModel, ConfigDict
from torch import nn

from fcd_secure.model.networks import THETA_S_MODULES, unwrap

Part = Literal["theta_c", "theta_s", "full"]
PARTS: tuple[str, ...] = ("theta_c", "theta_s", "full")
MANIFEST_VERSION = 1


class ManifestError(ValueError):
    """Parameters offered to or requested from a model do not match its manifest."""


class ManifestEntry(BaseModel):
    model_config = ConfigDict(frozen=True)
    name: str
    shape: tuple[int, ...]
    dtype: str
    part: Literal["theta_c", "theta_s"]

    @property
    def size(self) -> int:
        return int(np.prod(self.shape)) if self.shape else 1


class Manifest(BaseModel):
    """Ordered parameter layout with its partition and ``layout_hash`` (sha256 over the sorted layout)."""

    model_config = ConfigDict(frozen=True)
    version: int = MANIFEST_VERSION
    entries: tuple[ManifestEntry, ...]
    layout_hash: str

    def names(self, part: Part = "full") -> list[str]:
        _check_part(part)
        return [e.name for e in self.entries if part == "full" or e.part == part]

    def select(self, part: Part = "full") -> list[ManifestEntry]:
        _check_part(part)
        return [e for e in self.entries if part == "full" or e.part == part]

    def size(self, part: Part = "full") -> int:
        """Number of scalars in ``part``."""
        return sum(e.size for e in self.select(part))

    def nbytes(self, part: Part = "full") -> int:
        return sum(e.size * np.dtype(e.dtype).itemsize for e in self.select(part))

    def part_hash(self, part: Part) -> str:
        return _hash([e for e in self.select(part)])

    def to_json(self) -> str:
        return self.model_dump_json()

    @classmethod
    def from_json(cls, text: str) -> "Manifest":
        m = cls.model_validate_json(text)
        if _hash(list(m.entries)) != m.layout_hash:
            raise ManifestError("manifest layout_hash does not match its entries")
        return m


def _check_part(part: str) -> None:
    if part not in PARTS:
        raise ManifestError(f"unknown part {part!r}; expected one of {PARTS}")


def _hash(entries: list[ManifestEntry]) -> str:
    lines = sorted(f"{e.name}|{','.join(map(str, e.shape))}|{e.dtype}|{e.part}" for e in entries)
    payload = json.dumps({"version": MANIFEST_VERSION, "layout": lines}, separators=(",", ":"))
    return hashlib.sha256(payload.encode()).hexdigest()


def part_of(name: str) -> Literal["theta_c", "theta_s"]:
    """The partition rule: a parameter is Θs iff its top-level module is in THETA_S_MODULES."""
    return "theta_s" if name.split(".", 1)[0] in THETA_S_MODULES else "theta_c"


def _named_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in unwrap(model).named_parameters() if p.requires_grad]


def build_manifest(model: nn.Module) -> Manifest:
    """The manifest of ``model`` (a FedCausalDiff, bare or wrapped by Opacus)."""
    entries = tuple(
        ManifestEntry(name=n, shape=tuple(p.shape), dtype=str(p.detach().numpy().dtype), part=part_of(n))
        for n, p in _named_params(model)
    )
    return Manifest(entries=entries, layout_hash=_hash(list(entries)))


def get_params(model: nn.Module, part: Part) -> dict[str, np.ndarray]:
    """Copies of the parameters in ``part``, keyed by manifest name, in manifest order."""
    _check_part(part)
    return {
        n: p.detach().cpu().numpy().copy()
        for n, p in _named_params(model)
        if part == "full" or part_of(n) == part
    }


def set_params(model: nn.Module, part: Part, arrays: dict[str, np.ndarray]) -> None:
    """Load ``arrays`` into the parameters of ``part``. Strict: the names must be exactly the part's names and every
    shape must match; nothing is written unless everything matches."""
    _check_part(part)
    params = {n: p for n, p in _named_params(model) if part == "full" or part_of(n) == part}
    missing = sorted(set(params) - set(arrays))
    extra = sorted(set(arrays) - set(params))
    if missing or extra:
        msg = [f"set_params({part}): names do not match the manifest"]
        if missing:
            msg.append(f"missing {missing[:5]}{' …' if len(missing) > 5 else ''}")
        if extra:
            other = [n for n in extra if n in dict(_named_params(model))]
            msg.append(f"unexpected {extra[:5]}{' …' if len(extra) > 5 else ''}")
            if other:
                msg.append(f"({len(other)} of them belong to another part)")
        raise ManifestError("; ".join(msg))
    staged: dict[str, torch.Tensor] = {}
    for n, p in params.items():
        a = np.asarray(arrays[n])
        if tuple(a.shape) != tuple(p.shape):
            raise ManifestError(f"set_params({part}): {n} has shape {tuple(a.shape)}, manifest says {tuple(p.shape)}")
        if not np.issubdtype(a.dtype, np.floating):
            raise ManifestError(f"set_params({part}): {n} has dtype {a.dtype}, expected floating point")
        if not np.isfinite(a).all():
            raise ManifestError(f"set_params({part}): {n} holds NaN or inf")
        staged[n] = torch.as_tensor(a, dtype=p.dtype)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(staged[n])
