"""The one place versions are looked up: package metadata, nothing imported (torch and Flower stay unloaded).

Used by ``summary.json`` (``apps.outputs.versions``), the privacy report, and the versions a consortium pins and a
site's preflight compares (``provisioning.versions``).
"""

from __future__ import annotations

import platform
from importlib import metadata

import fcd_secure

__all__ = ["NOT_INSTALLED", "installed_versions"]

#: what a package that is not installed reads as
NOT_INSTALLED = "not installed"


def installed_versions(packages: tuple[str, ...] | list[str], *, python: bool = False) -> dict[str, str]:
    """``{package: version}`` for ``packages`` (``fcd_secure`` is this package's own ``__version__``, the rest from
    their installed metadata; a missing one reads :data:`NOT_INSTALLED`), and ``python`` when asked."""
    out: dict[str, str] = {}
    for name in packages:
        if name == "fcd_secure":
            out[name] = fcd_secure.__version__
            continue
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = NOT_INSTALLED
    if python:
        out["python"] = platform.python_version()
    return out
