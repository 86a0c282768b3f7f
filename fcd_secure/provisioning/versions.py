"""The software versions a consortium pins, read from package metadata (nothing is imported: torch stays unloaded)."""

from __future__ import annotations

from importlib import metadata

import fcd_secure

#: the packages whose versions every site must match (the model, the runtime, the tensors, the DP accountant)
PINNED_PACKAGES = ("fcd_secure", "flwr", "torch", "opacus")


def installed_versions() -> dict[str, str]:
    """``{package: version}`` of this environment; ``fcd_secure`` from the package itself, the rest from metadata.

    A package that is not installed reads as ``"not installed"`` (preflight then reports the mismatch).
    """
    out = {"fcd_secure": fcd_secure.__version__}
    for name in PINNED_PACKAGES[1:]:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out
