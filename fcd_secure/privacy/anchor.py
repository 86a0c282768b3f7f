"""The site's anchor of its privacy ledgers' heads: a deleted or rolled-back ledger is noticed, and refused.

A privacy ledger is a file on the site; deleting it, or putting back an older copy, would silently give the same
records a fresh budget. So every time a ledger grows, the site also writes the ledger's **head** (segment count, a
hash chain over the segments' reservations, accounted steps, ε at the last reservation) into its anchor file
``<state_dir>/privacy_anchor.json``, kept apart from the ledger folder (and from ``dp.ledger_dir``):

* before training, :meth:`AnchorStore.check` compares the ledger with its anchored head. Fewer segments, another
  chain over the anchored segments, or fewer accounted steps in them is a **rollback**
  (:class:`~fcd_secure.privacy.errors.LedgerRollback`), and so is a missing ledger whose anchor has segments: the
  site refuses to train;
* an operator may acknowledge it (:meth:`AnchorStore.acknowledge`, ``fcd privacy acknowledge-reset``): the reset is
  recorded with the reason, the operator, the time and the head that was lost, and the anchor moves to the
  ledger as it now is;
* the audit gate writes :func:`read_anchors` (the heads, with the count of acknowledged resets) into every upload
  line of the site's signed audit chain, which the server countersigns; ``fcd audit verify`` reports a head that
  disappears or goes backwards, acknowledged or not.

The anchor is a tamper-evidence device, in the line of append-only logs whose head is kept apart from the log
(Schneier & Kelsey 1999; Certificate Transparency's signed tree heads, RFC 6962 §3.5): a site that deletes both the
ledger and the anchor trains again, but its audit chain shows the head disappearing.

Write order keeps a crash from looking like a rollback: a reservation is written to the ledger before the anchor
(the ledger is then ahead), a commit, which may lower the accounted steps, to the anchor first.
"""

from __future__ import annotations

import getpass
import hashlib
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.anchor_records import LedgerHead, PrivacyAnchor, ResetRecord
from fcd_secure.errors import first_invalid
from fcd_secure.privacy.errors import PrivacyLedgerError, LedgerRollback
from fcd_secure.privacy.identity import DatasetIdentity, same_data

__all__ = [
    "ANCHOR_FILE",
    "AnchorStore",
    "LedgerHead",
    "LedgerView",
    "PrivacyAnchor",
    "ResetRecord",
    "read_anchors",
    "segment_chain",
]

#: The anchor file, directly in a site's state directory (not in ``privacy/``, not in ``dp.ledger_dir``).
ANCHOR_FILE = "privacy_anchor.json"
ANCHOR_FORMAT = "fcd_secure.privacy.anchor/1"
GENESIS = "0" * 64

#: The fields of a segment that never change once it is reserved: what the chain commits to.
CHAINED_FIELDS = ("seq", "plan_id", "sigma", "q", "reserved_steps", "reserved_at", "round", "run_id")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class AnchorEntry(_Model):
    """One ledger's anchored head, the table identity it belongs to, and every acknowledged reset."""

    head: LedgerHead
    identity: DatasetIdentity | None = None
    ledger: str = Field(description="where the ledger file was (absolute path)")
    resets: tuple[ResetRecord, ...] = ()
    updated: str


class AnchorFile(_Model):
    """The whole anchor file."""

    format: Literal["fcd_secure.privacy.anchor/1"] = ANCHOR_FORMAT
    entries: tuple[AnchorEntry, ...] = ()

    def entry(self, key: str) -> AnchorEntry | None:
        return next((e for e in self.entries if e.head.key == key), None)


@dataclass(frozen=True)
class LedgerView:
    """A ledger as it is now, for comparison with its anchor: per segment the chain hash and the accounted steps."""

    key: str
    chain: tuple[str, ...]
    steps: tuple[int, ...]
    epsilon: float

    def head(self) -> LedgerHead:
        return LedgerHead(
            key=self.key,
            segments=len(self.chain),
            chain=self.chain[-1] if self.chain else GENESIS,
            steps=sum(self.steps),
            epsilon=self.epsilon,
        )


def segment_chain(segments: Iterable[Any]) -> tuple[str, ...]:
    """``h_i = sha256(h_{i-1} || canonical(reservation of segment i))`` for every segment, ``h_0 = GENESIS``."""
    out, h = [], GENESIS
    for s in segments:
        fields = {k: getattr(s, k) for k in CHAINED_FIELDS}
        h = hashlib.sha256((h + json.dumps(fields, sort_keys=True, separators=(",", ":"))).encode()).hexdigest()
        out.append(h)
    return tuple(out)


