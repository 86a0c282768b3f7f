"""Offline verification: a clean federation verifies; every kind of tampering is caught and named (exit 6);
a policy breach recorded in an intact ledger is a violation (exit 1)."""

from __future__ import annotations

import json

import numpy as np
import pytest
from test_audit_support import MANIFEST, fingerprints, instruction, raw_key, run_rounds

from fcd_secure.audit.accounting import describe_message
from fcd_secure.audit.ledger import SITE_LEDGER_FILE, SiteLedger
from fcd_secure.audit.receipts import sign_receipt
from fcd_secure.audit.signing import canonical
from fcd_secure.audit.verify import UsageError, verify_path


@pytest.fixture()
def run(tmp_path):
    sites, server = run_rounds(tmp_path, n_sites=2, rounds=3)
    return tmp_path, sites, server


def _ledger_file(root, site_id="site-00"):
    return root / site_id / "audit" / SITE_LEDGER_FILE


def _lines(path):
    return path.read_text().splitlines()


def _write(path, lines):
    path.write_text("\n".join(lines) + "\n")


def _tampered(res):
    return [f for f in res.findings if f.severity == "tampered"]


def test_clean_run_verifies_and_totals_reconcile(run):
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 0 and res.status == "compliant", [f.message for f in res.findings]
    totals = res.totals()
    # the sites' records and the server's agree byte for byte
    assert totals["payload_bytes"] == res.server_totals["payload_bytes"] > 0
    assert totals["message_bytes"] == res.server_totals["message_bytes"]
    assert totals["messages"] == res.server_totals["messages"] == 2 * 3 + 2
    per_round = {(k[0], k[1]): v for k, v in res.per_round.items()}
    assert set(per_round) >= {(f"site-0{i}", r) for i in range(2) for r in (1, 2, 3)}
    # a train upload = Θc data (from the manifest) + bounded overhead
    theta_c = sum(int(np.prod(e.shape)) * 4 for e in MANIFEST.entries if e.part == "theta_c")
    assert theta_c < per_round[("site-00", 1)]["payload_bytes"] < theta_c + 4096
    # every upload but the last ack got its receipt; 3 checkpoints per site
    for s in res.ledgers:
        if s.role == "site":
            assert s.receipts == 3 and s.unreceipted == 1 and s.checkpoints == 3
        else:
            assert s.checkpoints == 3


def _resign(path, key, edit=None):
    """Rebuild a ledger's chain under ``key``: ``edit(obj)`` may change a line or return ``None`` to drop it; then
    the open entry, every seq, hash, signature and checkpoint is recomputed by the writer's own rule.

    What anyone holding the file and a signing key can do: the key beside the ledger (an insider), or a fresh one."""
    from fcd_secure.audit.entries import parse_line
    from fcd_secure.audit.ledger import checkpoint_fields
    from fcd_secure.audit.signing import GENESIS, line_hash, private_key, public_key_bytes, sign_hash
    from fcd_secure.fingerprints import fingerprint

    sk = private_key(key)
    out, prev, new_seq = [], GENESIS, {}
    for text in _lines(path):
        obj = {k: v for k, v in json.loads(text).items() if k not in ("hash", "sig")}
        if edit is not None:
            obj = edit(obj)
            if obj is None:
                continue
        new_seq[obj["seq"]] = len(out)
        if obj["kind"] == "receipt" and obj.get("for_seq") is not None:
            obj["for_seq"] = new_seq.get(obj["for_seq"])
        if obj["kind"] == "open":
            obj["public_key"] = public_key_bytes(key).hex()
            obj["key_fingerprint"] = fingerprint(public_key_bytes(key))
        if obj["kind"] == "checkpoint":
            entries = []
            for o in out:
                try:
                    entries.append(parse_line(canonical(o)))
                except ValueError:
                    pass  # a line that is not an entry counts in the chain, not among the messages
            obj.update(checkpoint_fields([o["hash"] for o in out], entries, obj["round"]))
        obj["seq"], obj["prev_hash"] = len(out), prev
        obj["hash"] = line_hash(obj)
        obj["sig"] = sign_hash(sk, obj["hash"])
        out.append(obj)
        prev = obj["hash"]
    _write(path, [canonical(o).decode() for o in out])


