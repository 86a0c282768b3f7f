"""``fcd consortium init``: the coordinator's folder, its keys and ``consortium.toml``.

The coordinator's folder (``--home``)::

    consortium.toml          the consortium's terms (below); every site receives it inside its signed bundle
    spec.toml                the data spec every site's table is read with (its digest is in consortium.toml)
    coordinator_ed25519.key  the coordinator's signing key (0600): signs bundles and the roster; never leaves
    pki/                     ca.crt, ca.key (0600; move it offline), server.pem, server.key (0600)
    app/                     the consortium's Flower app project; its FAB's SHA-256 is pinned by every site
    sites/<site-id>/         each enrolled site's request and SuperNode public key
    roster.json              the signed roster of enrolled sites (identity and SuperNode key fingerprints)
    bundles/<site-id>.json   the signed bundle of each site

``consortium.toml`` holds the consortium id, the SuperLink address and host names, the data spec's digest
(:func:`spec_digest`) and the digest of the encoded layout it gives every table (when the spec declares the levels of
its categorical columns), the secure-aggregation parameters, the minimum site policy, the pinned versions and the
preflight thresholds. A site's preflight checks itself against exactly these.
"""

from __future__ import annotations

import hashlib
import tomllib
from pathlib import Path
from typing import Annotated

import tomli_w
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from fcd_secure._io import FolderPath, atomic_write_text, drop_none
from fcd_secure.aggregation.secagg.config import SecAggPolicy
from fcd_secure.audit.signing import canonical, load_or_create_identity_key, public_key_bytes, utc_now
from fcd_secure.data.preprocess import layout_digest, spec_layout
from fcd_secure.data.inputs import load_dataset_spec
from fcd_secure.data.spec import DatasetSpec
from fcd_secure.engines.pki import DEFAULT_HOSTS, TLSFiles, check_tls_dir, make_tls_dir
from fcd_secure.provisioning.versions import installed_versions
from fcd_secure.federation.site_policy import SitePolicy
from fcd_secure.errors import FcdError, first_invalid
from fcd_secure.fingerprints import fingerprint, normalise_fingerprint

CONSORTIUM_FILE = "consortium.toml"
SPEC_FILE = "spec.toml"
COORDINATOR_KEY = "coordinator_ed25519.key"


class ProvisioningError(FcdError, ValueError):
    """Bad provisioning input (folder, request, bundle, option); the message names the file and the field."""


def spec_digest(spec: DatasetSpec) -> str:
    """SHA-256 of the spec's canonical JSON: the same spec in TOML or YAML, with other comments, has one digest."""
    return hashlib.sha256(canonical(spec.model_dump(mode="json"))).hexdigest()


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DataTerms(_Section):
    spec_sha256: str
    spec_name: str
    #: digest of the encoded layout every site's table has under the spec (``data.preprocess.spec_layout``): the
    #: column names, roles and cardinalities a model's parameter shapes depend on; absent when a categorical column
    #: declares no levels (its encoding then depends on each site's table)
    layout_sha256: str | None = None


#: the fewest trajectories a site's table may have unless ``fcd consortium init --min-trajectories`` says otherwise
DEFAULT_MIN_TRAJECTORIES = 50


def below_floor(n: int, need: int) -> str | None:
    """Why a site table of ``n`` trajectories is refused under a floor of ``need`` (``None`` when it is not): the one
    wording of ``fcd data validate``, ``fcd site init``, ``fcd consortium add-site`` and ``fcd site preflight``."""
    if n >= need:
        return None
    return (f"{n} trajectories; the consortium needs at least {need} per site (its secure-aggregation and DP-SGD "
            f"settings are sized for it: consortium.toml [preflight] min_trajectories)")


class PreflightTerms(_Section):
    min_trajectories: int = Field(DEFAULT_MIN_TRAJECTORIES, ge=1, description="fewest trajectories a site's table may have")
    max_clock_skew_s: float = Field(30.0, gt=0, description="largest clock difference to the coordinator allowed")
    min_free_disk_mb: int = Field(512, ge=0, description="free space a site's home needs")
    cert_min_days: int = Field(30, ge=0, description="a certificate expiring sooner turns preflight red")


#: a pinned key or certificate fingerprint, read as ``SHA256:<hex>`` (bare or upper-case hex in a hand-edited file
#: reads the same; anything else refuses with the field's name)
Fingerprint = Annotated[str, AfterValidator(normalise_fingerprint)]


