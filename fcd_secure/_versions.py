"""The one place versions are looked up: package metadata, nothing imported (torch and Flower stay unloaded).

Used by ``summary.json`` (``apps.outputs.versions``), the privacy report (``privacy.report``, its ``libraries``), and
the versions a consortium pins and a site's preflight compares (``provisioning.versions``). Each consumer names its
packages in the order it has always written them; the ones that wrote their own lookup before differ only in how a
missing package reads (``missing=``).
"""

from __future__ import annotations

import platform
from collections.abc import Iterable
from importlib import metadata

import fcd_secure

__all__ = ["NOT_INSTALLED", "PYTHON", "installed_versions"]

#: what a package that is not installed reads as (unless the caller passes ``missing=``)
NOT_INSTALLED = "not installed"
#: the name that stands for the interpreter's own version
PYTHON = "python"


def installed_versions(names: Iterable[str], *, missing: str = NOT_INSTALLED) -> dict[str, str]:
    """``{name: version}`` for ``names``, in their order: ``fcd_secure`` is this package's own ``__version__``,
    ``python`` (:data:`PYTHON`) the interpreter's, every other name its installed distribution's metadata
    (``importlib.metadata``; the package is not imported); a distribution that is not installed reads ``missing``."""
    out: dict[str, str] = {}
    for name in names:
        if name == "fcd_secure":
            out[name] = fcd_secure.__version__
        elif name == PYTHON:
            out[name] = platform.python_version()
        else:
            try:
                out[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                out[name] = missing
    return out
