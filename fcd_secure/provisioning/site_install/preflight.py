"""``fcd site preflight``: is this site ready to join a run? Every check says what is wrong and what to do.

The checks (each ``ok``, ``warn`` or ``fail``; any ``fail`` means not ready):

=================  ================================================================================================
``joined``         the site holds a bundle that still verifies against the coordinator key it pinned at join
``spec``           the site's data spec has the consortium's digest (a site reading its table another way is
                   refused here, before any run, not mid-run)
``table``          the table reads with the consortium's spec (columns, types, levels; the data layer's own errors)
``layout``         the table's encoded layout (column names, roles, cardinalities, action labels, Lmax) has the
                   consortium's digest; a warning when the consortium's spec leaves categorical levels undeclared
``rows``           enough trajectories for the consortium's secure-aggregation and DP-SGD settings
``columns``        the site-private columns are declared (a logged propensity named by the spec is present); columns
                   the spec does not name are listed (they are never read)
``policy``         the site's own policy meets the consortium's minimum and pins the consortium's app
``keys``           identity key, SuperNode key and executor secret present and readable by the owner only (0600)
``certificates``   the pinned CA (and the SuperLink's certificate, when reachable) valid for the consortium's margin
``clock``          the local clock is within the bound of the SuperLink's, in both directions: the ``Date`` header of
                   its ``/health`` answer over the TLS connection verified with the pinned CA (RFC 9110 §6.6.1,
                   1 s resolution; half the round trip is allowed for). With no such answer (SuperLink down), only
                   "not behind the coordinator's signed issue time of the bundle" is checked, and the message says
                   that this one-sided check cannot see a clock running ahead
``telemetry``      Flower telemetry off (``FLWR_TELEMETRY_ENABLED=0``; Flower's default is on)
``disk``           free space in the site's home
``versions``       fcd_secure, flwr, torch and opacus equal the consortium's pins
``superlink``      the SuperLink answers a TLS handshake verified with the pinned CA for its host name
=================  ================================================================================================
"""

from __future__ import annotations

import datetime as dt
import email.utils
import os
import shutil
import socket
import ssl
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from cryptography import x509

from fcd_secure.data.preprocess import (
    build_dataset,
    encoded_layout,
    layout_digest,
    spec_layout,
    undeclared_levels,
)
from fcd_secure.data.inputs import check_input, load_dataset_spec, read_input
from fcd_secure.data.spec import DataError, DatasetSpec
from fcd_secure.provisioning.bundle import BUNDLE_TYPE
from fcd_secure.provisioning.consortium import ConsortiumConfig, below_floor, spec_digest
from fcd_secure.provisioning.signed import SignedDocumentError, read_document
from fcd_secure.provisioning.versions import installed_versions
from fcd_secure.provisioning.site_install.home import SiteHome
from fcd_secure.provisioning.site_install.records import record_install
from fcd_secure.federation.site_policy import SitePolicy, SitePolicyError
from fcd_secure.fingerprints import fingerprint

Status = Literal["ok", "warn", "fail"]
TELEMETRY_OFF = ("0", "false", "no", "off")


@dataclass(frozen=True)
class Check:
    name: str
    status: Status
    message: str


@dataclass(frozen=True)
class PreflightResult:
    site_id: str
    checks: list[Check]

    @property
    def ready(self) -> bool:
        return all(c.status != "fail" for c in self.checks)

    @property
    def failed(self) -> list[str]:
        return [c.name for c in self.checks if c.status == "fail"]

    def to_json(self) -> dict:
        return {"site_id": self.site_id, "ready": self.ready, "failed": self.failed,
                "checks": [asdict(c) for c in self.checks]}


def _now() -> dt.datetime:
    return dt.datetime.now(dt.timezone.utc)


def _days_left(cert: x509.Certificate, now: dt.datetime) -> float:
    return (cert.not_valid_after_utc - now).total_seconds() / 86400.0


