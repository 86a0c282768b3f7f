"""A site's question budget: which what-if questions it answers at all (docs/threats.md P41-P43).

A threshold on a continuous context column is in the table's own units and is read on the site's grid of quantiles of
its training rows (``data.policy.snap_threshold``, in ``queries.policy_terms``); the question is charged against the
site's differencing budget (:func:`admit_question`: any two policies, in this question or answered before, act
differently on none or at least ``min_difference`` of its entities); and ``whatif.fires.<π>`` says whether a threshold
rule fires on any of the site's rows at all (:func:`fires`).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.audit import Refusal
from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.policy import Policy
from fcd_secure.data.schema import SiteDataset
from fcd_secure.queries.logged import target_probs

__all__ = ["MAX_ANSWERED_COHORTS", "QUESTION_RULE", "QUESTION_SLOT", "WEIGHT_GRID", "admit_question",
           "cohort_signature", "fires"]

#: the site's record of the cohorts it answered questions on (``slots/<name>`` of its state folder)
QUESTION_SLOT = "whatif_cohorts.json"
#: the most distinct cohorts a site answers over its lifetime: then its question budget is spent
MAX_ANSWERED_COHORTS = 5000
#: a stochastic policy's weights are compared on a grid of 1/WEIGHT_GRID in log(q/P) (:func:`_logged_plan`)
WEIGHT_GRID = 10.0
#: the refusal rule of a question the budget refuses (``audit.rules.REFUSAL_RULES``)
QUESTION_RULE = "eval_cohort"


def _logged_plan(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> np.ndarray:
    """The actions ``pol`` takes on each row's *logged* history over the first ``H`` steps, ``[n, H]`` (-1 on
    padding): what decides which of the row's logged steps are consistent with π, so which rows its OPE and DR sums
    read."""
    H = min(int(H), sub.L)
    if pol.stochastic:
        # a stochastic policy weighs every logged step; what sets its rows apart is how much it moves each weight,
        # so its "actions" are the weights on a grid of ~10 % (a row whose weight moves less reads as unchanged: the
        # odds of an action one patient received cannot single that patient out, P41)
        if sub.P is None:
            return np.where(sub.M[:, :H] > 0, 0, -1).astype(np.int64)
        ratio = target_probs(pol, sub, a_off, a_on)[:, :H] / np.where(sub.M[:, :H] > 0, sub.P[:, :H], 1.0)
        code = np.round(WEIGHT_GRID * np.log(np.maximum(ratio, 1e-300)))
        return np.where(sub.M[:, :H] > 0, code, -1).astype(np.int64)
    plan = pol.plan(sub.Y[:, :H], sub.lengths, a_off, a_on, A=sub.A[:, :H] if pol.needs_context else None)
    return np.where(sub.M[:, :H] > 0, plan, -1).astype(np.int64)


def fires(pol: Policy, sub: SiteDataset, a_off: int, a_on: int, H: int) -> bool:
    """Whether a threshold rule's condition holds at any valid step of the site's logged rows (P43)."""
    ctx = (lambda t: sub.A[:, : t + 1]) if pol.needs_context else (lambda t: None)
    for t in range(min(int(H), sub.L)):
        valid = sub.M[:, t] > 0
        if valid.any() and (pol.on(t, sub.Y[:, :t], sub.lengths, ctx(t)) & valid).any():
            return True
    return False


def cohort_signature(pol: Policy, sub: SiteDataset, anchors: tuple[int, int], H: int) -> dict[str, str]:
    """The cohort a policy touches on the site's rows: per row (keyed by a digest of its entity id and chunk), a
    digest of the actions the policy takes on that row's logged history. Two policies' sums can differ only through
    the rows whose digests differ (where a row's logged steps stop or start being consistent with π)."""
    plan = _logged_plan(pol, sub, anchors[0], anchors[1], H)
    seen: dict[str, int] = {}
    out: dict[str, str] = {}
    for i, e in enumerate(row_ids(sub)):
        k = seen.get(e, 0)
        seen[e] = k + 1
        key = hashlib.sha256(f"{e}#{k}".encode()).hexdigest()[:16]
        out[key] = hashlib.sha256(plan[i].tobytes()).hexdigest()[:16]
    return out


def _difference(a: dict[str, str], b: dict[str, str]) -> int:
    """How many rows two cohorts treat differently (a row in only one of them counts)."""
    return sum(1 for k in a.keys() | b.keys() if a.get(k) != b.get(k))


def admit_question(policies: list[Policy], sub: SiteDataset, anchors: tuple[int, int], H: int, min_difference: int,
                   record: Path | None) -> None:
    """Charge a question against the site's differencing budget, or refuse it before anything is computed (P41).

    Every policy's cohort (:func:`cohort_signature`) must equal, or differ by at least ``min_difference`` rows from,
    every other policy's in the question and every cohort the site answered before (``record``, kept in the site's
    state; an identical cohort is free). The admitted cohorts are recorded before the answer leaves; after
    :data:`MAX_ANSWERED_COHORTS` distinct ones the site answers no new cohort.

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
            if 0 < _difference(sigs[i], sigs[j]) < min_difference:
                raise Refusal(QUESTION_RULE, "config", "policy_difference")
    if record is None:
        return
    with file_lock(record):
        try:
            doc = json.loads(record.read_text()) if record.exists() else {}
        except ValueError:
            raise Refusal(QUESTION_RULE, "record", "unreadable") from None
        answered: list[dict[str, str]] = list(doc.get("cohorts", []))
        new: list[dict[str, str]] = []
        for sig in sigs:
            if sig in answered or sig in new:
                continue
            if any(0 < _difference(sig, old) < min_difference for old in answered):
                raise Refusal(QUESTION_RULE, "config", "answered_cohort")
            new.append(sig)
        if not new:
            return
        if len(answered) + len(new) > MAX_ANSWERED_COHORTS:
            raise Refusal(QUESTION_RULE, "config", "question_budget")
        atomic_write_text(record, json.dumps({"cohorts": answered + new}, separators=(",", ":")))
