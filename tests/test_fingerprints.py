"""Key fingerprints shown to people: one format (``SHA256:<hex>``) and one function (``fcd_secure.fingerprints``),
whatever the key: an Ed25519 identity, a SuperNode's OpenSSH key, the consortium's CA certificate; a pinned value
read back from a file keeps verifying, a malformed one is refused naming its field."""

from __future__ import annotations

import base64
import hashlib
import re

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes

from fcd_secure.audit.signing import load_or_create_identity_key, public_key_bytes
from fcd_secure.engines.pki import CA_CERT, certificate_fingerprint, make_node_key, make_tls_dir, node_key_fingerprint
from fcd_secure.fingerprints import fingerprint, normalise_fingerprint
from fcd_secure.provisioning.consortium import ConsortiumConfig, ProvisioningError

FORMAT = re.compile(r"^SHA256:[0-9a-f]{64}$")


def test_every_key_kind_has_the_one_format_and_the_digest_its_standard_tool_computes(tmp_path):
    ident = public_key_bytes(load_or_create_identity_key(tmp_path / "id.key"))
    assert fingerprint(ident) == "SHA256:" + hashlib.sha256(ident).hexdigest()
    node_fp = make_node_key(tmp_path / "node.key", tmp_path / "node.pub")
    blob = base64.b64decode((tmp_path / "node.pub").read_bytes().split()[1])
    assert node_fp == node_key_fingerprint((tmp_path / "node.pub").read_bytes()) == fingerprint(blob)
    make_tls_dir(tmp_path / "tls")
    cert = x509.load_pem_x509_certificate((tmp_path / "tls" / CA_CERT).read_bytes())
    ca_fp = certificate_fingerprint(cert)
    assert ca_fp == "SHA256:" + cert.fingerprint(hashes.SHA256()).hex()  # what the CA's fingerprint always was
    for fp in (fingerprint(ident), node_fp, ca_fp):
        assert FORMAT.match(fp) and normalise_fingerprint(fp) == fp


def test_a_pin_typed_by_a_person_reads_as_the_one_format_or_is_refused():
    fp = fingerprint(b"k")
    hexd = fp.removeprefix("SHA256:")
    for typed in (fp, hexd, hexd.upper(), f"  sha256:{hexd.upper()}\n"):
        assert normalise_fingerprint(typed) == fp
    for bad in ("", "SHA256:", hexd[:16], "SHA256:" + "g" * 64, "MD5:" + hexd):
        with pytest.raises(ValueError, match="not a key fingerprint"):
            normalise_fingerprint(bad)


def _terms(**fps: str) -> dict:
    return {"consortium_id": "c1", "created": "2026-01-01T00:00:00Z", "superlink": "127.0.0.1:9092",
            "hosts": ["127.0.0.1"], "app_fab_sha256": "0" * 64, "data": {"spec_sha256": "0" * 64, "spec_name": "s"},
            "versions": {}, **fps}


def test_consortium_terms_read_stored_fingerprints_and_refuse_a_malformed_one():
    fp = fingerprint(b"coordinator")
    ca = fingerprint(b"ca")
    stored = ConsortiumConfig.model_validate(_terms(coordinator_fingerprint=fp, ca_fingerprint=ca))
    assert (stored.coordinator_fingerprint, stored.ca_fingerprint) == (fp, ca)
    assert ConsortiumConfig.from_toml(stored.to_toml(), "consortium.toml") == stored  # a written file reads back
    # a hand-edited file with the bare hex digits pins the same keys
    typed = ConsortiumConfig.model_validate(_terms(coordinator_fingerprint=fp[7:].upper(), ca_fingerprint=ca[7:]))
    assert typed == stored
    text = stored.to_toml().replace(ca, "SHA256:abc")
    with pytest.raises(ProvisioningError, match="ca_fingerprint.*not a key fingerprint"):
        ConsortiumConfig.from_toml(text, "consortium.toml")
