"""A site's privacy ledger on disk: write-ahead, keyed by the dataset's fingerprint, fails closed.

The ε of DP-SGD composes over every step ever taken on a dataset (Abadi et al. 2016, "Deep Learning with
Differential Privacy"), across rounds, restarts and runs, so the history must outlive every process:

* **Keyed by the data, not by the process.** The file is ``<state_dir>/privacy/ledger-<fingerprint>.json`` where the
  fingerprint hashes the site's training arrays (``dataset_fingerprint``). Flower's ``node_id`` changes between
  runs and ``Context.state`` lives only for one run (Flower docs, "Design stateful ClientApps"); a ledger keyed by
  either silently restarts at ε = 0.
* **Write-ahead.** A round's steps are reserved (appended and fsync'ed) *before* any private data is touched;
  a crash mid-round therefore over-counts, never under-counts. The reservation is refused if the projected ε of
  the whole history would exceed the cap.
* **Fails closed.** An unreadable, foreign or inconsistent ledger file raises ``LedgerError``; it is never taken as
  "no history". A later run cannot raise the cap recorded by the first one, nor change δ.

The history is a list of segments ``(σ, q, steps)`` (Opacus' accountant format) with bookkeeping around each one;
ε is always recomputed from the segments by ``planner.epsilon`` so the file needs no trusted cached number.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from fcd_secure._io import atomic_write_text, file_lock
from fcd_secure.data.schema import SiteDataset
from fcd_secure.privacy.planner import epsilon

LEDGER_FORMAT = "fcd_secure.privacy.ledger/1"


class LedgerError(RuntimeError):
    """The ledger file cannot be trusted (unreadable, foreign, inconsistent). Training must not go on."""


class BudgetExceeded(RuntimeError):
    """A round would take the site's ε above its cap; the site refuses the round."""


def dataset_fingerprint(ds: SiteDataset) -> str:
    """SHA-256 (hex, 64 chars) of what DP-SGD trains on: shapes, dtypes and bytes of X, A, T, Y, M, and n_actions.

    The name and meta are left out (a site may rename its data between runs; the budget belongs to the records),
    and so are the propensities P, which the model never sees.
    """
    h = hashlib.sha256(b"fcd_secure.dataset/1")
    h.update(str(int(ds.n_actions)).encode())
    for key in ("X", "A", "T", "Y", "M"):
        arr = np.ascontiguousarray(getattr(ds, key))
        h.update(f"|{key}|{arr.dtype.str}|{arr.shape}|".encode())
        h.update(arr.tobytes())
    return h.hexdigest()


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
    plans: list[PlanRecord] = Field(default_factory=list)
    segments: list[SegmentRecord] = Field(default_factory=list)

    def history(self) -> list[tuple[float, float, int]]:
        """Every accounted segment. A reservation still open counts in full (a crash may have used it)."""
        return [(s.sigma, s.q, s.steps if s.status == "committed" else s.reserved_steps) for s in self.segments]

    def epsilon(self, accountant: str | None = None) -> float:
        return epsilon(self.history(), self.delta, accountant or self.accountant)


