"""The Θs a site held in earlier rounds, kept on the site so the egress gate refuses those too.

A Θs tensor that leaves one round late is as private as the current one (paper §III-B: Θs_i never leaves site i),
but the gate can only fingerprint what it is shown. The gate therefore remembers each new Θs version it sees at
check time (the handler commits Θs before its reply leaves, so every version passes through a check) and compares
replies with the last k of them as well (:attr:`~fcd_secure.audit.rules.GatePolicy.theta_s_history_rounds`).

The versions stay on the site, next to the state that already holds the current Θs: one ``.npz`` file written
atomically with mode 0600 (:func:`fcd_secure._io.atomic_write_bytes`) under an inter-process lock, holding at most
``keep`` earlier versions besides the current one. Nothing of it is ever sent or logged.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from fcd_secure._io import FileKept, atomic_write_bytes, file_lock, npz_bytes, read_npz

__all__ = ["THETA_S_HISTORY_FILE", "ThetaSHistory"]

#: Default file name of the history in a site's state (e.g. ``SiteState.slot(THETA_S_HISTORY_FILE)``).
THETA_S_HISTORY_FILE = "theta_s_history.npz"

Version = tuple[str, dict[str, np.ndarray]]  # (digest, Θs), read-only arrays

#: each history file's versions as this process last read or wrote them (:class:`~fcd_secure._io.FileKept`): the
#: gate consults the history on every message, and reading the ``.npz`` and hashing every version again cost each
#: message of a warm site 17 ms (cProfile of a 4-site in-process run); a version another process wrote is read
#: from disk
_VERSIONS: FileKept[list[Version]] = FileKept(16)


def _digest(theta: Mapping[str, np.ndarray]) -> str:
    h = hashlib.sha256()
    for name in sorted(theta):
        a = np.ascontiguousarray(np.asarray(theta[name]))
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
    return h.hexdigest()


class ThetaSHistory:
    """The last versions of a site's Θs, newest first (file-backed, 0600)."""

    def __init__(self, path: str | Path) -> None:
        """Args:
        path: the ``.npz`` file (created on first use).
        """
        self.path = Path(path)

    def _read(self) -> list[Version]:
        """The stored versions with their digests, oldest index first (newest first in time); the caller holds the
        file's lock."""
        if not self.path.exists():
            return []
        return _VERSIONS.get(self.path, self._load)

    def _load(self) -> list[Version]:
        raw = read_npz(self.path)
        versions: dict[int, dict[str, np.ndarray]] = {}
        for key, arr in raw.items():
            idx, _, name = key.partition("/")
            arr.flags.writeable = False
            versions.setdefault(int(idx), {})[name] = arr
        return [(_digest(versions[i]), versions[i]) for i in sorted(versions)]

    def observe(self, current: Mapping[str, np.ndarray], keep: int) -> list[dict[str, np.ndarray]]:
        """Record ``current`` if it is a new version and return the earlier versions, newest first (at most ``keep``).

        Args:
            current: the Θs the gate checks against now.
            keep: how many earlier versions to keep and return (0 keeps none).

        Returns:
            Earlier Θs versions, newest first, none equal to ``current``.
        """
        current = {str(k): np.asarray(v) for k, v in current.items()}
        key = _digest(current) if current else None
        with file_lock(self.path):
            stored = self._read()  # newest first; stored[0] is the version seen last
            before = len(stored)
            new = bool(current) and (not stored or stored[0][0] != key)
            if new:
                kept = {name: np.array(arr) for name, arr in current.items()}  # a copy the caller cannot change
                for arr in kept.values():
                    arr.flags.writeable = False
                stored = [(key, kept)] + stored
            stored = stored[: keep + 1]
            if new or len(stored) != before:
                arrays = {f"{i}/{name}": arr for i, (_, version) in enumerate(stored) for name, arr in version.items()}
                atomic_write_bytes(self.path, npz_bytes(arrays), mode=0o600)
                _VERSIONS.put(self.path, stored)
        return [v for digest, v in stored if digest != key][:keep]
