"""Reconciling the sites' ledgers with the server's: neither side can hide or invent an upload.

For every site ledger (when a server ledger is under the verified path):

* each ``manifest`` line must be a layout the server recorded, part for part (a site cannot hide a Θs name by
  declaring a manifest of its own making); the scans have already checked that every manifest line hashes to the
  layout hash it records (``ManifestLine.inconsistencies``: names, shapes, dtypes and site-bound flags), which also
  checks a site ledger verified without the server's;
* each upload must have the server's ``received`` line, equal in every fact both record (:data:`MESSAGE_FACTS`:
  run, node, round, message type, reply-to, message id, payload and message bytes, payload hash, and the names
  inside: records, tensors with shapes and dtypes, metric names, list lengths, config fields); a missing one means
  the server ledger lost it. An upload in a run no server ledger under the path covers is not the server's to
  reconcile: a refusal or error there (e.g. a foreign app the site refused to run, P27) is a note; content sent there
  makes the evidence partial until that run's server ledger is verified too. Bytes and hashes alone would let a site edit the names in its own ledger (a Θs tensor
  renamed away) and re-sign it with its key;
* each stored receipt and countersignature must be signed by a pinned server key and/or the server ledger's key,
  and name a server line that exists with that seq and hash. One anchored by neither could have been signed by
  anyone (``unverified``);
* each site chain head the server countersigned (its ``countersign`` lines) must still be in the site ledger, at
  the same seq with the same hash: a site ledger rewritten afterwards, even re-signed with the site's own key, no
  longer holds it (the cosigned tree heads of transparency logs, RFC 6962 §3.5 and C2SP tlog-cosignature).

And the other way: every ``received`` line must have its site upload (else an upload was hidden, or the Flower
runtime answered for the site outside its gate; the site's ``apps.client_app.SiteClientApp`` passes every message
type through its gate, so an honest site's refusal of a type it does not handle is in its ledger, P28). The one
exception is an empty error reply from source node :data:`SUPERLINK_NODE_ID`: the SuperLink's own answer for a site
that did not reply (a site that died mid-run), which no site can send; it is a note.

A refusal or error (no content) that the server ledger records but never receipted is a note, not partial evidence:
the server's own line is its acknowledgement, and withholding the receipt must not frame an honest site (P28).

Without any server ledger under the verified path nothing of this can be checked: every site ledger is then
**partial** evidence (and a server ledger without site ledgers too), never compliant.
"""

from __future__ import annotations

from datetime import datetime, timezone

from fcd_secure.audit.entries import UNNAMED_NODE_PREFIX, MessageLine
from fcd_secure.fingerprints import fingerprint
from fcd_secure.audit.verify.result import VerifyResult
from fcd_secure.audit.verify.server_side import ServerScan
from fcd_secure.audit.verify.site_side import CheckedReceipt, SiteScan

#: Every fact of a message that the site's upload line and the server's received line both record.
MESSAGE_FACTS = tuple(k for k in MessageLine.model_fields if k not in {"kind", "seq", "prev_hash", "time", "hash", "sig"})


def _short(value: object, limit: int = 160) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 1] + "…"


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
        _unreceipted(server, site, res)
        unanchored = sum(not _receipt(server, site, r, server_pins, res) for r in site.receipts if r.signed)
        unanchored += sum(not _stored_countersignature(server, site, loc, server_pins, res) for loc in site.countersignatures)
        if unanchored:
            res.add("unverified", site.label, None, None,
                    f"{unanchored} receipt(s) or countersignature(s) are signed by a key that is neither pinned "
                    "(--server-key) nor the key of a server ledger under this path: they could have been signed by anyone")
        if not server.present:
            res.add("partial", site.label, None, None,
                    "verified without the server ledger: uploads, receipts and countersigned chain heads could not be "
                    "reconciled with the server's records (a truncated or re-signed site ledger would pass); verify the "
                    "run directory with the server ledger for a verdict")
    if sites and server.present:
        _unrecorded_by_sites(server, sites, res)
        _countersigned_heads(server, sites, res)
    if server.present and not sites and server.received:
        for lab in sorted({lab for lab, _ in server.received.values()}):
            res.add("partial", lab, None, None,
                    "verified without any site ledger: the server's records could not be reconciled with the sites'")


