"""Which records a privacy budget belongs to: record identities, an order-free dataset fingerprint, "the same data".

DP-SGD's guarantee is per record (one trajectory, add/remove adjacency; Abadi et al. 2016), so a site's ε budget
belongs to its *records*, not to one byte layout of its training table. What counts as the same data here:

* **A record is identified by its raw rows, under the site's secret**: HMAC-SHA256 (RFC 2104; Bellare, Canetti &
  Krawczyk 1996) of the entity id (where the table names its entities) and the digest of the trajectory's *raw*
  values (``fcd_secure.data.records``: taken before the standardiser overwrites them, padding left out), keyed with
  the record secret of the folder that holds the site's ledgers (:func:`record_secret`; :func:`record_ids`). No value
  the coordinator sends enters it: standardisation statistics nudged by 1e-6, or moved by a site joining or one
  patient added anywhere, leave every record's id, so its history, as it was (docs/threats.md P45). Keyed, a ledger's
  list of records does not let someone holding a patient's values confirm that the patient is in it.
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
import hmac
import json
from pathlib import Path

import numpy as np
from pydantic import BaseModel, ConfigDict, Field

from fcd_secure._io import load_or_create_secret
from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.records import raw_records
from fcd_secure.data.schema import SiteDataset
from fcd_secure.privacy.errors import PrivacyLedgerError

__all__ = [
    "RECORD_KEY_HEX",
    "RECORD_SECRET_FILE",
    "SAME_DATA",
    "SKETCH_SIZE",
    "DatasetIdentity",
    "dataset_identity",
    "record_ids",
    "record_keys",
    "record_secret",
    "same_data",
    "shared_fraction",
]

#: Record ids kept in a sketch (the smallest ones): the estimate of shared records has a relative error of ~1/√k.
SKETCH_SIZE = 256
#: Two tables are the same data when their shared records make up at least this fraction of the smaller one.
SAME_DATA = 0.5
#: Hex digits of a record id kept as the key of its ε account (128 bits: no collision among 2^40 records).
RECORD_KEY_HEX = 32
#: the record secret's file in the folder of the site's ledgers (created on first use, mode 0600)
RECORD_SECRET_FILE = "record_secret.key"
_RECORD_TAG = b"fcd_secure.record/2|"
_DATASET_TAG = b"fcd_secure.dataset/3"


class DatasetIdentity(BaseModel):
    """A table's privacy identity: the order-free fingerprint, its record count and the bottom-k record ids.

    ``sketch`` is empty for an identity known by its fingerprint only (then only an equal fingerprint matches).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    fingerprint: str = Field(description="sha256 (hex) of the sorted record ids")
    n: int = Field(ge=0, description="records in the table")
    sketch: tuple[str, ...] = Field(default=(), description="the smallest distinct record ids (hex), sorted")


def record_secret(folder: str | Path) -> bytes:
    """The key of the record ids of the ledgers in ``folder`` (``record_secret.key``, 32 bytes, mode 0600), created
    with the folder's first ledger.

    Raises:
        PrivacyLedgerError: the folder holds ledgers that list records but the secret is gone (a new secret would
            give every record a fresh budget: restore the file from backup).
    """
    folder = Path(folder)
    path = folder / RECORD_SECRET_FILE
    if not path.exists() and any(_lists_records(p) for p in folder.glob("ledger-*.json")):
        raise PrivacyLedgerError(
            f"{folder} holds ledgers of records but no {RECORD_SECRET_FILE}: every record would start a fresh "
            "budget under a new secret; restore the file from backup, or, for ledgers written before the secret "
            "existed, migrate them (fcd site migrate: every record keeps its spend; the site refuses to train "
            "until then)"
        )
    return load_or_create_secret(path, 32)


def _lists_records(ledger: Path) -> bool:
    try:
        return bool(json.loads(ledger.read_text()).get("records"))
    except (OSError, ValueError):
        return True  # unreadable: assume it does (fail closed; the ledger itself refuses to open)


def record_ids(ds: SiteDataset, secret: bytes) -> list[bytes]:
    """Each trajectory's id, in row order: HMAC-SHA256(``secret``, entity id | raw-content digest) (module
    docstring). The entity id enters only where the table names its entities (``meta['entity_names']``); a bare row
    number would move when a row is added before it.

    Raises:
        DataError: ``ds`` is standardised without the digests of its raw records (``data.records.raw_records``).
    """
    digests = raw_records(ds)
    named = ds.meta.get("entity_names") is not None and isinstance(ds.meta.get("entity"), np.ndarray)
    ents = row_ids(ds) if named else [""] * ds.n
    header = _RECORD_TAG + f"{int(ds.n_actions)}|".encode()
    return [hmac.new(secret, header + e.encode() + b"|" + bytes(d), hashlib.sha256).digest()
            for e, d in zip(ents, digests)]


def record_keys(ds: SiteDataset, secret: bytes) -> list[str]:
    """The keys of the table's records in the per-record ε account (:mod:`fcd_secure.privacy.spend`): the first
    :data:`RECORD_KEY_HEX` hex digits of each record id, sorted, without repeats (two equal trajectories are one
    record for the account, so they share one budget: conservative)."""
    return sorted({rid.hex()[:RECORD_KEY_HEX] for rid in record_ids(ds, secret)})


def dataset_identity(ds: SiteDataset, secret: bytes) -> DatasetIdentity:
    """The privacy identity of a site's training table under the record ``secret`` (the propensities P, its name and
    the standardisation are left out)."""
    ids = sorted(record_ids(ds, secret))
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
