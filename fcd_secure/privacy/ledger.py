"""A site's privacy ledger on disk: write-ahead, keyed by the dataset's fingerprint, fails closed.

The ε of DP-SGD composes over every step ever taken on a dataset (Abadi et al. 2016, "Deep Learning with
Differential Privacy"), across rounds, restarts and runs, so the history must outlive every process:

* **Keyed by the data, not by the process.** The file is ``<state_dir>/privacy/ledger-<fingerprint>.json`` where the
  fingerprint is the order-free hash of the site's records (:mod:`fcd_secure.privacy.identity`); a later table that
  is the same data (reordered, a record dropped or added) finds the same ledger by its record sketch
  (:func:`find_ledger`). Flower's ``node_id`` changes between runs and ``Context.state`` lives only for one run
  (Flower docs, "Design stateful ClientApps"); a ledger keyed by either silently restarts at ε = 0.
* **Write-ahead.** A round's steps are reserved (appended and fsync'ed) *before* any private data is touched;
  a crash mid-round therefore over-counts, never under-counts. The reservation is refused if the projected ε of
  the whole history would exceed the cap.
* **Fails closed.** An unreadable, foreign or inconsistent ledger file raises ``PrivacyLedgerError``; it is never taken as
  "no history". A later run cannot raise the cap recorded by the first one, nor change δ.
* **Anchored.** Every change is also written to the site's anchor (:mod:`fcd_secure.privacy.anchor`), so a ledger
  that was deleted or restored from an older copy raises ``LedgerRollback`` until an operator acknowledges the
  reset (:func:`acknowledge_reset`), which carries the lost spend forward (``AnchorStore.carried``).
* **Per record, across ledgers.** A ledger lists the records it charges (``records``); a reservation is refused if
  any record of the table would exceed the cap over *every* ledger of the folder that holds it, plus the carried
  spend (:mod:`fcd_secure.privacy.spend`). A server that changes the split or seed each run opens new ledgers, never
  a new budget for a record.

The history is a list of segments ``(σ, q, steps)`` (Opacus' accountant format) with bookkeeping around each one;
ε is always recomputed from the segments by ``planner.epsilon`` so the file needs no trusted cached number.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.anchor_records import LedgerHead
from fcd_secure.data.schema import SiteDataset
from fcd_secure.errors import first_invalid
from fcd_secure.privacy.anchor import AnchorStore, LedgerView, ResetRecord, segment_chain, views_of
from fcd_secure.privacy.errors import BudgetExceeded, PrivacyLedgerError, LedgerRollback
from fcd_secure.privacy.identity import SAME_DATA, DatasetIdentity, dataset_identity, same_data, shared_fraction
from fcd_secure.privacy.planner import epsilon
from fcd_secure.privacy.spend import Holding, RecordGroup, groups, worst_group

__all__ = [
    "BudgetExceeded",
    "Ledger",
    "PrivacyLedgerError",
    "LedgerRollback",
    "LedgerState",
    "acknowledge_reset",
    "dataset_fingerprint",
    "find_ledger",
    "ledger_path",
    "migrate_to_record_secret",
    "privacy_ledger_hash",
    "site_holdings",
]

LEDGER_FORMAT = "fcd_secure.privacy.ledger/1"


def dataset_fingerprint(ds: SiteDataset, secret: bytes = b"") -> str:
    """SHA-256 (hex, 64 chars) of the sorted ids of the records DP-SGD trains on (raw X, A, T, Y at valid steps,
    keyed with ``secret``).

    Row order, padding, the name, the standardisation and the propensities P (which the model never sees) are left
    out: the budget belongs to the records (:mod:`fcd_secure.privacy.identity`,
    :func:`~fcd_secure.privacy.identity.dataset_identity`). ``DPSite.for_dataset`` keys them with the ledger folder's
    record secret; the empty key names a table by its content alone, for a ledger opened by a bare fingerprint.
    """
    return dataset_identity(ds, secret).fingerprint


def ledger_path(state_dir: str | Path, fingerprint: str, ledger_dir: str | Path | None = None) -> Path:
    """Where the ledger of a dataset lives: ``<ledger_dir>/ledger-<fp>.json`` when a persistent ledger folder is
    configured (shared by all sites of a machine, keyed only by the data), else ``<state_dir>/privacy/…``."""
    if not fingerprint or any(c not in "0123456789abcdef" for c in fingerprint):
        raise ValueError(f"dataset fingerprint must be lowercase hex, got {fingerprint!r}")
    if ledger_dir is not None:
        return Path(ledger_dir) / f"ledger-{fingerprint[:32]}.json"
    return Path(state_dir) / "privacy" / f"ledger-{fingerprint[:32]}.json"


class PlanRecord(BaseModel):
    """σ planned once for one planned use of the data (rounds × local epochs × steps per epoch)."""

    model_config = ConfigDict(extra="forbid")

    plan_id: int
    sigma: float = Field(gt=0)
    q: float = Field(gt=0, le=1)
    batch_size: int = Field(ge=1)
    steps_per_round: int = Field(ge=1)
    planned_rounds: int = Field(ge=1)
    local_epochs: int = Field(ge=1)
    created_at: float

    @property
    def planned_steps(self) -> int:
        return self.steps_per_round * self.planned_rounds


class SegmentRecord(BaseModel):
    """One round's DP-SGD steps: reserved before training, committed after (``steps`` ≤ ``reserved_steps``)."""

    model_config = ConfigDict(extra="forbid")

    seq: int
    plan_id: int
    sigma: float = Field(gt=0)
    q: float = Field(gt=0, le=1)
    reserved_steps: int = Field(ge=1)
    steps: int = Field(ge=0)
    status: Literal["reserved", "committed"]
    epsilon_projected: float
    reserved_at: float
    committed_at: float | None = None
    round: int | None = None
    run_id: str | None = None


