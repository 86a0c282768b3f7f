"""The site side of the Flower app (Message API ``ClientApp`` with custom actions).

Actions (message types):

* ``query.hello``: the site's identity and the model dims (non-private: feature counts, number of actions) so the
  server can build the initial global Θc; no counts, no data.
* ``train``: plain DSS round (``flows.PlainFedAvgFlow``): global Θc in, locally trained Θc + sample count out.
* ``query.evaluate``: federated evaluation; only aggregate sums leave (``federation.evaluation``).
* ``query.audit_receipts``: the server's closing receipts (answered by the audit egress gate itself);
* the secure-aggregation actions of ``fcd_secure.federation.secure_flow`` (registered by its
  ``register_client_actions`` when secure mode is on; see ``_register_secure_actions``).

Every handler runs behind ``mods.client_mods`` (guard; audit egress gate outermost when available).

``make_client_app(cfg)`` builds the app for the simulation engine (the config travels in the closure, since
``run_simulation`` gives an empty run config); the module-level ``app`` is the deployment entry point and reads
the config from the run config key ``fcd-config`` (JSON) that ``federation.deployment`` writes.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fcd_secure.config import RunConfig
from fcd_secure.federation.flows import (
    REC_CONFIG,
    REC_GLOBAL,
    REC_METRICS,
    REC_NUM,
    REC_UPDATE,
    arrays_to_record,
    record_to_arrays,
)
from fcd_secure.federation.mods import client_mods
from fcd_secure.federation.site import SiteRuntime

RUN_CONFIG_KEY = "fcd-config"
REC_HELLO = "hello"
REC_EVAL = "eval"


def config_from_context(context: Context, fallback: RunConfig | None) -> RunConfig:
    """The run config: the closure's (simulation) or the ``fcd-config`` run-config entry (deployment)."""
    raw = context.run_config.get(RUN_CONFIG_KEY) if context.run_config else None
    if raw:
        return RunConfig.from_json(str(raw))
    if fallback is None:
        raise RuntimeError(f"no run configuration: the run config has no {RUN_CONFIG_KEY!r} entry")
    return fallback


def _metric(v):
    """MetricRecord values: floats or lists of floats (histograms)."""
    return [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v)


def make_client_app(cfg: RunConfig | None = None) -> ClientApp:
    """A ClientApp bound to ``cfg`` (or, with ``None``, to the run config of each message's Context)."""

    def get_runtime(msg: Message, context: Context) -> SiteRuntime:
        return SiteRuntime.from_context(context, config_from_context(context, cfg))

    app = ClientApp(mods=client_mods(get_runtime))

    @app.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        dims = rt.dims
        rec = ConfigRecord(
            {
                "site-id": rt.site_id,
                "site-index": rt.site_index,
                "layout-hash": rt.layout_hash,
                **{f"dim-{k}": int(v) for k, v in dims.items()},
            }
        )
        return Message(RecordDict({REC_HELLO: rec}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        round_config = dict(msg.content[REC_CONFIG])
        theta, n, metrics = rt.train_round(record_to_arrays(msg.content[REC_GLOBAL]), round_config)
        content = RecordDict(
            {
                REC_UPDATE: arrays_to_record(theta),
                REC_NUM: MetricRecord({"n": int(n)}),
                REC_METRICS: MetricRecord({k: float(v) for k, v in metrics.items()}),
            }
        )
        return Message(content, reply_to=msg)

    @app.query("evaluate")
    def evaluate(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        eval_config = dict(msg.content[REC_CONFIG])
        sums = rt.evaluate(record_to_arrays(msg.content[REC_GLOBAL]), eval_config)
        return Message(RecordDict({REC_EVAL: MetricRecord({k: _metric(v) for k, v in sums.items()})}), reply_to=msg)

    _register_secure_actions(app, get_runtime, cfg)
    _register_audit_actions(app)
    return app


def _register_secure_actions(app: ClientApp, get_runtime: Callable[[Message, Context], SiteRuntime], cfg: RunConfig | None) -> None:
    """=== THE place where the secure-aggregation client actions are attached. ===

    They are registered whenever ``fcd_secure.federation.secure_flow`` exists (in deployment the ClientApp cannot
    know the run's mode before the first message); they only answer the secure flow's own message types.
    """
    try:
        secure_flow = importlib.import_module("fcd_secure.federation.secure_flow")
    except ModuleNotFoundError as exc:
        if exc.name != "fcd_secure.federation.secure_flow":
            raise
        return
    secure_flow.register_client_actions(app, get_runtime)


def _register_audit_actions(app: ClientApp) -> None:
    """The closing ``query.audit_receipts`` message needs a registered type (the egress gate answers it)."""
    try:
        egress = importlib.import_module("fcd_secure.audit.egress")
    except ModuleNotFoundError as exc:
        if exc.name != "fcd_secure.audit.egress":
            raise
        return
    egress.register_receipts_action(app)


#: Deployment entry point (``clientapp = "fcd_secure.federation.client_app:app"``).
app = make_client_app(None)
