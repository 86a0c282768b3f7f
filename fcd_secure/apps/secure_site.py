"""The site side of secure aggregation: the ``train.secagg_*`` ClientApp actions (server side:
``federation.secure.flow`` and ``federation.secure.secure_evaluation``; protocol: ``fcd_secure.aggregation.secagg``).

A training round (``federation.secure.flow``) trains inside the protocol's own messages. ``secagg_train_advertise``
trains the site's round, encodes the *update* Θc_i − Θc_global into the fixed-point vector and answers stage 0 of
the round's own protocol run (protocol id ``2r + 1``) with it as the client's input; ``secagg_share_keys`` and
``secagg_masked_input`` follow. ``secagg_train_masked`` trains into the client whose keys were set up during the
round before (protocol id ``2r``) and answers stage 2 with the masked input. ``secagg_consistency_next`` /
``secagg_unmask_next`` answer this round's stage 3 / 4 and the next round's stage 0 / 1. The fresh update goes
straight into exactly one client, in the call that trained it; the sample count and the loss are words of the
masked vector, never sent in clear (P7). A server round is trained once (:data:`TRAINED_SLOT`), whichever message
asks. The next round's client lives in its own node-state record (:data:`NEXT_KEY`), which no evaluation touches.

``secagg_evaluate`` evaluates the global Θc on the cohort the site chose (``queries.cohort``) (or, in round 0,
takes the moment sums of its raw training set, ``federation.secure.secure_stats``), keeps the sums in the node
state and replies with their *schema* only (key names and lengths, never values); the five protocol stages
(``secagg_advertise_keys`` … ``secagg_unmask``) then sum them: the first brings the union of the sites' schemas, and
the sums are encoded exactly (``federation.secure.eval_vector``). Only an evaluation prepares its input ahead of
stage 0; a training round's input enters with its training.

Each protocol stage rebuilds the site's :class:`~fcd_secure.aggregation.secagg.SecAggClient` from the node state,
answers one server request, and stores the client's state back; the last stage (or any failure) clears it, so no
round secret outlives its round in node memory. A round that started here is spent for the rest of its session
(:class:`ReplayGuard`, P5): the session is the site's own name for the run (``federation.state.session_id_of``: the
Flower run id and the run config received), so a replayed run is refused and a new run starts fresh, and a round id
above ``MAX_ROUND_ID`` is refused unclaimed (P31); training and evaluation rounds are counted apart. A server round
is trained once per site state, whatever the session (:data:`TRAINED_SLOT`), and only if it is one of the run's
configured rounds.

Before a reply leaves, the egress gate checks each of its protocol messages exactly against its request, the roster
and the layout (:func:`secure_reply_check`, P29).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fcd_secure.aggregation.secagg import ClientStage, ReplayGuard, SecAggClient, SecAggPolicy, encode, theta_hash
from fcd_secure.aggregation.secagg.client import check_reply
from fcd_secure.aggregation.secagg.messages import MsgType, peek_header
from fcd_secure.audit.rules import SECAGG_PREFIX, Refusal
from fcd_secure.aggregation.secagg.server import STAGES
from fcd_secure.federation.secure.eval_vector import (
    EvalLayout,
    encode_sums,
    schema_from_bytes,
    schema_of,
    schema_to_bytes,
)
from fcd_secure.federation.records import (
    REC_CONFIG,
    REC_GLOBAL,
    REC_SECAGG,
    SECAGG_CONSISTENCY_NEXT_STAGE,
    SECAGG_EVAL_LAYOUT_FIELD,
    SECAGG_EVALUATE_STAGE,
    SECAGG_FIELD,
    SECAGG_NEXT_FIELD,
    SECAGG_TRAIN_ADVERTISE_STAGE,
    SECAGG_TRAIN_MASKED_STAGE,
    SECAGG_UNMASK_NEXT_STAGE,
    pack_pair,
    record_to_global,
    unpack_pair,
    secagg_action,
    secagg_round_id,
)
from fcd_secure.federation.secure.setup import (
    METRIC_RANGE,
    SecureAggregationConfigError,
    site_roster,
    vector_layout,
)
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_PURPOSE, MAX_FIT_ROUNDS
from fcd_secure.federation.secure.secure_stats import PURPOSE_KEY, STATS_PURPOSE
from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR
from fcd_secure.federation.state import SiteState, run_config_hash, session_id_of
from fcd_secure.manifest import Manifest

if TYPE_CHECKING:  # pragma: no cover - fcd_secure.config pulls in torch; a site's secure actions need not
    from fcd_secure.config import RunConfig

#: ``Context.state`` record that carries one round's protocol state between messages.
STATE_KEY = "secagg"
#: ``Context.state`` record of the next training round's client, whose keys were set up ahead (its ``round``, its
#: ``client``); no evaluation touches it.
NEXT_KEY = "secagg_next"
#: The site-state slots of the cross-session replay guards (training rounds, evaluation rounds).
REPLAY_SLOT = "secagg_rounds.json"
EVAL_REPLAY_SLOT = "secagg_eval_rounds.json"
#: The site-state slot of the replay guard of the shared behaviour model's steps (``federation.secure
#: .secure_behaviour``): rounds of the evaluation kind, counted from 1 apart from the evaluation rounds, since the fit
#: runs between round 0's statistics and the first scored round
BEHAVIOUR_REPLAY_SLOT = "secagg_behaviour_rounds.json"
#: The site-state slot of the server rounds this site has trained: each is trained once, whichever way it came, in
#: any session (the unnamed session of :class:`ReplayGuard`: a site state's training rounds only go forward, as
#: ``federation.state.SiteState``'s do).
TRAINED_SLOT = "secagg_trained.json"
#: ``purpose`` of a round in the node state
TRAINING, EVALUATION = "train", "evaluate"


class SecureSite(Protocol):
    """What the secure actions need from a site (``apps.site.SiteRuntime`` is one)."""

    site_id: str
    state: SiteState
    cfg: RunConfig | None
    manifest: Manifest
    #: the secure-aggregation parameters the site pins (its own policy, never the server's)
    secagg_policy: SecAggPolicy

    def identity_private_key(self) -> bytes: ...

    def train_round(
        self, global_theta: dict[str, np.ndarray], round_config: dict[str, Any]
    ) -> tuple[dict[str, np.ndarray], int, dict]: ...

    def preprocessing_sums(self) -> dict[str, Any]: ...

    def behaviour_fit_sums(self, config: dict[str, Any]) -> dict[str, Any]: ...


RuntimeGetter = Callable[[Message, Context], SecureSite]


def _state_get(context: Context, key: str, record: str = STATE_KEY) -> Any:
    rec = context.state.get(record) if record in context.state else None
    return None if rec is None else rec.get(key)


def _state_set(context: Context, record: str = STATE_KEY, **values: Any) -> None:
    rec = context.state[record] if record in context.state else ConfigRecord({})
    for k, v in values.items():
        if v is None:
            if k in rec:
                del rec[k]
        else:
            rec[k] = v
    context.state[record] = rec


def _clear_round(context: Context) -> None:
    # an aborted or finished round leaves no secret (and no evaluation sum) behind in the node state
    _state_set(context, client=None, global_hash=None, round=None, purpose=None, sums=None, schema=None, slot=None)


def _clear_next(context: Context) -> None:
    _state_set(context, NEXT_KEY, client=None, round=None)


def _session(context: Context) -> bytes:
    """The site's name for the run of ``context`` (``federation.state.session_id_of``): the key of its replay counters."""
    return session_id_of(int(context.run_id), run_config_hash(context.run_config))


