"""The privacy-ledger heads a site's uploads record: they must form one history that never disappears or goes back.

Every upload line carries the heads of the site's DP ledgers (:class:`~fcd_secure.anchor_records.PrivacyAnchor`:
segment count, hash chain over the segments' reservations, accounted steps, ε, acknowledged resets) and the hash of
the ledger files (``privacy_ledger_hash``). Ledger files change on every reservation and commit, so their hash alone
cannot say "backwards"; the head can. Over the uploads of one site, in chain order, for each ledger:

* **disappears**: a head present in an earlier upload is missing from a later one (the anchor was deleted), or the
  ledger files' hash becomes ``None`` (the ledgers were deleted);
* **goes backwards**: fewer segments than before, or as many segments with another chain (rewritten reservations).

Either is a **violation** (the ε cap no longer bounds what the records spent) unless the later head records an
operator's acknowledged reset at or after the earlier head, which is reported as a **note** naming the operator, the
reason and the ε that was spent before it. More segments than before cannot be checked against the earlier chain
from the heads alone (a limit: the ledger file holds the segments).
"""

from __future__ import annotations

from fcd_secure.anchor_records import PrivacyAnchor
from fcd_secure.audit.entries import UploadLine
from fcd_secure.audit.verify.chain import Located
from fcd_secure.audit.verify.result import VerifyResult

__all__ = ["check_privacy_history"]


def _backwards(prev: PrivacyAnchor, cur: PrivacyAnchor) -> str | None:
    if cur.segments < prev.segments:
        return f"went back from {prev.segments} to {cur.segments} segment(s)"
    if cur.segments == prev.segments and cur.chain != prev.chain:
        return f"holds {cur.segments} segment(s) that are not the ones recorded before (rewritten)"
    return None


def _acknowledged(prev: PrivacyAnchor, cur: PrivacyAnchor) -> bool:
    r = cur.last_reset
    return cur.resets > prev.resets and r is not None and r.previous.segments >= prev.segments


def check_privacy_history(uploads: list[Located[UploadLine]], label: str, res: VerifyResult) -> None:
    """Report privacy-ledger heads that disappear or go backwards over one site's uploads (module docstring)."""
    last: dict[str, PrivacyAnchor] = {}
    gone: set[str] = set()
    hash_seen = False
    resets_at_hash = 0
    for loc in uploads:
        e = loc.entry
        anchors = {a.key: a for a in (e.privacy_anchors or ())}
        resets_now = sum(a.resets for a in anchors.values())
        for key, prev in last.items():
            cur = anchors.get(key)
            if cur is None:
                if key not in gone:
                    gone.add(key)
                    res.add("violation", label, e.seq, loc.line,
                            f"{loc.where}: the head of privacy ledger {key[:16]} ({prev.segments} segment(s), ε ≈ "
                            f"{prev.epsilon:.3f}) is gone from the site's anchors: the ε budget may have been reset")
                continue
            gone.discard(key)
            why = _backwards(prev, cur)
            if why is None:
                continue
            if _acknowledged(prev, cur):
                r = cur.last_reset
                res.add("note", label, e.seq, loc.line,
                        f"{loc.where}: privacy ledger {key[:16]} {why}; reset acknowledged by {r.operator} at {r.time} "
                        f"({r.reason!r}); ε ≈ {r.previous.epsilon:.3f} spent before the reset is not in its count")
            else:
                res.add("violation", label, e.seq, loc.line,
                        f"{loc.where}: privacy ledger {key[:16]} {why} without an acknowledged reset: the ε cap no "
                        "longer bounds what its records spent")
        last.update(anchors)
        if e.privacy_ledger_hash is not None:
            hash_seen, resets_at_hash = True, resets_now
        elif hash_seen and resets_now <= resets_at_hash:
            hash_seen = False  # reported once; a reappearing hash starts again
            res.add("violation", label, e.seq, loc.line,
                    f"{loc.where}: the site's DP ledger files disappeared (privacy_ledger_hash was recorded before, "
                    "none now) without an acknowledged reset")
