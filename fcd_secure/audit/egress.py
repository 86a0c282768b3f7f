"""The egress gate bound to a federation site (``fcd_secure.federation.site.SiteRuntime``), for ``client_mods``.

``fcd_secure.federation.mods.client_mods(get_runtime)`` calls :func:`make_egress_gate_mod` and puts the result
first (outermost). This module only adapts a site runtime to :class:`~fcd_secure.audit.gate.SiteAuditContext`;
the rules live in :mod:`fcd_secure.audit.gate`. Duck-typed on the runtime (``site_id``, ``manifest``, ``state``
with ``load()``/``slot()``/``dir``, ``identity_private_key()``, ``dataset_train``) so that audit does not import
the federation layer above it.

Without a runtime getter the gate still runs and fails closed: every reply becomes a generic error, because a site
whose egress cannot be checked must not send anything.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
from flwr.app import Context, Message

from fcd_secure.audit.allowlist import FEDERATION_POLICY, federation_gate_policy
from fcd_secure.audit.gate import RECEIPTS_MESSAGE_TYPE, GatePolicy, SiteAuditContext, make_egress_gate
from fcd_secure.audit.history import THETA_S_HISTORY_FILE, ThetaSHistory
from fcd_secure.audit.ledger import SITE_LEDGER_FILE, SiteLedger
from fcd_secure.privacy.anchor import read_anchors
from fcd_secure.privacy.ledger import privacy_ledger_hash


class NoSiteRuntime(RuntimeError):
    """The gate was built without a way to find the site: nothing may leave."""


def site_audit_context(rt, policy: GatePolicy = FEDERATION_POLICY, server_public_key: bytes | None = None) -> SiteAuditContext:
    """A :class:`SiteAuditContext` for one federation site runtime."""
    ledger = SiteLedger(rt.state.slot(SITE_LEDGER_FILE), rt.identity_private_key(), writer_id=rt.site_id)

    def theta_s() -> dict[str, np.ndarray]:
        # the handler commits Θs to disk before its reply leaves, so the last snapshot is the current Θs
        snap = rt.state.load()
        return {} if snap is None else dict(snap.theta_s)

    def propensities():
        ds = rt.dataset_train
        return None if ds is None else ds.P

    return SiteAuditContext(
        site_id=rt.site_id,
        manifest=rt.manifest,
        theta_s=theta_s,
        ledger=ledger,
        policy=policy,
        propensities=propensities,
        privacy_ledger_hash=lambda: privacy_ledger_hash(rt.state.dir, getattr(getattr(getattr(rt, "cfg", None), "dp", None), "ledger_dir", None)),
        server_public_key=server_public_key,
        theta_s_history=ThetaSHistory(rt.state.slot(THETA_S_HISTORY_FILE)),
        privacy_anchors=lambda: read_anchors(rt.state.dir),
    )


def register_receipts_action(app) -> None:
    """Register the ``query.audit_receipts`` action on a ``ClientApp``.

    Flower dispatches only registered message types, and builds its own error reply (with exception text, outside
    every mod) for anything else, so the closing receipts message needs a registered handler. The gate answers
    that message itself and never calls it; without a gate the handler refuses, so nothing is acknowledged
    that no ledger recorded.
    """
    category, action = RECEIPTS_MESSAGE_TYPE.split(".")
    if category != "query":  # pragma: no cover - guards a change of the constant
        raise ValueError(RECEIPTS_MESSAGE_TYPE)

    @app.query(action)
    def audit_receipts(msg: Message, context: Context) -> Message:
        raise NoSiteRuntime("audit receipts reached a ClientApp without the egress gate")


def make_egress_gate_mod(runtime_getter: Callable[[Message, Context], object] | None, policy: GatePolicy | None = None):
    """The outermost ClientApp mod for a federation site; ``runtime_getter(msg, context) -> SiteRuntime``."""

    def get_site(msg: Message, context: Context) -> SiteAuditContext:
        if runtime_getter is None:
            raise NoSiteRuntime("egress gate built without a site runtime getter")
        rt = runtime_getter(msg, context)
        pol = policy
        if pol is None:
            # The w/o-DSS ablation (paper Table III) uploads every parameter. Only the site's own run config can
            # allow that, never a request from the server; the uploads are recorded and verify reports them.
            cfg = getattr(rt, "cfg", None)
            sync = getattr(getattr(cfg, "federation", None), "sync", "dss")
            horizon = getattr(getattr(cfg, "evaluation", None), "ope_horizon", None)
            pol = federation_gate_policy(ope_horizons=(horizon,) if horizon else (), allow_theta_s_upload=sync == "full")
        return site_audit_context(rt, pol)

    return make_egress_gate(get_site)
