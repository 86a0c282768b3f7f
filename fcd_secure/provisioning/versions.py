"""The software versions a consortium pins, read from package metadata (nothing is imported: torch stays unloaded)."""

from __future__ import annotations

from fcd_secure._versions import installed_versions as package_versions

#: the packages whose versions every site must match (the model, the runtime, the tensors, the DP accountant)
PINNED_PACKAGES = ("fcd_secure", "flwr", "torch", "opacus")


def installed_versions() -> dict[str, str]:
    """``{package: version}`` of :data:`PINNED_PACKAGES` in this environment (``fcd_secure._versions``); a package
    that is not installed reads as ``"not installed"`` (preflight then reports the mismatch)."""
    return package_versions(PINNED_PACKAGES)
