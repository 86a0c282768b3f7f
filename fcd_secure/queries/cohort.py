"""Which test rows a site evaluates: chosen by the site, never fewer than its minimum cohort, never differenceable.

Federated evaluation sends sums over a site's test trajectories (``queries.evaluation``). If the server could
choose the rows, asking for 1, 2 and 3 rows and subtracting would give one patient's outcomes, true effect and
logged propensities exactly (docs/threats.md P22). So the server's ``max-rows`` is only a request:

* rows come from one fixed permutation of the test split, seeded by the site's identity and the split itself
  (its entities and logged records; never by anything the server sends, and the split is the site's own fixed cut,
  ``data.cohorts``), and an evaluation covers a prefix of it;
* with ``n`` test rows and ``m = min(min_cohort, n)``, a cohort has one of the sizes ``n, n - m, n - 2m, ... >= m``:
  the request is raised to the smallest such size that covers it. Any two cohorts then differ by a multiple of
  ``m`` rows, so no difference of two answers is about fewer than ``m`` rows; a split smaller than
  :data:`~fcd_secure.federation.site_policy.MIN_COHORT_FLOOR` rows is not evaluated at all;
* the site keeps a small record (``slots/eval_cohorts.json``: cohort sizes and how often each was evaluated, per
  test split) and refuses a cohort closer than ``m`` rows to one evaluated before (a policy changed in between)
  or one evaluated ``max_repeats`` times already.

Refusals are :class:`~fcd_secure.audit.Refusal` with rule ``eval_cohort`` (key ``min_rows``, ``overlap`` or
``repeats``); the egress gate records them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.audit import Refusal
from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR, EvaluationPolicy

COHORT_SLOT = "eval_cohorts.json"
RULE = "eval_cohort"


def entity_count(ds) -> int:
    """How many entities (patients, students) the rows of ``ds`` hold: its ``entity`` ids, else one per row."""
    ent = ds.meta.get("entity")
    return int(len(np.unique(ent))) if isinstance(ent, np.ndarray) and ent.shape == (ds.n,) else int(ds.n)


def split_fingerprint(ds, site_id: str) -> str:
    """SHA-256 of a test split's entities (their ids, :func:`fcd_secure.data.cohorts.row_ids`), its logged actions,
    outcomes and mask, and the site id: the key of its record and the seed of its permutation. The covariates and
    contexts are left out on purpose: they are z-scored with the consortium's statistics, which move whenever any
    site's data do, and a new scaling of the same patients must not open a fresh record (P40)."""
    from fcd_secure.data.cohorts import row_ids  # noqa: PLC0415

    h = hashlib.sha256(b"fcd_secure.eval_cohort/2|" + site_id.encode())
    h.update("\n".join(row_ids(ds)).encode())
    for key in ("T", "Y", "M"):
        arr = np.ascontiguousarray(getattr(ds, key))
        h.update(f"|{key}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


def cohort_size(n: int, requested: int | None, policy: EvaluationPolicy) -> int:
    """The number of rows a request for ``requested`` rows (``None``: all) is answered with (module docstring).

    Raises:
        Refusal: ``eval_cohort``/``min_rows`` when the split has fewer than ``MIN_COHORT_FLOOR`` rows.
    """
    if n < MIN_COHORT_FLOOR:
        raise Refusal(RULE, "config", "min_rows")
    m = min(policy.min_cohort, n)
    target = n if requested is None else min(n, max(int(requested), m))
    j = (n - target) // m
    return n - j * m


def cohort_rows(n: int, k: int, fingerprint: str) -> np.ndarray:
    """The first ``k`` rows of the split's fixed permutation, sorted (row indices into the test split)."""
    seed = np.random.SeedSequence(int(fingerprint[:32], 16))
    perm = np.random.default_rng(seed).permutation(n)
    return np.sort(perm[:k]).astype(np.int64)


class CohortRecord:
    """The site's record of evaluated cohort sizes per test split (``slots/eval_cohorts.json``)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    def _read(self) -> dict:
        if not self.path.exists():
            return {}
        try:
            doc = json.loads(self.path.read_text())
        except ValueError:
            # an unreadable record must not reset the site's history: refuse until an operator looks
            raise Refusal(RULE, "record", "unreadable") from None
        return doc if isinstance(doc, dict) else {}

    def admit(self, fingerprint: str, n: int, k: int, policy: EvaluationPolicy) -> None:
        """Record one evaluation of ``k`` rows of the split ``fingerprint`` (of ``n`` rows), or refuse it.

        Raises:
            Refusal: ``eval_cohort``/``overlap`` (a cohort within ``m`` rows of an earlier one) or
                ``eval_cohort``/``repeats`` (these rows were evaluated ``max_repeats`` times already).
        """
        m = min(policy.min_cohort, n)
        with file_lock(self.path):
            doc = self._read()
            sizes = {int(s): int(c) for s, c in doc.get(fingerprint, {}).get("sizes", {}).items()}
            if any(s != k and abs(s - k) < m for s in sizes):
                raise Refusal(RULE, "config", "overlap")
            if sizes.get(k, 0) >= policy.max_repeats:
                raise Refusal(RULE, "config", "repeats")
            sizes[k] = sizes.get(k, 0) + 1
            doc[fingerprint] = {"n": int(n), "sizes": {str(s): c for s, c in sorted(sizes.items())}}
            atomic_write_text(self.path, json.dumps(doc, indent=1, sort_keys=True))

    def counts(self, fingerprint: str) -> dict[int, int]:
        """How often each cohort size of a split was evaluated."""
        entry = self._read().get(fingerprint, {})
        return {int(s): int(c) for s, c in entry.get("sizes", {}).items()}


def select_rows(ds, site_id: str, requested: int | None, policy: EvaluationPolicy, record: CohortRecord) -> np.ndarray:
    """The rows of ``ds`` this site evaluates for a request of ``requested`` rows, recorded before use.

    Raises:
        Refusal: rule ``eval_cohort`` (see :func:`cohort_size` and :meth:`CohortRecord.admit`).
    """
    n = int(ds.n)
    k = cohort_size(n, requested, policy)
    fp = split_fingerprint(ds, site_id)
    record.admit(fp, n, k, policy)
    return cohort_rows(n, k, fp)
