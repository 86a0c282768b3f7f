"""What both ends of a secure-aggregation round are configured with: the roster, the site policy, the vector layout.

Site identity: each site's Ed25519 key is created on first use in its state directory
(``SiteState.identity_private_key``). The *roster* of every site's public key is configuration, never learned from
the server (docs/threats.md P2): a site reads it from ``node_config["secagg-roster"]`` (a JSON file
``{"version": 1, "sites": {site_id: hex public key}}``) or, by default, from ``<state_root>/secagg_roster.json``,
which :func:`provision_roster` writes for a federation whose sites share one state root (the operator's
provisioning step; in a deployment each hospital receives the same file out of band).

The *policy* (minimum sites, threshold rule, modulus, clip range, scale, deadlines; ``SecAggPolicy``) is the
``[secagg]`` section of the site's own policy file (``federation.site_policy``), never the server's config.

The *vector layout* (:func:`vector_layout`): Θc in manifest order plus the one site metric that travels, weighted and
masked, inside the vector (never in clear, P7).
"""

from __future__ import annotations

import json
from pathlib import Path

from flwr.app import Context

from fcd_secure._io import atomic_write_text
from fcd_secure.aggregation.secagg import VectorLayout
from fcd_secure.aggregation.secagg.keys import ed25519_public
from fcd_secure.federation.state import SiteState
from fcd_secure.manifest import Manifest
from fcd_secure.errors import FcdError

ROSTER_FILE = "secagg_roster.json"
ROSTER_NODE_CONFIG = "secagg-roster"
#: The site metrics that ride inside the masked vector. Each is divided by METRIC_RANGE before encoding, so that
#: losses up to METRIC_RANGE * clip fit the clip range of Θc updates.
METRICS = ("train_loss",)
METRIC_RANGE = 64.0


class SecureAggregationConfigError(FcdError, RuntimeError):
    """Secure aggregation cannot run with this configuration (no roster, Θs sync, too few sites, bad policy file)."""


def vector_layout(manifest: Manifest) -> VectorLayout:
    """The masked vector of a secure round: Θc of ``manifest`` and :data:`METRICS` (server and sites build the same)."""
    return VectorLayout.from_manifest(manifest, metrics=METRICS)


# -- roster ----------------------------------------------------------------------------------------------------------
def provision_roster(state_root: str | Path, site_ids: list[str]) -> dict[str, bytes]:
    """Create each site's identity key in its state directory (if missing) and write the roster file.

    The operator's provisioning step for a federation whose sites share one state root (simulation, local
    deployment). Idempotent: existing keys are kept.

    Args:
        state_root: the folder holding one state directory per site.
        site_ids: the sites of the federation.

    Returns:
        ``{site_id: Ed25519 public key}``, as written to ``<state_root>/secagg_roster.json``.
    """
    roster = {sid: ed25519_public(SiteState(state_root, sid).identity_private_key()) for sid in site_ids}
    write_roster(Path(state_root) / ROSTER_FILE, roster)
    return roster


def write_roster(path: str | Path, roster: dict[str, bytes]) -> Path:
    """Write a roster file ``{"version": 1, "sites": {site_id: hex Ed25519 public key}}`` (public keys only)."""
    doc = {"version": 1, "sites": {sid: pk.hex() for sid, pk in sorted(roster.items())}}
    return atomic_write_text(path, json.dumps(doc, indent=1))


def load_roster(path: str | Path) -> dict[str, bytes]:
    """Read a roster file.

    Raises:
        SecureAggregationConfigError: unreadable or malformed; the message names the file and the entry.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except OSError as exc:
        raise SecureAggregationConfigError(f"{path}: cannot read the secure-aggregation roster ({exc.strerror})") from None
    except json.JSONDecodeError as exc:
        raise SecureAggregationConfigError(f"{path}: roster is not valid JSON ({exc.msg})") from None
    sites = doc.get("sites") if isinstance(doc, dict) else None
    if not isinstance(sites, dict) or not sites:
        raise SecureAggregationConfigError(f"{path}: roster needs a non-empty 'sites' table {{site_id: hex key}}")
    out: dict[str, bytes] = {}
    for sid, hexkey in sites.items():
        try:
            key = bytes.fromhex(str(hexkey))
        except ValueError:
            raise SecureAggregationConfigError(f"{path}: roster entry {sid!r} is not hex") from None
        if len(key) != 32:
            raise SecureAggregationConfigError(f"{path}: roster entry {sid!r} must be a 32-byte Ed25519 key")
        out[str(sid)] = key
    return out


def site_roster(context: Context, site_id: str, state_root: str | Path) -> dict[str, bytes]:
    """The configured roster of a site: ``node_config["secagg-roster"]``, else ``<state_root>/secagg_roster.json``.

    Raises:
        SecureAggregationConfigError: no roster is configured, or it is malformed.
    """
    nc = dict(context.node_config) if context.node_config else {}
    configured = nc.get(ROSTER_NODE_CONFIG)
    path = Path(str(configured)) if configured else Path(state_root) / ROSTER_FILE
    if not path.exists():
        raise SecureAggregationConfigError(
            f"{path}: no secure-aggregation roster configured for site {site_id}; provision one "
            f"(fcd_secure.federation.secure.setup.provision_roster) or set node_config {ROSTER_NODE_CONFIG!r}"
        )
    return load_roster(path)
