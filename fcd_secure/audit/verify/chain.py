"""Reading one ledger file as evidence: every line's JSON, type, place in the chain, hash, signature and checkpoints.

Nothing is trusted before it is checked: the hash is recomputed from the line as written, the signature checked
against the key of the ledger's own ``open`` line (and that key against the pinned fingerprints), and every
checkpoint recomputed from the lines before it by the same rule the writer used
(:func:`fcd_secure.audit.ledger.checkpoint_fields`).
"""

from __future__ import annotations

import json
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, TypeVar

from pydantic import ValidationError

from fcd_secure.audit.entries import CheckpointLine, LedgerLine, parse_line
from fcd_secure.audit.ledger import SERVER_LEDGER_FILE, SITE_LEDGER_FILE, checkpoint_fields, read_lines
from fcd_secure.audit.signing import GENESIS, line_hash, signature_ok
from fcd_secure.fingerprints import fingerprint
from fcd_secure.audit.verify.result import VerifyResult
from fcd_secure.errors import first_invalid

#: which file must hold which writer's ledger
EXPECTED_ROLE = {SITE_LEDGER_FILE: "site", SERVER_LEDGER_FILE: "server"}

L = TypeVar("L", bound=LedgerLine)


@dataclass(frozen=True)
class Located(Generic[L]):
    """A typed line and the file line it was read from."""

    entry: L
    line: int

    @property
    def where(self) -> str:
        return f"entry seq {self.entry.seq} (line {self.line})"


@dataclass
class Chain:
    """One ledger file after its chain checks: its writer and the lines that parsed, in order."""

    path: Path
    label: str
    role: str | None = None
    writer_id: str | None = None
    public_key: bytes | None = None
    #: lines that are JSON objects (whether or not they check)
    size: int = 0
    entries: list[Located[LedgerLine]] = field(default_factory=list)

    @property
    def key_fingerprint(self) -> str | None:
        return fingerprint(self.public_key) if self.public_key is not None else None

    def of_kind(self, cls: type[L]) -> list[Located[L]]:
        """The lines of kind ``cls``, in order."""
        return [loc for loc in self.entries if isinstance(loc.entry, cls)]  # type: ignore[misc]


def discover(root: Path) -> tuple[list[Path], list[Path]]:
    """``(site ledgers, server ledgers)`` under a directory, or the one ledger file ``root``."""
    if root.is_file():
        if root.name == SERVER_LEDGER_FILE:
            return [], [root]
        return [root], []
    return sorted(root.rglob(SITE_LEDGER_FILE)), sorted(root.rglob(SERVER_LEDGER_FILE))


def _is_digest(h: str) -> bool:
    return len(h) == 64 and all(c in string.hexdigits for c in h)


def read_chain(path: Path, label: str, pinned: set[str] | None, expected_role: str, res: VerifyResult) -> Chain:
    """Parse and check one ledger file; every problem is a ``tampered`` finding in ``res``.

    Args:
        path: the ledger file.
        label: how findings name the ledger (its path relative to what was verified).
        pinned: the fingerprints the writer's key must be among, or ``None`` (not pinned).
        expected_role: ``site`` or ``server``: who must have written a file of this name.
        res: where findings go.

    Returns:
        The chain's writer and its lines that parsed, with their file line numbers.
    """

    def bad(seq: object, line: int | None, msg: str) -> None:
        res.add("tampered", label, seq if isinstance(seq, int) else None, line, msg)

    chain = Chain(path, label)
    hashes: list[object] = []  # of every line that is a JSON object: what a checkpoint commits to
    prev: str | None = GENESIS
    for idx, (ln, text) in enumerate(read_lines(path)):
        try:
            obj = json.loads(text)
            if not isinstance(obj, dict):
                raise ValueError("not an object")
        except ValueError:
            bad(None, ln, f"line {ln} is not a valid ledger entry (edited or corrupted)")
            prev = None
            continue
        seq = obj.get("seq")
        where = f"entry seq {seq} (line {ln})"
        if idx == 0:
            _check_open(obj, path, where, pinned, expected_role, chain, lambda m: bad(seq, ln, m))
        if seq != idx:
            bad(seq, ln, f"{where}: expected seq {idx} (an entry was deleted, inserted or moved before it)")
        if prev is not None and obj.get("prev_hash") != prev:
            bad(seq, ln, f"{where}: prev_hash does not match the entry before it (deleted, inserted or reordered entries)")
        try:
            computed = line_hash(obj)
        except (TypeError, ValueError):
            computed = None
        if computed != obj.get("hash"):
            bad(seq, ln, f"{where}: content does not match its hash (the entry was edited)")
        elif chain.public_key is None or not signature_ok(chain.public_key, obj["hash"], str(obj.get("sig", ""))):
            bad(seq, ln, f"{where}: signature does not verify against the ledger's key")
        chain.size += 1
        prev = obj.get("hash")
        hashes.append(prev)
        try:
            entry = parse_line(text)
        except ValidationError as exc:
            at, msg = first_invalid(exc, "line")
            bad(seq, ln, f"{where}: not a well-formed {obj.get('kind')!r} entry ({at}: {msg})")
            continue
        if isinstance(entry, CheckpointLine):
            before = [loc.entry for loc in chain.entries]
            _check_checkpoint(entry, hashes[:-1], before, where, lambda m: bad(seq, ln, m))
        chain.entries.append(Located(entry, ln))
    if chain.size == 0:
        bad(None, None, "the ledger is empty")
    return chain


def _check_open(obj: dict, path: Path, where: str, pinned: set[str] | None, expected_role: str, chain: Chain, bad) -> None:
    """Line 0 must be the writer's ``open`` line, of the role the file name demands, with a pinned key."""
    if obj.get("kind") != "open" or "public_key" not in obj:
        bad(f"{where}: the ledger does not start with its 'open' entry (entries deleted at the start?)")
        return
    try:
        chain.public_key = bytes.fromhex(obj["public_key"])
    except (TypeError, ValueError):
        chain.public_key = None
    chain.role, chain.writer_id = obj.get("role"), obj.get("writer_id")
    if chain.role != expected_role:
        # a site ledger passed off as the server's (or the reverse) would reconcile with itself
        bad(f"{where}: the ledger opens with role {chain.role!r}, but {path.name} must be written by the "
            f"{expected_role} (ledgers swapped or renamed?)")
    if chain.public_key is None or obj.get("key_fingerprint") != fingerprint(chain.public_key):
        bad(f"{where}: the key fingerprint does not match the public key")
    elif pinned is not None and fingerprint(chain.public_key) not in pinned:
        bad(f"{where}: signed by key {fingerprint(chain.public_key)}, which is not among the pinned fingerprints")


def _check_checkpoint(cp: CheckpointLine, hashes: list[object], before: list[LedgerLine], where: str, bad) -> None:
    """A checkpoint must say what :func:`checkpoint_fields` says of the lines before it."""
    if not all(isinstance(h, str) and _is_digest(h) for h in hashes):
        bad(f"{where}: checkpoint of round {cp.round} disagrees with the chain (merkle_root)")
        return
    for k, v in checkpoint_fields(hashes, before, cp.round).items():  # type: ignore[arg-type]
        if getattr(cp, k) != v:
            bad(f"{where}: checkpoint of round {cp.round} disagrees with the chain ({k})")
            return