def _guard(rt: SecureSite, context: Context, slot: str) -> ReplayGuard:
    """The replay counters of one kind of protocol round (:data:`REPLAY_SLOT`, :data:`EVAL_REPLAY_SLOT`) in the session
    of ``context`` (P5, P30)."""
    if slot == BEHAVIOUR_REPLAY_SLOT:  # a run asks the fit's sums at most MAX_FIT_ROUNDS times (P68)
        return ReplayGuard(rt.state.slot(slot), session=_session(context), max_round=MAX_FIT_ROUNDS)
    return ReplayGuard(rt.state.slot(slot), session=_session(context))


def _claim_training(rt: SecureSite, server_round: int) -> None:
    """Spend ``server_round`` for training: a site trains each round once, whichever message asks (a second update
    of the same round would give the server two sums to difference, P5)."""
    ReplayGuard(rt.state.slot(TRAINED_SLOT)).claim(b"trained-rounds", server_round)


def _train_update(rt: SecureSite, msg: Message) -> tuple[int, np.ndarray, bytes]:
    """Train the round of ``msg`` once and encode its update; returns the server round, the vector and the hash of
    the global Θc received. The round is refused before any training if it was trained before (P5); the caller
    checks the protocol round id."""
    round_config = dict(msg.content[REC_CONFIG])
    server_round = int(round_config["server-round"])
    rounds = rt.cfg.federation.rounds if rt.cfg is not None else None
    if rounds is not None and not 1 <= server_round <= rounds:
        # a round the run does not have would be trained, committed and spent for good (P31)
        raise SecureAggregationConfigError(f"server round {server_round} is not one of the run's rounds 1..{rounds}")
    global_theta = record_to_global(msg.content[REC_GLOBAL])
    ReplayGuard(rt.state.slot(TRAINED_SLOT)).check_fresh(server_round)
    layout = vector_layout(rt.manifest)
    theta, n, metrics = rt.train_round(global_theta, round_config)
    _claim_training(rt, server_round)
    loss = metrics.get("loss", metrics.get("total", 0.0))
    # the update, not the parameters, enters the vector: its values are small, so the fixed-point grid is fine
    update = {k: np.asarray(v, np.float64) - np.asarray(global_theta[k], np.float64) for k, v in theta.items()}
    vector = encode(layout, rt.secagg_policy, update, int(n), {"train_loss": float(loss) / METRIC_RANGE})
    return server_round, vector, theta_hash(layout, global_theta)


