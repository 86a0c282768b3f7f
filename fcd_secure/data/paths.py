"""Where the real datasets are read from: the one rule for the data folder, and the checks every loader makes.

The folder is resolved once, here, for every command and API (``fcd run``, ``fcd data describe``, ``fcd ablate``,
``load_federated``, the DKT oracle's training script), in this order:

1. an explicit folder (``--data-dir`` on the command line, ``data_dir=`` in the API, ``data.data_dir`` in a run
   config);
2. ``$FCD_DATA_DIR``;
3. ``../shared/data`` next to the project root, when the package runs from a source checkout (the root holds
   ``pyproject.toml``) and that folder exists. An installed package has no such default: its "project root" would be
   ``site-packages`` and the folder would resolve inside the virtual environment.

A folder named by 1 or 2 that does not exist is an error naming it (never a silent fall-back to the next rule).

The shipped target policies are found by :func:`policy_dir` in either layout: ``fcd_secure/policies/`` inside an
installed wheel (the build copies the top-level ``policies/`` there), else the source tree's top-level ``policies/``.
"""

from __future__ import annotations

import os
from pathlib import Path

import fcd_secure
from fcd_secure.data.spec import DataError

__all__ = [
    "DATA_DIR_ENV",
    "PROJECT_ROOT",
    "dataset_folder",
    "default_data_dir",
    "is_source_checkout",
    "need_file",
    "policy_dir",
]

#: The folder holding ``fcd_secure/``, ``policies/`` and ``tests/``.
PROJECT_ROOT = Path(fcd_secure.__file__).resolve().parents[1]
#: Environment variable naming the data folder (rule 2).
DATA_DIR_ENV = "FCD_DATA_DIR"
#: Where an installed wheel keeps the policies (the build copies the top-level ``policies/`` here).
PACKAGED_POLICIES = Path(fcd_secure.__file__).resolve().parent / "policies"


def is_source_checkout() -> bool:
    """Whether the package runs from its source tree (``pyproject.toml`` beside ``fcd_secure/``), not installed."""
    return (PROJECT_ROOT / "pyproject.toml").is_file()


def policy_dir() -> Path:
    """The folder of the shipped policies: ``fcd_secure/policies`` of an installed wheel, else ``policies/`` of the
    source tree (module docstring)."""
    return PACKAGED_POLICIES if PACKAGED_POLICIES.is_dir() else PROJECT_ROOT / "policies"


def default_data_dir(data_dir: str | os.PathLike[str] | None = None) -> Path:
    """The data folder: ``data_dir`` if given, else ``$FCD_DATA_DIR``, else ``../shared/data`` (module docstring).

    Args:
        data_dir: An explicit folder (``--data-dir``); ``None`` falls through to the environment and the default.

    Returns:
        The folder, which exists.

    Raises:
        DataError: The chosen folder does not exist; the message names it and says which rule chose it, or lists
            everything that was tried.
    """
    if data_dir is not None:
        path = Path(data_dir)
        if not path.is_dir():
            raise DataError("data folder given with --data-dir (data_dir) does not exist", file=path)
        return path
    env = os.environ.get(DATA_DIR_ENV)
    if env:
        path = Path(env)
        if not path.is_dir():
            raise DataError(f"data folder named by ${DATA_DIR_ENV} does not exist", file=path)
        return path
    fallback = PROJECT_ROOT.parent / "shared" / "data"
    if is_source_checkout() and fallback.is_dir():
        return fallback
    tried = f"{fallback} does not exist" if is_source_checkout() else "an installed package has no default folder"
    raise DataError(
        f"no data folder: --data-dir (data_dir) not given, ${DATA_DIR_ENV} not set, and {tried}; "
        f"pass --data-dir DIR or set {DATA_DIR_ENV}",
        file=fallback if is_source_checkout() else None,
    )


def dataset_folder(data_dir: str | os.PathLike[str] | None, sub: str | os.PathLike[str]) -> Path:
    """The folder ``sub`` of one dataset inside the data folder (:func:`default_data_dir` of ``data_dir``).

    Raises:
        DataError: The data folder or ``sub`` inside it does not exist; the message names both.
    """
    base = default_data_dir(data_dir)
    path = base / sub
    if not path.is_dir():
        raise DataError(f"dataset folder '{sub}' not found under {base}; pass the right --data-dir", file=path)
    return path


def need_file(path: Path) -> Path:
    """``path`` itself, after checking that the file exists.

    Raises:
        DataError: The file is missing; the message names it.
    """
    if not path.is_file():
        raise DataError("expected data file is missing", file=path)
    return path
