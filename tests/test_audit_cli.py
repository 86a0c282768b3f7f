"""`fcd audit verify`: exit codes reach the shell, one JSON envelope on --json, a Markdown report otherwise."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from test_audit_support import fingerprints, run_rounds
from typer.testing import CliRunner

from fcd_secure.cli.main import app

runner = CliRunner()


@pytest.fixture()
def run(tmp_path):
    sites, server = run_rounds(tmp_path, n_sites=2, rounds=2)
    return tmp_path, sites, server


def _invoke(*args):
    return runner.invoke(app, ["audit", "verify", *map(str, args)])


def test_compliant_run_json_envelope(run):
    root, sites, server = run
    site_fp, server_fp = fingerprints(sites, server)
    args = [root, "--json", "--server-key", server_fp[0]]
    for fp in site_fp:
        args += ["--site-key", fp]
    res = _invoke(*args)
    assert res.exit_code == 0, res.output
    env = json.loads(res.stdout)
    assert set(env) == {"schema_version", "status", "exit_code", "error_code", "message", "hint", "data"}
    assert env["status"] == "compliant" and env["exit_code"] == 0 and env["error_code"] is None
    data = env["data"]
    assert data["totals"]["payload_bytes"] == data["server_totals"]["payload_bytes"] > 0
    assert {r["site_id"] for r in data["per_round"]} == {"site-00", "site-01"}
    assert all(l["key_pinned"] for l in data["ledgers"])


def _pins(sites, server):
    site_fp, server_fp = fingerprints(sites, server)
    return [a for fp in site_fp for a in ("--site-key", fp)] + ["--server-key", server_fp[0]]


def test_unpinned_exit_3_unverified_and_allow_unpinned(run):
    """Without pins the evidence is not tied to its writers: never 'compliant', a distinct exit code."""
    root, sites, server = run
    res = _invoke(root, "--json")
    assert res.exit_code == 3, res.output
    env = json.loads(res.stdout)
    assert env["status"] == "unverified" and env["exit_code"] == 3 and env["error_code"] == "IDENTITY_NOT_PINNED"
    assert "UNVERIFIED" in env["message"] and "--site-key" in env["hint"]
    res = _invoke(root, "--json", "--allow-unpinned")
    assert res.exit_code == 0
    env = json.loads(res.stdout)
    assert env["status"] == "unverified" and "--allow-unpinned" in env["message"]
    res = _invoke(root, "--plain", "--allow-unpinned")
    assert "**Verdict: UNVERIFIED** (exit 0)" in res.stdout
    # pinning every writer turns the same evidence compliant
    res = _invoke(root, "--json", *_pins(sites, server))
    assert res.exit_code == 0 and json.loads(res.stdout)["status"] == "compliant"


def test_help_documents_every_exit_code():
    res = runner.invoke(app, ["audit", "verify", "--help"], terminal_width=200)
    assert res.exit_code == 0
    for line in ("0  compliant", "1  violation", "2  usage", "3  unverified", "4  partial", "6  tampered", "--allow-unpinned"):
        assert line in res.stdout, line


def test_markdown_report_lists_sites_rounds_and_totals(run):
    root, sites, server = run
    res = _invoke(root, "--plain", *_pins(sites, server))
    assert res.exit_code == 0, res.output
    out = res.stdout
    assert "**Verdict: COMPLIANT**" in out
    assert "| site-00 | 1 |" in out and "| site-01 | 2 |" in out
    assert "**all sites**" in out and "server received" in out


def test_tampered_exit_6_names_the_entry(run):
    root, _, _ = run
    path = root / "site-01" / "audit" / "site_ledger.jsonl"
    lines = path.read_text().splitlines()
    del lines[3]
    path.write_text("\n".join(lines) + "\n")
    res = _invoke(root, "--json")
    assert res.exit_code == 6
    env = json.loads(res.stdout)
    assert env["status"] == "tampered" and env["error_code"] == "EVIDENCE_TAMPERED"
    assert "site-01" in env["message"] and "seq 4" in env["message"]


def test_usage_errors_exit_2(tmp_path, run):
    root, _, _ = run
    res = _invoke(tmp_path / "missing", "--json")
    assert res.exit_code == 2
    assert json.loads(res.stdout)["error_code"] == "USAGE"
    res = _invoke(root, "--site-key", "not-a-fingerprint")
    assert res.exit_code == 2


def test_exit_code_reaches_the_shell(run):
    """The installed entry point, in a fresh process: a tampered ledger exits 6, not 1."""
    root, _, _ = run
    path = root / "site-00" / "audit" / "site_ledger.jsonl"
    raw = path.read_text()
    path.write_text(raw.replace('"round":1', '"round":2', 1))
    fcd = Path(sys.executable).parent / "fcd"
    env = {**os.environ, "FLWR_TELEMETRY_ENABLED": "0"}
    proc = subprocess.run([str(fcd), "audit", "verify", str(root), "--json"], capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 6, proc.stderr
    assert json.loads(proc.stdout)["status"] == "tampered"


def test_fingerprints_lists_every_writer_and_no_key_material(run):
    root, sites, server = run
    res = _invoke_cmd("fingerprints", root, "--json")
    assert res.exit_code == 0, res.output
    rows = json.loads(res.stdout)["data"]
    assert {r["key_fingerprint"] for r in rows} == {s.ledger.fingerprint for s in sites} | {server.ledger.fingerprint}
    assert {r["role"] for r in rows} == {"site", "server"}
    for s in sites:
        assert s.key.hex() not in res.stdout
    assert _invoke_cmd("fingerprints", root / "nope").exit_code == 2


def _invoke_cmd(cmd, *args):
    return runner.invoke(app, ["audit", cmd, *map(str, args)])


def test_one_site_folder_is_partial_exit_4_in_the_envelope(run):
    """Without the server ledger nothing can show a cut or re-signed site ledger: a distinct verdict and exit code."""
    root, sites, server = run
    res = _invoke(root / "site-00", "--json", *_pins(sites, server))
    assert res.exit_code == 4, res.output
    env = json.loads(res.stdout)
    assert env["status"] == "partial" and env["error_code"] == "EVIDENCE_PARTIAL" and "PARTIAL" in env["message"]
    assert any(f["severity"] == "partial" for f in env["data"]["findings"])
    assert _invoke(root / "site-00", "--json", "--allow-unpinned").exit_code == 4


def test_fingerprints_are_printed_whole_at_80_columns_and_pinned_from_a_file(run, tmp_path):
    """The operator hands fingerprints to the auditor: each must print whole on a narrow terminal, and a pin file
    written by `fingerprints --out` pins every writer for `verify --pins`."""
    root, sites, server = run
    res = runner.invoke(app, ["audit", "fingerprints", str(root)], terminal_width=80, env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    site_fp, server_fp = fingerprints(sites, server)
    lines = res.stdout.splitlines()
    for fp in site_fp + server_fp:
        assert any(line.strip() == f"key {fp}" for line in lines), fp  # whole, on one line
    assert "…" not in res.stdout
    for line in lines:
        if line.strip().startswith("key "):
            assert len(line) <= 80
    pins = tmp_path / "pins.toml"
    res = runner.invoke(app, ["audit", "fingerprints", str(root), "--out", str(pins)])
    assert res.exit_code == 0 and pins.is_file()
    text = pins.read_text()
    assert all(fp in text for fp in site_fp + server_fp) and "[sites]" in text and "[server]" in text
    res = _invoke(root, "--json", "--pins", pins)
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["status"] == "compliant"


def test_a_bad_pin_file_and_a_non_ledger_file_are_usage_errors(run, tmp_path):
    root, _, _ = run
    bad = tmp_path / "pins.toml"
    bad.write_text('[sites]\nsite-00 = "SHA256:nothex"\n')
    res = _invoke(root, "--json", "--pins", bad)
    assert res.exit_code == 2 and json.loads(res.stdout)["error_code"] == "USAGE"
    assert str(bad) in json.loads(res.stdout)["message"]
    for name, content in (("rounds.csv", "round,sites\n1,site-00\n"), ("summary.json", '{"rounds": 2}\n'),
                          ("empty.jsonl", "")):
        f = tmp_path / name
        f.write_text(content)
        res = _invoke(f, "--json")
        assert res.exit_code == 2, (name, res.output)  # the wrong file, not tampered evidence (exit 6)
        env = json.loads(res.stdout)
        assert env["error_code"] == "USAGE" and "not a ledger" in env["message"]
    # a real ledger with a tampered line is still judged as evidence
    ledger = root / "site-00" / "audit" / "site_ledger.jsonl"
    ledger.write_text(ledger.read_text().replace('"round":1', '"round":2', 1))
    assert _invoke(ledger, "--json").exit_code == 6


def test_verify_human_report_keeps_fingerprints_whole_at_80_columns(run):
    root, sites, server = run
    res = runner.invoke(app, ["audit", "verify", str(root), *_pins(sites, server)], terminal_width=80,
                        env={"COLUMNS": "80"})
    assert res.exit_code == 0, res.output
    site_fp, server_fp = fingerprints(sites, server)
    flat = res.stdout
    for fp in site_fp + server_fp:
        assert fp in flat, fp
    assert "…" not in flat
