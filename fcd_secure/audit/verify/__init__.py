"""Offline verification of site and server ledgers, for auditors (``fcd audit verify``).

Given a run directory (or one site's directory, or one ledger file) and the key fingerprints the auditor pinned out
of band, verification runs in three steps: scan the server ledger(s) (:mod:`.server_side`), scan every site ledger
(:mod:`.site_side`), reconcile the two (:mod:`.reconcile`); each ledger's chain is read by :mod:`.chain`, every
recorded message is held to the egress policy by :mod:`.message_rules`, and the findings and verdict are
:mod:`.result`. The verdict is the first that applies (its exit code is what ``fcd audit verify`` returns):

* **tampered** (exit 6, evidence tampered or inconsistent): a line that does not parse or is not a well-formed
  entry, a hash, ``prev_hash``, ``seq`` or signature that does not check, a ledger signed by a key that is not
  pinned, a ``manifest`` line whose names, shapes, dtypes and flags do not hash to the layout hash it records (or
  that names a tensor twice, or flags a name that is not one of its Θs tensors), a site's manifest line that is not
  the server's for that hash, a ledger whose ``open`` entry names the other role (``site_ledger.jsonl`` must be
  written by a site, ``server_ledger.jsonl`` by the server), a checkpoint that disagrees with the chain before it, a receipt or
  countersignature whose signature or fields do not match what it acknowledges (or that acknowledges an upload the
  site never recorded, or is signed by a key that is neither the server ledger's nor a pinned server key), a server
  ledger entry with no matching site upload, a site upload the server ledger present has no record of (a deleted
  server ledger tail), a site upload and the server's record of it that differ in any fact (bytes, hash, tensor
  names, shapes, dtypes, records, metric or config names), or a site chain head the server countersigned that the
  site ledger no longer holds (a ledger rewritten, even re-signed with the site's own key, after the server signed);
* **violation** (exit 1): an upload that left the site naming a Θs parameter or a propensity, a tensor that is not a
  Θc tensor of the manifest in force (or has another shape/dtype), or whose bytes exceed the Θc layout plus the
  protocol overhead bound, or a refusal whose error reply still carried content; the same rules on every reply the
  server ledger received; and a privacy-ledger head that disappears or goes backwards over a site's uploads without
  an acknowledged reset (:mod:`.privacy_history`);
* **partial** (exit 4, evidence incomplete): site ledgers verified without the server ledger (or a server ledger
  without the site ledgers), or an upload with content the server never acknowledged with a receipt. Nothing can then
  rule out a truncated or re-signed ledger, so this is never "compliant", and ``--allow-unpinned`` does not change its
  exit. A refusal or error (no content) that the server ledger records with every fact equal but never receipted is
  a **note**: the server's own ledger is the acknowledgement, and a server that withholds the receipt (or stops at
  the refusal) cannot turn an honest site's evidence partial (P28);
* refusals (a reply the site's gate withheld, or a request its own policy refused: weaker settings, a downgrade to
  clear text, an evaluation cohort, an app it does not pin, a message type its app does not handle) are **not**
  violations: they are the site doing its job, and are listed with their rule in ``VerifyResult.refusals`` (report
  section "Refusals", JSON ``data.refusals``); a message type the site does not handle is also named in a note (P28);
* **unverified** (exit 3, identity not pinned): every check above passed, but some ledger's key (or the key that
  signed a site's receipts) was not pinned with ``--site-key`` / ``--server-key``. Unpinned signatures prove only
  that one key wrote a whole chain: a chain rebuilt and re-signed with a fresh key checks just as well, so this is
  never "compliant". ``allow_unpinned=True`` (``--allow-unpinned``) turns the exit code to 0; the verdict stays
  "unverified";
* **compliant** (exit 0) otherwise: intact, consistent, complete, within policy, and tied to pinned identities.

An acknowledged privacy-ledger reset is a **note** naming the operator, the reason and the ε spent before it.

Exit 2 (usage error: missing path, malformed fingerprint, no ledger found) is raised as :class:`UsageError`.

It also totals uplink bytes per site and per round (paper Table II "uplink = selected clients × synchronised
parameter size", here measured). The negative proof "Θs never left" covers what passed through the gate: network
counters must corroborate that there was no other path.
"""