class LedgerState(BaseModel):
    """The whole file."""

    model_config = ConfigDict(extra="forbid")

    format: Literal["fcd_secure.privacy.ledger/1"] = LEDGER_FORMAT
    fingerprint: str
    n_site: int = Field(ge=1)
    delta: float = Field(gt=0, lt=1)
    epsilon_cap: float = Field(gt=0)
    clip: float = Field(gt=0)
    accountant: Literal["prv", "rdp"]
    #: what the batch-coupled L_align became under DP in the latest run ("off" | "reference"), for the report
    align_under_dp: str | None = None
    noise_seed: str | None = None
    #: site ids that trained on this dataset (labels for the report; the key is the fingerprint)
    sites: list[str] = Field(default_factory=list)
    #: the smallest record ids of the first table (:class:`~fcd_secure.privacy.identity.DatasetIdentity`), so that
    #: the same data in another row order, or with a record dropped, finds this ledger
    sketch: list[str] = Field(default_factory=list)
    #: fingerprints of every table trained under this ledger (the first is ``fingerprint``)
    datasets: list[str] = Field(default_factory=list)
    #: the keys of every record of those tables (:func:`~fcd_secure.privacy.identity.record_keys`), sorted: each is
    #: charged this ledger's whole history in the site's per-record account (:mod:`fcd_secure.privacy.spend`); empty
    #: for a ledger opened by a bare fingerprint, which then accounts its own history only
    records: list[str] = Field(default_factory=list)
    plans: list[PlanRecord] = Field(default_factory=list)
    segments: list[SegmentRecord] = Field(default_factory=list)

    def history(self) -> list[tuple[float, float, int]]:
        """Every accounted segment. A reservation still open counts in full (a crash may have used it)."""
        return [(s.sigma, s.q, s.steps if s.status == "committed" else s.reserved_steps) for s in self.segments]

    def identity(self) -> DatasetIdentity:
        """The identity of the table that opened this ledger."""
        return DatasetIdentity(fingerprint=self.fingerprint, n=self.n_site, sketch=tuple(self.sketch))

    def view(self, key: str) -> LedgerView:
        """This ledger as its anchor compares it (:mod:`fcd_secure.privacy.anchor`)."""
        return LedgerView(
            key=key,
            chain=segment_chain(self.segments),
            steps=tuple(h[2] for h in self.history()),
            epsilon=max((s.epsilon_projected for s in self.segments), default=0.0),
        )

    def epsilon(self, accountant: str | None = None) -> float:
        return epsilon(self.history(), self.delta, accountant or self.accountant)

    def holding(self, key: str) -> Holding:
        """This ledger in the site's per-record account."""
        return Holding(key=key, history=tuple(self.history()), delta=self.delta, records=frozenset(self.records))


