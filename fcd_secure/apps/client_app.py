"""The site side of the Flower app (Message API ``ClientApp`` with custom actions).

Actions (message types; record names in ``federation.records``):

* ``query.hello``: the site's identity and the model dims (non-private: feature counts, number of actions) so the
  server can build the initial global Θc; no counts, no data.
* ``train``: plain DSS round (``plain_flow.PlainFedAvgFlow``): global Θc in, locally trained Θc + sample count out.
* ``query.evaluate``: federated evaluation; only aggregate sums leave (``queries.evaluation``).
* ``train.secagg_*``: the secure-aggregation actions (``apps.secure_site``). They are always registered: in
  deployment the ClientApp cannot know the run's mode before the first message, and they answer only the secure
  flow's own message types.
* ``query.audit_receipts``: the server's closing receipts (answered by the audit egress gate itself).

Every handler runs behind ``mods.client_mods``: the audit egress gate (outermost), then the guard. The gate, the
secure actions and the receipts action are imported directly, so a ClientApp without them cannot be built.

Each handler first asks the site whether it may run (``SiteRuntime.admit``): a run config weaker than the site's
policy, or a clear-text action sent to a site in secure mode, is refused before anything is computed, and the gate
records the refusal in the site ledger.

``make_client_app(cfg)`` builds the app for the simulation engine (the config travels in the closure, since
``run_simulation`` gives an empty run config); the module-level ``app`` is the deployment entry point and reads
the config from the run config key ``fcd-config`` (JSON) that ``engines.deployment`` writes.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fcd_secure.config import RunConfig
from fcd_secure.apps.egress import register_receipts_action
from fcd_secure.apps.mods import client_mods
from fcd_secure.federation.records import (
    EVALUATE_ACTION,
    HELLO_ACTION,
    REC_CONFIG,
    REC_EVAL,
    REC_GLOBAL,
    REC_HELLO,
    REC_METRICS,
    REC_NUM,
    REC_UPDATE,
    arrays_to_record,
    config_came_from_server,
    config_from_context,
    record_to_global,
)
from fcd_secure.apps.secure_site import register_secure_actions
from fcd_secure.apps.site import SiteRuntime


def _metric(v):
    """MetricRecord values: floats or lists of floats (histograms)."""
    return [float(x) for x in v] if isinstance(v, (list, tuple)) else float(v)


def make_client_app(cfg: RunConfig | None = None) -> ClientApp:
    """A ClientApp bound to ``cfg`` (or, with ``None``, to the run config of each message's Context).

    Raises:
        Whatever the egress gate factory raises: there is no ClientApp without its gate.
    """

    def get_runtime(msg: Message, context: Context) -> SiteRuntime:
        # the site as it is (the gate records with it, refusals included); handlers use ``admitted``
        own = not config_came_from_server(context)
        return SiteRuntime.from_context(context, config_from_context(context, cfg), own_config=own)

    def admitted(msg: Message, context: Context) -> SiteRuntime:
        rt = get_runtime(msg, context)
        rt.admit(msg.metadata.message_type)
        return rt

    app = ClientApp(mods=client_mods(get_runtime))

    @app.query(HELLO_ACTION)
    def hello(msg: Message, context: Context) -> Message:
        rt = admitted(msg, context)
        rec = ConfigRecord(
            {
                "site-id": rt.site_id,
                "site-index": rt.site_index,
                "layout-hash": rt.layout_hash,
                **{f"dim-{k}": int(v) for k, v in rt.dims.items()},
            }
        )
        return Message(RecordDict({REC_HELLO: rec}), reply_to=msg)

    @app.train()
    def train(msg: Message, context: Context) -> Message:
        rt = admitted(msg, context)
        round_config = dict(msg.content[REC_CONFIG])
        theta, n, metrics = rt.train_round(record_to_global(msg.content[REC_GLOBAL]), round_config)
        content = RecordDict(
            {
                REC_UPDATE: arrays_to_record(theta),
                REC_NUM: MetricRecord({"n": int(n)}),
                REC_METRICS: MetricRecord({k: float(v) for k, v in metrics.items()}),
            }
        )
        return Message(content, reply_to=msg)

    @app.query(EVALUATE_ACTION)
    def evaluate(msg: Message, context: Context) -> Message:
        rt = admitted(msg, context)
        eval_config = dict(msg.content[REC_CONFIG])
        sums = rt.evaluate(record_to_global(msg.content[REC_GLOBAL]), eval_config)
        return Message(RecordDict({REC_EVAL: MetricRecord({k: _metric(v) for k, v in sums.items()})}), reply_to=msg)

    register_secure_actions(app, admitted)
    register_receipts_action(app)
    return app


#: Deployment entry point (``clientapp = "fcd_secure.apps.client_app:app"``).
app = make_client_app(None)