def rollback_reason(head: LedgerHead, view: LedgerView | None) -> str | None:
    """Why ``view`` holds less than the anchored ``head`` (a missing ledger is ``view = None``), or ``None``."""
    if head.segments == 0:
        return None
    if view is None:
        return f"the ledger is gone, its anchor records {head.segments} segment(s), ε ≈ {head.epsilon:.3f}"
    n = head.segments
    if len(view.chain) < n:
        return f"the ledger has {len(view.chain)} segment(s), its anchor records {n} (ε ≈ {head.epsilon:.3f})"
    if view.chain[n - 1] != head.chain:
        return f"the ledger's first {n} segment(s) are not the ones anchored (rewritten or another ledger)"
    if sum(view.steps[:n]) < head.steps:
        return f"the ledger's first {n} segment(s) account {sum(view.steps[:n])} steps, the anchor {head.steps}"
    return None


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


class AnchorStore:
    """Read-modify-write access to one site's anchor file (``<state_dir>/privacy_anchor.json``), under a lock."""

    def __init__(self, state_dir: str | Path) -> None:
        self.path = Path(state_dir) / ANCHOR_FILE

    def load(self) -> AnchorFile:
        """The anchors on disk (none if the file does not exist).

        Raises:
            PrivacyLedgerError: the file exists but is unreadable or not an anchor file (fail closed).
        """
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return AnchorFile()
        except (OSError, UnicodeDecodeError) as exc:
            raise PrivacyLedgerError(f"{self.path}: unreadable privacy anchor ({exc}); refusing to train") from exc
        try:
            return AnchorFile.model_validate_json(text)
        except ValidationError as exc:
            where, msg = first_invalid(exc, "file")
            raise PrivacyLedgerError(f"{self.path}: invalid privacy anchor at '{where}': {msg}; refusing to train") from None

    def _save(self, anchors: AnchorFile) -> None:
        atomic_write_text(self.path, anchors.model_dump_json(indent=1), mode=0o600)

    def entry(self, key: str) -> AnchorEntry | None:
        return self.load().entry(key)

    def matching(self, identity: DatasetIdentity) -> list[AnchorEntry]:
        """Anchored ledgers of the same data as ``identity`` (:func:`~fcd_secure.privacy.identity.same_data`)."""
        return [e for e in self.load().entries if e.identity is not None and same_data(e.identity, identity)]

    def check(self, key: str, view: LedgerView | None, state_dir_hint: str | Path | None = None) -> None:
        """Raise if the ledger ``key`` (``view``; ``None`` when its file is missing) is behind its anchored head.

        Raises:
            LedgerRollback: the ledger was deleted or rolled back since it was anchored.
            PrivacyLedgerError: the anchor file cannot be read.
        """
        entry = self.entry(key)
        if entry is None:
            return
        why = rollback_reason(entry.head, view)
        if why is not None:
            where = state_dir_hint if state_dir_hint is not None else self.path.parent
            raise LedgerRollback(
                f"{entry.ledger}: privacy ledger rolled back or deleted ({why}); the site refuses to train on this "
                f"data until an operator acknowledges the reset: fcd privacy acknowledge-reset {where} --reason '…'"
            )

    def carried(self) -> float:
        """ε carried forward by every acknowledged reset of this site: the sum of the heads' ε that were lost.

        A lost ledger's records are not known any more (only its sketch is), so the spend it held is charged to every
        record the site trains from then on, by basic composition (Dwork & Roth 2014, Thm. 3.16: ε and δ add up). A
        head's ε is that ledger's own spend at its last reservation (:attr:`SegmentRecord.epsilon_projected
        <fcd_secure.privacy.ledger.SegmentRecord>` leaves earlier carried spend out), so a second reset of the same
        ledger adds only what was spent after the first. An acknowledgement therefore never raises what is left.

        Raises:
            PrivacyLedgerError: the anchor file cannot be read.
        """
        return float(sum(r.previous.epsilon for e in self.load().entries for r in e.resets))

    def check_witness(self, witnessed: Sequence[LedgerHead]) -> None:
        """Raise if a head the site's signed audit chain recorded (``witnessed``) is neither in the anchor nor reset.

        The anchor catches a deleted ledger; deleting the anchor with it would leave nothing to compare. The site's
        audit chain records the heads with every upload (``audit.gate``), so a head it recorded that the anchor no
        longer holds (no entry, fewer segments, and no acknowledged reset of at least that many segments) means the
        ledger and its anchor went together: the site refuses to train at start until an operator acknowledges.

        Raises:
            LedgerRollback: a witnessed head is gone.
            PrivacyLedgerError: the anchor file cannot be read.
        """
        anchors = self.load()
        for w in witnessed:
            if w.segments == 0:
                continue
            e = anchors.entry(w.key)
            if e is not None and (e.head.segments >= w.segments or any(r.previous.segments >= w.segments for r in e.resets)):
                continue
            raise LedgerRollback(
                f"{self.path}: the site's audit chain recorded privacy ledger {w.key[:16]} at {w.segments} segment(s), "
                f"ε ≈ {w.epsilon:.3f}, and the anchor {'no longer holds it' if e is None else 'holds less'} (ledger and "
                "anchor deleted or replaced); the site refuses to train until an operator acknowledges the reset: "
                f"fcd privacy acknowledge-reset {self.path.parent} --reason '…'"
            )

    def update(self, head: LedgerHead, *, identity: DatasetIdentity | None, ledger: str | Path) -> None:
        """Anchor ``head`` (keeping the entry's identity and resets when ``identity`` is ``None``)."""
        with file_lock(self.path):
            anchors = self.load()
            old = anchors.entry(head.key)
            entry = AnchorEntry(
                head=head,
                identity=identity if identity is not None else (old.identity if old else None),
                ledger=str(Path(ledger).resolve()),
                resets=old.resets if old else (),
                updated=_now(),
            )
            others = tuple(e for e in anchors.entries if e.head.key != head.key)
            self._save(AnchorFile(entries=others + (entry,)))

    def acknowledge(
        self,
        views: dict[str, LedgerView | None],
        *,
        reason: str,
        operator: str | None = None,
        witnessed: Sequence[LedgerHead] = (),
        ledger_dir: str | Path | None = None,
    ) -> list[ResetRecord]:
        """Record an operator's acknowledgement of every anchored ledger that is behind its head.

        Args:
            views: the ledgers as they are now, by key (``None``: the file is missing).
            reason: why (kept in the anchor and, through the next upload, in the audit chain).
            operator: who acknowledges (default: the login name).
            witnessed: the heads the site's audit chain recorded (:meth:`check_witness`); one the anchor lost too
                (the anchor file was deleted with the ledger) is acknowledged as a reset of a missing ledger, so
                its spend is carried forward (:meth:`carried`).
            ledger_dir: where such a ledger was (for the record; default ``<state_dir>/privacy``).

        Returns:
            The reset records written (empty when no ledger was behind its anchor).

        Raises:
            ValueError: an empty reason.
        """
        if not reason.strip():
            raise ValueError("a reset must be acknowledged with a reason")
        who = operator or getpass.getuser()
        written: list[ResetRecord] = []
        with file_lock(self.path):
            anchors = self.load()
            entries = []
            for e in anchors.entries:
                view = views.get(e.head.key)
                if rollback_reason(e.head, view) is None:
                    entries.append(e)
                    continue
                current = view.head() if view is not None else None
                rec = ResetRecord(time=_now(), reason=reason.strip(), operator=who, previous=e.head, current=current)
                written.append(rec)
                new_head = current or LedgerHead(key=e.head.key, segments=0, chain=GENESIS, steps=0, epsilon=0.0)
                entries.append(e.model_copy(update={"head": new_head, "resets": e.resets + (rec,), "updated": rec.time}))
            folder = Path(ledger_dir) if ledger_dir is not None else self.path.parent / "privacy"
            for w in witnessed:
                e = next((x for x in entries if x.head.key == w.key), None)
                covered = e is not None and (
                    e.head.segments >= w.segments or any(r.previous.segments >= w.segments for r in e.resets)
                )
                if w.segments == 0 or covered:
                    continue
                lost = LedgerHead(key=w.key, segments=w.segments, chain=w.chain, steps=w.steps, epsilon=w.epsilon)
                rec = ResetRecord(time=_now(), reason=reason.strip(), operator=who, previous=lost, current=None)
                written.append(rec)
                genesis = LedgerHead(key=w.key, segments=0, chain=GENESIS, steps=0, epsilon=0.0)
                if e is None:
                    path = (folder / f"ledger-{w.key}.json").resolve()
                    entries.append(AnchorEntry(head=genesis, ledger=str(path), resets=(rec,), updated=rec.time))
                else:
                    entries[entries.index(e)] = e.model_copy(
                        update={"head": genesis, "resets": e.resets + (rec,), "updated": rec.time}
                    )
            if written:
                self._save(AnchorFile(entries=tuple(entries)))
        return written


def read_anchors(state_dir: str | Path) -> tuple[PrivacyAnchor, ...] | None:
    """Every anchored ledger head of a site, for its audit upload lines; ``None`` when the site has no anchor file.

    Raises:
        PrivacyLedgerError: the anchor file exists but cannot be read (the gate then sends nothing: fail closed).
    """
    store = AnchorStore(state_dir)
    if not store.path.exists():
        return None
    return tuple(PrivacyAnchor.of(e) for e in sorted(store.load().entries, key=lambda e: e.head.key))


def views_of(entries: Sequence[AnchorEntry], load_view) -> dict[str, LedgerView | None]:
    """``{key: load_view(path) or None}`` for the ledger file of every entry (``None`` when it is missing)."""
    out: dict[str, LedgerView | None] = {}
    for e in entries:
        p = Path(e.ledger)
        out[e.head.key] = load_view(p) if p.exists() else None
    return out
