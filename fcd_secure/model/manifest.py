"""Building the Θc / Θs manifest of a simulator's network, and moving parameters in and out by manifest name.

The contract itself (``Manifest``, ``ManifestEntry``, parts) is :mod:`fcd_secure.manifest`, which every other layer
reads; this module is the only place that knows how the partition maps onto the network (docs/architecture.md;
paper §III-A "Θ = Θc ∪ {Θs_i}"). Entries are the trainable parameters by their state_dict names (stable across
processes: DPGRU keeps nn.GRU's names, and an Opacus ``GradSampleModule`` wrapper's ``_module.`` prefix is stripped).

The partition rule (:func:`part_of`):

* ``theta_c`` — shared causal parameters: action embedding, GRU trunk, K^(c) head, ε_c, decoder, site
  discriminator (the trunk producing K^(c) is shared so ε_c acts in one coordinate system at every site; the
  discriminator is shared because a site sees only its own label, so a local one learns nothing);
* ``theta_s`` — site-local: K^(s) head, ε_s, parallel head, behaviour head (:data:`networks.THETA_S_MODULES`);
  the behaviour head is also *site-bound* (:data:`networks.SITE_BOUND_MODULES`): full synchronisation leaves it on
  the site too.

Another simulator (:mod:`fcd_secure.model.baselines`) passes its own site-local modules as ``theta_s_modules`` (and
``site_bound_modules``).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from fcd_secure.manifest import THETA_C, THETA_S, Manifest, ManifestEntry, ManifestError, Part, Side, check_part
from fcd_secure.model.networks import SITE_BOUND_MODULES, THETA_S_MODULES

__all__ = ["build_manifest", "get_params", "part_of", "set_params"]


def part_of(name: str, theta_s_modules: tuple[str, ...] = THETA_S_MODULES) -> Side:
    """The partition rule: a parameter is Θs iff its top-level module is in ``theta_s_modules``."""
    return THETA_S if name.split(".", 1)[0] in theta_s_modules else THETA_C


def _bare(model: nn.Module) -> nn.Module:
    """The network behind Opacus' ``GradSampleModule`` wrappers (whose ``_module.`` prefix is not a name)."""
    m = model
    while hasattr(m, "_module") and isinstance(m._module, nn.Module):
        m = m._module
    return m


def _named_params(model: nn.Module) -> list[tuple[str, nn.Parameter]]:
    return [(n, p) for n, p in _bare(model).named_parameters() if p.requires_grad]


def build_manifest(
    model: nn.Module,
    theta_s_modules: tuple[str, ...] = THETA_S_MODULES,
    site_bound_modules: tuple[str, ...] = SITE_BOUND_MODULES,
) -> Manifest:
    """The manifest of ``model`` (bare or wrapped by Opacus).

    Args:
        model: the network; a FedCausalDiff by default.
        theta_s_modules: its site-local top-level modules (default: Fed-CausalDiff's).
        site_bound_modules: those of them that not even full synchronisation sends (default: Fed-CausalDiff's).
    """
    entries = []
    for n, p in _named_params(model):
        side = part_of(n, theta_s_modules)
        bound = side == THETA_S and n.split(".", 1)[0] in site_bound_modules
        entries.append(ManifestEntry(name=n, shape=tuple(p.shape), dtype=p.dtype, part=side, site_bound=bound))
    return Manifest.from_entries(entries)


def get_params(
    model: nn.Module,
    part: Part,
    theta_s_modules: tuple[str, ...] = THETA_S_MODULES,
    site_bound_modules: tuple[str, ...] = SITE_BOUND_MODULES,
) -> dict[str, np.ndarray]:
    """Copies of the parameters in ``part`` (the manifest decides), keyed by manifest name, in manifest order.

    Raises:
        ManifestError: for an unknown part.
    """
    keep = set(build_manifest(model, theta_s_modules, site_bound_modules).names(check_part(part)))
    return {n: p.detach().cpu().numpy().copy() for n, p in _named_params(model) if n in keep}


def set_params(
    model: nn.Module,
    part: Part,
    arrays: dict[str, np.ndarray],
    theta_s_modules: tuple[str, ...] = THETA_S_MODULES,
    site_bound_modules: tuple[str, ...] = SITE_BOUND_MODULES,
) -> None:
    """Load ``arrays`` into the parameters of ``part``.

    Strict: the names must be exactly the part's names, every shape must match, values must be finite floating
    point; nothing is written unless everything matches.

    Raises:
        ManifestError: naming the first tensor that does not match.
    """
    manifest = build_manifest(model, theta_s_modules, site_bound_modules)
    keep = set(manifest.names(check_part(part)))
    params = {n: p for n, p in _named_params(model) if n in keep}
    manifest.check_arrays(arrays, part)
    staged: dict[str, torch.Tensor] = {}
    for n, p in params.items():
        a = np.asarray(arrays[n])
        if not np.issubdtype(a.dtype, np.floating):
            raise ManifestError(f"set_params({part}): {n} has dtype {a.dtype}, expected floating point")
        if not np.isfinite(a).all():
            raise ManifestError(f"set_params({part}): {n} holds NaN or inf")
        staged[n] = torch.as_tensor(a, dtype=p.dtype)
    with torch.no_grad():
        for n, p in params.items():
            p.copy_(staged[n])