def test_unpinned_is_never_compliant(run):
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    res = verify_path(root)
    assert res.status == "unverified" and res.exit_code == 3
    unverified = [f for f in res.findings if f.severity == "unverified"]
    assert {f.ledger for f in unverified} == {s.path for s in res.ledgers}
    # pinning only the sites still leaves the server (and the receipts it signed) unverified
    res = verify_path(root, site_keys=site_fp)
    assert res.exit_code == 3 and [f.ledger for f in res.findings if f.severity == "unverified"] == ["server/audit/server_ledger.jsonl"]
    # --allow-unpinned: exit 0, the verdict stays unverified
    res = verify_path(root, allow_unpinned=True)
    assert res.status == "unverified" and res.exit_code == 0


def test_a_chain_re_signed_with_a_fresh_key_is_unverified_or_tampered(run):
    """Forged evidence (rebuilt and re-signed end to end with a fresh key) checks internally. The server's
    countersignatures of the site's chain heads expose it even unpinned; without them, only pins do."""
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    path = _ledger_file(root)
    original = path.read_text()
    _resign(path, raw_key())
    res = verify_path(root)
    assert res.exit_code == 6
    assert any("countersigned" in f.message and f.ledger == "site-00/audit/site_ledger.jsonl" for f in _tampered(res))
    # the countersignatures the site stored are gone too: the server's own copies still do not match
    path.write_text(original)
    _resign(path, raw_key(), edit=lambda o: None if o["kind"] == "countersignature" else o)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any("no longer holds it" in f.message for f in _tampered(res))
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 6
    assert any(f.ledger == "site-00/audit/site_ledger.jsonl" and "not among the pinned" in f.message for f in _tampered(res))
    # the site's folder alone, unpinned: nothing contradicts the forgery, and nothing makes it compliant
    res = verify_path(root / "site-00")
    assert res.status == "partial" and res.exit_code == 4


def test_wrong_pinned_key_is_tampered(run):
    root, sites, server = run
    other = SiteLedger.open(root / "elsewhere", raw_key(), "x").fingerprint
    res = verify_path(root, site_keys=[other], server_keys=[server.ledger.fingerprint])
    assert res.exit_code == 6
    assert any("not among the pinned" in f.message for f in _tampered(res))