from __future__ import annotations

import json
from pathlib import Path

from pydantic import ValidationError

from fcd_secure.audit.entries import OpenLine, parse_line
from fcd_secure.audit.ledger import SERVER_LEDGER_FILE, SITE_LEDGER_FILE, read_lines
from fcd_secure.fingerprints import normalise_fingerprint
from fcd_secure.audit.verify.chain import discover
from fcd_secure.audit.verify.reconcile import reconcile
from fcd_secure.audit.verify.result import (
    EXIT_CODES,
    EXIT_OK,
    EXIT_PARTIAL,
    EXIT_TAMPERED,
    EXIT_UNPINNED,
    EXIT_USAGE,
    EXIT_VIOLATION,
    Finding,
    LedgerSummary,
    RefusalSummary,
    UsageError,
    VerifyResult,
)
from fcd_secure.audit.verify.server_side import scan_server
from fcd_secure.audit.verify.site_side import scan_site

__all__ = [
    "EXIT_CODES",
    "EXIT_OK",
    "EXIT_PARTIAL",
    "EXIT_TAMPERED",
    "EXIT_UNPINNED",
    "EXIT_USAGE",
    "EXIT_VIOLATION",
    "Finding",
    "LedgerSummary",
    "RefusalSummary",
    "UsageError",
    "VerifyResult",
    "ledger_identities",
    "verify_path",
]


def _pins(keys: list[str] | None) -> set[str] | None:
    return {normalise_fingerprint(k) for k in keys} if keys else None


def _check_ledger_file(path: Path) -> None:
    """A file given as evidence must at least look like a ledger: its first line a JSON object with a ``kind``.

    Anything else (a CSV, a summary, a binary) is the wrong file, a usage error, not tampered evidence: a ledger
    that was tampered with still starts with a ledger line (verification then says what is wrong with it).

    Raises:
        UsageError: empty, unreadable, or not a ledger.
    """
    try:
        with open(path, "rb") as fh:
            first = next((line for line in fh if line.strip()), b"")
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror})") from None
    try:
        head = json.loads(first) if first else None
    except ValueError:
        head = None
    if not isinstance(head, dict) or "kind" not in head:
        raise UsageError(
            f"{path}: not a ledger (expected {SITE_LEDGER_FILE} or {SERVER_LEDGER_FILE}: JSON lines, one entry each)"
        )


def _ledgers_under(root: Path) -> tuple[list[Path], list[Path]]:
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory")
    if root.is_file():
        _check_ledger_file(root)
    sites, servers = discover(root)
    if not sites and not servers:
        raise UsageError(f"{root}: no {SITE_LEDGER_FILE} or {SERVER_LEDGER_FILE} found")
    return sites, servers


