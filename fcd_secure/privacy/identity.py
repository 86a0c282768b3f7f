"""Which records a privacy budget belongs to: record identities, an order-free dataset fingerprint, "the same data".

DP-SGD's guarantee is per record (one trajectory, add/remove adjacency; Abadi et al. 2016), so a site's ε budget
belongs to its *records*, not to one byte layout of its training table. What counts as the same data here:

* **A record is identified by its content**: the sha256 of one trajectory's valid steps (X, and A, T, Y at the
  steps its mask M marks valid, with their step indices and dtypes; :func:`record_ids`). Padding is left out, so a
  table padded to another length (e.g. after its longest trajectory was dropped) keeps its record ids. The data
  carry no stable entity ids (students are record positions, Diabetes-130's ``patient_nbr`` is factorised), so the
  content is the only identity that survives a reload.
* **The fingerprint** (:attr:`DatasetIdentity.fingerprint`) hashes the sorted multiset of record ids: row order
  does not change it, any change of a record's content does.
* **The same data** (:func:`same_data`): two tables whose shared records make up at least :data:`SAME_DATA` of the
  smaller one. Estimated from bottom-k sketches of the record ids (Broder 1997, "On the resemblance and containment
  of documents"; Cohen & Kaplan 2007, bottom-k sketches), exact for tables of at most :data:`SKETCH_SIZE` records.
  A reordered table, one with a record dropped or added, and a subset or superset of a ledgered table therefore
  keep its budget; a table that shares fewer records gets its own.

Limits: records edited value by value are new records (a DP guarantee is about records as released, and an edited
record is one the ledger has not seen); two tables that share less than half their records keep separate budgets,
although their shared records compose across both.
"""

from __future__ import annotations

import hashlib

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fcd_secure.data.schema import SiteDataset

__all__ = [
    "RECORD_KEY_HEX",
    "SAME_DATA",
    "SKETCH_SIZE",
    "DatasetIdentity",
    "dataset_identity",
    "record_ids",
    "record_keys",
    "same_data",
    "shared_fraction",
]

#: Record ids kept in a sketch (the smallest ones): the estimate of shared records has a relative error of ~1/√k.
SKETCH_SIZE = 256
#: Two tables are the same data when their shared records make up at least this fraction of the smaller one.
SAME_DATA = 0.5
#: Hex digits of a record id kept as the key of its ε account (128 bits: no collision among 2^40 records).
RECORD_KEY_HEX = 32
_RECORD_TAG = b"fcd_secure.record/1"
_DATASET_TAG = b"fcd_secure.dataset/2"


class DatasetIdentity(BaseModel):
    """A table's privacy identity: the order-free fingerprint, its record count and the bottom-k record ids.

    ``sketch`` is empty for an identity known by its fingerprint only (then only an equal fingerprint matches).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fingerprint: str = Field(description="sha256 (hex) of the sorted record ids")
    n: int = Field(ge=0, description="records in the table")
    sketch: tuple[str, ...] = Field(default=(), description="the smallest distinct record ids (hex), sorted")


def record_ids(ds: SiteDataset) -> list[bytes]:
    """The sha256 of each trajectory's content, in row order (see the module docstring for what is hashed)."""
    header = _RECORD_TAG + f"|{int(ds.n_actions)}|{ds.X.dtype.str}|{ds.A.dtype.str}|{ds.T.dtype.str}|{ds.Y.dtype.str}|".encode()
    X, A, T, Y = (np.ascontiguousarray(a) for a in (ds.X, ds.A, ds.T, ds.Y))
    valid = np.asarray(ds.M) > 0
    out = []
    for i in range(ds.n):
        steps = np.flatnonzero(valid[i])
        h = hashlib.sha256(header)
        h.update(steps.astype("<i8").tobytes())
        h.update(X[i].tobytes())
        h.update(np.ascontiguousarray(A[i, steps]).tobytes())
        h.update(np.ascontiguousarray(T[i, steps]).tobytes())
        h.update(np.ascontiguousarray(Y[i, steps]).tobytes())
        out.append(h.digest())
    return out


def record_keys(ds: SiteDataset) -> list[str]:
    """The keys of the table's records in the per-record ε account (:mod:`fcd_secure.privacy.spend`): the first
    :data:`RECORD_KEY_HEX` hex digits of each record id, sorted, without repeats (two equal trajectories are one
    record for the account, so they share one budget: conservative)."""
    return sorted({rid.hex()[:RECORD_KEY_HEX] for rid in record_ids(ds)})


def dataset_identity(ds: SiteDataset) -> DatasetIdentity:
    """The privacy identity of a site's training table (the propensities P, its name and meta are left out)."""
    ids = sorted(record_ids(ds))
    h = hashlib.sha256(_DATASET_TAG + f"|{int(ds.n_actions)}|{len(ids)}|".encode())
    for rid in ids:
        h.update(rid)
    sketch = tuple(r.hex() for r in sorted(set(ids))[:SKETCH_SIZE])
    return DatasetIdentity(fingerprint=h.hexdigest(), n=len(ids), sketch=sketch)


def shared_fraction(a: DatasetIdentity, b: DatasetIdentity) -> float:
    """Estimated fraction of the smaller table's records that the other table holds too (0 … 1).

    With bottom-k sketches S_A, S_B, the k smallest ids of S_A ∪ S_B are the k smallest of A ∪ B, and an id among
    them is in A exactly when it is in S_A; so the share of those in both estimates the Jaccard index J, and
    |A ∩ B| = J (|A| + |B|) / (1 + J).
    """
    if a.fingerprint == b.fingerprint:
        return 1.0
    if not a.sketch or not b.sketch or not a.n or not b.n:
        return 0.0
    sa, sb = set(a.sketch), set(b.sketch)
    union = sorted(sa | sb)[:SKETCH_SIZE]
    jaccard = sum(1 for x in union if x in sa and x in sb) / len(union)
    shared = jaccard * (a.n + b.n) / (1.0 + jaccard)
    return min(1.0, shared / min(a.n, b.n))


def same_data(a: DatasetIdentity, b: DatasetIdentity) -> bool:
    """Whether ``a`` and ``b`` are the same data for the privacy budget (shared records ≥ :data:`SAME_DATA`)."""
    return shared_fraction(a, b) >= SAME_DATA
