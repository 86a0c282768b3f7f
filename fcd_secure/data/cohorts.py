"""Which entities a site trains on, validates on and answers questions on: fixed by the site, from a site secret.

A site's test set decides which patients every answer is computed on, and its training set which patients the
secure preprocessing sums (``data.moments``) and the model see. If a value the *server* sends decided the cut (a seed,
``data.test_fraction``), two runs with test fractions 0.2 and 0.2035 would put one more patient in the test set, and
the difference of their round-0 totals, or of their evaluation sums, would be that one patient's values
(docs/threats.md P40). So the site fixes the assignment itself, once:

* every entity (a patient, a student: all chunks of it together) gets a key ``HMAC-SHA256(secret, entity id)``
  (Bellare, Canetti & Krawczyk 1996, "Keying hash functions for message authentication", CRYPTO; RFC 2104) under a
  secret the site keeps (:func:`site_secret`: ``split_secret.key`` in its state directory, created on first use, mode
  0600). Without the secret the order is unpredictable, so nobody outside the site can aim a cut at a patient;
* the entities, sorted by key, are the site's one fixed order: the **test** set is its first entities (about
  ``test_fraction`` of the rows), the **validation** set the next ones (about ``validation_fraction`` of the rows
  left), the rest is **training** (:func:`split_rows`, applied twice);
* the fractions are the site's (``[split]`` of its policy, ``federation.site_policy``) and are rounded to a grid of
  :data:`FRACTION_GRID` (5 %) here, whatever asks: 0.2 and 0.2035 are one cut. The server's ``data.test_fraction``
  and ``seed`` never reach a deployed site's cut (the policy replaces them: ``SitePolicy.admit``).

The server may ask for a *smaller* evaluation cohort, never a different one: cohorts are nested prefixes of one
fixed order of the test set in steps of the site's minimum cohort (``queries.cohort``).

A simulated site has no disk of its own before the run: its secret is derived from the dataset's seed and its index
(:func:`seeded_secret` of :func:`~fcd_secure.data.partition.site_split_seed`), so a simulation is reproducible and a
test can recompute every cut. The run's seed is then the *dataset's* identity (it also draws the sites and the
world), not a value that moves one patient.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure._io import load_or_create_secret
from fcd_secure.data.spec import DataError

__all__ = [
    "FRACTION_GRID", "SECRET_FILE", "entity_keys", "grid_fraction", "row_ids", "row_ids_from_meta", "seeded_secret",
    "site_secret", "split_rows",
]

#: split fractions are multiples of this (5 % of a site's rows): two requests closer than that are one cut
FRACTION_GRID = 0.05
#: the file of a deployed site's split secret inside its state directory
SECRET_FILE = "split_secret.key"
_DOMAIN = b"fcd_secure.split/1|"


def grid_fraction(fraction: float, lo: float = FRACTION_GRID) -> float:
    """``fraction`` rounded to the :data:`FRACTION_GRID`, within ``[lo, 1 - grid]`` (0 stays 0 when ``lo`` is 0)."""
    steps = round(float(fraction) / FRACTION_GRID)
    return float(min(max(steps * FRACTION_GRID, lo), 1.0 - FRACTION_GRID))


def seeded_secret(seed: int) -> bytes:
    """The split secret of a *simulated* site whose split seed is ``seed`` (module docstring)."""
    return hashlib.sha256(b"fcd_secure.simulated-site-secret/1|" + str(int(seed)).encode()).digest()


def site_secret(state_dir: str | Path) -> bytes:
    """A deployed site's split secret: 32 bytes from the OS CSPRNG in ``<state_dir>/split_secret.key`` (mode 0600),
    created on first use (the site's first run) and never changed afterwards.

    Raises:
        SecretFileError: the file exists but is not a 32-byte secret (a damaged file must not silently become a new
            cut: restore it from backup; a new secret would be a new split whose answers could be differenced).
    """
    return load_or_create_secret(Path(state_dir) / SECRET_FILE, 32)


def row_ids_from_meta(meta: Mapping[str, Any], n: int) -> list[str]:
    """The entity id of each of ``n`` rows: ``entity_names[entity]``, else the entity code, else the row number (each
    row its own entity). ``meta['entity']`` is the one key of a row's entity, whatever the world."""
    ent, names = meta.get("entity"), meta.get("entity_names")
    if isinstance(ent, np.ndarray) and ent.shape == (n,):
        if names is not None:
            return [str(names[int(e)]) for e in ent]
        return [f"entity-{int(e)}" for e in ent]
    return [str(i) for i in range(n)]


def row_ids(ds: Any) -> list[str]:
    """:func:`row_ids_from_meta` of a dataset (one id per row; chunks of one entity share it)."""
    return row_ids_from_meta(ds.meta, int(ds.n))


def entity_keys(secret: bytes, ids: Sequence[str]) -> np.ndarray:
    """``HMAC-SHA256(secret, id)``'s first 8 bytes as unsigned integers, one per id (uint64)."""
    out = np.empty(len(ids), dtype=np.uint64)
    for i, e in enumerate(ids):
        out[i] = int.from_bytes(hmac.new(secret, _DOMAIN + str(e).encode(), hashlib.sha256).digest()[:8], "big")
    return out


def split_rows(ids: Sequence[str], fraction: float, secret: bytes) -> tuple[np.ndarray, np.ndarray]:
    """``(rest, picked)``, sorted row indices: ``picked`` holds the first entities of the site's key order until
    about ``grid_fraction(fraction)`` of the rows are taken (whole entities; at least one row on each side).

    Raises:
        DataError: fewer than 2 rows.
    """
    n = len(ids)
    if n < 2:
        raise DataError(f"{n} trajectory cannot be split into two sides")
    codes, first = np.unique(np.asarray(ids, dtype=object).astype(str), return_inverse=True)
    if len(codes) == 1:  # one entity only: its trajectories are the units
        codes, first = np.array([f"{codes[0]}#{i}" for i in range(n)]), np.arange(n)
    sizes = np.bincount(first, minlength=len(codes))
    keys = entity_keys(secret, list(codes))
    order = np.lexsort((codes, keys))  # by key; the id breaks a (2^-64) tie
    target = min(max(1, int(round(grid_fraction(fraction) * n))), n - 1)
    picked: list[int] = []
    count = 0
    for g in order:
        if count >= target:
            break
        if count + sizes[g] <= target or not picked:
            if count + sizes[g] >= n:  # never everything on one side
                continue
            picked.append(int(g))
            count += int(sizes[g])
    is_picked = np.isin(first, picked)
    return np.flatnonzero(~is_picked), np.flatnonzero(is_picked)
