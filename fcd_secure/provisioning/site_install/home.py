"""The site's folder (``--home``): made by ``fcd site init``, completed by ``fcd site join``.

::

    site.toml                  site id, the table's path (the table stays where the hospital keeps it), its digest
    spec.toml                  the data spec the site reads its table with
    site_policy.toml           the site's own policy (0600), from the strict defaults; join pins the consortium's app
    node_auth.key / .pub       the SuperNode key (EC P-384; private 0600)
    superexec.secret           the site executor's secret (0600)
    state/<site-id>/           identity key (Ed25519, 0600), training state, the site ledger
    enrolment_request.json     public keys and fingerprints, signed with the identity key: goes to the coordinator
    consortium/                after join: the verified bundle and what it pins (consortium.toml, spec.toml, ca.crt,
                               secagg_roster.json)

No private key is ever written outside this folder, and none is in the request or the bundle.
"""

from __future__ import annotations

import os
import shutil
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
from cryptography import x509

from fcd_secure._io import FolderPath, atomic_write_text, file_sha256, load_or_create_secret
from fcd_secure.audit.signing import public_key_bytes, utc_now
from fcd_secure.data.inputs import TableRef, dataset_from_input, input_digest, load_dataset_spec, table_ref
from fcd_secure.engines.deployment import SiteFiles
from fcd_secure.engines.pki import certificate_fingerprint, make_node_key, node_key_fingerprint
from fcd_secure.provisioning.bundle import BUNDLE_TYPE
from fcd_secure.provisioning.consortium import (
    CONSORTIUM_FILE,
    DEFAULT_MIN_TRAJECTORIES,
    SPEC_FILE,
    ConsortiumConfig,
    ProvisioningError,
    below_floor,
    spec_digest,
)
from fcd_secure.provisioning.enrolment import write_request
from fcd_secure.provisioning.signed import SignedDocumentError, read_document
from fcd_secure.federation.secure.setup import ROSTER_FILE, write_roster
from fcd_secure.provisioning.site_install.records import record_install
from fcd_secure.provisioning.site_install.tables import claim_table
from fcd_secure.federation.site_policy import SitePolicy
from fcd_secure.federation.state import SiteState, StateError, check_site_id
from fcd_secure.fingerprints import fingerprint, normalise_fingerprint

SITE_FILE = "site.toml"
REQUEST_FILE = "enrolment_request.json"
PINNED_DIR = "consortium"
BUNDLE_FILE = "bundle.json"


@dataclass(frozen=True)
class SiteHome(SiteFiles):
    """A site's folder (module docstring)."""

    root: Path

    @classmethod
    def at(cls, home: str | Path) -> "SiteHome":
        return cls(Path(home).resolve())

    # -- paths
    site_file = FolderPath("root", SITE_FILE)
    spec = FolderPath("root", SPEC_FILE)
    request = FolderPath("root", REQUEST_FILE)
    pinned = FolderPath("root", PINNED_DIR)
    bundle = FolderPath("pinned", BUNDLE_FILE)
    ca_cert = FolderPath("pinned", "ca.crt")
    roster = FolderPath("pinned", ROSTER_FILE)
    pinned_spec = FolderPath("pinned", SPEC_FILE)
    pinned_config = FolderPath("pinned", CONSORTIUM_FILE)

    # -- contents
    def info(self) -> dict[str, Any]:
        """``site.toml``.

        Raises:
            ProvisioningError: this folder is not a site's home.
        """
        if not self.site_file.is_file():
            raise ProvisioningError(f"{self.site_file}: missing (field: file): not a site home (fcd site init --home ...)")
        return tomllib.loads(self.site_file.read_text())

    @property
    def site_id(self) -> str:
        return str(self.info()["site_id"])

    @property
    def table(self) -> TableRef:
        """The site's table: a file, a DuckDB file, or a PostgreSQL URL (``fcd_secure.data.inputs``)."""
        return table_ref(self.info()["table"])

    def state(self) -> SiteState:
        return SiteState(self.state_root, self.site_id)

    def identity_key(self) -> bytes:
        return self.state().identity_private_key()

    def identity_fingerprint(self) -> str:
        return fingerprint(public_key_bytes(self.identity_key()))

    def joined(self) -> bool:
        return self.bundle.is_file() and self.pinned_config.is_file()

    def consortium(self) -> ConsortiumConfig:
        """The pinned consortium terms (after join).

        Raises:
            ProvisioningError: the site has not joined.
        """
        if not self.joined():
            raise ProvisioningError(f"{self.pinned_config}: missing: the site has not joined (fcd site join BUNDLE)")
        return ConsortiumConfig.from_toml(self.pinned_config.read_text(), str(self.pinned_config))

    def key_files(self) -> list[Path]:
        return [self.state().path("identity_ed25519.key"), self.node_key, self.secret]