def _training_client(rt: SecureSite, context: Context, *, input_later: bool = False) -> SecAggClient:
    return SecAggClient(
        rt.site_id,
        rt.identity_private_key(),
        site_roster(context, rt.site_id, Path(rt.state.dir).parent),
        rt.secagg_policy,
        vector_layout(rt.manifest),
        replay_guard=_guard(rt, context, REPLAY_SLOT),
        input_later=input_later,
    )


def _request_bytes(msg: Message, field: str = SECAGG_FIELD, *, required: bool = True) -> bytes | None:
    rec = msg.content[REC_SECAGG] if REC_SECAGG in msg.content else None
    value = None if rec is None else rec.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, bytes):
        raise SecureAggregationConfigError(f"secure-aggregation request without a bytes {field!r} field")
    return value


def _evaluate_handler(get_runtime: RuntimeGetter) -> Callable[[Message, Context], Message]:
    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        eval_config = dict(msg.content[REC_CONFIG])
        global_theta = record_to_global(msg.content[REC_GLOBAL])
        round_id = int(eval_config["eval-round"])
        purpose = eval_config.get(PURPOSE_KEY)
        slot = BEHAVIOUR_REPLAY_SLOT if purpose == BEHAVIOUR_PURPOSE else EVAL_REPLAY_SLOT
        _guard(rt, context, slot).check_fresh(round_id)
        if purpose == STATS_PURPOSE:  # round 0: moment sums of the raw training set
            sums = rt.preprocessing_sums()
        elif purpose == BEHAVIOUR_PURPOSE:  # a step of the shared behaviour model: sums over the training rows
            sums = rt.behaviour_fit_sums(eval_config)
        else:
            sums = rt.evaluate(global_theta, eval_config)  # on the cohort the site chose (refusals propagate)
        schema = schema_of(sums)
        _clear_round(context)
        _state_set(
            context,
            sums=json.dumps({k: (list(v) if isinstance(v, (list, tuple)) else v) for k, v in sums.items()}).encode(),
            schema=schema_to_bytes(schema),
            global_hash=theta_hash(vector_layout(rt.manifest), global_theta),
            round=round_id,
            purpose=EVALUATION,
            slot=slot,
        )
        # names and lengths only: the values stay in node memory until they are masked
        return Message(RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: schema_to_bytes(schema)})}), reply_to=msg)

    return handler


