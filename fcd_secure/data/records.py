"""What one record (trajectory) is before any preprocessing that depends on other sites: its raw-content digest.

DP-SGD's guarantee is per record (add/remove one trajectory; Abadi et al. 2016, "Deep learning with differential
privacy", CCS), so the site's ε account (``fcd_secure.privacy.identity``) must know a record again in every run. The
values a site trains on are z-scored with the consortium's statistics (``data.moments``, or the pooled
:class:`~fcd_secure.data.preprocess.Standardizer` of a simulation), which move whenever the coordinator sends other
numbers or any site's membership changes; a record keyed by its standardised values would be a new record each time
(docs/threats.md P45). So each row's digest is taken over its **raw** values, once, before the standardiser
overwrites them, and travels with the row in ``meta[RAW_RECORD_KEY]`` (a per-row array: ``SiteDataset.subset``
slices it with its rows).

The digest is the sha256 of the trajectory's valid steps: X, and A, T, Y at the steps its mask M marks valid, with
their step indices and dtypes (padding is left out, so a table padded to another length keeps its digests). It is
never written to disk as such: the privacy layer keys it, with the entity id, under a secret of the site's.
"""

from __future__ import annotations

import hashlib

import numpy as np

from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

__all__ = ["RAW_RECORD_KEY", "raw_record_digests", "raw_records"]

#: the per-row meta entry holding each row's raw-content digest (``S32``), set when a dataset is standardised
RAW_RECORD_KEY = "raw_record"
_TAG = b"fcd_secure.raw-record/1"


def raw_record_digests(ds: SiteDataset) -> np.ndarray:
    """The sha256 of each trajectory's current values (module docstring), ``S32`` ``[n]``, in row order."""
    dtypes = "|".join(a.dtype.str for a in (ds.X, ds.A, ds.T, ds.Y))
    header = _TAG + f"|{int(ds.n_actions)}|{dtypes}|".encode()
    X, A, T, Y = (np.ascontiguousarray(a) for a in (ds.X, ds.A, ds.T, ds.Y))
    valid = np.asarray(ds.M) > 0
    out = np.empty(ds.n, dtype="S32")
    for i in range(ds.n):
        steps = np.flatnonzero(valid[i])
        h = hashlib.sha256(header)
        h.update(steps.astype("<i8").tobytes())
        h.update(X[i].tobytes())
        h.update(np.ascontiguousarray(A[i, steps]).tobytes())
        h.update(np.ascontiguousarray(T[i, steps]).tobytes())
        h.update(np.ascontiguousarray(Y[i, steps]).tobytes())
        out[i] = h.digest()
    return out


def raw_records(ds: SiteDataset) -> np.ndarray:
    """Each row's raw-content digest: the one recorded before standardisation, or, for a dataset never standardised,
    the digest of its values as they are.

    Raises:
        DataError: ``ds`` is standardised and carries no raw digests (its raw values are gone: no record identity
            that the statistics cannot move).
    """
    kept = ds.meta.get(RAW_RECORD_KEY)
    if isinstance(kept, np.ndarray) and kept.shape == (ds.n,):
        return kept
    if ds.meta.get("standardization") is not None:
        raise DataError(f"{ds.name}: standardised without the digests of its raw records; a record's identity must "
                        "not depend on the standardisation statistics")
    return raw_record_digests(ds)