def init_site(home: str | Path, spec_path: str | Path, table_path: str | Path, site_id: str,
              min_trajectories: int = DEFAULT_MIN_TRAJECTORIES) -> dict[str, Any]:
    """Install a site: check its table against its spec and the consortium's trajectory floor, make its keys,
    policy and enrolment request (which carries the table's size, so that the coordinator checks the floor too).

    Args:
        home: the site's folder (created, mode 0700; must not hold a site yet).
        spec_path: the data spec (the consortium's, as the hospital received it).
        table_path: the site's own long-format table (stays where it is; only its path and digest are recorded).
        site_id: the site's id in the consortium.
        min_trajectories: the consortium's floor (``consortium.toml [preflight] min_trajectories``, which the site
            has not seen yet: the coordinator says it, else its default).

    Returns:
        ``{"site_id", "identity_fingerprint", "node_fingerprint", "spec_sha256", "trajectories", "request"}``: the
        fingerprints go to the coordinator out of band, with the request file.

    Raises:
        ProvisioningError: the folder holds a site already, the site id is invalid, another home on this host
            holds the table (``site_install.tables``), or the table has fewer trajectories than ``min_trajectories``.
        fcd_secure.data.spec.DataError: the spec or the table cannot be read, or the table does not match the spec.
    """
    h = SiteHome.at(home)
    if h.site_file.exists():
        raise ProvisioningError(f"{h.site_file}: a site is installed here already; choose another --home")
    try:
        check_site_id(site_id)
    except StateError as exc:
        raise ProvisioningError(f"--site-id: {exc}") from None
    table = table_ref(table_path)
    table = table.resolve() if isinstance(table, Path) else table
    # the table must be readable with the spec, and big enough, before anything is made
    spec, ds = dataset_from_input(spec_path, table)
    n = int(ds.n)
    if short := below_floor(n, min_trajectories):
        raise ProvisioningError(f"{table}: {short}; a table this small is refused at enrolment (fcd consortium "
                                "add-site) and by fcd site preflight")
    table_sha256 = input_digest(table)
    claim_table(h.root, table, table_sha256)  # one home per table (or database) on this host: one ε budget (P46)
    h.root.mkdir(parents=True, exist_ok=True)
    os.chmod(h.root, 0o700)
    atomic_write_text(h.spec, Path(spec_path).read_text())
    atomic_write_text(h.site_file, tomli_w.dumps({"site_id": site_id, "table": str(table), "created": utc_now()}))
    SitePolicy().write(h.policy)  # the strict defaults; the data are named by `fcd site start` (own-table)
    node_fp = make_node_key(h.node_key, h.node_pub)
    load_or_create_secret(h.secret)
    key = SiteState(h.state_root, site_id).identity_private_key()
    digest = spec_digest(spec)
    write_request(h.request, site_id, key, h.node_pub.read_bytes(), digest, n)
    id_fp = fingerprint(public_key_bytes(key))
    record_install(h.state_root, site_id, "init", {
        "identity_fingerprint": id_fp, "node_fingerprint": node_fp, "spec_sha256": digest,
        "table_sha256": table_sha256,
    })
    return {"site_id": site_id, "identity_fingerprint": id_fp, "node_fingerprint": node_fp, "spec_sha256": digest,
            "trajectories": n, "request": str(h.request)}