class Ledger:
    """Read-modify-write access to one ledger file, serialised by :func:`fcd_secure._io.file_lock`.

    Several processes may hold a ``Ledger`` on the same file (Flower simulation actors, a restarted site); every
    change re-reads the file under the lock, so none can reserve against a stale history. With an ``anchor``
    (the site's :class:`~fcd_secure.privacy.anchor.AnchorStore`), every change is anchored and a reservation first
    checks that the ledger is not behind its anchor.
    """

    def __init__(self, path: str | Path, *, anchor: AnchorStore | None = None) -> None:
        self.path = Path(path)
        self.anchor = anchor

    @property
    def key(self) -> str:
        """The file key: ``ledger-<key>.json``."""
        return self.path.stem[len("ledger-"):]

    # -- io ------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> LedgerState:
        """The state on disk; ``PrivacyLedgerError`` naming the file if it is missing, unreadable or inconsistent."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise PrivacyLedgerError(f"{self.path}: no privacy ledger here") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise PrivacyLedgerError(f"{self.path}: unreadable privacy ledger ({exc}); refusing to train") from exc
        try:
            state = LedgerState.model_validate(raw)
        except ValidationError as exc:
            where, msg = first_invalid(exc)
            raise PrivacyLedgerError(f"{self.path}: invalid privacy ledger at field '{where}': {msg}") from exc
        if not self.path.name.startswith(f"ledger-{state.fingerprint[:32]}"):
            raise PrivacyLedgerError(f"{self.path}: ledger is for dataset {state.fingerprint[:16]}…, not this file name")
        seqs = [s.seq for s in state.segments]
        if seqs != list(range(1, len(seqs) + 1)):
            raise PrivacyLedgerError(f"{self.path}: segment numbers {seqs} are not 1..n (entries removed or reordered)")
        for s in state.segments:
            if s.steps > s.reserved_steps:
                raise PrivacyLedgerError(f"{self.path}: segment {s.seq} spent {s.steps} > reserved {s.reserved_steps} steps")
        return state

    def view(self) -> LedgerView | None:
        """The ledger as its anchor compares it, or ``None`` when the file is missing."""
        return self.load().view(self.key) if self.path.exists() else None

    def _save(self, state: LedgerState) -> None:
        # a reader (or a crash) sees the old file or the new one, never half of one
        atomic_write_text(self.path, state.model_dump_json(indent=1))

    def _anchor(self, state: LedgerState, identity: DatasetIdentity | None = None) -> None:
        if self.anchor is not None:
            self.anchor.update(state.view(self.key).head(), identity=identity, ledger=self.path)

    def check_anchor(self) -> None:
        """Raise ``LedgerRollback`` if the ledger was deleted or rolled back since the site anchored it."""
        if self.anchor is not None:
            self.anchor.check(self.key, self.view())

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock for a read-modify-write cycle."""
        with file_lock(self.path):
            yield

    # -- operations ----------------------------------------------------------------------------------
    def open_or_create(
        self,
        *,
        fingerprint: str | None = None,
        n_site: int,
        delta: float,
        epsilon_cap: float,
        clip: float,
        accountant: str,
        align_under_dp: str | None = None,
        noise_seed: str | None = None,
        site: str | None = None,
        identity: DatasetIdentity | None = None,
        records: Sequence[str] | None = None,
    ) -> LedgerState:
        """Load the ledger, or create it on first use; check a later run's settings against it.

        The first run fixes δ and the cap: a later config may lower the cap (it then applies) but never raise it,
        and may not change δ (ε at two different δ cannot be added up). Both raise ``PrivacyLedgerError``. The table
        (``identity``, or a bare ``fingerprint``) must be the ledger's own data
        (:func:`~fcd_secure.privacy.identity.same_data`); its size may differ from the first table's (a record
        dropped or added): the latest is recorded. ``records`` (the table's record keys) join the ledger's records
        while it has no history (else at their first reservation, :meth:`reserve`).

        Raises:
            LedgerRollback: the ledger is missing or behind the site's anchor.
            PrivacyLedgerError: another table's ledger, a raised cap, another δ, an unreadable file.
        """
        if identity is None:
            if fingerprint is None:
                raise ValueError("open_or_create needs the table's identity or fingerprint")
            identity = DatasetIdentity(fingerprint=fingerprint, n=n_site)
        with self.locked():
            self.check_anchor()
            if not self.path.exists():
                state = LedgerState(
                    fingerprint=identity.fingerprint,
                    n_site=n_site,
                    delta=delta,
                    epsilon_cap=epsilon_cap,
                    clip=clip,
                    accountant=accountant,  # type: ignore[arg-type]
                    align_under_dp=align_under_dp,
                    noise_seed=noise_seed,
                    sites=[site] if site else [],
                    sketch=list(identity.sketch),
                    datasets=[identity.fingerprint],
                    records=sorted(set(records or ())),
                )
                self._save(state)
                self._anchor(state, identity)
                return state
            state = self.load()
            if state.fingerprint != identity.fingerprint and not same_data(state.identity(), identity):
                raise PrivacyLedgerError(
                    f"{self.path}: ledger belongs to dataset {state.fingerprint[:16]}… (this table shares "
                    f"{shared_fraction(state.identity(), identity):.0%} of its records)"
                )
            if not np.isclose(state.delta, delta, rtol=1e-12, atol=0):
                raise PrivacyLedgerError(
                    f"{self.path}: this dataset's budget is kept at δ={state.delta:g}; dp.delta={delta:g} would "
                    "make the ε of earlier runs incomparable. Use the recorded δ."
                )
            if epsilon_cap > state.epsilon_cap:
                raise PrivacyLedgerError(
                    f"{self.path}: dp.epsilon={epsilon_cap:g} is above the cap {state.epsilon_cap:g} fixed by the "
                    "first run on this dataset; a cap can be lowered, never raised"
                )
            changed = False
            if epsilon_cap < state.epsilon_cap:
                state.epsilon_cap = epsilon_cap
                changed = True
            if clip != state.clip or accountant != state.accountant:
                # C and the accountant may change between runs: segments carry (σ, q, steps) and σ is relative to
                # the C of its round, so the composition stays valid. The latest values are what the report shows.
                state.clip, state.accountant = clip, accountant  # type: ignore[assignment]
                changed = True
            if (align_under_dp, noise_seed) != (state.align_under_dp, state.noise_seed):
                state.align_under_dp, state.noise_seed = align_under_dp, noise_seed
                changed = True
            if site and site not in state.sites:
                state.sites.append(site)
                changed = True
            if state.n_site != n_site:
                state.n_site = n_site  # the same data with a record dropped or added: q and δ follow the latest table
                changed = True
            if identity.fingerprint not in state.datasets:
                state.datasets = (state.datasets or [state.fingerprint]) + [identity.fingerprint]
                changed = True
            if records and not state.segments and not set(records) <= set(state.records):
                # listed now (nothing is charged to them yet); a ledger with history lists them at their first
                # reservation, so a refused table's records are never charged this ledger's earlier rounds
                state.records = sorted(set(state.records) | set(records))
                changed = True
            if changed:
                self._save(state)
            self._anchor(state, state.identity())
            return state

    def add_plan(self, plan: dict[str, Any]) -> PlanRecord:
        """Append a plan (the :class:`PlanRecord` fields but ``plan_id`` and ``created_at``) and return it."""
        with self.locked():
            state = self.load()
            record = PlanRecord(plan_id=len(state.plans) + 1, created_at=time.time(), **plan)
            state.plans.append(record)
            self._save(state)
            return record

    def record_groups(self, state: LedgerState, records: Sequence[str] | None) -> list[RecordGroup]:
        """The table's records grouped by the ledgers of this folder that charge them, this ledger's history in each
        (:func:`fcd_secure.privacy.spend.groups`); one group of this ledger alone when ``records`` is ``None``."""
        if not records:
            return [RecordGroup(tuple(state.history()), state.delta, max(1, state.n_site))]
        return groups(records, site_holdings(self.path.parent, exclude=self.path), base=state.history(),
                      base_delta=state.delta)

    def reserve(
        self,
        *,
        plan_id: int,
        sigma: float,
        q: float,
        steps: int,
        round_id: int | None = None,
        run_id: str | None = None,
        records: Sequence[str] | None = None,
        carried: float = 0.0,
    ) -> SegmentRecord:
        """Append a reserved segment if every record of the table stays ≤ the cap; else raise ``BudgetExceeded``.

        A record's projected ε composes this round with every ledger of the folder that holds the record
        (``records``: the table's record keys; ``None``: this ledger only) and adds ``carried`` (the spend of
        acknowledged resets). Reservations in one folder are serialised, so two tables sharing records cannot both
        pass against a stale account.

        Raises:
            BudgetExceeded: some record's projected ε would exceed the cap (the files are left as they were).
            LedgerRollback: the ledger is behind the site's anchor.
        """
        if steps < 1:
            raise ValueError(f"dp: a round must reserve at least one step, got {steps}")
        with file_lock(self.path.parent / "reservations"), self.locked():
            self.check_anchor()
            state = self.load()
            gs = self.record_groups(state, records)
            own, _ = worst_group(gs, state.accountant, [(sigma, q, steps)])
            projected = own + carried
            if projected > state.epsilon_cap:
                spent, _ = worst_group(gs, state.accountant)
                raise BudgetExceeded(
                    f"privacy budget exhausted for dataset {state.fingerprint[:16]}…: this round's {steps} steps would "
                    f"bring the most-spent record of this table to ε {projected:.3f} > cap {state.epsilon_cap:g} "
                    f"(that record has spent {spent + carried:.3f} over every run on this site"
                    + (f", {carried:.3f} of it carried by acknowledged resets" if carried else "")
                    + f", at δ={state.delta:g}, {state.accountant})"
                )
            seg = SegmentRecord(
                seq=len(state.segments) + 1,
                plan_id=plan_id,
                sigma=sigma,
                q=q,
                reserved_steps=steps,
                steps=steps,
                status="reserved",
                epsilon_projected=own,  # without the carried spend: a later reset carries this head's ε once
                reserved_at=time.time(),
                round=round_id,
                run_id=run_id,
            )
            state.segments.append(seg)
            if records and not set(records) <= set(state.records):
                # the table's records are charged from this reservation on (never for a refused one)
                state.records = sorted(set(state.records) | set(records))
            self._save(state)  # the ledger first: a crash before the anchor leaves the ledger ahead, never behind
            self._anchor(state)
            return seg

    def commit(self, seq: int, steps_taken: int) -> SegmentRecord:
        """Close a reservation with the steps actually taken (never more than reserved)."""
        with self.locked():
            state = self.load()
            if not 1 <= seq <= len(state.segments):
                raise PrivacyLedgerError(f"{self.path}: no segment {seq} to commit")
            seg = state.segments[seq - 1]
            if seg.status != "reserved":
                raise PrivacyLedgerError(f"{self.path}: segment {seq} is already committed")
            if steps_taken > seg.reserved_steps:
                raise PrivacyLedgerError(
                    f"{self.path}: segment {seq} took {steps_taken} steps but reserved {seg.reserved_steps}"
                )
            seg.steps = steps_taken
            seg.status = "committed"
            seg.committed_at = time.time()
            self._anchor(state)  # the anchor first: a commit may lower the accounted steps
            self._save(state)
            return seg