class ConsortiumConfig(_Section):
    """``consortium.toml`` (module docstring)."""

    consortium_id: str = Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    created: str
    superlink: str
    hosts: list[str]
    coordinator_fingerprint: Fingerprint
    ca_fingerprint: Fingerprint
    app_fab_sha256: str
    data: DataTerms
    secagg: SecAggPolicy = Field(default_factory=SecAggPolicy)
    site_policy: SitePolicy = Field(default_factory=SitePolicy)
    versions: dict[str, str]
    preflight: PreflightTerms = Field(default_factory=PreflightTerms)

    def to_toml(self) -> str:
        return tomli_w.dumps(drop_none(self.model_dump(mode="json")))

    @classmethod
    def from_toml(cls, text: str, where: str) -> "ConsortiumConfig":
        """Parse ``consortium.toml`` text.

        Raises:
            ProvisioningError: not TOML, or a field missing or wrong (named).
        """
        try:
            return cls.model_validate(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ProvisioningError(f"{where}: not TOML ({exc})") from None
        except ValidationError as exc:
            loc, msg = first_invalid(exc, model=cls)
            raise ProvisioningError(f"{where}: field {loc}: {msg}") from None


class Coordinator:
    """The coordinator's folder (module docstring)."""

    def __init__(self, home: str | Path) -> None:
        self.home = Path(home).resolve()

    config_path = FolderPath("home", CONSORTIUM_FILE)
    spec_path = FolderPath("home", SPEC_FILE)
    key_path = FolderPath("home", COORDINATOR_KEY)
    pki = FolderPath("home", "pki")
    app_dir = FolderPath("home", "app")
    roster_path = FolderPath("home", "roster.json")

    def site_dir(self, site_id: str) -> Path:
        return self.home / "sites" / site_id

    def bundle_path(self, site_id: str) -> Path:
        return self.home / "bundles" / f"{site_id}.json"

    def key(self) -> bytes:
        if not self.key_path.is_file():
            raise ProvisioningError(f"{self.key_path}: missing (field: file): not a consortium folder (fcd consortium init)")
        return load_or_create_identity_key(self.key_path)

    def fingerprint(self) -> str:
        return fingerprint(public_key_bytes(self.key()))

    def config(self) -> ConsortiumConfig:
        """The consortium's terms.

        Raises:
            ProvisioningError: no ``consortium.toml`` here, or it does not parse.
        """
        if not self.config_path.is_file():
            raise ProvisioningError(f"{self.config_path}: missing (field: file): run fcd consortium init --home {self.home}")
        return ConsortiumConfig.from_toml(self.config_path.read_text(), str(self.config_path))

    def enrolled(self) -> list[str]:
        root = self.home / "sites"
        return sorted(p.name for p in root.iterdir() if (p / "request.json").is_file()) if root.is_dir() else []


def init_consortium(
    home: str | Path,
    consortium_id: str,
    spec_path: str | Path,
    *,
    hosts: tuple[str, ...] = DEFAULT_HOSTS,
    port: int = 9092,
    cert_days: int = 365,
    secagg: SecAggPolicy | None = None,
    site_policy: SitePolicy | None = None,
    preflight: PreflightTerms | None = None,
    version_pins: dict[str, str] | None = None,
) -> Coordinator:
    """Create a consortium in ``home`` (module docstring).

    Args:
        home: the coordinator's folder (created; must not hold a consortium already).
        consortium_id: the consortium's name (letters, digits, ``.``, ``_``, ``-``).
        spec_path: the data spec every site's table must match.
        hosts: the names and addresses the SuperLink is reached by (its certificate's SANs); the first is the
            address sites connect to.
        port: the SuperLink's Fleet API port.
        cert_days: validity of the CA and the SuperLink certificate.
        secagg: the secure-aggregation parameters (default: the shipped ones).
        site_policy: the minimum site policy (default: the strict defaults).
        preflight: the preflight thresholds.
        version_pins: versions to pin instead of this environment's (``{package: version}``).

    Returns:
        The coordinator.

    Raises:
        ProvisioningError: ``home`` already holds a consortium, or an option is invalid.
        fcd_secure.data.spec.DataError: the spec cannot be read.
    """
    from fcd_secure.engines.deployment import fab_sha256, write_app_project  # noqa: PLC0415 - imports flwr

    co = Coordinator(home)
    if co.config_path.exists():
        raise ProvisioningError(f"{co.config_path}: a consortium already exists here; choose another --home")
    if not hosts:
        raise ProvisioningError("--host: name at least one host the SuperLink is reached by")
    spec = load_dataset_spec(spec_path)
    layout = spec_layout(spec)
    co.home.mkdir(parents=True, exist_ok=True)
    co.home.chmod(0o700)
    atomic_write_text(co.spec_path, Path(spec_path).read_text())
    key = load_or_create_identity_key(co.key_path)
    check_tls_dir(make_tls_dir(co.pki, tuple(hosts), days=cert_days), hosts=tuple(hosts))
    write_app_project(co.app_dir, consortium_id)
    versions = installed_versions()
    for name, v in (version_pins or {}).items():
        if name not in versions:
            raise ProvisioningError(f"--pin {name}={v}: field package: pins are for {', '.join(versions)}")
        versions[name] = v
    tls = TLSFiles(co.pki / "ca.crt", co.pki / "server.pem", co.pki / "server.key")
    try:
        cfg = ConsortiumConfig(
            consortium_id=consortium_id,
            created=utc_now(),
            superlink=f"{hosts[0]}:{int(port)}",
            hosts=list(hosts),
            coordinator_fingerprint=fingerprint(public_key_bytes(key)),
            ca_fingerprint=tls.ca_fingerprint,
            app_fab_sha256=fab_sha256(co.app_dir),
            data=DataTerms(spec_sha256=spec_digest(spec), spec_name=spec.name,
                           layout_sha256=None if layout is None else layout_digest(layout)),
            secagg=secagg or SecAggPolicy(),
            site_policy=site_policy or SitePolicy(),
            versions=versions,
            preflight=preflight or PreflightTerms(),
        )
    except ValidationError as exc:
        loc, msg = first_invalid(exc)
        raise ProvisioningError(f"field {loc}: {msg}") from None
    atomic_write_text(co.config_path, cfg.to_toml())
    return co