def _manifests(server: ServerScan, site: SiteScan, res: VerifyResult) -> None:
    if not server.manifests:
        return
    for loc in site.manifests:
        m = loc.entry
        srv = server.manifests.get(m.layout_hash)
        if srv is None or srv.theta_c != m.theta_c or srv.theta_s != m.theta_s:
            res.add("tampered", site.label, m.seq, loc.line,
                    f"{loc.where}: the site's manifest (layout {m.layout_hash[:12]}) is not the one the server ran with")


def _foreign_refusal(server: ServerScan, up) -> bool:
    """A refusal or error (no content) in a run the server ledger under the path does not cover (e.g. an app the
    site refused to run, P27): not the server's to reconcile or receipt."""
    runs = {loc.entry.run_id for _lab, loc in server.received.values()}
    return server.present and bool(runs) and up.run_id not in runs and up.status in ("refused", "error")


def _unreceipted(server: ServerScan, site: SiteScan, res: VerifyResult) -> None:
    for loc in site.unreceipted:
        up = loc.entry
        if _foreign_refusal(server, up):
            continue
        if up.status in ("refused", "error") and up.message_id in server.received:
            # the server's ledger holds this reply with every fact equal (``_uploads``) and it carried nothing: the
            # missing receipt hides nothing (a server stopping at a refusal, or withholding its receipt, P28)
            res.add("note", site.label, up.seq, loc.line,
                    f"{loc.where}: the server recorded this {up.status} reply (no content, round {up.round}) in its "
                    "ledger but never sent its receipt back (e.g. the run stopped at it)")
            continue
        res.add("partial", site.label, up.seq, loc.line,
                f"{loc.where}: the {up.status} upload {up.message_id[:16]} (round {up.round}) has no server receipt: "
                "the server never acknowledged it here, or the run ended before the receipts came back")


def _uploads(server: ServerScan, site: SiteScan, res: VerifyResult) -> None:
    runs = {loc.entry.run_id for _lab, loc in server.received.values()}
    for loc in site.uploads:
        up = loc.entry
        found = server.received.get(up.message_id)
        if found is None:
            if server.present and runs and up.run_id not in runs:
                if _foreign_refusal(server, up):
                    res.add("note", site.label, up.seq, loc.line,
                            f"{loc.where}: a {up.status} reply (no content) in run {up.run_id}, which no server ledger "
                            "under this path covers (e.g. an app the site refused to run)")
                else:
                    res.add("partial", site.label, up.seq, loc.line,
                            f"{loc.where}: content sent in run {up.run_id}, which no server ledger under this path "
                            "covers: verify that run's server ledger too")
            elif server.present:
                # every reply that leaves the gate (content, refusal or error) reaches the server's ledger; one
                # missing means that ledger lost its record (e.g. its tail was cut to hide an upload)
                res.add("tampered", site.label, up.seq, loc.line,
                        f"{loc.where}: the site sent message {up.message_id[:16]} ({up.status}, {up.payload_bytes} payload "
                        f"bytes) in round {up.round}, which no server ledger records (server ledger entries deleted, or "
                        "a reply the server never pulled)")
            continue
        srv = found[1].entry
        for k in MESSAGE_FACTS:
            if getattr(srv, k) != getattr(up, k):
                res.add("tampered", site.label, up.seq, loc.line,
                        f"{loc.where}: the server ledger records {k} = {_short(getattr(srv, k))}, the site "
                        f"{_short(getattr(up, k))} (the site's record of this message was edited)")
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

    anchored = _key_anchored(server, fingerprint(bytes.fromhex(rec.server_public_key)), server_pins, lambda m: bad(f"receipt {m}"))
    if server.present and checked.matched:
        found = server.received.get(rec.message_id)
        srv = found[1].entry if found is not None else None
        if srv is None or srv.hash != rec.server_entry_hash or srv.seq != rec.server_seq:
            bad(f"names server ledger entry {rec.server_seq}, which the server ledger does not hold")
    return anchored