def find_ledger(folder: str | Path, identity: DatasetIdentity, anchor: AnchorStore | None = None) -> Path:
    """The ledger file of ``identity``'s data in ``folder`` (it need not exist yet).

    In order: the file named by the table's own fingerprint; a ledger in ``folder`` opened by the same data (the
    largest share of records wins); a ledger the site anchored for the same data that is gone (the caller's anchor
    check then refuses); else a new file named by the fingerprint.

    Raises:
        PrivacyLedgerError: a ledger file or the anchor in the way cannot be read.
    """
    folder = Path(folder)
    own = folder / f"ledger-{identity.fingerprint[:32]}.json"
    if own.exists():
        return own
    best: tuple[float, Path] | None = None
    for p in sorted(folder.glob("ledger-*.json")):
        share = shared_fraction(Ledger(p).load().identity(), identity)
        if share >= SAME_DATA and (best is None or share > best[0]):
            best = (share, p)
    if best is not None:
        return best[1]
    if anchor is not None:
        for entry in anchor.matching(identity):
            if entry.head.segments > 0 and not Path(entry.ledger).exists():
                return Path(entry.ledger)
    return own


def site_holdings(folder: str | Path, exclude: str | Path | None = None) -> list[Holding]:
    """Every ledger of ``folder`` that lists its records, as the per-record account reads it (``exclude`` left out).

    Raises:
        PrivacyLedgerError: a ledger cannot be read (fail closed: its records' spend would be missed).
    """
    skip = Path(exclude).resolve() if exclude is not None else None
    out = []
    for p in sorted(Path(folder).glob("ledger-*.json")):
        if skip is not None and p.resolve() == skip:
            continue
        ledger = Ledger(p)
        state = ledger.load()
        if state.records:
            out.append(state.holding(ledger.key))
    return out


