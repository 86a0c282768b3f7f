"""Certificates and SuperNode keys of a deployment, made and checked with ``cryptography``.

What the pinned Flower (:data:`fcd_secure._flower.pins.FLWR_VERSION`) needs for TLS and SuperNode authentication (its
documentation, "Enable TLS connections" and "Authenticate SuperNodes"):

* a CA certificate (``ca.crt``) that every SuperNode and the ``flwr`` CLI trust;
* the SuperLink's certificate (``server.pem``, ``server.key``) signed by that CA, with the host names it is reached
  by as subject alternative names (``127.0.0.1`` and ``localhost`` on loopback);
* one EC key per SuperNode in OpenSSH format (``<site>.key`` private, kept in the site's folder; ``<site>.pub``
  public, registered with ``flwr supernode register``). The consortium uses one curve, NIST P-384.

:func:`check_tls_dir` and :func:`load_node_key` refuse missing, unreadable or expired certificates, a server
certificate the CA did not sign or that does not name the host, and keys of another curve, each with the file and
field named, before any process starts.
"""

from __future__ import annotations

import base64
import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from fcd_secure._io import atomic_write_bytes
from fcd_secure.errors import FcdError
from fcd_secure.fingerprints import fingerprint

CA_CERT, SERVER_CERT, SERVER_KEY = "ca.crt", "server.pem", "server.key"
#: the one curve of SuperNode keys
NODE_CURVE = ec.SECP384R1
DEFAULT_HOSTS = ("127.0.0.1", "localhost")


class PKIError(FcdError, ValueError):
    """A certificate or key that cannot be used; the message names the file and the field."""


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn), x509.NameAttribute(NameOID.ORGANIZATION_NAME, "fcd_secure")])


def _san(hosts: tuple[str, ...]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for h in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(h)))
        except ValueError:
            names.append(x509.DNSName(h))
    return x509.SubjectAlternativeName(names)


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())


def make_tls_dir(folder: str | Path, hosts: tuple[str, ...] = DEFAULT_HOSTS, days: int = 365) -> Path:
    """A CA and the SuperLink's certificate for ``hosts`` in ``folder`` (private keys 0600).

    The CA's private key is written as ``ca.key`` beside them: the operator moves it offline after provisioning.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    now = _now()
    ca_key = ec.generate_private_key(NODE_CURVE())
    ca = (
        x509.CertificateBuilder()
        .subject_name(_name("fcd_secure consortium CA"))
        .issuer_name(_name("fcd_secure consortium CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature=True, content_commitment=False, key_encipherment=False, data_encipherment=False,
                          key_agreement=False, key_cert_sign=True, crl_sign=True, encipher_only=False, decipher_only=False),
            critical=True,
        )
        .sign(ca_key, hashes.SHA384())
    )
    srv_key = ec.generate_private_key(NODE_CURVE())
    srv = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca.subject)
        .public_key(srv_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + dt.timedelta(days=days))
        .add_extension(_san(tuple(hosts)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .sign(ca_key, hashes.SHA384())
    )
    atomic_write_bytes(folder / CA_CERT, ca.public_bytes(serialization.Encoding.PEM))
    atomic_write_bytes(folder / "ca.key", _pem_key(ca_key), mode=0o600)
    atomic_write_bytes(folder / SERVER_CERT, srv.public_bytes(serialization.Encoding.PEM))
    atomic_write_bytes(folder / SERVER_KEY, _pem_key(srv_key), mode=0o600)
    return folder


def _load_cert(path: Path) -> x509.Certificate:
    if not path.is_file():
        raise PKIError(f"{path}: missing (field: file)")
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except ValueError as exc:
        raise PKIError(f"{path}: not a PEM certificate ({exc})") from None


def _check_validity(path: Path, cert: x509.Certificate, now: dt.datetime) -> None:
    if cert.not_valid_after_utc <= now:
        raise PKIError(f"{path}: certificate expired (field not_valid_after = {cert.not_valid_after_utc.isoformat()})")
    if cert.not_valid_before_utc > now:
        raise PKIError(f"{path}: certificate not yet valid (field not_valid_before = {cert.not_valid_before_utc.isoformat()})")


@dataclass(frozen=True)
class TLSFiles:
    """The checked TLS files of a SuperLink."""

    ca_cert: Path
    server_cert: Path
    server_key: Path

    @property
    def ca_fingerprint(self) -> str:
        """The CA's :func:`certificate_fingerprint` (what ``consortium.toml`` pins)."""
        return certificate_fingerprint(x509.load_pem_x509_certificate(self.ca_cert.read_bytes()))


