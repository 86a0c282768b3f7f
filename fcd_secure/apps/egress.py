"""The audit egress gate bound to a federation site: the outermost mod of every site's ClientApp.

:func:`make_egress_gate_mod` adapts a :class:`~fcd_secure.apps.site.SiteRuntime` (identity, manifest, state,
training data) to the audit's :class:`~fcd_secure.audit.SiteAuditContext`; the rules themselves are the audit's
(:func:`fcd_secure.audit.make_egress_gate`). ``apps.mods.client_mods`` puts the gate first, so it sees exactly
what leaves the site and records every reply in the site ledger.

Without a runtime getter the gate still runs and fails closed: every reply becomes a generic error, because a site
whose egress cannot be checked must not send anything.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np
from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fcd_secure.audit import (
    RECEIPTS_MESSAGE_TYPE,
    SITE_LEDGER_FILE,
    THETA_S_HISTORY_FILE,
    GatePolicy,
    SiteAuditContext,
    SiteFailure,
    SiteLedger,
    ThetaSHistory,
    federation_gate_policy,
    make_egress_gate,
)
from fcd_secure.audit.allowlist import HELLO_DIMS, TRAIN_METRICS
from fcd_secure.data.moments import KEYS as MOMENT_KEYS
from fcd_secure.data.moments import MAX_MOMENT_COLUMNS
from fcd_secure.data.policy import DEFAULT_POLICY_NAMES
from fcd_secure.evaluation.propensity import SHARED_FIT_SCALARS, shared_list_caps
from fcd_secure.apps.guard import site_error_of
from fcd_secure.apps.secure_site import secure_reply_check
from fcd_secure.federation.records import REC_CONFIG, REC_EVAL, REC_HELLO, REC_METRICS, REC_NUM
from fcd_secure.federation.secure.eval_vector import max_words
from fcd_secure.apps.site import SiteRuntime
from fcd_secure.queries.registry import metric_lists, metric_names
from fcd_secure.queries.request import evaluated_policy_names
from fcd_secure.privacy.anchor import read_anchors
from fcd_secure.privacy.ledger import privacy_ledger_hash
from fcd_secure.errors import FcdError

def federation_policy(
    ope_horizon: int | None = 2, policy_names: tuple[str, ...] | list[str] = DEFAULT_POLICY_NAMES,
    shared_behaviour: bool = True, **fields
) -> GatePolicy:
    """What the federation's own messages may carry besides Θc: exact record/key names (``client_app``,
    ``plain_flow``, and every registered query's sums, ``queries.registry``), built from the evaluated policies and
    the truncated OPE horizon.

    Args:
        ope_horizon: ``evaluation.ope_horizon`` of the site's run (its ``<estimator>_h<H>`` keys), or None.
        policy_names: the policies the evaluation asks about (``request.evaluated_policy_names``); each adds the exact
            keys of its sums, so a reply's names stay a fixed function of the question (at most
            ``request.MAX_POLICIES`` policies, names of ``[A-Za-z0-9_-]``).
        shared_behaviour: admit the shared behaviour model's sums (a run that shares it,
            ``config.EvaluationSection.shares_behaviour_model``, docs/threats.md P68); a site's gate in any other run
            admits none of them, and its bound on a masked evaluation vector stays without their Hessian's 20,100
            sums.
        **fields: further :class:`~fcd_secure.audit.GatePolicy` fields (e.g. ``allow_theta_s_upload``), hashable.

    The gate asks for it on every message (``make_egress_gate_mod``); the policy is a pure function of these
    arguments, all read from the site's effective settings of that message, and frozen, so it is built once per
    distinct argument tuple (:func:`_federation_policy`, a ``functools.lru_cache``): a changed site policy changes
    the arguments and so the key, never an entry.
    """
    return _federation_policy(None if ope_horizon is None else int(ope_horizon), tuple(policy_names),
                              bool(shared_behaviour), tuple(sorted(fields.items())))


@functools.lru_cache(maxsize=32)
def _federation_policy(ope_horizon: int | None, policy_names: tuple[str, ...], shared_behaviour: bool,
                       field_items: tuple[tuple[str, object], ...]) -> GatePolicy:
    """:func:`federation_policy`'s body, memoised on its hashable arguments."""
    fields = dict(field_items)
    # every evaluation sum is declared once, by the query that sends it (queries.registry)
    base = federation_gate_policy(
        eval_names=metric_names(policy_names, ope_horizon),
        eval_lists=metric_lists(),
        # the endogenous contexts' head (model/context.py): its dim in hello, its loss part in a training reply
        dims=HELLO_DIMS + ("n_endogenous",),
        train_metrics=TRAIN_METRICS + ("context",),
        rec_hello=REC_HELLO,
        rec_num=REC_NUM,
        rec_metrics=REC_METRICS,
        rec_eval=REC_EVAL,
        **fields,
    )
    # round 0 of a secure-standardisation run announces the names of its moment sums
    # (``federation.secure.secure_stats``)
    moments = {f"{REC_EVAL}/{k}" for k in MOMENT_KEYS if k.endswith(".n")}
    moment_lists = {f"{REC_EVAL}/{k}": MAX_MOMENT_COLUMNS for k in MOMENT_KEYS if not k.endswith(".n")}
    # the sums of a consortium's shared behaviour model, by their own names and caps (``evaluation.propensity``,
    # docs/threats.md P67): nothing else of a site's model of its logging policy may leave
    behaviour = {f"{REC_EVAL}/{k}" for k in SHARED_FIT_SCALARS} if shared_behaviour else set()
    behaviour_lists = ({f"{REC_EVAL}/{k}": cap for k, cap in shared_list_caps().items()} if shared_behaviour
                       else {})
    return base.model_copy(update={
        "allowed_metrics": frozenset(base.allowed_metrics | moments | behaviour),
        "allowed_metric_lists": {**base.allowed_metric_lists, **moment_lists, **behaviour_lists},
    })


