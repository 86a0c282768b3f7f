"""Scanning the server ledger(s): the other side of every reconciliation.

The server ledger is read first: its ``received`` lines (by message id), its ``manifest`` lines (by layout hash), its
``countersign`` lines (the sites' chain heads it signed) and the keys that wrote it are what each site's uploads,
manifests, receipts and chains are compared with. Every content reply the server received is also checked against
the egress policy and the server's own manifest (:func:`~fcd_secure.audit.verify.message_rules.check_message`): a
Θs name the server received is a violation even if the site's ledger was edited to hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from fcd_secure.audit.entries import CheckpointLine, CountersignLine, ExclusionLine, ManifestLine, ReceivedLine
from fcd_secure.audit.ledger import SERVER_LEDGER_FILE
from fcd_secure.audit.verify.chain import EXPECTED_ROLE, Located, read_chain
from fcd_secure.audit.verify.message_rules import check_message
from fcd_secure.audit.verify.result import LedgerSummary, VerifyResult


@dataclass
class ServerScan:
    """What the server ledgers under the verified path record."""

    #: whether any server ledger was found (without one, nothing is reconciled)
    present: bool = False
    #: message id -> (ledger label, the ``received`` line)
    received: dict[str, tuple[str, Located[ReceivedLine]]] = field(default_factory=dict)
    #: layout hash -> the server's ``manifest`` line
    manifests: dict[str, ManifestLine] = field(default_factory=dict)
    #: fingerprints of the keys that wrote the server ledgers
    keys: set[str] = field(default_factory=set)
    #: (ledger label, countersign line) of every site chain head the server signed
    countersigns: list[tuple[str, Located[CountersignLine]]] = field(default_factory=list)
    #: (seq, hash) of every countersign line, to check the copies the sites stored
    countersign_hashes: set[tuple[int, str]] = field(default_factory=set)


def scan_server(paths: list[Path], label: Callable[[Path], str], pinned: set[str] | None, res: VerifyResult) -> ServerScan:
    """Check every server ledger's chain and collect what the sites' ledgers are reconciled with.

    Args:
        paths: the ``server_ledger.jsonl`` files.
        label: how findings name a file.
        pinned: the pinned server fingerprints, or ``None``.
        res: where findings, the ledger summaries and the server totals go.
    """
    scan = ServerScan(present=bool(paths))
    for path in paths:
        lab = label(path)
        chain = read_chain(path, lab, pinned, EXPECTED_ROLE[SERVER_LEDGER_FILE], res)
        if chain.key_fingerprint is not None:
            scan.keys.add(chain.key_fingerprint)
        summary = LedgerSummary(lab, chain.role or "server", chain.writer_id, chain.key_fingerprint, pinned is not None, chain.size)
        in_force = None
        for loc in chain.entries:
            e = loc.entry
            if isinstance(e, ReceivedLine):
                scan.received[e.message_id] = (lab, loc)  # type: ignore[assignment]
                summary.payload_bytes += e.payload_bytes
                summary.message_bytes += e.message_bytes
                if not e.is_error:
                    check_message(e, in_force, _violation(res, lab, loc), layout_hash=False)
            elif isinstance(e, CheckpointLine):
                summary.checkpoints += 1
            elif isinstance(e, ManifestLine):
                scan.manifests[e.layout_hash] = e
                in_force = (e, e.to_manifest())
                for problem in e.inconsistencies():
                    res.add("tampered", lab, e.seq, loc.line, f"{loc.where}: the manifest line is inconsistent: {problem}")
            elif isinstance(e, CountersignLine):
                scan.countersigns.append((lab, loc))  # type: ignore[arg-type]
                scan.countersign_hashes.add((e.seq, e.hash))
            elif isinstance(e, ExclusionLine):  # the server's word on a site it left out (P33): said, not judged
                res.add("note", lab, e.seq, loc.line,
                        f"{loc.where}: the server left {e.site_id} out of every round from round {e.round} on: {e.reason}")
        rounds = {loc.entry.round for loc in chain.of_kind(ReceivedLine) if loc.entry.round is not None}
        closed = {loc.entry.round for loc in chain.of_kind(CheckpointLine)}
        for r in sorted(rounds - closed):
            res.add("note", lab, None, None, f"round {r} has no signed checkpoint yet")
        res.ledgers.append(summary)
    received = [loc.entry for _, loc in scan.received.values()]
    res.server_totals = {
        "messages": len(received),
        "payload_bytes": sum(e.payload_bytes for e in received),
        "message_bytes": sum(e.message_bytes for e in received),
    }
    return scan


def _violation(res: VerifyResult, label: str, loc: Located) -> Callable[[str], None]:
    def viol(msg: str) -> None:
        res.add("violation", label, loc.entry.seq, loc.line, f"{loc.where}: the server received a reply that breaks the egress policy: {msg}")

    return viol