def verify_path(
    path: str | Path,
    *,
    site_keys: list[str] | None = None,
    server_keys: list[str] | None = None,
    allow_unpinned: bool = False,
    site_pins_by_writer: dict[str, str] | None = None,
) -> VerifyResult:
    """Verify every ledger under ``path``.

    Args:
        path: a run directory, a site directory or one ledger file.
        site_keys: pinned site fingerprints (``SHA256:<hex>``); ``None`` or empty means not pinned.
        server_keys: pinned server fingerprints; ``None`` or empty means not pinned. Without pins the signatures
            prove only that one key wrote each chain, so the verdict is at best "unverified".
        allow_unpinned: exit 0 instead of 3 when unpinned keys are the only shortfall (the verdict stays
            "unverified").
        site_pins_by_writer: the pin file's ``[sites]`` table (writer id -> fingerprint), when the site pins came
            from one: a pin that contradicts both the site's ledger and the server's countersignatures of it is the
            pin file's error (:func:`_check_pins_against_evidence`), not the evidence's.

    Returns:
        The findings, per-ledger summaries, uplink totals and the verdict with its exit code.

    Raises:
        UsageError: a missing path, a malformed fingerprint or a directory without ledgers.
    """
    root = Path(path)
    if not root.exists():
        raise UsageError(f"{root}: no such file or directory")
    try:
        pin_site, pin_server = _pins(site_keys), _pins(server_keys)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    site_paths, server_paths = _ledgers_under(root)
    res = VerifyResult(root=str(root), allow_unpinned=allow_unpinned)
    base = root if root.is_dir() else root.parent

    def label(p: Path) -> str:
        try:
            return str(p.relative_to(base))
        except ValueError:
            return str(p)

    server = scan_server(server_paths, label, pin_server, res)
    sites = [scan_site(p, label(p), pin_site, res) for p in site_paths]
    reconcile(server, sites, pin_server, res)
    _check_pins_against_evidence(site_pins_by_writer or {}, pin_site, pin_server, sites, server)
    for s in res.ledgers:
        if not s.key_pinned:
            flag = "--server-key" if s.role == "server" else "--site-key"
            res.add("unverified", s.path, None, None,
                    f"{s.role} key {s.key_fingerprint} was not pinned ({flag}): the signatures prove one writer, not "
                    "which; a ledger rebuilt and re-signed with a fresh key would verify the same")
    return res


def _check_pins_against_evidence(by_writer: dict[str, str], pinned: set[str] | None, server_pins: set[str] | None,
                                 sites, server) -> None:
    """Refuse a pin file whose pin for a site is neither that site's ledger key nor the key the server countersigned
    that ledger's heads with.

    Two witnesses agree on the key (the site's chain, and the server ledger, itself pinned and checked, which
    countersigned the site's heads naming the key it saw) and the pin file alone says otherwise: the pin is what is
    wrong (a mistyped digit), and a verdict of TAMPERED would blame the evidence for the auditor's own file. Where the
    server's countersignatures name another key, or there are none, the ledger stays what the scan found.

    Raises:
        UsageError: such a pin.
    """
    if not by_writer or not server.present or (server_pins is not None and not server.keys <= server_pins):
        return  # no server ledger, or one whose own key is not pinned: no second witness
    cosigned = {(loc.entry.writer_id, loc.entry.site_key_fingerprint) for _lab, loc in server.countersigns}
    for site in sites:
        writer, key = site.chain.writer_id, site.chain.key_fingerprint
        pin = by_writer.get(writer or "")
        if pin is None or key is None or pin == key or (pinned is not None and key in pinned):
            continue
        if (writer, key) in cosigned:
            raise UsageError(
                f"the pin file's [sites] {writer} = {pin} is not the key of {site.label} ({key}), which is the key "
                f"the server countersigned {writer}'s ledger with: the pin file is wrong (a mistyped fingerprint?); "
                "check it against the fingerprint the site gave out of band")


def ledger_identities(path: str | Path) -> list[dict[str, str | None]]:
    """``{ledger, role, writer_id, key_fingerprint}`` of every ledger under ``path``, from each ``open`` line.

    For the operator's provisioning step (export the fingerprint to the auditor out of band), not for auditing:
    a fingerprint read from the evidence itself proves nothing about who wrote it.

    Raises:
        UsageError: a missing path or a directory without ledgers.
    """
    sites, servers = _ledgers_under(Path(path))
    out = []
    for p in servers + sites:
        first = next(iter(read_lines(p)), None)
        try:
            head = parse_line(first[1]) if first else None
        except ValidationError:
            head = None
        opened = head if isinstance(head, OpenLine) else None
        out.append({
            "ledger": str(p),
            "role": opened.role if opened else None,
            "writer_id": opened.writer_id if opened else None,
            "key_fingerprint": opened.key_fingerprint if opened else None,
        })
    return out