FEDERATION_POLICY = federation_policy()


def evaluation_vector_bound(policy: GatePolicy, rt: SiteRuntime) -> int:
    """Words of the longest evaluation vector ``policy`` lets the site build (every allow-listed evaluation key)."""
    prefix = f"{policy.secagg_schema_record}/"
    scalars = sum(1 for m in policy.allowed_metrics if m.startswith(prefix))
    lists = [n for m, n in policy.allowed_metric_lists.items() if m.startswith(prefix)]
    return max_words(scalars, lists, rt.secagg_policy)


def site_gate_policy(rt: SiteRuntime, request_config) -> GatePolicy:
    """What may leave ``rt`` in answer to a message whose config record is ``request_config``: :func:`federation_policy`
    of the site's effective settings (``rt.cfg``: its policy, never a weaker request) and the evaluated policies the
    request names, with Θs uploads only under ``federation.sync = "full"`` and, in secure mode, the longest masked
    evaluation vector those names allow (a masked evaluation input may be longer than Θc: a small-Θc simulator)."""
    names = evaluated_policy_names(request_config, rt.cfg)
    fed = rt.cfg.federation
    pol = federation_policy(
        rt.cfg.evaluation.ope_horizon, names,
        shared_behaviour=rt.cfg.evaluation.shares_behaviour_model,
        allow_theta_s_upload=fed.sync == "full", secure_only=fed.secure_aggregation,
    )
    if fed.secure_aggregation:
        pol = pol.model_copy(update={"secagg_max_vector_words": evaluation_vector_bound(pol, rt)})
    return pol


RuntimeGetter = Callable[[Message, Context], SiteRuntime]


class NoSiteRuntime(FcdError, RuntimeError):
    """The gate was built without a way to find the site: nothing may leave."""


def site_audit_context(
    rt: SiteRuntime,
    policy: GatePolicy = FEDERATION_POLICY,
    server_public_key: bytes | None = None,
    context: Context | None = None,
) -> SiteAuditContext:
    """The audit's view of one federation site.

    Args:
        rt: the site runtime answering this message.
        policy: what may leave besides Θc.
        server_public_key: the server's Ed25519 key, if the site pins it (receipts are then checked against it).
        context: the message's Flower context; with it, every secure-aggregation reply is checked exactly against
            its request, roster and layout (``apps.secure_site.secure_reply_check``, P29).
    """
    ledger = SiteLedger(rt.state.slot(SITE_LEDGER_FILE), rt.identity_private_key(), writer_id=rt.site_id)

    def theta_s() -> dict[str, np.ndarray]:
        # the handler commits Θs to disk before its reply leaves, so the last snapshot is the current Θs
        snap = rt.state.load()
        return {} if snap is None else dict(snap.theta_s)

    def propensities() -> np.ndarray | None:
        return rt.dataset_train.P

    return SiteAuditContext(
        site_id=rt.site_id,
        manifest=rt.manifest,
        theta_s=theta_s,
        ledger=ledger,
        policy=policy,
        propensities=propensities,
        privacy_ledger_hash=lambda: privacy_ledger_hash(rt.state.dir, rt.cfg.dp.ledger_dir),
        server_public_key=server_public_key,
        theta_s_history=ThetaSHistory(rt.state.slot(THETA_S_HISTORY_FILE)),
        privacy_anchors=lambda: read_anchors(rt.state.dir),
        protocol_reply=None if context is None else secure_reply_check(rt, context),
    )


def register_receipts_action(app: ClientApp) -> None:
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


def make_egress_gate_mod(runtime_getter: RuntimeGetter | None, policy: GatePolicy | None = None):
    """The outermost ClientApp mod of a federation site.

    Args:
        runtime_getter: ``(msg, context) -> SiteRuntime``; ``None`` builds a gate that lets nothing out.
        policy: what may leave besides Θc; by default :data:`FEDERATION_POLICY`, with Θs uploads allowed only when
            the site's effective settings say ``federation.sync = "full"`` (its policy opted in: the w/o-DSS ablation
            of paper Table III; verify reports those uploads), and nothing numeric outside secure aggregation when
            the site runs in secure mode (P20).

    Returns:
        A Flower mod ``(msg, context, call_next) -> Message``.
    """

    def get_site(msg: Message, context: Context) -> SiteAuditContext:
        if runtime_getter is None:
            raise NoSiteRuntime("egress gate built without a site runtime getter")
        try:
            rt = runtime_getter(msg, context)
            pol = policy if policy is not None else site_gate_policy(rt, msg.content.get(REC_CONFIG))
            return site_audit_context(rt, pol, context=context)
        except Exception as exc:  # noqa: BLE001 - reported by category only (e.g. data that fails its spec)
            error = site_error_of(exc)
            if error == "internal":
                raise
            raise SiteFailure(error) from None

    return make_egress_gate(get_site)
