"""A site's enrolment request: its public keys, signed with its own identity key (proof that it holds the key).

The site's operator also hands the coordinator the identity fingerprint out of band (read aloud, typed in:
``fcd consortium add-site REQUEST --fingerprint ...``); the request file alone could come from anyone.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from fcd_secure.audit.signing import public_key_bytes, utc_now
from fcd_secure.engines.pki import NODE_CURVE, node_key_fingerprint
from fcd_secure.provisioning.consortium import ConsortiumConfig, ProvisioningError, below_floor
from fcd_secure.provisioning.signed import SignedDocumentError, read_document, sign_document, write_document
from fcd_secure.provisioning.versions import installed_versions
from fcd_secure.federation.state import StateError, check_site_id
from fcd_secure.fingerprints import fingerprint, normalise_fingerprint

REQUEST_TYPE = "enrolment"


def write_request(
    path: str | Path, site_id: str, identity_key: bytes, node_public: bytes, spec_sha256: str, trajectories: int
) -> dict[str, Any]:
    """Write the signed enrolment request of a site; returns its payload. ``trajectories`` is the size of the site's
    table, which the coordinator checks against the consortium's floor before it enrols the site."""
    payload = {
        "site_id": site_id,
        "trajectories": int(trajectories),
        "identity_public_key": public_key_bytes(identity_key).hex(),
        "identity_fingerprint": fingerprint(public_key_bytes(identity_key)),
        "node_public_key": node_public.decode("ascii").strip(),
        "node_fingerprint": node_key_fingerprint(node_public),
        "spec_sha256": spec_sha256,
        "versions": installed_versions(),
        "created": utc_now(),
    }
    write_document(path, sign_document(REQUEST_TYPE, payload, identity_key))
    return payload


def check_request(path: str | Path, cfg: ConsortiumConfig, expected_fingerprint: str | None) -> dict[str, Any]:
    """The checked payload of an enrolment request.

    Args:
        path: the request file.
        cfg: the consortium's terms.
        expected_fingerprint: the site's identity fingerprint as its operator gave it out of band (``None``: not
            checked; the CLI warns).

    Raises:
        ProvisioningError: unreadable or changed, self-signature wrong, a fingerprint other than the one given, a
            table below the consortium's trajectory floor, a data spec other than the consortium's, or a SuperNode
            key of another curve (each named).
    """
    path = Path(path)
    try:
        want = None if expected_fingerprint is None else normalise_fingerprint(expected_fingerprint)
    except ValueError as exc:
        raise ProvisioningError(f"--fingerprint: {exc}") from None
    try:
        doc = read_document(path, REQUEST_TYPE, want)
    except SignedDocumentError as exc:
        raise ProvisioningError(str(exc)) from None
    p = doc["payload"]
    need = ("site_id", "identity_public_key", "node_public_key", "spec_sha256")
    for f in need:
        if not isinstance(p.get(f), str):
            raise ProvisioningError(f"{path}: field payload.{f} is missing")
    if p["identity_public_key"] != doc["signer"].hex():
        raise ProvisioningError(f"{path}: field payload.identity_public_key is not the key that signed the request")
    try:
        check_site_id(p["site_id"])
    except StateError as exc:
        raise ProvisioningError(f"{path}: field payload.site_id: {exc}") from None
    n = p.get("trajectories")
    if not isinstance(n, int) or isinstance(n, bool):
        raise ProvisioningError(f"{path}: field payload.trajectories is missing (the site's table size: run "
                                "fcd site init again with this version)")
    if short := below_floor(n, cfg.preflight.min_trajectories):
        raise ProvisioningError(f"{path}: field payload.trajectories: site {p['site_id']!r} brings {short}")
    if p["spec_sha256"] != cfg.data.spec_sha256:
        raise ProvisioningError(
            f"{path}: field payload.spec_sha256: site {p['site_id']!r} reads its table with another data spec "
            f"({p['spec_sha256'][:16]}…) than the consortium's {cfg.data.spec_name!r} ({cfg.data.spec_sha256[:16]}…)"
        )
    try:
        node = serialization.load_ssh_public_key(p["node_public_key"].encode("ascii"))
    except (ValueError, UnicodeEncodeError, NotImplementedError):
        raise ProvisioningError(f"{path}: field payload.node_public_key is not an OpenSSH public key") from None
    if not isinstance(node, ec.EllipticCurvePublicKey) or not isinstance(node.curve, NODE_CURVE):
        raise ProvisioningError(f"{path}: field payload.node_public_key: SuperNode keys are EC P-384 (secp384r1)")
    return {**p, "identity_fingerprint": doc["fingerprint"],
            "node_fingerprint": node_key_fingerprint(p["node_public_key"].encode("ascii"))}
