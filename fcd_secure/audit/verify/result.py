"""What verification finds: findings, per-ledger summaries, the verdict and its exit code."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal
from fcd_secure.errors import FcdError

EXIT_OK, EXIT_VIOLATION, EXIT_USAGE, EXIT_UNPINNED, EXIT_PARTIAL, EXIT_TAMPERED = 0, 1, 2, 3, 4, 6
#: verdict -> exit code (``unverified`` exits 0 only under ``allow_unpinned``; ``partial`` never exits 0)
EXIT_CODES = {
    "compliant": EXIT_OK,
    "violation": EXIT_VIOLATION,
    "unverified": EXIT_UNPINNED,
    "partial": EXIT_PARTIAL,
    "tampered": EXIT_TAMPERED,
}
#: the verdict is the first severity found in this order
VERDICT_ORDER = ("tampered", "violation", "partial", "unverified")

Severity = Literal["tampered", "violation", "partial", "unverified", "note"]


class UsageError(FcdError, ValueError):
    """Bad input to verify (path, fingerprint): exit 2."""


@dataclass
class Finding:
    """One thing verification found, located by ledger (relative path), entry seq and file line."""

    severity: Severity
    ledger: str
    seq: int | None
    line: int | None
    message: str

    def to_json(self) -> dict[str, Any]:
        return {"severity": self.severity, "ledger": self.ledger, "seq": self.seq, "line": self.line, "message": self.message}


@dataclass
class LedgerSummary:
    """One ledger's writer, key, size and what it records."""

    path: str
    role: str
    writer_id: str | None
    key_fingerprint: str | None
    key_pinned: bool
    lines: int
    uploads_sent: int = 0
    uploads_refused: int = 0
    uploads_error: int = 0
    receipts: int = 0
    unreceipted: int = 0
    checkpoints: int = 0
    payload_bytes: int = 0
    message_bytes: int = 0


@dataclass
class RefusalSummary:
    """One reply a site refused to send (its gate or its policy), or one part of a request its handler declined while
    it answered the rest (``part``: the line's ``declined``, P70): not a violation, listed for the auditor."""

    ledger: str
    site_id: str | None
    seq: int
    round: int | None
    action: str
    rule: str | None
    record: str | None
    key: str | None
    part: bool = False

    def to_json(self) -> dict[str, Any]:
        return dict(vars(self))


def _zero() -> dict[str, int]:
    return {"messages": 0, "payload_bytes": 0, "message_bytes": 0}


@dataclass
class VerifyResult:
    """Everything :func:`~fcd_secure.audit.verify.verify_path` found, its verdict and the uplink totals."""

    root: str
    findings: list[Finding] = field(default_factory=list)
    ledgers: list[LedgerSummary] = field(default_factory=list)
    #: every refusal the sites recorded (gate rules and site-policy rules), in ledger order
    refusals: list[RefusalSummary] = field(default_factory=list)
    #: (site_id, round) -> {"messages", "payload_bytes", "message_bytes"}; uplink that left the sites
    per_round: dict[tuple[str | None, int | None], dict[str, int]] = field(default_factory=dict)
    server_totals: dict[str, int] = field(default_factory=dict)
    #: every installation step the sites recorded (``install`` lines: init, join, preflight), in ledger order
    installations: list[dict[str, Any]] = field(default_factory=list)
    #: exit 0 instead of 3 when the only shortfall is unpinned identities (the verdict stays "unverified")
    allow_unpinned: bool = False

    def add(self, severity: Severity, ledger: str, seq: int | None, line: int | None, message: str) -> None:
        self.findings.append(Finding(severity, ledger, seq, line, message))

    def count_uplink(self, site_id: str | None, round: int | None, payload_bytes: int, message_bytes: int) -> None:
        agg = self.per_round.setdefault((site_id, round), _zero())
        agg["messages"] += 1
        agg["payload_bytes"] += int(payload_bytes)
        agg["message_bytes"] += int(message_bytes)

    @property
    def status(self) -> str:
        """The verdict: the most serious finding's severity (tampered > violation > partial > unverified), else
        compliant."""
        for severity in VERDICT_ORDER:
            if any(f.severity == severity for f in self.findings):
                return severity
        return "compliant"

    @property
    def exit_code(self) -> int:
        """The verdict's exit code (0 for ``unverified`` under ``allow_unpinned``)."""
        if self.status == "unverified" and self.allow_unpinned:
            return EXIT_OK
        return EXIT_CODES[self.status]

    def totals(self) -> dict[str, int]:
        """Messages, payload bytes and message bytes that left all sites."""
        out = _zero()
        for v in self.per_round.values():
            for k in out:
                out[k] += int(v[k])
        return out

    def per_site(self) -> dict[str | None, dict[str, int]]:
        """Messages, payload bytes and message bytes that left each site."""
        out: dict[str | None, dict[str, int]] = defaultdict(_zero)
        for (site, _), v in self.per_round.items():
            for k in v:
                out[site][k] += v[k]
        return dict(out)

    def to_json(self) -> dict[str, Any]:
        """Everything above as JSON (the ``data`` of the CLI envelope)."""
        return {
            "root": self.root,
            "verdict": self.status,
            "ledgers": [vars(s) for s in self.ledgers],
            "findings": [f.to_json() for f in self.findings],
            "refusals": [r.to_json() for r in self.refusals],
            "per_round": [
                {"site_id": s, "round": r, **v}
                for (s, r), v in sorted(self.per_round.items(), key=lambda kv: (str(kv[0][0]), kv[0][1] if kv[0][1] is not None else -1))
            ],
            "per_site": self.per_site(),
            "totals": self.totals(),
            "server_totals": self.server_totals,
            "installation": self.installations,
        }