def _check_keys(h: SiteHome) -> Check:
    bad = []
    for p in h.key_files():
        if not p.is_file():
            bad.append(f"{p}: missing")
            continue
        mode = stat.S_IMODE(p.stat().st_mode)
        if mode & 0o077:
            bad.append(f"{p}: readable by others (mode {mode:04o}); run chmod 600 {p}")
    if bad:
        return Check("keys", "fail", "; ".join(bad))
    return Check("keys", "ok", f"{len(h.key_files())} key files, owner-only (0600)")


def _check_table(h: SiteHome, cfg: ConsortiumConfig) -> tuple[list[Check], int | None]:
    out: list[Check] = []
    site_spec = load_dataset_spec(h.spec)
    digest = spec_digest(site_spec)
    if digest != cfg.data.spec_sha256:
        out.append(Check("spec", "fail",
                         f"{h.spec}: this site's data spec (digest {digest[:16]}…) differs from the consortium's "
                         f"{cfg.data.spec_name!r} ({cfg.data.spec_sha256[:16]}…); read the table with the consortium's "
                         f"spec ({h.pinned_spec})"))
    else:
        out.append(Check("spec", "ok", f"data spec {cfg.data.spec_name!r} = the consortium's ({digest[:16]}…)"))
    spec = load_dataset_spec(h.pinned_spec)
    table = h.table
    try:
        # a CDM database first: the connection, its tables and columns, the cohort's concept ids and units
        if (found := check_input(h.pinned_spec, table)) is not None:
            out.append(Check("database", "ok", found))
    except DataError as exc:
        out.append(Check("database", "fail", str(exc)))
        return out, None
    try:
        spec, df = read_input(h.pinned_spec, table)
        ds = build_dataset(spec, df, str(table))
    except DataError as exc:
        out.append(Check("table", "fail", f"the table does not match the consortium's spec: {exc}"))
        return out, None
    out.append(Check("table", "ok", f"{table} reads with the consortium's spec"))
    out.append(_check_layout(ds.meta, spec, cfg))
    declared = {c for c, _ in spec.required_columns()}
    undeclared = sorted(set(map(str, df.columns)) - declared)
    if spec.propensity and spec.propensity not in df.columns:
        out.append(Check("columns", "fail", f"{table}: the logged propensity column {spec.propensity!r} is missing"))
    elif undeclared:
        out.append(Check("columns", "warn", f"columns the spec does not declare are never read: {', '.join(undeclared)}"))
    else:
        priv = f"logged propensity {spec.propensity!r} stays on the site" if spec.propensity else "no propensity column"
        out.append(Check("columns", "ok", f"every column is declared; {priv}"))
    return out, int(ds.n)


def _check_layout(meta: dict, spec: DatasetSpec, cfg: ConsortiumConfig) -> Check:
    """The encoded layout of this site's table against the consortium's: a difference would stop the run at its
    first message (the model's parameter shapes follow it), so it is caught here."""
    pinned = cfg.data.layout_sha256
    if pinned is None:
        fields = undeclared_levels(spec)
        why = (f"categorical columns declare no levels ({', '.join(fields)})" if fields
               else "the spec names no action vocabulary (actions or n_actions)")
        return Check("layout", "warn", f"the consortium pins no data layout: {why}, so each site's encoding follows its "
                     "own table and a difference shows only when the run starts")
    mine = encoded_layout(meta)
    digest = layout_digest(mine)
    if digest == pinned:
        return Check("layout", "ok", f"encoded layout = the consortium's ({digest[:16]}…): "
                     f"{len(mine['x_names'])} static and {len(mine['a_names'])} context columns")
    expected = spec_layout(spec)
    diff = [k for k in mine if expected is None or mine[k] != expected.get(k)]
    return Check("layout", "fail", f"this table's encoded layout (digest {digest[:16]}…) differs from the consortium's "
                 f"({pinned[:16]}…) in {', '.join(diff) or 'its digest'}; the model could not be built for it")