def test_malformed_fingerprint_and_missing_path_are_usage_errors(run, tmp_path):
    root, _, _ = run
    with pytest.raises(UsageError):
        verify_path(root, site_keys=["SHA256:abc"])
    with pytest.raises(UsageError):
        verify_path(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(UsageError):
        verify_path(tmp_path / "empty")


def test_flipping_one_byte_is_caught_and_named(run):
    root, sites, server = run
    path = _ledger_file(root)
    lines = _lines(path)
    target = next(i for i, l in enumerate(lines) if json.loads(l)["kind"] == "upload")
    entry = json.loads(lines[target])
    # an edit that keeps valid JSON: one digit of the recorded payload size
    old = f'"payload_bytes":{entry["payload_bytes"]}'
    new = f'"payload_bytes":{entry["payload_bytes"] - 1}'
    lines[target] = lines[target].replace(old, new)
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any(f.seq == entry["seq"] and "edited" in f.message for f in _tampered(res))


def test_random_byte_flip_that_breaks_json_names_the_line(run):
    root, _, _ = run
    path = _ledger_file(root)
    raw = bytearray(path.read_bytes())
    pos = raw.index(b'"kind":"upload"') + 2
    raw[pos] ^= 0x01
    path.write_bytes(bytes(raw))
    res = verify_path(root)
    assert res.exit_code == 6
    assert _tampered(res)


def test_deleting_an_entry_is_caught(run):
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    victim = 4
    seq_after = json.loads(lines[victim + 1])["seq"]
    del lines[victim]
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any(f.seq == seq_after and "prev_hash" in f.message for f in _tampered(res))


def test_deleting_the_last_upload_is_caught_by_the_server_ledger(run):
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    last_upload = max(i for i, l in enumerate(lines) if json.loads(l)["kind"] == "upload")
    _write(path, lines[:last_upload])  # truncate: the chain itself stays valid
    res = verify_path(root)
    assert res.exit_code == 6
    assert any("no site ledger records" in f.message for f in _tampered(res))


def test_inserting_an_entry_is_caught(run):
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    lines.insert(5, lines[3])  # a replayed (validly signed) entry
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any(f.line == 6 for f in _tampered(res))


def test_reordering_entries_is_caught(run):
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    lines[3], lines[4] = lines[4], lines[3]
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    seqs = {f.seq for f in _tampered(res)}
    assert json.loads(lines[3])["seq"] in seqs


def test_receipt_that_does_not_match_is_caught(tmp_path):
    """A validly signed receipt for other bytes than the site recorded: the two records do not reconcile."""
    from test_audit_support import Site

    site = Site(tmp_path)
    server_key = raw_key()
    reply = site.send(instruction("train", 1))
    f = describe_message(reply)
    forged = sign_receipt(
        server_key, run_id=f.run_id, node_id=f.node_id, round=f.round, message_type=f.message_type, reply_to=f.reply_to,
        message_id=f.message_id, payload_bytes=f.payload_bytes + 1000, message_bytes=f.message_bytes,
        payload_sha256=f.payload_sha256, server_seq=5, server_entry_hash="0" * 64, time="2026-01-01T00:00:00+00:00",
    )
    site.ledger.store_receipt(forged, server_public_key=None)
    res = verify_path(tmp_path / site.site_id)
    assert res.exit_code == 6
    (finding,) = _tampered(res)
    assert "payload_bytes" in finding.message and "receipt" in finding.message


def test_receipt_with_a_bad_signature_is_caught(run):
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    idx = next(i for i, l in enumerate(lines) if json.loads(l)["kind"] == "receipt")
    rec = json.loads(lines[idx])["receipt"]
    rec["payload_bytes"] += 1  # the server never signed this
    entry = json.loads(lines[idx])
    entry["receipt"] = rec
    lines[idx] = canonical(entry).decode()
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any(f.seq == entry["seq"] for f in _tampered(res))


def test_server_ledger_tampering_is_caught(run):
    root, _, server = run
    path = server.ledger.path
    lines = _lines(path)
    del lines[2]
    _write(path, lines)
    res = verify_path(root)
    assert res.exit_code == 6
    assert any("server_ledger" in f.ledger for f in _tampered(res))


def test_an_intact_ledger_recording_a_breach_is_a_violation(tmp_path):
    """If the gate were bypassed, the signed entry itself shows the breach: exit 1, naming the entry."""
    from flwr.app import Array, ArrayRecord, Message, MetricRecord, RecordDict

    ledger = SiteLedger.open(tmp_path / "s", raw_key(), "s")
    ledger.record_manifest(MANIFEST)
    msg = instruction("train", 1)
    rng = np.random.default_rng(0)
    bad = Message(RecordDict({"update": ArrayRecord({"eps_s.weight": Array(rng.standard_normal((6, 4)).astype(np.float32))}),
                              "num": MetricRecord({"propensity_mean": 0.4})}), reply_to=msg)
    line = ledger.record_upload(describe_message(bad), status="sent", layout_hash=MANIFEST.layout_hash, privacy_ledger_hash=None)
    res = verify_path(tmp_path / "s")
    assert res.exit_code == 1
    msgs = [f.message for f in res.findings if f.severity == "violation" and f.seq == line.seq]
    assert any("Θs" in m for m in msgs) and any("propensity" in m for m in msgs)


def test_bytes_beyond_the_layout_are_a_violation(tmp_path):
    from flwr.app import Array, ArrayRecord, Message, RecordDict

    ledger = SiteLedger.open(tmp_path / "s", raw_key(), "s")
    ledger.record_manifest(MANIFEST)
    msg = instruction("train", 1)
    ok = Message(RecordDict({"update": ArrayRecord({"trunk.bias": Array(np.ones(6, np.float32))})}), reply_to=msg)
    facts = describe_message(ok)
    facts.payload_bytes += 50_000  # an upload far heavier than what it declares
    line = ledger.record_upload(facts, status="sent", layout_hash=MANIFEST.layout_hash, privacy_ledger_hash=None)
    res = verify_path(tmp_path / "s")
    assert res.exit_code == 1
    assert any(f.seq == line.seq and "undeclared" in f.message for f in res.findings)


def test_ledger_refuses_a_second_key(tmp_path):
    from fcd_secure.audit.ledger import AuditLedgerError

    SiteLedger.open(tmp_path, raw_key(), "s")
    with pytest.raises(AuditLedgerError):
        SiteLedger.open(tmp_path, raw_key(), "s")


def test_no_private_key_material_in_ledgers(run):
    root, sites, server = run
    text = "".join(p.read_text() for p in root.rglob("*.jsonl"))
    for k in [s.key for s in sites] + [server.key]:
        assert k.hex() not in text
        import base64

        assert base64.b64encode(k).decode() not in text


def test_a_site_manifest_that_differs_from_the_servers_is_caught(tmp_path):
    """A site that records a manifest of its own making (Θs renamed into Θc) disagrees with the server's."""
    from test_audit_support import Server, Site

    from fcd_secure.manifest import Manifest

    server = Server(tmp_path)
    forged = Manifest.from_entries(e.model_copy(update={"part": "theta_c"}) for e in MANIFEST.entries)
    site = Site(tmp_path)
    site.ctx.manifest = forged
    server.receive(site.send(server.downlink("train", 1, 11)), site.site_id)
    res = verify_path(tmp_path)
    assert res.exit_code == 6
    assert any("not the one the server ran with" in f.message for f in _tampered(res))
    assert forged.specs("theta_s") == {}


def _forged_line_ledger(tmp_path, entries, layout_hash):
    """A site ledger whose manifest line records ``entries`` beside ``layout_hash`` (signed by the site itself), and
    one upload of Θc tensors of ``entries`` sent under that hash."""
    from flwr.app import Array, ArrayRecord, Message, RecordDict

    from fcd_secure.manifest import Manifest

    forged = Manifest(entries=tuple(entries), layout_hash=layout_hash)
    ledger = SiteLedger.open(tmp_path / "s", raw_key(), "s")
    ledger.record_manifest(forged)
    arrays = {e.name: Array(np.zeros(e.shape, np.float32)) for e in forged.select("theta_c")}
    msg = Message(RecordDict({"update": ArrayRecord(arrays)}), reply_to=instruction("train", 1))
    ledger.record_upload(describe_message(msg), status="sent", layout_hash=layout_hash, privacy_ledger_hash=None)
    return verify_path(tmp_path / "s")


def test_a_manifest_line_that_does_not_hash_to_its_layout_is_tampered_even_without_the_server_ledger(tmp_path):
    """A site records the consortium's layout hash beside a layout of its own (a Θs tensor moved into Θc) and sends
    that tensor: the upload matches the line, but the line's names hash to another layout. Verified alone, the
    site's ledger is tampered, not merely partial."""
    moved = [e.model_copy(update={"part": "theta_c"}) if e.name == "eps_s.weight" else e for e in MANIFEST.entries]
    res = _forged_line_ledger(tmp_path, moved, MANIFEST.layout_hash)
    assert res.exit_code == 6
    assert any("manifest line is inconsistent" in f.message and "hash to" in f.message for f in _tampered(res))
    # the honest line verifies as before: partial (no server ledger), nothing tampered
    honest = _forged_line_ledger(tmp_path / "honest", MANIFEST.entries, MANIFEST.layout_hash)
    assert honest.status == "partial" and not _tampered(honest)


def test_a_manifest_line_that_drops_a_site_bound_flag_is_tampered(tmp_path):
    """The flag that keeps the behaviour head off every uplink is part of the layout hash: a line that keeps the hash
    but drops the flag no longer hashes to it."""
    from fcd_secure.manifest import ManifestEntry, layout_hash

    head = ManifestEntry(name="behaviour.weight", shape=(3, 6), dtype="float32", part="theta_s", site_bound=True)
    bound = [*MANIFEST.entries, head]
    real = layout_hash(bound)
    dropped = [e.model_copy(update={"site_bound": False}) for e in bound]
    res = _forged_line_ledger(tmp_path, dropped, real)
    assert res.exit_code == 6 and any("manifest line is inconsistent" in f.message for f in _tampered(res))
    assert not _tampered(_forged_line_ledger(tmp_path / "honest", bound, real))


def test_a_manifest_line_with_a_consistent_hash_can_still_contradict_itself():
    """A writer that hashes what it writes can still record a name on both sides of the partition, or flag a name it
    does not list as Θs: the line names the contradiction, and an honest line has none."""
    from fcd_secure.audit.entries import ManifestLine
    from fcd_secure.manifest import Manifest, ManifestEntry, layout_hash

    def line(entries, site_bound=None):
        fields = {**ManifestLine.fields_of(Manifest(entries=tuple(entries), layout_hash=layout_hash(entries))),
                  "site_bound": site_bound}
        return ManifestLine.model_validate({**fields, "kind": "manifest", "seq": 1, "prev_hash": "0", "time": "t",
                                            "hash": "h", "sig": "s"})

    assert line(MANIFEST.entries).inconsistencies() == []
    twice = [*MANIFEST.entries, ManifestEntry(name="eps_s.weight", shape=(6, 4), dtype="float32", part="theta_c")]
    assert line(twice).inconsistencies() == ["a tensor name appears more than once"]
    stray = line(MANIFEST.entries, site_bound=["trunk.weight"]).inconsistencies()
    assert any("not Θs tensors" in p for p in stray)


def test_a_site_upload_missing_from_the_server_ledger_is_tampered(run):
    """The server cuts its ledger's tail (a valid chain, just shorter) to hide uploads it received: the site's
    uploads that the server ledger no longer records are named, site entry seq and line."""
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    path = server.ledger.path
    lines = _lines(path)
    cut = next(i for i, l in enumerate(lines) if json.loads(l).get("action") == "query.audit_receipts")
    _write(path, lines[:cut])
    site_lines = _lines(_ledger_file(root))
    ack_line = next(i for i, l in enumerate(site_lines, 1) if json.loads(l).get("action") == "query.audit_receipts")
    ack_seq = json.loads(site_lines[ack_line - 1])["seq"]
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 6
    hidden = [f for f in _tampered(res) if f.ledger == "site-00/audit/site_ledger.jsonl"]
    assert [(f.seq, f.line) for f in hidden] == [(ack_seq, ack_line)]
    assert "no server ledger records" in hidden[0].message and f"seq {ack_seq} (line {ack_line})" in hidden[0].message


def test_a_receipt_signed_by_the_site_itself_is_tampered(run):
    """With the server ledger present but its key unpinned, a site forges a receipt for an upload under a key of
    its own, copying the server entry's seq and hash: the receipt key must be the server ledger's key."""
    root, sites, server = run
    site_fp, _ = fingerprints(sites, server)
    site = sites[0]
    ack = [l for l in site.ledger.lines() if l["kind"] == "upload"][-1]
    srv = next(l for l in server.ledger.lines() if l.get("message_id") == ack["message_id"])
    forged = sign_receipt(
        raw_key(), run_id=ack["run_id"], node_id=ack["node_id"], round=ack["round"], message_type=ack["action"],
        reply_to=ack["reply_to"], message_id=ack["message_id"], payload_bytes=ack["payload_bytes"],
        message_bytes=ack["message_bytes"], payload_sha256=ack["payload_sha256"], server_seq=srv["seq"],
        server_entry_hash=srv["hash"], time=srv["time"],
    )
    line = site.ledger.store_receipt(forged, server_public_key=None)
    res = verify_path(root, site_keys=site_fp)
    assert res.exit_code == 6
    (finding,) = _tampered(res)
    assert finding.seq == line.seq and "not the key of the server ledger" in finding.message
    # the site's directory alone (no server ledger, server unpinned): partial, and its receipts are unanchored
    res = verify_path(root / site.site_id, site_keys=[site.ledger.fingerprint])
    assert res.status == "partial" and res.exit_code == 4
    assert any(f.severity == "unverified" and "receipt" in f.message for f in res.findings)


def test_swapped_ledger_roles_are_tampered(run, tmp_path_factory):
    root, sites, server = run
    site_path, server_path = _ledger_file(root), server.ledger.path
    site_text, server_text = site_path.read_text(), server_path.read_text()
    site_path.write_text(server_text)
    server_path.write_text(site_text)
    res = verify_path(root)
    assert res.exit_code == 6
    roles = {f.ledger for f in _tampered(res) if "opens with role" in f.message}
    assert roles == {"site-00/audit/site_ledger.jsonl", "server/audit/server_ledger.jsonl"}
    # one file on its own: the server's ledger presented as a site ledger
    alone = tmp_path_factory.mktemp("alone") / SITE_LEDGER_FILE
    alone.write_text(server_text)
    res = verify_path(alone)
    assert res.exit_code == 6
    assert any(f.seq == 0 and "opens with role 'server'" in f.message for f in _tampered(res))


def test_a_signed_line_that_is_not_a_ledger_entry_is_tampered(run):
    """Verify reads every line into its typed entry, strictly: a line whose field has another JSON type (here a
    payload size written as a string) is not evidence of anything, even when its hash and signature check."""
    root, _, _ = run
    path = _ledger_file(root)
    lines = _lines(path)
    idx = next(i for i, l in enumerate(lines) if json.loads(l)["kind"] == "upload")
    entry = json.loads(lines[idx])
    entry["payload_bytes"] = str(entry["payload_bytes"])
    lines[idx] = canonical(entry).decode()
    _write(path, lines)
    key = raw_key()
    _resign(path, key)  # a chain that checks end to end, under a fresh key
    res = verify_path(root)
    assert res.exit_code == 6
    finding = _tampered(res)[0]  # the first finding names the line; what depended on it is reported after it
    assert finding.ledger == "site-00/audit/site_ledger.jsonl" and finding.seq == entry["seq"]
    assert "not a well-formed 'upload' entry" in finding.message and "payload_bytes" in finding.message
    # the writer refuses to append to a ledger it cannot read as entries (fail closed)
    from fcd_secure.audit.ledger import AuditLedgerError

    with pytest.raises(AuditLedgerError, match=f"line {idx + 1} is not a ledger line"):
        SiteLedger(path, key, writer_id="site-00").entries()


# -- P24: an insider with the site key cannot re-sign a recorded leak away -----------------------------------------
def _leaking_run(root, rounds=3):
    """A site whose own policy let Θs out (the w/o-DSS ablation): every training upload records a Θs tensor."""
    from flwr.app import Array
    from test_audit_support import POLICY, Server, Site, close_run

    from fcd_secure.audit import GatePolicy

    site = Site(root, policy=GatePolicy(allowed_metrics=POLICY.allowed_metrics, allow_theta_s_upload=True))
    server = Server(root)

    def leak(content):
        content["update"]["eps_s.weight"] = Array(site.theta_s["eps_s.weight"])
        content["update"]["ks_head.bias"] = Array(site.theta_s["ks_head.bias"])

    for r in range(1, rounds + 1):
        reply = site.send(server.downlink("train", r, 11), site.train_handler(leak))
        assert reply.has_content()
        server.receive(reply, site.site_id)
    close_run([site], server, rounds, [11])
    return site, server


def test_an_insider_re_signing_an_edited_ledger_with_the_site_key_is_not_compliant(tmp_path):
    """The site ledger records a Θs leak; someone with the site's key file edits the Θs names out of every upload
    line, keeps every byte count and hash, and re-signs the chain with that key. Pinned keys and the server ledger
    present: the server's record of the same messages, its own upload rules and its countersignatures of the
    site's chain heads each expose it."""
    site, server = _leaking_run(tmp_path)
    pins = dict(site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    before = verify_path(tmp_path, **pins)
    assert before.status == "violation"
    leaks = [f for f in before.findings if f.severity == "violation" and f.ledger.startswith("site-00")]
    assert len(leaks) >= 6  # two Θs tensors in each of three rounds

    key = (tmp_path / site.site_id / "identity_ed25519.key").read_bytes()  # the site's key file, beside its ledger

    def hide(obj):
        if obj["kind"] == "upload":
            obj["tensors"] = [t for t in obj["tensors"] if t["name"] not in ("eps_s.weight", "ks_head.bias")]
        return obj

    _resign(_ledger_file(tmp_path), key, edit=hide)  # the same key: still pinned
    res = verify_path(tmp_path, **pins)
    assert res.status != "compliant" and res.exit_code != 0
    assert res.status == "tampered"
    msgs = [f.message for f in _tampered(res)]
    assert any("tensors" in m and "edited" in m for m in msgs)  # facts reconciled with the server's received lines
    assert any("countersigned" in m for m in msgs)  # the server signed the original heads
    served = [f for f in res.findings if f.severity == "violation" and f.ledger.startswith("server")]
    assert any("eps_s.weight" in f.message and "Θs" in f.message for f in served)  # the server's copy is checked too
    # the edited site ledger alone: the countersignatures it stored no longer match its own chain
    alone = verify_path(tmp_path / site.site_id, **pins)
    assert alone.status == "tampered" and any("countersigned" in f.message for f in _tampered(alone))
    # had the insider dropped those too, the folder alone would still only be partial evidence
    _resign(_ledger_file(tmp_path), key, edit=lambda o: None if o["kind"] == "countersignature" else o)
    alone = verify_path(tmp_path / site.site_id, **pins)
    assert alone.status == "partial" and alone.exit_code == 4
    assert verify_path(tmp_path, **pins).status == "tampered"


def test_uploads_without_a_server_receipt_are_a_finding(tmp_path):
    """A run cut before the receipts came back (or a server that never acknowledged): the evidence is partial."""
    from test_audit_support import Server, Site

    site, server = Site(tmp_path), Server(tmp_path)
    for r in (1, 2):
        server.receive(site.send(server.downlink("train", r, 11)), site.site_id)
    server.audit.close()  # no closing receipts message: round 2's upload never got its receipt
    res = verify_path(tmp_path, site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    assert res.status == "partial" and res.exit_code == 4
    (finding,) = [f for f in res.findings if f.severity == "partial"]
    assert "no server receipt" in finding.message and finding.seq is not None


def test_one_site_folder_without_the_server_ledger_is_partial_never_compliant(run):
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    res = verify_path(root / "site-00", site_keys=site_fp, server_keys=server_fp)
    assert res.status == "partial" and res.exit_code == 4
    assert verify_path(root / "site-00", site_keys=site_fp, server_keys=server_fp, allow_unpinned=True).exit_code == 4
    # a cut tail on its own is not "compliant" either
    path = _ledger_file(root)
    lines = _lines(path)
    last_upload = max(i for i, l in enumerate(lines) if json.loads(l)["kind"] == "upload")
    _write(path, lines[:last_upload])
    res = verify_path(root / "site-00", site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 4
    # and the server ledger alone cannot stand for the sites
    res = verify_path(server.ledger.path, server_keys=server_fp)
    assert res.status == "partial"


# -- P25: a privacy budget reset shows in the audit chain ------------------------------------------------------------
def _dp_site(root, policy=None):
    """A gate whose uploads record a real site's privacy anchors (the DP ledger of ``root/site-00``)."""
    from test_audit_support import Server, Site

    from fcd_secure.privacy.anchor import read_anchors
    from fcd_secure.privacy.ledger import privacy_ledger_hash

    site, server = Site(root), Server(root)
    state = root / site.site_id
    site.ctx.privacy_anchors = lambda: read_anchors(state)
    site.ctx.privacy_ledger_hash = lambda: privacy_ledger_hash(state)
    return site, server, state


def _dp_round(state):
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite

    dp = DPSite(state, "c" * 64, DPConfig(enabled=True, epsilon=5.0, delta=1e-3, accountant="rdp", noise_seed="run_seed"),
                60, planned_rounds=4, local_epochs=1, batch_size=12)
    dp.commit(dp.reserve_round())
    return dp


@pytest.mark.parametrize("acknowledged", [False, True], ids=["deleted", "deleted-and-acknowledged"])
def test_a_deleted_privacy_ledger_shows_in_the_audit_chain(tmp_path, acknowledged):
    from test_audit_support import close_run

    from fcd_secure.privacy.ledger import LedgerRollback, acknowledge_reset

    site, server, state = _dp_site(tmp_path)
    pins = dict(site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    for r in (1, 2):
        dp = _dp_round(state)
        server.receive(site.send(server.downlink("train", r, 11)), site.site_id)
    dp.ledger.path.unlink()
    if acknowledged:
        with pytest.raises(LedgerRollback):
            _dp_round(state)
        acknowledge_reset(state, "disk failure", operator="ops")
    else:
        (state / "privacy_anchor.json").unlink()  # the insider removes the anchor too, so the site trains again
        server.receive(site.send(server.downlink("train", 3, 11)), site.site_id)  # an upload before retraining
    _dp_round(state)
    server.receive(site.send(server.downlink("train", 4, 11)), site.site_id)
    close_run([site], server, 4, [11])
    res = verify_path(tmp_path, **pins)
    if acknowledged:
        assert res.status == "compliant", [f.message for f in res.findings if f.severity != "note"]
        (note,) = [f for f in res.findings if f.severity == "note" and "privacy ledger" in f.message]
        assert "ops" in note.message and "disk failure" in note.message and "went back from 2 to 1" in note.message
    else:
        assert res.status == "violation"
        found = [f.message for f in res.findings if f.severity == "violation"]
        assert any("privacy ledger" in m and "gone" in m for m in found)  # the head vanished from the anchors
        assert any("DP ledger files disappeared" in m for m in found)  # and the files from the ledger hash
        assert any("went back from 2 to 1" in m for m in found)  # then it came back with less history


def test_a_restored_older_privacy_ledger_shows_in_the_audit_chain(tmp_path):
    """An older copy of ledger and anchor put back (the site then trains): the head goes from 2 segments to 1."""
    from test_audit_support import close_run

    site, server, state = _dp_site(tmp_path)
    dp = _dp_round(state)
    saved = {p: p.read_bytes() for p in (dp.ledger.path, state / "privacy_anchor.json")}
    server.receive(site.send(server.downlink("train", 1, 11)), site.site_id)
    _dp_round(state)
    server.receive(site.send(server.downlink("train", 2, 11)), site.site_id)
    for p, raw in saved.items():
        p.write_bytes(raw)
    server.receive(site.send(server.downlink("train", 3, 11)), site.site_id)
    close_run([site], server, 3, [11])
    res = verify_path(tmp_path, site_keys=[site.ledger.fingerprint], server_keys=[server.ledger.fingerprint])
    assert res.status == "violation"
    assert any("went back from 2 to 1" in f.message for f in res.findings if f.severity == "violation")


def test_the_privacy_heads_the_gate_records_are_the_privacy_layers_anchors():
    """The audit layer records the privacy layer's anchors: one type (``fcd_secure.anchor_records``), so a head can
    neither be refused by the gate nor misread by verify for a field the two layers spelled differently."""
    from fcd_secure import anchor_records
    from fcd_secure.audit import entries
    from fcd_secure.privacy import anchor

    assert entries.PrivacyAnchor is anchor.PrivacyAnchor is anchor_records.PrivacyAnchor
    assert anchor.ResetRecord is anchor_records.ResetRecord
    assert anchor.LedgerHead is anchor_records.LedgerHead


def test_an_error_reply_the_superlink_built_for_a_silent_site_is_a_note(run):
    """A site killed mid-run (docs/hospital.md, "Walkthrough, measured": the verdict was TAMPERED): the SuperLink
    answers the messages it cannot deliver itself, with Flower's own node-unavailable error reply from source node
    SUPERLINK_NODE_ID, which no site can send from. The server ledger records those replies and no site ledger can:
    a note, the verdict stays compliant. The same empty error reply from a site's node is still tampered (the
    Flower runtime of a live site builds those outside its gate, with exception text)."""
    from flwr.common import Error, Message
    from flwr.common.constant import SUPERLINK_NODE_ID, ErrorCode
    from flwr.server.superlink.linkstate.utils import create_message_error_unavailable_res_message

    from fcd_secure.audit.verify.reconcile import SUPERLINK_NODE_ID as OURS

    assert OURS == SUPERLINK_NODE_ID
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    lost = instruction("train", 4, 101)
    server.ledger.accept(create_message_error_unavailable_res_message(lost.metadata, "node_unavail"), "site-01")
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 0, [f.message for f in res.findings if f.severity != "note"]
    notes = [f.message for f in res.findings if f.severity == "note" and "SuperLink answered" in f.message]
    assert len(notes) == 1 and "site-01" in notes[0]
    from_site = Message(Error(code=ErrorCode.NODE_UNAVAILABLE, reason="Error: Node Unavailable"),
                        reply_to=instruction("train", 4, 100))
    server.ledger.accept(from_site, "site-00")
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.exit_code == 6 and any("gate never saw" in f.message for f in _tampered(res))