def _evaluation_input(context: Context, msg: Message, rt: SecureSite) -> tuple[EvalLayout, np.ndarray]:
    """The agreed evaluation layout (from the first stage's request) and this site's encoded sums."""
    union_bytes = msg.content[REC_SECAGG].get(SECAGG_EVAL_LAYOUT_FIELD)
    if not isinstance(union_bytes, bytes):
        raise SecureAggregationConfigError(f"evaluation round without a {SECAGG_EVAL_LAYOUT_FIELD!r} layout")
    sums = json.loads(bytes(_state_get(context, "sums")).decode())
    layout = EvalLayout.of(schema_from_bytes(union_bytes), rt.secagg_policy)
    # the weight word: the cohort's rows; in round 0 (moment sums) it only scales the masked words and cancels in
    # the decoding, so it is the protocol's smallest admissible weight
    rows = int(round(sums["n_test"])) if "n_test" in sums else MIN_COHORT_FLOOR
    vector = encode_sums(layout, sums, rows, rt.secagg_policy)
    _state_set(context, sums=None, schema=union_bytes)
    return layout, vector


def _stage_handler(stage: str, get_runtime: RuntimeGetter) -> Callable[[Message, Context], Message]:
    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        request = msg.content[REC_SECAGG][SECAGG_FIELD]
        if not isinstance(request, bytes):
            raise SecureAggregationConfigError(f"secure-aggregation request without a bytes {SECAGG_FIELD!r} field")
        evaluation = _state_get(context, "purpose") == EVALUATION
        try:
            vector = None
            if evaluation and stage == STAGES[0]:
                layout, vector = _evaluation_input(context, msg, rt)
                layout = layout.vector_layout()
            elif evaluation:
                layout = EvalLayout.of(schema_from_bytes(bytes(_state_get(context, "schema"))), rt.secagg_policy).vector_layout()
            else:
                layout = vector_layout(rt.manifest)
            client = SecAggClient(
                rt.site_id,
                rt.identity_private_key(),
                site_roster(context, rt.site_id, Path(rt.state.dir).parent),
                rt.secagg_policy,
                layout,
                replay_guard=_guard(rt, context, (_state_get(context, "slot") or EVAL_REPLAY_SLOT) if evaluation
                                    else REPLAY_SLOT),
            )
            if stage == STAGES[0]:
                # only an evaluation prepares its input ahead (``secagg_evaluate``); a training round's input enters
                # with its training (``secagg_train_advertise`` / ``secagg_train_masked``), never through this stage
                gh = _state_get(context, "global_hash")
                if vector is None or gh is None:
                    raise SecureAggregationConfigError(f"site {rt.site_id} has no prepared input for this round")
                client.set_input(vector, gh, _state_get(context, "round"))
            else:
                blob = _state_get(context, "client")
                if blob is None:
                    raise SecureAggregationConfigError(f"site {rt.site_id} has no secure-aggregation state for stage {stage}")
                client.restore(blob)
            reply = client.handle(request)
        except Exception:
            _clear_round(context)
            raise
        if stage == STAGES[-1]:
            _clear_round(context)
        else:
            _state_set(context, client=client.export())
        return Message(RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: reply})}), reply_to=msg)

    return handler


def _train_and_answer(
    rt: SecureSite, msg: Message, context: Context, client: SecAggClient, request: bytes, server_round: int,
    protocol_round: int,
) -> Message:
    """Train the round once, bind the fresh update to ``client`` and answer ``request`` with it; the client then
    holds this round's state (or, on any failure, nothing is kept)."""
    try:
        _, vector, global_hash = _train_update(rt, msg)
        client.set_input(vector, global_hash, protocol_round)
        reply = client.handle(request)
    except Exception:
        _clear_round(context)
        raise
    _state_set(context, client=client.export(), round=server_round, purpose=TRAINING)
    return Message(RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: reply})}), reply_to=msg)


def _train_advertise_handler(get_runtime: RuntimeGetter) -> Callable[[Message, Context], Message]:
    """Train, then answer stage 0 of the round's own protocol run (protocol id ``2r + 1``) with the fresh update as
    its input: the update enters exactly this one client, in this one call."""

    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        request = _request_bytes(msg)
        server_round = int(dict(msg.content[REC_CONFIG])["server-round"])
        protocol_round = secagg_round_id(server_round, pipelined=False)
        if peek_header(request).round_id != protocol_round:
            raise SecureAggregationConfigError(f"stage 0 of round {server_round} must carry protocol round {protocol_round}")
        _guard(rt, context, REPLAY_SLOT).check_fresh(protocol_round)  # before training, not only at the claim
        _clear_round(context)
        if (_state_get(context, "round", NEXT_KEY) or 0) <= server_round:
            _clear_next(context)  # keys set up ahead for this round are never used: it trains here, once
        client = _training_client(rt, context)
        return _train_and_answer(rt, msg, context, client, request, server_round, protocol_round)

    return handler


