"""`fcd deploy` refuses bad input before any process starts: each a clear error naming the file and field, exit 2.

Real certificates and keys (``cryptography``), real policy files, the real CLI; no Flower process is started, which
the tests check by scanning every running process for the deployment's folder.
"""

from __future__ import annotations

import datetime as dt
import os
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from typer.testing import CliRunner

from fcd_secure.cli.main import app as fcd_app
from fcd_secure.engines.pki import PKIError, check_tls_dir, load_node_key, make_node_key, make_tls_dir
from fcd_secure.federation.site_policy import SitePolicy


def _processes_under(folder: Path) -> list[int]:
    """PIDs of running processes whose command line names ``folder``."""
    out = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(folder) in cmd and "pytest" not in cmd:
            out.append(int(pid))
    return out


class Result:
    """Exit code and the CLI's output with line wrapping undone."""

    def __init__(self, res) -> None:
        self.exit_code = res.exit_code
        self.output = " ".join(res.output.split())


def _invoke(args: list[str]) -> Result:
    return Result(CliRunner().invoke(fcd_app, args, env={"COLUMNS": "1000"}))


def _deploy(tmp_path: Path, *extra: str) -> Result:
    work = tmp_path / "work"
    res = _invoke(["deploy", "--preset", "tiny", "--sites", "4", "--rounds", "1", "--workdir", str(work),
                   "--out", str(tmp_path / "run"), *extra])
    assert not _processes_under(work), "a process was started for a deployment that was refused"
    assert not (tmp_path / "run" / "summary.json").exists()
    return res


def _expire(tls: Path) -> None:
    """Re-sign server.pem with the CA so that it expired yesterday."""
    ca = x509.load_pem_x509_certificate((tls / "ca.crt").read_bytes())
    ca_key = serialization.load_pem_private_key((tls / "ca.key").read_bytes(), password=None)
    srv = x509.load_pem_x509_certificate((tls / "server.pem").read_bytes())
    now = dt.datetime.now(dt.timezone.utc)
    builder = (
        x509.CertificateBuilder().subject_name(srv.subject).issuer_name(ca.subject).public_key(srv.public_key())
        .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(days=30))
        .not_valid_after(now - dt.timedelta(days=1))
    )
    for ext in srv.extensions:
        builder = builder.add_extension(ext.value, ext.critical)
    (tls / "server.pem").write_bytes(builder.sign(ca_key, hashes.SHA384()).public_bytes(serialization.Encoding.PEM))


def test_missing_certificate_is_refused_naming_the_file(tmp_path):
    tls = make_tls_dir(tmp_path / "tls")
    (tls / "server.pem").unlink()
    res = _deploy(tmp_path, "--tls-dir", str(tls))
    assert res.exit_code == 2
    assert "server.pem: missing (field: file)" in res.output


def test_expired_certificate_is_refused_naming_file_and_field(tmp_path):
    tls = make_tls_dir(tmp_path / "tls")
    _expire(tls)
    res = _deploy(tmp_path, "--tls-dir", str(tls))
    assert res.exit_code == 2
    assert "server.pem" in res.output and "expired" in res.output and "not_valid_after" in res.output


def test_a_certificate_from_another_ca_or_for_another_host_is_refused(tmp_path):
    a, b = make_tls_dir(tmp_path / "a"), make_tls_dir(tmp_path / "b", hosts=("10.0.0.7",))
    (a / "ca.crt").write_bytes((b / "ca.crt").read_bytes())
    with pytest.raises(PKIError, match="not signed by"):
        check_tls_dir(a)
    with pytest.raises(PKIError, match="does not name host 127.0.0.1"):
        check_tls_dir(b)
    check_tls_dir(make_tls_dir(tmp_path / "c"))  # a fresh one is fine


def test_a_policy_file_that_does_not_parse_is_refused_naming_the_file(tmp_path):
    pol = tmp_path / "policies"
    pol.mkdir()
    for i in range(4):
        SitePolicy().write(pol / f"site-{i:02d}.toml")
    (pol / "site-02.toml").write_text("[secure\nrequired = true\n")
    res = _deploy(tmp_path, "--site-policies", str(pol))
    assert res.exit_code == 2 and "site-02.toml: the site policy is not valid TOML" in res.output


def test_a_policy_weaker_than_the_consortium_minimum_is_refused_naming_the_field(tmp_path):
    pol = tmp_path / "policies"
    pol.mkdir()
    for i in range(4):
        SitePolicy().write(pol / f"site-{i:02d}.toml")
    SitePolicy(evaluation={"min_cohort": 20}).write(pol / "site-03.toml")
    res = _deploy(tmp_path, "--site-policies", str(pol))
    assert res.exit_code == 2
    assert "site-03.toml: field evaluation.min_cohort" in res.output and "consortium minimum" in res.output


def test_a_node_key_of_an_unsupported_curve_is_refused_naming_file_and_field(tmp_path):
    keys = tmp_path / "keys"
    keys.mkdir()
    for i in range(4):
        make_node_key(keys / f"site-{i:02d}.key", keys / f"site-{i:02d}.pub")
    k1 = ec.generate_private_key(ec.SECP256K1())
    (keys / "site-01.key").write_bytes(
        k1.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    res = _deploy(tmp_path, "--node-keys-dir", str(keys))
    assert res.exit_code == 2
    assert "site-01.key: field curve: secp256k1 is not supported" in res.output
    ed = ed25519.Ed25519PrivateKey.generate()
    (keys / "site-01.key").write_bytes(
        ed.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption())
    )
    with pytest.raises(PKIError, match="field key type"):
        load_node_key(keys / "site-01.key")
    assert load_node_key(keys / "site-00.key").curve.name == "secp384r1"


def test_a_secure_deployment_refuses_plain_aggregation_and_too_few_sites(tmp_path):
    res = _deploy(tmp_path, "--no-secure-aggregation")
    assert res.exit_code == 2 and "--insecure-dev" in res.output
    res = _invoke(["deploy", "--preset", "tiny", "--sites", "2", "--workdir", str(tmp_path / "w2")])
    assert res.exit_code == 2 and "minimum" in res.output
    assert not _processes_under(tmp_path / "w2")
