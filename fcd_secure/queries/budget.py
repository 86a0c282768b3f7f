"""A site's question budget: which what-if questions it answers at all (docs/threats.md P41-P44).

A threshold on a continuous context column is in the table's own units and is read on the site's grid of quantiles of
its training rows (``data.policy.snap_threshold``, in ``queries.policy_terms``); the question is charged against the
site's differencing budget (:func:`admit_question`: any two policies, in this question or answered before, act
differently on none or at least ``min_difference`` of its entities); and ``whatif.fires.<π>`` says whether a threshold
rule fires on any of the site's rows at all (:func:`fires`).
"""

from __future__ import annotations

import base64
import hashlib
import json
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.audit import Refusal
from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.policy import Policy
from fcd_secure.data.schema import SiteDataset
from fcd_secure.queries.logged import target_probs

__all__ = ["MAX_ANSWERED_COHORTS", "QUESTION_RULE", "QUESTION_SLOT", "RECORD_VERSION", "SAME_WEIGHT", "WEIGHT_SHARE",
           "Cohort", "admit_question", "cohort_difference", "cohort_signature", "fires"]

#: the site's record of the cohorts it answered questions on (``slots/<name>`` of its state folder)
QUESTION_SLOT = "whatif_cohorts.json"
#: the most distinct cohorts a site answers over its lifetime: then its question budget is spent
MAX_ANSWERED_COHORTS = 5000
#: a row's weights "change" between two stochastic cohorts when its largest move in log(q/P) is at least this share
#: of the largest move of any row (:func:`cohort_difference`): a pair that moves one patient's weight and every other
#: weight by a millionth of that is a one-patient difference, however small the move
WEIGHT_SHARE = 0.1
#: two stochastic cohorts whose log-weights move by at most this much on every row are the same cohort (free)
SAME_WEIGHT = 1e-9
#: the version of the record's format; a record of another version is refused (never silently restarted)
RECORD_VERSION = 2
#: the refusal rule of a question the budget refuses (``audit.rules.REFUSAL_RULES``)
QUESTION_RULE = "eval_cohort"


@dataclass(frozen=True)
class Cohort:
    """What a policy does on each of the site's rows, as the differencing budget compares it.

    ``kind`` is ``plan`` (a deterministic policy's actions on each row's logged history: two rows differ when any
    action differs) or ``weights`` (a stochastic policy's exact log-weights log(q/P) at each logged step, compared by
    size: :func:`cohort_difference`); ``rows`` keys each row by a digest of its entity id and its chunk number
    (``<entity digest>#<chunk>``); ``values`` is ``[n, H]`` (plan codes, -1 on padding; log-weights, NaN on padding).
    """

    kind: str
    rows: tuple[str, ...]
    values: np.ndarray

    def to_json(self) -> dict:
        arr = np.ascontiguousarray(self.values, dtype=np.int64 if self.kind == "plan" else np.float64)
        return {"kind": self.kind, "rows": list(self.rows), "shape": list(arr.shape), "dtype": arr.dtype.str,
                "values": base64.b64encode(zlib.compress(arr.tobytes(), 6)).decode("ascii")}

    @classmethod
    def from_json(cls, doc: dict) -> "Cohort":
        raw = zlib.decompress(base64.b64decode(doc["values"]))
        values = np.frombuffer(raw, dtype=np.dtype(doc["dtype"])).reshape([int(s) for s in doc["shape"]])
        return cls(str(doc["kind"]), tuple(str(r) for r in doc["rows"]), values)


