"""Audit evidence that is stale, incomplete or checked against a mistyped pin (issue 45 item 4).

Measured on the hospital deployment: site ledgers copied by hand after one run and not again after the next read as
TAMPERED (exit 6), naming a Flower node number; a typo in the auditor's own pin file gave TAMPERED too. Now:

* a site ledger copied before a later run (it records nothing of that run and ends before the server's records of
  it) is **partial** evidence, "stale", naming the site; a ledger cut inside a run it records stays TAMPERED;
* a pin that contradicts both the site's ledger and the server's countersignatures of it is the pin file's error:
  exit 2 (bad input), naming the writer; a ledger re-keyed by a forger stays TAMPERED;
* ``fcd audit collect`` copies each site's current evidence (site ledger, DP ledgers, privacy anchor) into the
  evidence folder, replacing an earlier copy, and records what it copied.

The ledgers are written by the real gate and server audit (``test_audit_support``); the deployment run that
collects and verifies its own evidence is ``tests/test_hospital_deployment.py``.
"""

from __future__ import annotations

import json
import shutil

import pytest
import test_audit_support as support
from test_audit_support import Server, Site, close_run, fingerprints, raw_key
from typer.testing import CliRunner

from fcd_secure.audit.ledger import SITE_LEDGER_FILE
from fcd_secure.audit.pins import write_pins
from fcd_secure.audit.verify import ledger_identities, verify_path
from fcd_secure.cli import audit as audit_cli

runner = CliRunner()


def _one_run(root, run_id: int, rounds: int = 2):
    """A federation of two sites over ``root`` (ledgers appended to across runs, as on a consortium's sites)."""
    made = support.instruction

    def instruction(*args, **kwargs):
        msg = made(*args, **kwargs)
        msg.metadata.__dict__["_run_id"] = run_id
        return msg

    support.instruction = instruction
    try:
        sites = [Site(root, f"site-{i:02d}", seed=run_id + i) for i in range(2)]
        server = Server(root)
        for r in range(1, rounds + 1):
            for i, s in enumerate(sites):
                server.receive(s.send(server.downlink("train", r, 100 + i)), s.site_id)
        close_run(sites, server, rounds, [100, 101])
    finally:
        support.instruction = made
    return sites, server


@pytest.fixture()
def two_runs(tmp_path):
    root = tmp_path / "evidence"
    _one_run(root, run_id=7)
    stale = tmp_path / "copied-after-run-7.jsonl"
    shutil.copyfile(root / "site-01" / "audit" / SITE_LEDGER_FILE, stale)
    sites, server = _one_run(root, run_id=8)
    return root, stale, fingerprints(sites, server)


def test_a_ledger_copied_before_the_last_run_is_stale_not_tampered(two_runs):
    root, stale, (site_fp, server_fp) = two_runs
    assert verify_path(root, site_keys=site_fp, server_keys=server_fp).status == "compliant"
    shutil.copyfile(stale, root / "site-01" / "audit" / SITE_LEDGER_FILE)
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.status == "partial" and res.exit_code == 4, [f.message for f in res.findings if f.severity != "note"]
    partial = [f.message for f in res.findings if f.severity == "partial"]
    assert partial and all("stale evidence" in m and "fcd audit collect" in m for m in partial)
    assert any("site site-01" in m for m in partial) and not any("node 10" in m for m in partial)
    # the site's ledger removed altogether: incomplete evidence too, by the site's name
    (root / "site-01" / "audit" / SITE_LEDGER_FILE).unlink()
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.status == "partial" and any("no ledger of site-01" in f.message for f in res.findings)


def test_a_ledger_cut_inside_a_run_it_records_stays_tampered(two_runs):
    root, _stale, (site_fp, server_fp) = two_runs
    path = root / "site-01" / "audit" / SITE_LEDGER_FILE
    lines = path.read_text().splitlines()
    last_upload = max(i for i, line in enumerate(lines) if json.loads(line)["kind"] == "upload")
    path.write_text("\n".join(lines[:last_upload]) + "\n")
    res = verify_path(root, site_keys=site_fp, server_keys=server_fp)
    assert res.status == "tampered" and any("site site-01" in f.message for f in res.findings)


def _verify_cli(root, pins) -> tuple[int, dict]:
    res = runner.invoke(audit_cli.app, ["verify", str(root), "--pins", str(pins), "--json"])
    return res.exit_code, json.loads(res.stdout)


def test_a_mistyped_pin_is_bad_input_a_re_keyed_ledger_is_tampered(two_runs, tmp_path):
    root, _stale, _fps = two_runs
    pins = write_pins(tmp_path / "pins.toml", ledger_identities(root))
    code, env = _verify_cli(root, pins)
    assert code == 0, env
    text = pins.read_text()
    line = next(ln for ln in text.splitlines() if ln.startswith("site-01"))
    digit = line[-3]
    typo = line[:-3] + ("0" if digit != "0" else "1") + line[-2:]
    pins.write_text(text.replace(line, typo))
    code, env = _verify_cli(root, pins)
    assert code == 2, env
    assert "site-01" in env["message"] and "pin file is wrong" in env["message"], env
    # the pin right, the ledger re-signed with a fresh key (the forger's): the server countersigned another key
    pins.write_text(text)
    from test_audit_verify import _resign  # noqa: PLC0415

    _resign(root / "site-01" / "audit" / SITE_LEDGER_FILE, raw_key())
    code, env = _verify_cli(root, pins)
    assert code == 6, env


def test_collect_copies_each_sites_current_evidence(tmp_path):
    from test_hospital_install import make_consortium

    c = make_consortium(tmp_path)
    ev = tmp_path / "run" / "evidence"
    homes = [str(s["home"]) for s in c["sites"]]
    res = runner.invoke(audit_cli.app, ["collect", str(ev), *[a for h in homes for a in ("--site-home", h)], "--json"])
    assert res.exit_code == 2 and "fingerprints.json" in json.loads(res.stdout)["message"]
    ev.mkdir(parents=True)
    (ev / "fingerprints.json").write_text("{}")
    (ev / "sites" / "h0").mkdir(parents=True)
    (ev / "sites" / "h0" / "left-over.jsonl").write_text("an older copy\n")
    res = runner.invoke(audit_cli.app, ["collect", str(ev), *[a for h in homes for a in ("--site-home", h)], "--json"])
    env = json.loads(res.stdout)
    assert res.exit_code == 0, env
    assert [r["site_id"] for r in env["data"]["sites"]] == ["h0", "h1"]
    for s in c["sites"]:
        copied = ev / "sites" / s["id"] / SITE_LEDGER_FILE
        assert copied.read_bytes() == (s["home"] / "state" / s["id"] / "slots" / SITE_LEDGER_FILE).read_bytes()
    assert not (ev / "sites" / "h0" / "left-over.jsonl").exists()  # replaced as a whole
    record = json.loads((ev / "collected.json").read_text())
    assert set(record) == {"h0", "h1"} and SITE_LEDGER_FILE in record["h0"]["files"]
    assert not list(ev.rglob("*.key"))  # evidence only: no key travels
    res = runner.invoke(audit_cli.app, ["collect", str(ev), "--site-home", homes[0], "--site-home", homes[0], "--json"])
    assert res.exit_code == 2 and "given twice" in json.loads(res.stdout)["message"]
