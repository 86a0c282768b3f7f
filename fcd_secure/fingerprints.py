"""Key fingerprints as people see, compare and pin them: one format, ``SHA256:<64 lower-case hex digits>``.

The format is the one NVFLARE prints for its root CA and that ``openssl x509 -fingerprint -sha256`` gives (there
with colons): the SHA-256 digest (FIPS 180-4) of the key's or certificate's bytes, in hex after the algorithm's name.
Every fingerprint of the package is this function of some bytes:

* an audit or coordinator identity: the raw 32-byte Ed25519 public key (RFC 8032 §5.1.5; ``audit.signing``);
* a SuperNode key: the key blob of its OpenSSH public line (RFC 4253 §6.6; ``engines.pki.node_key_fingerprint``),
  what ``ssh-keygen -l -E sha256`` hashes, shown in hex rather than its base64;
* the consortium's CA: its DER certificate (RFC 5280), what ``x509.Certificate.fingerprint(SHA256())`` hashes.

What a person types in (a pin on the command line, in a policy file or in ``consortium.toml``) is read by
:func:`normalise_fingerprint`, which also takes the bare hex digits in any case, so every value written by earlier
releases (always ``SHA256:<hex>``) still reads back the same.

A base module (``tests/test_layers.py``): audit, engines and provisioning all show and check fingerprints.
"""

from __future__ import annotations

import hashlib

__all__ = ["fingerprint", "normalise_fingerprint"]

PREFIX = "SHA256:"


def fingerprint(material: bytes) -> str:
    """``SHA256:<hex>`` of ``material`` (a raw public key, an OpenSSH key blob or a DER certificate)."""
    return PREFIX + hashlib.sha256(bytes(material)).hexdigest()


def normalise_fingerprint(text: str) -> str:
    """``SHA256:<hex>`` of a fingerprint given as ``SHA256:<hex>`` or bare hex (any case, surrounding blanks).

    Raises:
        ValueError: ``text`` is not 64 hex digits, with or without the ``SHA256:`` prefix.
    """
    t = text.strip()
    if t.upper().startswith(PREFIX):
        t = t[len(PREFIX):]
    t = t.lower()
    if len(t) != 64 or any(c not in "0123456789abcdef" for c in t):
        raise ValueError(f"not a key fingerprint: {text!r} (expected {PREFIX}<64 hex digits>)")
    return PREFIX + t