#: the node id Flower's SuperLink gives its own messages (``flwr.common.constant.SUPERLINK_NODE_ID`` in the pinned Flower; a
#: literal here because the audit layer imports no Flower code; tests/test_audit_verify.py checks it):
#: the source of the error replies it builds for a node that did not answer, a node id it never allocates to a site
SUPERLINK_NODE_ID = 1


def _time(text: str) -> datetime | None:
    try:
        t = datetime.fromisoformat(text)
    except (TypeError, ValueError):
        return None
    return t if t.tzinfo is not None else t.replace(tzinfo=timezone.utc)


def _stale(site: SiteScan, run_id: int, after: str) -> bool:
    """Whether ``site``'s ledger is a copy taken before run ``run_id``: it records nothing of that run and ends
    before the time ``after`` (the server's record). A ledger cut inside a run it records is not stale: its other
    uploads of the run show that the copy was taken later."""
    if any(u.entry.run_id == run_id for u in site.uploads):
        return False
    last, at = (site.chain.entries[-1].entry.time if site.chain.entries else None), _time(after)
    end = _time(last) if last else None
    return end is not None and at is not None and end < at


_RECOLLECT = "collect the sites' current evidence (fcd audit collect) and verify again"


def _site_names(server: ServerScan) -> dict[tuple[int, int], str]:
    """``(run id, node id) -> site id`` from the server's received lines that name the site: a reply recorded before
    the server knew the node (its ``hello``, :data:`UNNAMED_NODE_PREFIX`) is named by the others of that node."""
    return {(loc.entry.run_id, loc.entry.node_id): loc.entry.site_id for _lab, loc in server.received.values()
            if loc.entry.site_id and not loc.entry.site_id.startswith(UNNAMED_NODE_PREFIX)}


def _unrecorded_by_sites(server: ServerScan, sites: list[SiteScan], res: VerifyResult) -> None:
    site_mids = {loc.entry.message_id for site in sites for loc in site.uploads}
    by_writer = {site.chain.writer_id: site for site in sites}
    names = _site_names(server)
    for mid, (lab, loc) in server.received.items():
        if mid in site_mids:
            continue
        srv = loc.entry
        if srv.is_error and srv.node_id == SUPERLINK_NODE_ID and srv.payload_bytes == 0 and not srv.records:
            # the SuperLink's own answer for a site that did not reply (its node unavailable, the message expired):
            # Flower builds it with source node SUPERLINK_NODE_ID and a fixed reason, and refuses any site reply
            # whose source is not the node the message went to, so no site can send one (a site killed mid-run)
            res.add("note", lab, srv.seq, loc.line,
                    f"{loc.where}: the SuperLink answered message {mid[:16]} for site {srv.site_id or '?'}, which did "
                    f"not reply (source node {SUPERLINK_NODE_ID}: built by the SuperLink, no site content)")
            continue
        site_id = names.get((srv.run_id, srv.node_id), srv.site_id)
        named = bool(site_id) and not site_id.startswith(UNNAMED_NODE_PREFIX)
        who = f"site {site_id}" if named else f"node {srv.node_id} (a site the server never named)"
        own = by_writer.get(site_id) if named else None
        if named and own is None:
            # the evidence lacks that site's ledger altogether: incomplete, not inconsistent
            res.add("partial", lab, srv.seq, loc.line,
                    f"{loc.where}: the server received message {mid[:16]} from {who} (round {srv.round}), and no "
                    f"ledger of {site_id} is under this path: {_RECOLLECT}")
            continue
        if own is not None and _stale(own, srv.run_id, srv.time):
            # the site's ledger ends before the server received this: a copy taken before that run (stale), which
            # cannot show the upload; the site's current ledger can (a cut ledger reads the same: never compliant)
            res.add("partial", lab, srv.seq, loc.line,
                    f"{loc.where}: the server received message {mid[:16]} from {who} at {srv.time} (round "
                    f"{srv.round}), after {own.label} ends: stale evidence, {_RECOLLECT}")
            continue
        why = "(an upload was hidden or a site entry deleted)"
        if srv.is_error:
            why = ("(an error reply the site's gate never saw: the Flower runtime builds these before dispatch, "
                   "e.g. for an unregistered message type, and they carry exception text)")
        res.add("tampered", lab, srv.seq, loc.line,
                f"{loc.where}: the server received message {mid[:16]} from {who} which no site ledger records {why}")