class Ledger:
    """Read-modify-write access to one ledger file, serialised by :func:`fcd_secure._io.file_lock`.

    Several processes may hold a ``Ledger`` on the same file (Flower simulation actors, a restarted site); every
    change re-reads the file under the lock, so none can reserve against a stale history.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)

    # -- io ------------------------------------------------------------------------------------------
    def exists(self) -> bool:
        return self.path.exists()

    def load(self) -> LedgerState:
        """The state on disk; ``LedgerError`` naming the file if it is missing, unreadable or inconsistent."""
        try:
            raw = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError as exc:
            raise LedgerError(f"{self.path}: no privacy ledger here") from exc
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise LedgerError(f"{self.path}: unreadable privacy ledger ({exc}); refusing to train") from exc
        try:
            state = LedgerState.model_validate(raw)
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"])
            raise LedgerError(f"{self.path}: invalid privacy ledger at field '{where}': {first['msg']}") from exc
        if not self.path.name.startswith(f"ledger-{state.fingerprint[:32]}"):
            raise LedgerError(f"{self.path}: ledger is for dataset {state.fingerprint[:16]}…, not this file name")
        seqs = [s.seq for s in state.segments]
        if seqs != list(range(1, len(seqs) + 1)):
            raise LedgerError(f"{self.path}: segment numbers {seqs} are not 1..n (entries removed or reordered)")
        for s in state.segments:
            if s.steps > s.reserved_steps:
                raise LedgerError(f"{self.path}: segment {s.seq} spent {s.steps} > reserved {s.reserved_steps} steps")
        return state

    def _save(self, state: LedgerState) -> None:
        # a reader (or a crash) sees the old file or the new one, never half of one
        atomic_write_text(self.path, state.model_dump_json(indent=1))

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Exclusive lock for a read-modify-write cycle."""
        with file_lock(self.path):
            yield

    # -- operations ----------------------------------------------------------------------------------
    def open_or_create(
        self,
        *,
        fingerprint: str,
        n_site: int,
        delta: float,
        epsilon_cap: float,
        clip: float,
        accountant: str,
        align_under_dp: str | None = None,
        noise_seed: str | None = None,
        site: str | None = None,
    ) -> LedgerState:
        """Load the ledger, or create it on first use; check a later run's settings against it.

        The first run fixes δ and the cap: a later config may lower the cap (it then applies) but never raise it,
        and may not change δ (ε at two different δ cannot be added up). Both raise ``LedgerError``.
        """
        with self.locked():
            if not self.path.exists():
                state = LedgerState(
                    fingerprint=fingerprint,
                    n_site=n_site,
                    delta=delta,
                    epsilon_cap=epsilon_cap,
                    clip=clip,
                    accountant=accountant,  # type: ignore[arg-type]
                    align_under_dp=align_under_dp,
                    noise_seed=noise_seed,
                    sites=[site] if site else [],
                )
                self._save(state)
                return state
            state = self.load()
            if state.fingerprint != fingerprint:
                raise LedgerError(f"{self.path}: ledger belongs to dataset {state.fingerprint[:16]}…")
            if state.n_site != n_site:
                raise LedgerError(f"{self.path}: ledger has n_site={state.n_site}, this dataset has {n_site}")
            if not np.isclose(state.delta, delta, rtol=1e-12, atol=0):
                raise LedgerError(
                    f"{self.path}: this dataset's budget is kept at δ={state.delta:g}; dp.delta={delta:g} would "
                    "make the ε of earlier runs incomparable. Use the recorded δ."
                )
            if epsilon_cap > state.epsilon_cap:
                raise LedgerError(
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
            if changed:
                self._save(state)
            return state

    def add_plan(self, plan: dict[str, Any]) -> PlanRecord:
        """Append a plan (the :class:`PlanRecord` fields but ``plan_id`` and ``created_at``) and return it."""
        with self.locked():
            state = self.load()
            record = PlanRecord(plan_id=len(state.plans) + 1, created_at=time.time(), **plan)
            state.plans.append(record)
            self._save(state)
            return record

    def reserve(
        self, *, plan_id: int, sigma: float, q: float, steps: int, round_id: int | None = None, run_id: str | None = None
    ) -> SegmentRecord:
        """Append a reserved segment if the projected ε stays ≤ the cap; else raise ``BudgetExceeded``."""
        if steps < 1:
            raise ValueError(f"dp: a round must reserve at least one step, got {steps}")
        with self.locked():
            state = self.load()
            projected = epsilon(state.history() + [(sigma, q, steps)], state.delta, state.accountant)
            if projected > state.epsilon_cap:
                spent = state.epsilon()
                raise BudgetExceeded(
                    f"privacy budget exhausted for dataset {state.fingerprint[:16]}…: this round's {steps} steps would "
                    f"bring ε to {projected:.3f} > cap {state.epsilon_cap:g} (spent {spent:.3f} at δ={state.delta:g}, "
                    f"{state.accountant})"
                )
            seg = SegmentRecord(
                seq=len(state.segments) + 1,
                plan_id=plan_id,
                sigma=sigma,
                q=q,
                reserved_steps=steps,
                steps=steps,
                status="reserved",
                epsilon_projected=projected,
                reserved_at=time.time(),
                round=round_id,
                run_id=run_id,
            )
            state.segments.append(seg)
            self._save(state)
            return seg

    def commit(self, seq: int, steps_taken: int) -> SegmentRecord:
        """Close a reservation with the steps actually taken (never more than reserved)."""
        with self.locked():
            state = self.load()
            if not 1 <= seq <= len(state.segments):
                raise LedgerError(f"{self.path}: no segment {seq} to commit")
            seg = state.segments[seq - 1]
            if seg.status != "reserved":
                raise LedgerError(f"{self.path}: segment {seq} is already committed")
            if steps_taken > seg.reserved_steps:
                raise LedgerError(
                    f"{self.path}: segment {seq} took {steps_taken} steps but reserved {seg.reserved_steps}"
                )
            seg.steps = steps_taken
            seg.status = "committed"
            seg.committed_at = time.time()
            self._save(state)
            return seg


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