def acknowledge_reset(
    state_dir: str | Path,
    reason: str,
    operator: str | None = None,
    *,
    witnessed: Sequence[LedgerHead] = (),
    ledger_dir: str | Path | None = None,
) -> list[ResetRecord]:
    """An operator's acknowledgement that the site's privacy ledgers were lost or rolled back.

    Every anchored ledger of ``<state_dir>/privacy_anchor.json`` that is behind its anchored head gets a reset
    record (reason, operator, time, the head that was lost) and is re-anchored as it now is, so the site trains
    again. The records stay in the anchor file, the privacy report lists them, and the audit gate carries them into
    the site's signed audit chain with the next upload, where ``fcd audit verify`` reports them.

    The spend each lost head held is carried forward (``AnchorStore.carried``): it is charged to every record the
    site trains afterwards, so an acknowledgement never raises what is left of any record's budget.

    Args:
        state_dir: the site's state directory.
        reason: why (required, recorded).
        operator: who acknowledges (default: the login name).
        witnessed: the heads the site's signed audit chain recorded; those the anchor lost too (ledger and anchor
            deleted together) are acknowledged as well.
        ledger_dir: where such a lost ledger was (for the record).

    Returns:
        The reset records written (empty: nothing was behind its anchor).

    Raises:
        FileNotFoundError: the site has no anchor file and its audit chain recorded no head.
        PrivacyLedgerError: the anchor, or a ledger that still exists, cannot be read.
        ValueError: an empty reason.
    """
    store = AnchorStore(state_dir)
    if not store.path.exists() and not any(w.segments for w in witnessed):
        raise FileNotFoundError(f"{store.path}: no privacy anchor in this state directory")
    views = views_of(store.load().entries, lambda p: Ledger(p).view())
    return store.acknowledge(views, reason=reason, operator=operator, witnessed=witnessed, ledger_dir=ledger_dir)