def _server_date(tls: ssl.SSLSocket, host: str) -> tuple[dt.datetime, float] | None:
    """The SuperLink's clock: the ``Date`` header of its ``/health`` answer and the request's round trip (s)."""
    if tls.selected_alpn_protocol() not in (None, "http/1.1"):
        return None
    t0 = _now()
    try:
        tls.sendall(f"GET /health HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode())
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 65536:
            chunk = tls.recv(4096)
            if not chunk:
                break
            head += chunk
    except (OSError, ssl.SSLError):
        return None
    rtt = (_now() - t0).total_seconds()
    for line in head.split(b"\r\n")[1:]:
        name, _, value = line.partition(b":")
        if name.strip().lower() == b"date":
            try:
                return email.utils.parsedate_to_datetime(value.strip().decode("latin-1")), rtt
            except (TypeError, ValueError):
                return None
    return None


def _tls_probe(cfg: ConsortiumConfig, ca: Path, timeout: float
               ) -> tuple[Check, x509.Certificate | None, tuple[dt.datetime, float] | None]:
    host, _, port = cfg.superlink.rpartition(":")
    ctx = ssl.create_default_context(cafile=str(ca))
    ctx.set_alpn_protocols(["h2", "http/1.1"])
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as raw:
            with ctx.wrap_socket(raw, server_hostname=host) as tls:
                der = tls.getpeercert(binary_form=True)
                clock = _server_date(tls, host)
    except ssl.SSLCertVerificationError as exc:
        return Check("superlink", "fail",
                     f"{cfg.superlink}: the SuperLink's certificate does not verify with the pinned CA {ca} "
                     f"(wrong CA or host name: {exc.verify_message})"), None, None
    except (OSError, ssl.SSLError) as exc:
        return Check("superlink", "fail", f"{cfg.superlink}: SuperLink unreachable ({exc}); is `fcd server start` "
                     "running and the port open to this site?"), None, None
    return (Check("superlink", "ok", f"{cfg.superlink}: TLS verified with the pinned CA"),
            x509.load_der_x509_certificate(der), clock)


def _check_clock(server: tuple[dt.datetime, float] | None, issued: str | None, now: dt.datetime, bound: float) -> Check | None:
    """Two-sided against the SuperLink's ``Date`` when it answered, else one-sided against the bundle (docstring)."""
    if server is not None:
        date, rtt = server
        # Date is truncated to the second and was stamped somewhere within the round trip
        skew = (now - date).total_seconds() - rtt / 2
        slack = 1.0 + rtt / 2
        if abs(skew) > bound + slack:
            way = "ahead of" if skew > 0 else "behind"
            return Check("clock", "fail", f"local clock is {abs(skew):.0f} s {way} the SuperLink's (its HTTP Date, "
                         f"TLS-verified; bound {bound:.0f} s); synchronise it (NTP)")
        return Check("clock", "ok", f"within {bound:.0f} s of the SuperLink's clock (skew {skew:+.1f} s, ±{slack:.1f} s)")
    if issued:
        behind = (dt.datetime.fromisoformat(issued) - now).total_seconds()
        if behind > bound:
            return Check("clock", "fail", f"local clock is {behind:.0f} s behind the coordinator's signed issue time "
                         f"(bound {bound:.0f} s); synchronise it (NTP)")
        return Check("clock", "warn", f"not behind the coordinator's signed issue time (bound {bound:.0f} s); the "
                     "SuperLink did not answer, so a clock running ahead cannot be detected (one-sided check)")
    return None


def run_preflight(home: str | Path, *, timeout_s: float = 5.0, record: bool = True) -> PreflightResult:
    """Run every check (module docstring) and append the verdict to the site ledger.

    Raises:
        ProvisioningError: ``home`` is not a site home (usage, exit 2).
    """
    h = SiteHome.at(home)
    sid = h.site_id
    checks: list[Check] = []
    now = _now()
    if not h.joined():
        checks.append(Check("joined", "fail", f"{h.bundle}: missing: run fcd site join BUNDLE --coordinator-fingerprint ..."))
        checks.append(_check_keys(h))
        res = PreflightResult(sid, checks)
        if record:
            record_install(h.state_root, sid, "preflight", {"verdict": "not_ready", "failed": ",".join(res.failed)})
        return res
    cfg = h.consortium()
    try:
        doc = read_document(h.bundle, BUNDLE_TYPE, cfg.coordinator_fingerprint)
        if doc["payload"].get("consortium_toml") != h.pinned_config.read_text():
            raise SignedDocumentError(f"{h.pinned_config}: differs from the signed bundle")
        checks.append(Check("joined", "ok", f"consortium {cfg.consortium_id!r}, coordinator {cfg.coordinator_fingerprint}"))
    except SignedDocumentError as exc:
        checks.append(Check("joined", "fail", f"the pinned bundle no longer verifies: {exc}"))
        doc = None
    table_checks, n = _check_table(h, cfg)
    checks += table_checks
    if n is not None:
        short = below_floor(n, cfg.preflight.min_trajectories)
        checks.append(Check("rows", "fail", short) if short else Check("rows", "ok", f"{n} trajectories"))
    try:
        policy = SitePolicy.load(h.policy)
        policy.check_meets(cfg.site_policy, str(h.policy))
        if cfg.app_fab_sha256 not in policy.app.fab_sha256:
            raise SitePolicyError(f"{h.policy}: field app.fab_sha256 does not pin the consortium's app {cfg.app_fab_sha256}")
        if policy.app.coordinator_key is None or fingerprint(bytes.fromhex(policy.app.coordinator_key)) != cfg.coordinator_fingerprint:
            raise SitePolicyError(f"{h.policy}: field app.coordinator_key is not the consortium's coordinator key "
                                  "(fcd site join pins it)")
        checks.append(Check("policy", "ok", "meets the consortium minimum; pins the consortium's app"))
    except SitePolicyError as exc:
        checks.append(Check("policy", "fail", str(exc)))
    checks.append(_check_keys(h))
    ca = x509.load_pem_x509_certificate(h.ca_cert.read_bytes())
    probe, server_cert, server_clock = _tls_probe(cfg, h.ca_cert, timeout_s)
    margin = cfg.preflight.cert_min_days
    certs = [("CA", ca)] + ([("SuperLink certificate", server_cert)] if server_cert is not None else [])
    left = [(name, c, _days_left(c, now)) for name, c in certs]
    soon = [f"{name} expires in {d:.0f} days (on {c.not_valid_after_utc.date()})" for name, c, d in left if d < margin]
    if soon:
        checks.append(Check("certificates", "fail", "; ".join(soon) + f"; the consortium requires {margin} days: renew"))
    else:
        checks.append(Check("certificates", "ok", ", ".join(f"{name} valid {d:.0f} more days" for name, _c, d in left)))
    clock = _check_clock(server_clock, doc["payload"].get("issued") if doc else None, _now(),
                         cfg.preflight.max_clock_skew_s)
    if clock is not None:
        checks.append(clock)
    tel = os.environ.get("FLWR_TELEMETRY_ENABLED")
    checks.append(Check("telemetry", "ok" if tel is not None and tel.lower() in TELEMETRY_OFF else "fail",
                        "Flower telemetry off" if tel is not None and tel.lower() in TELEMETRY_OFF
                        else f"Flower telemetry is on (FLWR_TELEMETRY_ENABLED={tel!r}; unset means on): set FLWR_TELEMETRY_ENABLED=0"))
    free_mb = shutil.disk_usage(h.root).free // (1 << 20)
    need_mb = cfg.preflight.min_free_disk_mb
    checks.append(Check("disk", "ok" if free_mb >= need_mb else "fail",
                        f"{free_mb} MB free in {h.root}" + ("" if free_mb >= need_mb else f"; the consortium requires {need_mb} MB")))
    have = installed_versions()
    diff = [f"{k} {have.get(k)} (consortium pins {v})" for k, v in sorted(cfg.versions.items()) if have.get(k) != v]
    checks.append(Check("versions", "fail" if diff else "ok",
                        ("version mismatch: " + "; ".join(diff)) if diff else
                        ", ".join(f"{k} {v}" for k, v in sorted(cfg.versions.items()))))
    checks.append(probe)
    res = PreflightResult(sid, checks)
    if record:
        record_install(h.state_root, sid, "preflight", {
            "verdict": "ready" if res.ready else "not_ready", "failed": ",".join(res.failed),
            "consortium_id": cfg.consortium_id,
        })
    return res