def _key_anchored(server: ServerScan, signer: str, server_pins: set[str] | None, bad) -> bool:
    """Whether a server signature's key is anchored (pinned, or the server ledger's); reports a key that is not."""
    anchored = False
    if server_pins is not None:
        anchored = True
        if signer not in server_pins:
            bad(f"signed by server key {signer}, which is not pinned")
    if server.present:
        anchored = True
        if signer not in server.keys:
            bad(f"signed by key {signer}, which is not the key of the server ledger "
                f"({', '.join(sorted(server.keys)) or 'no valid key'}): the server did not issue it")
    return anchored


def _stored_countersignature(server: ServerScan, site: SiteScan, loc, server_pins: set[str] | None, res: VerifyResult) -> bool:
    """A countersignature the site stored must come from the server: an anchored key and a line the server holds."""
    cs = loc.entry.countersign
    where = f"countersignature entry seq {loc.entry.seq} (line {loc.line})"

    def bad(msg: str) -> None:
        res.add("tampered", site.label, loc.entry.seq, loc.line, f"{where}: {msg}")

    anchored = _key_anchored(server, fingerprint(bytes.fromhex(loc.entry.server_public_key)), server_pins, bad)
    if server.present and (cs.seq, cs.hash) not in server.countersign_hashes:
        bad(f"names server ledger entry {cs.seq}, which the server ledger does not hold")
    return anchored


def _countersigned_heads(server: ServerScan, sites: list[SiteScan], res: VerifyResult) -> None:
    """Every site chain head the server countersigned must still be in that site's ledger, byte for byte.

    A countersignature belongs to the site ledger written by its ``writer_id``, or holding uploads from its
    ``(run_id, node_id)`` (so a ledger re-keyed or renamed by a forger is still found).
    """
    for lab, loc in server.countersigns:
        cs = loc.entry
        cp = cs.checkpoint
        for site in sites:
            nodes = {(u.entry.run_id, u.entry.node_id) for u in site.uploads}
            if site.chain.writer_id != cs.writer_id and (cs.run_id, cs.node_id) not in nodes:
                continue
            own = next((x for x in site.chain.entries if x.entry.seq == cp.seq), None)
            last = site.chain.entries[-1].entry.seq if site.chain.entries else -1
            if (own is None and cp.seq > last and site.chain.key_fingerprint == cs.site_key_fingerprint
                    and _stale(site, cs.run_id, cs.time)):
                # the ledger ends before the head the server signed: a copy older than the server's record (stale)
                res.add("partial", site.label, None, None,
                        f"{site.label} ends at seq {last}; the server countersigned {cs.writer_id}'s head of round "
                        f"{cp.round} at seq {cp.seq} (server ledger {lab} entry seq {cs.seq}): stale evidence, "
                        f"{_RECOLLECT}")
                break
            if own is None or own.entry.hash != cp.hash or site.chain.key_fingerprint != cs.site_key_fingerprint:
                res.add("tampered", site.label, cp.seq, own.line if own is not None else None,
                        f"the server countersigned this ledger's checkpoint of round {cp.round} (seq {cp.seq}, hash "
                        f"{cp.hash[:16]}…, site key {cs.site_key_fingerprint[:23]}…; server ledger {lab} entry seq "
                        f"{cs.seq}), and the ledger no longer holds it: it was rewritten, cut or re-keyed after the "
                        "server signed its head (a re-signed ledger does not match)")
