"""ε per record across every ledger of a site: what any single record has spent, whatever split or seed trained it.

DP-SGD's guarantee is per record (add/remove one trajectory; Abadi et al. 2016), and a record that is trained in
several runs composes all of them. A site's ledgers are kept per training table (:mod:`fcd_secure.privacy.ledger`),
and a server that changes the seed or ``data.test_fraction`` every run makes every training table share less than
half its records with the earlier ones, so each run opens its own ledger. The cap must therefore bound the
composition over *every* ledger that holds the record, not the ledger of one table. Here:

* every ledger lists the records it charges (:attr:`Holding.records`: the first 128 bits of each record's keyed
  raw-content hash, :func:`~fcd_secure.privacy.identity.record_keys`), and charges its whole history to each of them (a ledger
  trains tables that share at least half their records, so a record of one of them is charged the others' rounds
  too: conservative);
* the records of a table are grouped by the set of ledgers that hold them; each group's history is the
  concatenation of those ledgers' segments, composed by the accountant (sequential composition; the order of
  segments does not change ε, so a history is sorted and equal histories are computed once), at the smallest δ of
  those ledgers;
* what a record has spent is the ε of its group's history, plus the spend carried forward by acknowledged resets
  (:meth:`fcd_secure.privacy.anchor.AnchorStore.carried`, added by basic composition).

The number of groups is at most the number of distinct sets of ledgers, not the number of records.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from fcd_secure.privacy.planner import Segment, epsilon

__all__ = [
    "Holding",
    "RecordGroup",
    "canonical",
    "groups",
    "site_spend",
    "spend_summary",
    "spend_values",
    "worst_group",
]


@dataclass(frozen=True)
class Holding:
    """One ledger as the per-record account reads it: its accounted segments, its δ and the records it charges."""

    key: str
    history: tuple[Segment, ...]
    delta: float
    records: frozenset[str]


@dataclass(frozen=True)
class RecordGroup:
    """Records charged by the same ledgers: their composed history, the δ it is read at, and how many they are."""

    history: tuple[Segment, ...]
    delta: float
    count: int

    def epsilon(self, accountant: str, extra: Sequence[Segment] = ()) -> float:
        return epsilon(canonical(self.history + tuple(extra)), self.delta, accountant)


def canonical(segments: Iterable[Sequence[float]]) -> tuple[Segment, ...]:
    """The segments sorted (composition is order-free), empty ones dropped: one history, one accountant call."""
    return tuple(sorted((float(s), float(q), int(n)) for s, q, n in segments if int(n) > 0))


def groups(
    records: Iterable[str], holdings: Sequence[Holding], *, base: Sequence[Segment] = (), base_delta: float | None = None
) -> list[RecordGroup]:
    """``records`` grouped by the ``holdings`` that charge them, each group with its composed history.

    Args:
        records: the records to account (e.g. the table a round will train on).
        holdings: the site's ledgers that may hold them (the ledger of ``base`` left out).
        base: a history charged to every record (the ledger the round reserves in).
        base_delta: the δ of ``base``'s ledger.
    """
    members: dict[str, list[int]] = {r: [] for r in records}
    keys = members.keys()
    for j, h in enumerate(holdings):
        for r in h.records & keys:
            members[r].append(j)
    out = []
    for sig, count in Counter(tuple(v) for v in members.values()).items():
        hist = list(base)
        deltas = [] if base_delta is None else [base_delta]
        for j in sig:
            hist += holdings[j].history
            deltas.append(holdings[j].delta)
        out.append(RecordGroup(canonical(hist), min(deltas) if deltas else 1.0, count))
    return out


def worst_group(
    gs: Sequence[RecordGroup], accountant: str, extra: Sequence[Segment] = ()
) -> tuple[float, RecordGroup | None]:
    """The largest ε over the groups (with ``extra`` segments charged to every record) and the group reaching it."""
    best: tuple[float, RecordGroup | None] = (0.0, None)
    seen: dict[tuple, float] = {}
    for g in gs:
        k = (g.history, g.delta)
        if k not in seen:
            seen[k] = g.epsilon(accountant, extra)
        if best[1] is None or seen[k] > best[0]:
            best = (seen[k], g)
    return best


def spend_values(gs: Sequence[RecordGroup], accountant: str, carried: float = 0.0) -> list[tuple[float, int]]:
    """``(ε, records)`` of every group that trained at least once, ``carried`` added (the spend of acknowledged
    resets); records listed by a ledger that never reserved a step are left out."""
    return [(g.epsilon(accountant) + carried, g.count) for g in gs if g.history]


def spend_summary(values: Iterable[tuple[float, int]], carried: float = 0.0) -> dict[str, float | int]:
    """Per-record spend over ``(ε, records)`` pairs (:func:`spend_values`): how many records, the largest and the
    median ε, and the part of it carried by acknowledged resets."""
    vals = sorted((float(v), int(c)) for v, c in values if int(c) > 0)
    n = sum(c for _, c in vals)
    if n == 0:
        return {"records": 0, "max": carried, "median": carried, "carried_from_resets": carried}
    return {"records": n, "max": vals[-1][0], "median": _weighted_median(vals, n), "carried_from_resets": carried}


def site_spend(holdings: Sequence[Holding], accountant: str, carried: float = 0.0) -> list[tuple[float, int]]:
    """``(ε, records)`` over every record the ``holdings`` (one site's ledgers) charge."""
    every: set[str] = set()
    for h in holdings:
        every |= h.records
    return spend_values(groups(every, holdings), accountant, carried)


def _weighted_median(values: list[tuple[float, int]], n: int) -> float:
    """The median of the multiset {value × count} (the mean of the two middle ones when ``n`` is even)."""

    def at(i: int) -> float:
        seen = 0
        for v, c in values:
            seen += c
            if i < seen:
                return v
        return values[-1][0]

    return at(n // 2) if n % 2 else (at(n // 2 - 1) + at(n // 2)) / 2