def privacy_ledger_hash(state_dir: Path, ledger_dir: str | Path | None = None) -> str | None:
    """sha256 over the site's DP ledger files, binding the privacy ledger's state to every upload entry.

    ``<state_dir>/privacy/ledger-*.json``, or ``<ledger_dir>/ledger-*.json`` when the run keeps DP ledgers in a
    persistent folder (``[dp] ledger_dir``); ``None`` when the site trains without DP.
    """
    files = sorted(Path(state_dir).glob("privacy/ledger-*.json"))
    if ledger_dir:
        files += sorted(Path(ledger_dir).glob("ledger-*.json"))
    if not files:
        return None
    h = hashlib.sha256()
    for f in files:
        h.update(f.name.encode() + b"\0" + f.read_bytes() + b"\0")
    return h.hexdigest()


#: the note a record-secret migration leaves beside the ledgers it re-keyed (:func:`migrate_to_record_secret`)
MIGRATION_NOTE = "record_secret.migration.json"


def migrate_to_record_secret(folder: str | Path, tables: Sequence[SiteDataset]) -> dict[str, Any]:
    """Give a folder of ledgers that predates its record secret one, keeping every record's spent ε (P45).

    Ledgers written before ``record_secret.key`` list their records under keys no secret reproduces, and the site
    refuses to train on them (:func:`fcd_secure.privacy.identity.record_secret`). Here every such ledger is charged
    to *every* record of the site's ``tables`` (its table as it is now: pass every split) under a fresh secret: each
    record then composes the whole history of every old ledger, at least what it had spent in any of them
    (conservative: a record that was in one ledger only is charged all of them). The new secret is written last, so
    a migration stopped midway runs again from the start (its ledgers still list records and no secret is there).
    A note beside the ledgers (:data:`MIGRATION_NOTE`) records when, which ledgers, their ε and the records charged.

    What it cannot keep: the spend of a record no longer in ``tables`` (its key under the new secret is unknown); such
    a record, added back later, starts from the ledgers that charge it then.

    Raises:
        PrivacyLedgerError: the folder has its record secret already, or no ledger that lists records.
    """
    import datetime  # noqa: PLC0415
    import secrets  # noqa: PLC0415

    from fcd_secure._io import atomic_write_bytes  # noqa: PLC0415
    from fcd_secure.privacy.identity import RECORD_SECRET_FILE, record_keys  # noqa: PLC0415

    folder = Path(folder)
    if (folder / RECORD_SECRET_FILE).exists():
        raise PrivacyLedgerError(f"{folder / RECORD_SECRET_FILE}: the ledgers have their record secret; nothing to "
                                 "migrate")
    old = [Ledger(p) for p in sorted(folder.glob("ledger-*.json")) if Ledger(p).load().records]
    if not old:
        raise PrivacyLedgerError(f"{folder}: no ledger that lists records; nothing to migrate")
    secret = secrets.token_bytes(32)
    keys = sorted(set().union(*(record_keys(t, secret) for t in tables)))
    migrated = []
    for ledger in old:
        with ledger.locked():
            state = ledger.load()
            migrated.append({"ledger": ledger.path.name, "epsilon": state.epsilon(), "records_before": len(state.records)})
            state.records = keys
            ledger._save(state)
    note = {"migrated": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"), "records_charged": len(keys),
            "ledgers": migrated, "rule": "every record of the site's table is charged every ledger listed here"}
    atomic_write_text(folder / MIGRATION_NOTE, json.dumps(note, indent=1) + "\n")
    atomic_write_bytes(folder / RECORD_SECRET_FILE, secret, mode=0o600)
    return note