def _train_masked_handler(get_runtime: RuntimeGetter) -> Callable[[Message, Context], Message]:
    """Train the round whose keys were set up during the previous one (protocol id ``2r``), bind the update to that
    client and answer its stage 2 (the relayed shares come with the training request)."""

    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        request = _request_bytes(msg)
        server_round = int(dict(msg.content[REC_CONFIG])["server-round"])
        blob = _state_get(context, "client", NEXT_KEY)
        if blob is None or _state_get(context, "round", NEXT_KEY) != server_round:
            _clear_next(context)
            raise SecureAggregationConfigError(f"site {rt.site_id} set up no keys ahead for round {server_round}")
        _clear_round(context)
        try:
            client = _training_client(rt, context)
            client.restore(bytes(blob))
            _clear_next(context)  # from here the client lives in this round's slot or nowhere
            protocol_round = secagg_round_id(server_round, pipelined=True)
            # checked before training: a request the client would refuse must not spend the round (or DP budget)
            if client.stage is not ClientStage.SHARED or peek_header(request).round_id != protocol_round:
                raise SecureAggregationConfigError(f"site {rt.site_id}: round {server_round}'s keys are not ready for its input")
        except Exception:
            _clear_round(context)
            raise
        return _train_and_answer(rt, msg, context, client, request, server_round, protocol_round)

    return handler


