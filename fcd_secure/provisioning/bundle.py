"""``fcd consortium add-site``: register a site, re-sign the roster, write every site's signed bundle.

A bundle is a signed document (:mod:`.signed`, type ``bundle``) whose payload carries everything a site pins at
join: ``consortium.toml`` and the data spec (texts), the CA certificate (PEM), the SuperLink address, and the
roster of every enrolled site's Ed25519 identity key (public keys only; secure aggregation authenticates sites by
it, docs/threats.md P2). Adding a site changes the roster, so every enrolled site's bundle is re-issued; a site re-joins with
its newest bundle before the first run (``fcd site join`` accepts a newer bundle of the same consortium).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_text
from fcd_secure.audit.signing import utc_now
from fcd_secure.provisioning.consortium import Coordinator, ProvisioningError
from fcd_secure.provisioning.enrolment import check_request
from fcd_secure.provisioning.signed import sign_document, write_document

BUNDLE_TYPE, ROSTER_TYPE = "bundle", "roster"


def _enrolled_requests(co: Coordinator) -> dict[str, dict[str, Any]]:
    out = {}
    for sid in co.enrolled():
        out[sid] = json.loads((co.site_dir(sid) / "request.json").read_text())["payload"]
    return out


def add_site(co: Coordinator, request_path: str | Path, expected_fingerprint: str | None) -> dict[str, Any]:
    """Check a site's enrolment request and enrol it (module docstring).

    Args:
        co: the coordinator.
        request_path: the site's ``enrolment_request.json``.
        expected_fingerprint: the site's identity fingerprint, given out of band.

    Returns:
        ``{"site_id", "identity_fingerprint", "node_fingerprint", "bundles": [paths]}``.

    Raises:
        ProvisioningError: the request does not check (:func:`~.enrolment.check_request`), or the site id is
            enrolled already with other keys.
    """
    cfg = co.config()
    req = check_request(request_path, cfg, expected_fingerprint)
    sid = req["site_id"]
    known = _enrolled_requests(co).get(sid)
    if known is not None and (known["identity_public_key"], known["node_public_key"]) != (
        req["identity_public_key"], req["node_public_key"]
    ):
        raise ProvisioningError(f"{request_path}: field payload.site_id: {sid!r} is enrolled already with other keys")
    folder = co.site_dir(sid)
    folder.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(request_path, folder / "request.json")
    atomic_write_text(folder / "node.pub", req["node_public_key"] + "\n")
    bundles = write_bundles(co)
    return {"site_id": sid, "identity_fingerprint": req["identity_fingerprint"],
            "node_fingerprint": req["node_fingerprint"], "bundles": [str(b) for b in bundles]}


def write_bundles(co: Coordinator) -> list[Path]:
    """Sign the roster of every enrolled site and write each site's bundle; returns the bundle paths."""
    cfg, key = co.config(), co.key()
    reqs = _enrolled_requests(co)
    issued = utc_now()
    roster = {
        sid: {"identity_public_key": r["identity_public_key"], "identity_fingerprint": r["identity_fingerprint"],
              "node_fingerprint": r["node_fingerprint"]}
        for sid, r in sorted(reqs.items())
    }
    write_document(co.roster_path, sign_document(ROSTER_TYPE, {"consortium_id": cfg.consortium_id, "issued": issued,
                                                               "sites": roster}, key))
    common = {
        "consortium_id": cfg.consortium_id,
        "issued": issued,
        "consortium_toml": co.config_path.read_text(),
        "spec": co.spec_path.read_text(),
        "ca_crt": (co.pki / "ca.crt").read_text(),
        "superlink": cfg.superlink,
        "roster": roster,
    }
    out = []
    for sid in sorted(reqs):
        path = co.bundle_path(sid)
        write_document(path, sign_document(BUNDLE_TYPE, {**common, "site_id": sid}, key))
        out.append(path)
    return out