def _logged_plan(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> tuple[str, np.ndarray]:
    """``(kind, [n, H])``: the actions ``pol`` takes on each row's *logged* history over the first ``H`` steps (-1 on
    padding), what decides which of the row's logged steps are consistent with π; or, for a stochastic policy, its
    exact log-weights log(q/P) at each logged step (NaN on padding), how much it moves each row's OPE and DR terms."""
    H = min(int(H), sub.L)
    if pol.stochastic and sub.P is not None:
        # no grid: a grid maps a 2-6 % move of one patient's weight to "unchanged" and the answer's difference is
        # that patient's term (P41); the sizes of the moves are compared instead (cohort_difference)
        valid = sub.M[:, :H] > 0
        ratio = target_probs(pol, sub, a_off, a_on)[:, :H] / np.where(valid, sub.P[:, :H], 1.0)
        return "weights", np.where(valid, np.log(np.maximum(ratio, 1e-300)), np.nan)
    if pol.stochastic:  # no logged propensities: no weights, no OPE; every logged step is read alike
        return "plan", np.where(sub.M[:, :H] > 0, 0, -1).astype(np.int64)
    plan = pol.plan(sub.Y[:, :H], sub.lengths, a_off, a_on, A=sub.A[:, :H] if pol.needs_context else None)
    return "plan", np.where(sub.M[:, :H] > 0, plan, -1).astype(np.int64)


def fires(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> bool:
    """Whether a threshold rule's condition holds at any valid step of the site's logged rows (P43)."""
    ctx = (lambda t: sub.A[:, : t + 1]) if pol.needs_context else (lambda t: None)
    for t in range(min(int(H), sub.L)):
        valid = sub.M[:, t] > 0
        if valid.any() and (pol.on(t, sub.Y[:, :t], sub.lengths, ctx(t)) & valid).any():
            return True
    return False


def cohort_signature(pol: Policy, sub: SiteDataset, anchors: tuple[int, int], H: int) -> Cohort:
    """The :class:`Cohort` a policy touches on the site's rows (keyed by a digest of each row's entity id and chunk).
    Two policies' sums can differ only through the rows they treat differently (:func:`cohort_difference`)."""
    kind, values = _logged_plan(pol, sub, anchors[0], anchors[1], H)
    seen: dict[str, int] = {}
    keys: list[str] = []
    for e in row_ids(sub):
        k = seen.get(e, 0)
        seen[e] = k + 1
        keys.append(f"{hashlib.sha256(e.encode()).hexdigest()[:16]}#{k}")
    return Cohort(kind, tuple(keys), values)


def _row_moves(a: Cohort, b: Cohort) -> dict[str, float]:
    """Per row key of either cohort, how far its values move from ``a`` to ``b`` (inf: the row is in one of them
    only, its padding differs, or the cohorts are of another kind or horizon; a plan row: 0 or inf)."""
    ia, ib = {k: i for i, k in enumerate(a.rows)}, {k: i for i, k in enumerate(b.rows)}
    comparable = a.kind == b.kind and a.values.shape[1:] == b.values.shape[1:]
    out: dict[str, float] = {}
    for k in ia.keys() | ib.keys():
        if not comparable or k not in ia or k not in ib:
            out[k] = float("inf")
            continue
        va, vb = a.values[ia[k]], b.values[ib[k]]
        if a.kind == "plan":
            out[k] = 0.0 if np.array_equal(va, vb) else float("inf")
        elif not np.array_equal(np.isnan(va), np.isnan(vb)):
            out[k] = float("inf")
        else:
            d = np.abs(va - vb)
            out[k] = float(np.nanmax(d)) if np.isfinite(va).any() else 0.0
    return out


def cohort_difference(a: Cohort, b: Cohort) -> int:
    """How many *entities* two cohorts treat differently (a row in only one of them counts; chunks of one entity are
    one entity): for plans, the entities with a row whose actions differ; for weights, those with a row whose
    log-weight moves by more than :data:`SAME_WEIGHT` and by at least :data:`WEIGHT_SHARE` of the largest row's
    move, whatever that move's size (so no grid, and no move too small to count, can hide a one-patient pair)."""
    moves = _row_moves(a, b)
    if not moves:
        return 0
    top = max(moves.values())
    if top <= SAME_WEIGHT:
        return 0
    cut = max(SAME_WEIGHT, WEIGHT_SHARE * top) if np.isfinite(top) else float("inf")
    changed = {k for k, d in moves.items() if d > SAME_WEIGHT and d >= cut}
    return len({k.split("#", 1)[0] for k in changed})


def admit_question(policies: list[Policy], sub: SiteDataset, anchors: tuple[int, int], H: int, min_difference: int,
                   record: Path | None) -> None:
    """Charge a question against the site's differencing budget, or refuse it before anything is computed (P41).

    Every policy's cohort (:func:`cohort_signature`) must equal, or differ by at least ``min_difference`` entities
    (:func:`cohort_difference`: for a stochastic policy, by the sizes of its exact weights' moves, never on a grid)
    from, every other policy's in the question and every cohort the site answered before (``record``, kept in the
    site's state; an identical cohort is free; docs/threats.md P44). The admitted cohorts are recorded before the
    answer leaves; after :data:`MAX_ANSWERED_COHORTS` distinct ones the site answers no new cohort.

    What it bounds: the difference of any two answers is a sum over at least ``min_difference`` entities, never one
    patient's 1/P and logged action (the attack of 32 thresholds one patient apart). What it does not bound: a
    linear combination of three or more answers whose cohorts overlap cleverly (Dinur & Nissim 2003, "Revealing
    information while preserving privacy", PODS) — answering many distinct cohorts needs noise, not a rule; the
    lifetime cap on distinct cohorts limits how many such equations exist.

    Raises:
        Refusal: ``eval_cohort`` with key ``policy_difference`` (two policies of the question), ``answered_cohort``
            (a cohort close to one answered before), ``question_budget`` (the record is full) or ``unreadable``.
    """
    sigs = [cohort_signature(p, sub, anchors, H) for p in policies]
    for i in range(len(sigs)):
        for j in range(i):
            if 0 < cohort_difference(sigs[i], sigs[j]) < min_difference:
                raise Refusal(QUESTION_RULE, "config", "policy_difference")
    if record is None:
        return
    with file_lock(record):
        try:
            doc = json.loads(record.read_text()) if record.exists() else {"version": RECORD_VERSION, "cohorts": []}
            if doc.get("version") != RECORD_VERSION:
                raise ValueError(f"record version {doc.get('version')!r}")
            answered = [Cohort.from_json(c) for c in doc["cohorts"]]
        except (ValueError, KeyError, TypeError, zlib.error):
            # an unreadable record (or one of an older format) must not reset the site's history: refuse until an
            # operator looks
            raise Refusal(QUESTION_RULE, "record", "unreadable") from None
        new: list[Cohort] = []
        for sig in sigs:
            gaps = [cohort_difference(sig, old) for old in answered + new]
            if 0 in gaps:  # the same cohort (up to SAME_WEIGHT): answered before, free
                continue
            if any(g < min_difference for g in gaps):
                raise Refusal(QUESTION_RULE, "config", "answered_cohort")
            new.append(sig)
        if not new:
            return
        if len(answered) + len(new) > MAX_ANSWERED_COHORTS:
            raise Refusal(QUESTION_RULE, "config", "question_budget")
        atomic_write_text(record, json.dumps({"version": RECORD_VERSION,
                                              "cohorts": doc["cohorts"] + [c.to_json() for c in new]},
                                             separators=(",", ":")))