def check_tls_dir(folder: str | Path, hosts: tuple[str, ...] = ("127.0.0.1",), now: dt.datetime | None = None) -> TLSFiles:
    """Check a folder of ``ca.crt``, ``server.pem``, ``server.key`` before a SuperLink starts with it.

    Raises:
        PKIError: a missing or unreadable file, an expired or not-yet-valid certificate, a server certificate not
            signed by the CA or not naming ``hosts``, or a key that does not match the certificate.
    """
    folder = Path(folder)
    now = now or _now()
    ca_path, srv_path, key_path = folder / CA_CERT, folder / SERVER_CERT, folder / SERVER_KEY
    ca, srv = _load_cert(ca_path), _load_cert(srv_path)
    _check_validity(ca_path, ca, now)
    _check_validity(srv_path, srv, now)
    try:
        srv.verify_directly_issued_by(ca)
    except (ValueError, TypeError, InvalidSignature):
        raise PKIError(f"{srv_path}: not signed by {ca_path} (field issuer)") from None
    try:
        san = srv.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise PKIError(f"{srv_path}: no subject alternative names (field subjectAltName)") from None
    named = {str(v) for v in san.get_values_for_type(x509.IPAddress)} | set(san.get_values_for_type(x509.DNSName))
    for h in hosts:
        if h not in named:
            raise PKIError(f"{srv_path}: does not name host {h} (field subjectAltName = {sorted(named)})")
    if not key_path.is_file():
        raise PKIError(f"{key_path}: missing (field: file)")
    try:
        key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except (ValueError, TypeError) as exc:
        raise PKIError(f"{key_path}: not an unencrypted PEM private key ({exc})") from None
    if key.public_key().public_numbers() != srv.public_key().public_numbers():  # type: ignore[union-attr]
        raise PKIError(f"{key_path}: does not match {srv_path} (field public key)")
    return TLSFiles(ca_path, srv_path, key_path)


def make_node_key(private_path: str | Path, public_path: str | Path) -> str:
    """A SuperNode authentication key (EC P-384, OpenSSH): private 0600, public beside; returns the fingerprint."""
    key = ec.generate_private_key(NODE_CURVE())
    atomic_write_bytes(
        private_path,
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.OpenSSH, serialization.NoEncryption()),
        mode=0o600,
    )
    return write_node_public(key, public_path)


def write_node_public(key: ec.EllipticCurvePrivateKey, public_path: str | Path) -> str:
    """The OpenSSH public line of a SuperNode key (what ``flwr supernode register`` reads); returns its fingerprint."""
    pub = key.public_key().public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
    atomic_write_bytes(public_path, pub + b"\n")
    return node_key_fingerprint(pub)


def certificate_fingerprint(cert: x509.Certificate) -> str:
    """:func:`~fcd_secure.fingerprints.fingerprint` of a certificate's DER bytes (RFC 5280), the digest
    ``x509.Certificate.fingerprint(hashes.SHA256())`` computes."""
    return fingerprint(cert.public_bytes(serialization.Encoding.DER))


def node_key_fingerprint(openssh_public: bytes) -> str:
    """:func:`~fcd_secure.fingerprints.fingerprint` of an OpenSSH public key line's key blob (RFC 4253 §6.6)."""
    parts = openssh_public.split()
    return fingerprint(base64.b64decode(parts[1]))


def load_node_key(private_path: str | Path) -> ec.EllipticCurvePrivateKey:
    """Load and check a SuperNode's private key.

    Raises:
        PKIError: missing, unreadable, not an EC key, or not on the consortium's curve (P-384).
    """
    path = Path(private_path)
    if not path.is_file():
        raise PKIError(f"{path}: missing (field: file)")
    data = path.read_bytes()
    try:
        key = serialization.load_ssh_private_key(data, password=None)
    except (ValueError, TypeError, NotImplementedError):
        try:
            key = serialization.load_pem_private_key(data, password=None)
        except (ValueError, TypeError, NotImplementedError) as exc:
            raise PKIError(f"{path}: not a readable private key ({exc})") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise PKIError(f"{path}: field key type: {type(key).__name__} is not an EC key; SuperNode keys are EC P-384")
    if not isinstance(key.curve, NODE_CURVE):
        raise PKIError(f"{path}: field curve: {key.curve.name} is not supported; SuperNode keys are EC P-384 (secp384r1)")
    return key
