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
* any other message type is refused through the same mods (:class:`SiteClientApp`): the gate answers with the
  ``unknown_message_type`` refusal of its closed vocabulary and records it in the site ledger (P28). Flower's own
  ``ClientApp`` raises for an unregistered type outside every mod, and its runtime answers with the exception text,
  a reply no site ledger records, which ``fcd audit verify`` then had to call tampered.

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

from collections.abc import Callable, Sequence

from flwr.app import ConfigRecord, Context, Message, MetricRecord, RecordDict
from flwr.clientapp import ClientApp

from fcd_secure.audit.rules import UNKNOWN_TYPE_RULE, Refusal
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


#: Flower's action name of a bare category (``"train"`` is dispatched as ``"train.default"``; the pinned
#: Flower's ``flwr.clientapp.client_app.DEFAULT_ACTION``).
DEFAULT_ACTION = "default"

Handler = Callable[[Message, Context], Message]


def _refuse_unknown(msg: Message, context: Context) -> Message:
    """The handler of every message type the site does not register: nothing runs, the gate records the refusal."""
    raise Refusal(UNKNOWN_TYPE_RULE, "metadata", "message_type")


def _with_mods(handler: Handler, mods: Sequence) -> Handler:
    """``handler`` behind ``mods``, the first outermost: the order Flower gives a registered handler (the pinned
    Flower's ``flwr.client.mod.utils.make_ffn``)."""

    def wrap(inner: Handler, mod) -> Handler:  # noqa: ANN001 - a Flower mod
        return lambda msg, ctx: mod(msg, ctx, inner)

    for mod in reversed(list(mods)):
        handler = wrap(handler, mod)
    return handler


class SiteClientApp(ClientApp):
    """A ``ClientApp`` in which every message passes the site's mods, whatever its type (P28).

    The pinned Flower's ``ClientApp.__call__`` raises ``ValueError("No train function registered …")`` for a type nobody
    registered, *before* any mod runs; the SuperNode's runtime then answers with ``str(exception)``. That reply never
    passed the egress gate: no ledger line records it, and its text is Flower's. Here a type the site does not
    register is dispatched to a handler that refuses it, behind the same mods as every registered one, so the gate
    answers with the closed-vocabulary refusal ``unknown_message_type`` and records it like any other refusal.

    Args:
        mods: the site's mods, outermost first (``apps.mods.client_mods``).
    """

    def __init__(self, mods: list) -> None:
        super().__init__(mods=mods)
        self._handled: set[str] = set()
        self._refuse = _with_mods(_refuse_unknown, mods)

    def _tracked(self, category: str, action: str, decorator: Callable[[Handler], Handler]) -> Callable[[Handler], Handler]:
        def register(fn: Handler) -> Handler:
            out = decorator(fn)  # Flower's checks first: a name it refuses is never marked as handled
            self._handled.add(f"{category}.{action}")
            return out

        return register

    def train(self, action: str = DEFAULT_ACTION, *, mods=None):  # noqa: ANN201 - Flower's decorator type
        return self._tracked("train", action, super().train(action, mods=mods))

    def evaluate(self, action: str = DEFAULT_ACTION, *, mods=None):  # noqa: ANN201
        return self._tracked("evaluate", action, super().evaluate(action, mods=mods))

    def query(self, action: str = DEFAULT_ACTION, *, mods=None):  # noqa: ANN201
        return self._tracked("query", action, super().query(action, mods=mods))

    def handles(self, message_type: str) -> bool:
        """Whether a handler is registered for ``message_type`` (a bare category means its default action)."""
        full = message_type if "." in message_type else f"{message_type}.{DEFAULT_ACTION}"
        return full in self._handled

    def __call__(self, message: Message, context: Context) -> Message:
        if self.handles(message.metadata.message_type):
            return super().__call__(message, context)
        return self._refuse(message, context)  # the site registers no lifespan: nothing to enter around it


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

    app = SiteClientApp(mods=client_mods(get_runtime))

    @app.query(HELLO_ACTION)
    def hello(msg: Message, context: Context) -> Message:
        rt = admitted(msg, context)
        rec = ConfigRecord(
            {
                "site-id": rt.site_id,
                "site-index": rt.site_index,
                "layout-hash": rt.layout_hash,
                # its propensity status (a closed vocabulary): the answers name the sites without propensities
                "behaviour": rt.data.behaviour,
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