def _pair_handler(stage: str, get_runtime: RuntimeGetter) -> Callable[[Message, Context], Message]:
    """One of this round's last two stages (``consistency`` or ``unmask``, field ``msg``) together with one of the
    next round's first two (``advertise_keys`` or ``share_keys``, field ``next``): two clients, each with its own
    keys, state machine and checks, in one message. Either part may be absent. Any failure clears both rounds: a
    server caught misbehaving in one round gets no keys set up ahead for the next."""
    last = stage == SECAGG_UNMASK_NEXT_STAGE

    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        this_req = _request_bytes(msg, required=False)
        next_req = _request_bytes(msg, SECAGG_NEXT_FIELD, required=False)
        if this_req is None and next_req is None:
            raise SecureAggregationConfigError(f"{stage}: a request with neither this round's nor the next round's part")
        this_reply = next_reply = b""
        current = _state_get(context, "round") if _state_get(context, "purpose") == TRAINING else None
        try:
            if this_req is not None:
                blob = _state_get(context, "client")
                if blob is None or _state_get(context, "purpose") != TRAINING:
                    raise SecureAggregationConfigError(f"site {rt.site_id} has no training round in progress for {stage}")
                client = _training_client(rt, context)
                client.restore(bytes(blob))
                this_reply = client.handle(this_req)
                if last:
                    _clear_round(context)
                else:
                    _state_set(context, client=client.export())
            if next_req is not None:
                protocol_round = peek_header(next_req).round_id
                if protocol_round % 2 or (current is not None and protocol_round // 2 <= int(current)):
                    raise SecureAggregationConfigError(f"{stage}: protocol round {protocol_round} is not a later round set up ahead")
                if last:
                    blob = _state_get(context, "client", NEXT_KEY)
                    if blob is None or _state_get(context, "round", NEXT_KEY) != protocol_round // 2:
                        raise SecureAggregationConfigError(f"site {rt.site_id} advertised no keys for round {protocol_round // 2}")
                    nxt = _training_client(rt, context)
                    nxt.restore(bytes(blob))
                else:
                    _clear_next(context)
                    nxt = _training_client(rt, context, input_later=True)
                next_reply = nxt.handle(next_req)
                _state_set(context, NEXT_KEY, client=nxt.export(), round=protocol_round // 2)
        except Exception:
            _clear_round(context)
            _clear_next(context)
            raise
        return Message(RecordDict({REC_SECAGG: ConfigRecord({SECAGG_FIELD: pack_pair(this_reply, next_reply)})}), reply_to=msg)

    return handler


def _vector_words(rt: SecureSite, context: Context, stage: str) -> int:
    """Words of the masked vector this site's reply to a shares relay must carry: the training layout (Θc and the
    metrics, from the site's own manifest), or in an evaluation round the agreed evaluation layout the round's first
    stage stored (itself bounded by the gate's evaluation allow-list)."""
    if stage != SECAGG_TRAIN_MASKED_STAGE and _state_get(context, "purpose") == EVALUATION:
        schema = bytes(_state_get(context, "schema"))
        return EvalLayout.of(schema_from_bytes(schema), rt.secagg_policy).vector_layout().length
    return vector_layout(rt.manifest).length


def secure_reply_check(rt: SecureSite, context: Context) -> Callable[[Message, RecordDict], None]:
    """The egress gate's exact check of this site's secure-aggregation replies (``SiteAuditContext.protocol_reply``,
    docs/threats.md P29).

    Each protocol message of a reply must be exactly what this site's client answers to the request it came with
    (:func:`fcd_secure.aggregation.secagg.client.check_reply`): the header parsed and answering the request's session,
    round and type; the length pinned by the request, the roster and the layout (key advertisement: the selected
    sites; key sharing: the key list; masked input: the layout's words × 4; unmask: the alive and dropped sites); every
    name the one the client writes. A combined stage's two parts are checked each against its own request, and a part
    whose request is absent must be empty. The evaluation schema (``secagg_evaluate``) is the gate's own rule.

    Returns:
        ``(instruction, content) -> None``, raising :class:`~fcd_secure.audit.rules.Refusal` (``protocol_shape``).
    """

    def check(msg: Message, content: RecordDict) -> None:
        stage = msg.metadata.message_type.removeprefix(SECAGG_PREFIX)
        if stage == SECAGG_EVALUATE_STAGE:
            return
        try:
            reply = content[REC_SECAGG][SECAGG_FIELD]
            if not isinstance(reply, bytes):
                raise SecureAggregationConfigError("the reply is not bytes")
            this_req = _request_bytes(msg, required=False)
            if stage in (SECAGG_CONSISTENCY_NEXT_STAGE, SECAGG_UNMASK_NEXT_STAGE):
                parts = list(zip((this_req, _request_bytes(msg, SECAGG_NEXT_FIELD, required=False)), unpack_pair(reply)))
            else:
                parts = [(this_req, reply)]
            roster = site_roster(context, rt.site_id, Path(rt.state.dir).parent)
            for request, part in parts:
                if request is None:
                    if part:
                        raise SecureAggregationConfigError("a reply part without its request")
                    continue
                relay = peek_header(request).type is MsgType.SHARES_RELAY
                check_reply(request, part, rt.site_id, _vector_words(rt, context, stage) if relay else 0, roster)
        except Exception:  # noqa: BLE001 - whatever does not check is refused; the reason stays the rule's name
            raise Refusal("protocol_shape", REC_SECAGG, SECAGG_FIELD) from None

    return check


def register_secure_actions(app: ClientApp, get_runtime: RuntimeGetter) -> None:
    """Attach the ten ``train.secagg_*`` actions to ``app`` (evaluate, the five protocol stages and the four combined
    stages of a training round).

    Args:
        app: the site's ClientApp.
        get_runtime: ``(msg, context) -> site``, the site that answers (see :class:`SecureSite`).

    Errors propagate to the app's mods (egress gate, guard), which turn them into a generic error reply: the server
    sees a dropout, never a reason or a key (P18).
    """
    app.train(secagg_action(SECAGG_EVALUATE_STAGE))(_evaluate_handler(get_runtime))
    for stage in STAGES:
        app.train(secagg_action(stage))(_stage_handler(stage, get_runtime))
    app.train(secagg_action(SECAGG_TRAIN_ADVERTISE_STAGE))(_train_advertise_handler(get_runtime))
    app.train(secagg_action(SECAGG_TRAIN_MASKED_STAGE))(_train_masked_handler(get_runtime))
    for stage in (SECAGG_CONSISTENCY_NEXT_STAGE, SECAGG_UNMASK_NEXT_STAGE):
        app.train(secagg_action(stage))(_pair_handler(stage, get_runtime))
