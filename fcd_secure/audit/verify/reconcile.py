"""Reconciling the sites' ledgers with the server's: neither side can hide or invent an upload.

For every site ledger (when a server ledger is under the verified path):

* each ``manifest`` line must be a layout the server recorded, part for part (a site cannot hide a Θs name by
  declaring a manifest of its own making);
* each upload must have the server's ``received`` line, equal in every reconciled field (run, node, round,
  reply-to, message id, payload and message bytes, payload hash); a missing one means the server ledger lost it;
* each stored receipt must be signed by a pinned server key and/or the server ledger's key, and name a server line
  that exists with that seq and hash. A receipt anchored by neither could have been signed by anyone
  (``unverified``).

And the other way: every ``received`` line must have its site upload (else an upload was hidden, or the Flower
runtime answered for the site outside its gate).
"""

from __future__ import annotations

from fcd_secure.audit.signing import fingerprint
from fcd_secure.audit.verify.result import VerifyResult
from fcd_secure.audit.verify.server_side import ServerScan
from fcd_secure.audit.verify.site_side import RECONCILED_FIELDS, CheckedReceipt, SiteScan


def reconcile(server: ServerScan, sites: list[SiteScan], server_pins: set[str] | None, res: VerifyResult) -> None:
    """Compare every site ledger with the server ledgers; findings go to ``res``.

    Args:
        server: what the server ledgers record.
        sites: every site ledger, scanned.
        server_pins: the pinned server fingerprints, or ``None``.
        res: where findings go.
    """
    for site in sites:
        _manifests(server, site, res)
        _uploads(server, site, res)
        unanchored = sum(not _receipt(server, site, r, server_pins, res) for r in site.receipts if r.signed)
        if unanchored:
            res.add("unverified", site.label, None, None,
                    f"{unanchored} receipt(s) are signed by a key that is neither pinned (--server-key) nor the key "
                    "of a server ledger under this path: they could have been signed by anyone")
    if sites and server.present:
        _unrecorded_by_sites(server, sites, res)


def _manifests(server: ServerScan, site: SiteScan, res: VerifyResult) -> None:
    if not server.manifests:
        return
    for loc in site.manifests:
        m = loc.entry
        srv = server.manifests.get(m.layout_hash)
        if srv is None or srv.theta_c != m.theta_c or srv.theta_s != m.theta_s:
            res.add("tampered", site.label, m.seq, loc.line,
                    f"{loc.where}: the site's manifest (layout {m.layout_hash[:12]}) is not the one the server ran with")


def _uploads(server: ServerScan, site: SiteScan, res: VerifyResult) -> None:
    for loc in site.uploads:
        up = loc.entry
        found = server.received.get(up.message_id)
        if found is None:
            if server.present:
                # every reply that leaves the gate (content, refusal or error) reaches the server's ledger; one
                # missing means that ledger lost its record (e.g. its tail was cut to hide an upload)
                res.add("tampered", site.label, up.seq, loc.line,
                        f"{loc.where}: the site sent message {up.message_id[:16]} ({up.status}, {up.payload_bytes} payload "
                        f"bytes) in round {up.round}, which no server ledger records (server ledger entries deleted, or "
                        "a reply the server never pulled)")
            continue
        srv = found[1].entry
        for k in RECONCILED_FIELDS:
            if getattr(srv, k) != getattr(up, k):
                res.add("tampered", site.label, up.seq, loc.line,
                        f"{loc.where}: the server ledger records {k} = {getattr(srv, k)!r}, the site {getattr(up, k)!r}")
                break


def _receipt(
    server: ServerScan, site: SiteScan, checked: CheckedReceipt, server_pins: set[str] | None, res: VerifyResult
) -> bool:
    """Check a validly signed receipt against the server's identity and ledger; return whether its key is anchored.

    The key written inside the receipt proves nothing by itself (a site could sign receipts with a key of its own):
    it must be a pinned server key when pins are given, and the key of a server ledger under the path when one is.
    """
    loc = checked.at
    rec = loc.entry.receipt
    where = f"receipt entry seq {loc.entry.seq} (line {loc.line})"

    def bad(msg: str) -> None:
        res.add("tampered", site.label, loc.entry.seq, loc.line, f"{where}: {msg}")

    signer = fingerprint(bytes.fromhex(rec.server_public_key))
    anchored = False
    if server_pins is not None:
        anchored = True
        if signer not in server_pins:
            bad(f"receipt signed by server key {signer}, which is not pinned")
    if server.present:
        anchored = True
        if signer not in server.keys:
            bad(f"receipt signed by key {signer}, which is not the key of the server ledger "
                f"({', '.join(sorted(server.keys)) or 'no valid key'}): a receipt the server did not issue")
        if checked.matched:
            found = server.received.get(rec.message_id)
            srv = found[1].entry if found is not None else None
            if srv is None or srv.hash != rec.server_entry_hash or srv.seq != rec.server_seq:
                bad(f"names server ledger entry {rec.server_seq}, which the server ledger does not hold")
    return anchored


def _unrecorded_by_sites(server: ServerScan, sites: list[SiteScan], res: VerifyResult) -> None:
    site_mids = {loc.entry.message_id for site in sites for loc in site.uploads}
    for mid, (lab, loc) in server.received.items():
        if mid in site_mids:
            continue
        srv = loc.entry
        why = "(an upload was hidden or a site entry deleted)"
        if srv.is_error:
            why = ("(an error reply the site's gate never saw: the Flower runtime builds these before dispatch, "
                   "e.g. for an unregistered message type, and they carry exception text)")
        res.add("tampered", lab, srv.seq, loc.line,
                f"{loc.where}: the server received message {mid[:16]} from node {srv.node_id} which no site ledger "
                f"records {why}")