def join_site(home: str | Path, bundle_path: str | Path, coordinator_fingerprint: str) -> dict[str, Any]:
    """Verify the coordinator's bundle against the fingerprint the operator typed, and pin what it carries.

    Raises:
        ProvisioningError: the fingerprint is malformed; the bundle does not verify (changed, or signed by another
            key); it is for another site or another consortium; its roster lacks this site's key; its CA is not the
            one its terms name; or it belongs to another consortium than the one this site joined.
        SitePolicyError: the site's own policy is weaker than the consortium's minimum.
    """
    h = SiteHome.at(home)
    sid = h.site_id
    try:
        want = normalise_fingerprint(coordinator_fingerprint)
    except ValueError as exc:
        raise ProvisioningError(f"--coordinator-fingerprint: {exc}") from None
    try:
        doc = read_document(bundle_path, BUNDLE_TYPE, want)
    except SignedDocumentError as exc:
        raise ProvisioningError(f"refused: {exc}") from None
    p = doc["payload"]
    where = str(bundle_path)
    cfg = ConsortiumConfig.from_toml(str(p.get("consortium_toml", "")), f"{where}: payload.consortium_toml")
    if p.get("site_id") != sid:
        raise ProvisioningError(f"{where}: field payload.site_id: this bundle is for {p.get('site_id')!r}, not {sid!r}")
    if cfg.coordinator_fingerprint != want:
        raise ProvisioningError(f"{where}: field consortium.coordinator_fingerprint names another key than the signer")
    mine = public_key_bytes(h.identity_key()).hex()
    roster = p.get("roster") or {}
    if not isinstance(roster, dict) or roster.get(sid, {}).get("identity_public_key") != mine:
        raise ProvisioningError(f"{where}: field payload.roster: this site's identity key is not in the roster")
    ca = x509.load_pem_x509_certificate(str(p["ca_crt"]).encode("ascii"))
    if certificate_fingerprint(ca) != cfg.ca_fingerprint:
        raise ProvisioningError(f"{where}: field payload.ca_crt is not the CA named in consortium.toml (ca_fingerprint)")
    if h.joined():
        old = h.consortium()
        if old.consortium_id != cfg.consortium_id or old.coordinator_fingerprint != cfg.coordinator_fingerprint:
            raise ProvisioningError(
                f"{h.pinned_config}: this site has joined consortium {old.consortium_id!r} already; use another --home"
            )
    policy = SitePolicy.load(h.policy)
    policy.check_meets(cfg.site_policy, str(h.policy))
    h.pinned.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(bundle_path, h.bundle)
    atomic_write_text(h.pinned_config, p["consortium_toml"])
    atomic_write_text(h.pinned_spec, p["spec"])
    atomic_write_text(h.ca_cert, p["ca_crt"])
    write_roster(h.roster, {s: bytes.fromhex(r["identity_public_key"]) for s, r in roster.items()})
    # the app, and who may start it: every deployed run must carry this coordinator's signature for this consortium
    app = policy.app.model_copy(update={"fab_sha256": (cfg.app_fab_sha256,), "coordinator_key": doc["signer"].hex(),
                                        "consortium_id": cfg.consortium_id})
    policy.model_copy(update={"app": app}).write(h.policy)
    facts = {"consortium_id": cfg.consortium_id, "coordinator_fingerprint": want, "ca_fingerprint": cfg.ca_fingerprint,
             "bundle_sha256": file_sha256(h.bundle), "roster_sites": len(roster), "app_fab_sha256": cfg.app_fab_sha256}
    record_install(h.state_root, sid, "join", facts)
    return {"site_id": sid, **facts}


def site_node_fingerprint(h: SiteHome) -> str:
    return node_key_fingerprint(h.node_pub.read_bytes())


def migrate_privacy(h: SiteHome) -> dict[str, Any]:
    """``fcd site migrate``: give the site's DP ledgers that predate ``record_secret.key`` a record secret, charging
    every record of the site's whole table (every split) every old ledger, so each keeps at least what it spent
    (``privacy.ledger.migrate_to_record_secret``, docs/threats.md P45).

    Raises:
        ProvisioningError: not a site home; nothing to migrate (the secret is there, or no ledger lists records).
        DataError: the site's table no longer reads with its spec.
    """
    from fcd_secure.data.inputs import dataset_from_input  # noqa: PLC0415
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415
    from fcd_secure.privacy.ledger import migrate_to_record_secret  # noqa: PLC0415

    policy = SitePolicy.load(h.policy)
    # the folder the site's DP training keeps its ledgers in (privacy.engine.ledger_folder under the site's policy)
    folder = Path(policy.dp.ledger_dir) if policy.dp.ledger_dir else h.state().dir / "privacy"
    _, table = dataset_from_input(h.spec, h.table)
    try:
        note = migrate_to_record_secret(folder, [table])
    except PrivacyLedgerError as exc:
        raise ProvisioningError(str(exc)) from None
    return {"folder": str(folder), **note}
