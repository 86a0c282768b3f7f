"""The Flower carrier of pairwise-masked secure aggregation (Bonawitz et al., CCS 2017; DESIGN.md P1–P18).

Paper §III-B (DSS) and Table II: each sampled site trains (Θc, Θs_i) locally and only Θc is aggregated
with sample-size-weighted FedAvg. Here the server learns only the weighted sum: ``SecureAggregationFlow``
implements the ``AggregationFlow`` seam of ``federation.flows`` over six custom ClientApp actions

====================================  ===================================================================
``train.secagg_train``                 global Θc in; the site trains and keeps the encoded update in its
                                       ``Context.state`` (never replied); the reply is an acknowledgement
``train.secagg_advertise_keys``        stage 0: round parameters in, signed X25519 round keys out
``train.secagg_share_keys``            stage 1: signed key list in, AES-GCM encrypted Shamir shares out
``train.secagg_masked_input``          stage 2: relayed shares in, masked uint32 vector out
``train.secagg_consistency``           stage 3: survivors in, Ed25519 signature (survivors + model hash) out
``train.secagg_unmask``                stage 4: signatures in, shares of alive / dropped sites out
====================================  ===================================================================

Every protocol message is the strict byte encoding of ``fcd_secure.aggregation.secagg.messages`` in a
``ConfigRecord`` field ``msg`` (the audit egress gate lets only bytes and ints through in ``train.secagg_*``).
Each stage has its own deadline (``SecAggPolicy.deadlines``, P17): a site that has not answered by then is a
dropout, and anything it sends later is ignored (P9). Fewer survivors than the threshold abort the round and
the global model stays unchanged (``RoundOutcome.theta_c is None``).

Site identity: the Ed25519 key is created on first use in the site state (``SiteRuntime.identity_private_key``).
The *roster* of every site's public key is configuration, never learned from the server (P2): a site reads it
from ``node_config["secagg-roster"]`` (a JSON file ``{site_id: hex public key}``) or, by default, from
``<state_root>/secagg_roster.json``, which :func:`provision_roster` writes for a simulated federation (the
operator's provisioning step; in a deployment each hospital receives the same file out of band). Its policy
(minimum sites, threshold rule, modulus, clip range, scale, deadlines) is the site's own: ``node_config
["secagg-policy"]`` (JSON/TOML file of ``SecAggPolicy`` fields) or the run config's ``secagg`` section, if any,
else the safe defaults.
"""

from __future__ import annotations

import json
import logging
import os
import time
import tomllib
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fcd_secure.aggregation.secagg import (
    SecAggClient,
    SecAggError,
    SecAggPolicy,
    SecAggServer,
    VectorLayout,
    encode,
    theta_hash,
)
from fcd_secure.aggregation.secagg.client import ReplayGuard
from fcd_secure.aggregation.secagg.server import STAGES
from fcd_secure.federation.flows import (
    REC_CONFIG,
    REC_GLOBAL,
    RoundOutcome,
    arrays_to_record,
    config_record,
    record_to_arrays,
)

if TYPE_CHECKING:  # pragma: no cover
    from fcd_secure.config import RunConfig
    from fcd_secure.federation.messaging import Comm

log = logging.getLogger("fcd_secure.secagg")

ACTION_PREFIX = "train.secagg_"
TRAIN_ACTION = "train"
REC_SECAGG = "secagg"
STATE_KEY = "secagg"
ROSTER_FILE = "secagg_roster.json"
REPLAY_SLOT = "secagg_rounds.json"
#: the one site metric that travels, weighted and masked, inside the vector (never in clear, P7); it is divided
#: by METRIC_RANGE before encoding so that losses up to METRIC_RANGE * clip fit the clip range of Θc updates
METRICS = ("train_loss",)
METRIC_RANGE = 64.0


class SecureAggregationConfigError(RuntimeError):
    """Secure aggregation cannot run with this configuration (no roster, Θs sync, too few sites)."""


# -- configuration: roster and policy --------------------------------------------------------------------------
def provision_roster(state_root: str | Path, site_ids: list[str]) -> dict[str, bytes]:
    """Create each site's identity key in its state directory (if missing) and write the roster file.

    This is the operator's provisioning step for a federation whose sites share one state root (simulation).
    Returns ``{site_id: Ed25519 public key}``. Idempotent: existing keys are kept.
    """
    from fcd_secure.aggregation.secagg.keys import ed25519_public  # noqa: PLC0415
    from fcd_secure.federation.state import SiteState, atomic_write_bytes  # noqa: PLC0415

    roster = {sid: ed25519_public(SiteState(state_root, sid).identity_private_key()) for sid in site_ids}
    doc = {"version": 1, "sites": {sid: pk.hex() for sid, pk in sorted(roster.items())}}
    atomic_write_bytes(Path(state_root) / ROSTER_FILE, json.dumps(doc, indent=1).encode())
    return roster


def load_roster(path: str | Path) -> dict[str, bytes]:
    """Read a roster file; errors name the file and the entry."""
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


def load_policy(path: str | Path) -> SecAggPolicy:
    """A site's policy from a JSON or TOML file of ``SecAggPolicy`` fields (a ``[secagg]`` table is accepted)."""
    path = Path(path)
    try:
        text = path.read_text()
        raw = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
    except (OSError, ValueError) as exc:
        raise SecureAggregationConfigError(f"{path}: cannot read the secure-aggregation policy ({exc})") from None
    raw = raw.get("secagg", raw)
    try:
        return SecAggPolicy.model_validate(raw)
    except ValueError as exc:
        raise SecureAggregationConfigError(f"{path}: invalid secure-aggregation policy ({exc})") from None


def _config_policy(cfg: Any) -> SecAggPolicy:
    pol = getattr(cfg, "secagg", None) if cfg is not None else None
    if isinstance(pol, SecAggPolicy):
        return pol
    if isinstance(pol, dict):
        return SecAggPolicy.model_validate(pol)
    return SecAggPolicy()


def layout_of(entries: Any) -> VectorLayout:
    """The vector layout of Θc: manifest entries of part ``theta_c`` in name order (the order both the server,
    which only sees the global arrays, and the sites, which hold the manifest, can rebuild). Θs names are kept so
    that offering one is refused (P15)."""
    items = []
    for e in getattr(entries, "entries", entries):
        if isinstance(e, tuple):
            items.append(e)
        else:
            items.append((e.name, tuple(e.shape), e.part))
    return VectorLayout.from_manifest(sorted(items, key=lambda t: t[0]), metrics=METRICS)


# -- server side ---------------------------------------------------------------------------------------------------
class SecureAggregationFlow:
    """Server side of a secure DSS round (the ``AggregationFlow`` seam of ``federation.flows``)."""

    def __init__(self, policy: SecAggPolicy | None = None, *, session_id: bytes | None = None) -> None:
        self.policy = policy or SecAggPolicy()
        # one protocol session per federation run; rounds inside it are numbered by the server round
        self.session_id = session_id if session_id is not None else os.urandom(16)
        self.last_report: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: "RunConfig") -> "SecureAggregationFlow":
        fed = config.federation
        if fed.sync != "dss":
            raise SecureAggregationConfigError(
                "secure aggregation carries only Θc (federation.sync = 'dss'); the 'full' ablation synchronises Θs, "
                "which may never enter the masked vector (P15): run it with --no-secure-aggregation"
            )
        policy = _config_policy(config)
        if fed.clients_per_round < policy.min_sites:
            raise SecureAggregationConfigError(
                f"federation.clients_per_round = {fed.clients_per_round} is below the secure-aggregation minimum of "
                f"{policy.min_sites} sites (P10); sample more sites or use --no-secure-aggregation"
            )
        if fed.clients_per_round > min(policy.max_sites, policy.max_overflow_sites()):
            raise SecureAggregationConfigError(
                f"federation.clients_per_round = {fed.clients_per_round} is above what one secure round can sum without "
                f"overflow or beyond the policy's max_sites ({min(policy.max_sites, policy.max_overflow_sites())}, P6); "
                "sample fewer sites per round or lower secagg clip / scale_bits"
            )
        return cls(policy)

    def _send_stage(
        self, comm: "Comm", action: str, requests: dict[str, bytes], node_of: dict[str, int], timeout_s: float, rnd: int
    ) -> dict[str, bytes]:
        contents = {node_of[s]: RecordDict({REC_SECAGG: ConfigRecord({"msg": req})}) for s, req in requests.items()}
        replies = comm.send(list(contents), ACTION_PREFIX + action, contents, timeout_s, round=rnd)
        out: dict[str, bytes] = {}
        for s in requests:
            rep = replies.get(node_of[s])
            if rep is None or rep.has_error() or REC_SECAGG not in rep.content:
                continue
            blob = rep.content[REC_SECAGG].get("msg")
            if isinstance(blob, bytes):
                out[s] = blob
        return out

    def run_round(
        self,
        comm: "Comm",
        node_ids: list[int],
        server_round: int,
        global_theta_c: dict[str, np.ndarray],
        round_config: dict,
    ) -> RoundOutcome:
        pol, dl, rnd = self.policy, self.policy.deadlines, int(server_round)
        site_of = {nid: comm.site_of.get(nid, f"node-{nid}") for nid in node_ids}
        node_of = {s: nid for nid, s in site_of.items()}
        report: dict[str, Any] = {"selected": len(node_ids)}
        self.last_report = report

        def aborted(why: str, participants: list[int] | None = None) -> RoundOutcome:
            report["aborted"] = why
            log.warning("secure round %d aborted: %s (global model unchanged)", rnd, why)
            failed = [n for n in node_ids if n not in (participants or [])]
            return RoundOutcome(None, None, participants or [], failed, {"aborted": why, "secagg": dict(report)})

        if len(node_ids) < pol.min_sites:
            return aborted(f"{len(node_ids)} sites selected, secure aggregation needs at least {pol.min_sites} (P10)")
        t0 = time.perf_counter()
        content = RecordDict(
            {
                REC_GLOBAL: arrays_to_record(global_theta_c),
                REC_CONFIG: config_record({**round_config, "server-round": rnd}),
            }
        )
        replies = comm.send(node_ids, ACTION_PREFIX + TRAIN_ACTION, content, dl.train, round=rnd)
        trained = [n for n in node_ids if (r := replies.get(n)) is not None and not r.has_error()]
        report["trained"] = len(trained)
        if len(trained) < pol.min_sites:
            return aborted(f"only {len(trained)} sites finished training, secure aggregation needs {pol.min_sites}")
        layout = layout_of([(k, tuple(np.shape(v)), "theta_c") for k, v in global_theta_c.items()])
        try:
            server = SecAggServer(pol, layout, [site_of[n] for n in trained], round_id=rnd, session_id=self.session_id)
        except SecAggError as exc:
            return aborted(str(exc))
        requests = server.start()
        try:
            for stage in STAGES:
                got = self._send_stage(comm, stage, requests, node_of, dl.for_stage(stage), rnd)
                for s, blob in got.items():
                    try:
                        server.collect(s, blob)
                    except SecAggError:
                        pass  # recorded by the server as this site's failure; it is a dropout from now on
                requests = server.advance()
                report[stage] = len(server.report.survivors.get(stage, ()))
            agg = server.finish()
        except SecAggError as exc:  # too few survivors, or shares that do not reconstruct: abort, keep the global
            return aborted(str(exc), [node_of[s] for s in server.report.survivors.get("masked_input", ())])
        report["server_s"] = round(time.perf_counter() - t0, 3)
        participants = [node_of[s] for s in server.report.survivors["masked_input"]]
        # the vector held Σ w_i (Θc_i − Θc_global) / Σ w_i: the weighted FedAvg is the global plus that mean update
        theta = {
            k: (np.asarray(global_theta_c[k], np.float64) + agg.theta_c[k]).astype(np.asarray(global_theta_c[k]).dtype)
            for k in global_theta_c
        }
        metrics = {
            "n_total": float(agg.n_total),
            "train_loss": agg.metrics["train_loss"] * METRIC_RANGE,
            "clipped_fraction": agg.clipped_fraction,
            # per value: the fixed-point bound plus one float32 ulp of the result (both FedAvgs round to float32)
            "quantisation_bound": agg.quantisation_bound + _max_abs(theta) * 2.0**-23,
            "secagg": dict(report),
        }
        if agg.clipped_fraction > 0:
            log.warning("secure round %d: %.4g of the aggregated values were clipped to ±%g", rnd, agg.clipped_fraction, pol.clip)
        failures = [n for n in node_ids if n not in participants]
        return RoundOutcome(theta, float(agg.n_total), participants, failures, metrics)


def _max_abs(arrays: dict[str, np.ndarray]) -> float:
    return max((float(np.abs(a).max()) for a in arrays.values() if np.size(a)), default=0.0)


# -- client side ---------------------------------------------------------------------------------------------------
def _site_root(rt: Any) -> Path:
    return Path(rt.state.dir).parent


def site_roster(rt: Any, context: Context) -> dict[str, bytes]:
    """The configured roster of this site (node_config ``secagg-roster`` or ``<state_root>/secagg_roster.json``)."""
    nc = dict(context.node_config) if context.node_config else {}
    path = Path(str(nc["secagg-roster"])) if nc.get("secagg-roster") else _site_root(rt) / ROSTER_FILE
    if not path.exists():
        raise SecureAggregationConfigError(
            f"{path}: no secure-aggregation roster configured for site {rt.site_id}; provision one "
            "(fcd_secure.federation.secure_flow.provision_roster) or set node_config 'secagg-roster'"
        )
    return load_roster(path)


def site_policy(rt: Any, context: Context) -> SecAggPolicy:
    """The site's own policy: ``node_config["secagg-policy"]`` (a file on the site), else the run config's
    ``secagg`` section only when that config is the site's own (simulation: it travels in the app's closure),
    never when it arrived from the server (deployment: run config key ``fcd-config``), else the safe defaults."""
    nc = dict(context.node_config) if context.node_config else {}
    if nc.get("secagg-policy"):
        return load_policy(str(nc["secagg-policy"]))
    from_server = bool(context.run_config and context.run_config.get("fcd-config"))
    return SecAggPolicy() if from_server else _config_policy(getattr(rt, "cfg", None))


def _state_get(context: Context, key: str) -> Any:
    rec = context.state.get(STATE_KEY) if STATE_KEY in context.state else None
    return None if rec is None else rec.get(key)


def _state_set(context: Context, **values: Any) -> None:
    rec = context.state[STATE_KEY] if STATE_KEY in context.state else ConfigRecord({})
    for k, v in values.items():
        if v is None:
            if k in rec:
                del rec[k]
        else:
            rec[k] = v
    context.state[STATE_KEY] = rec


def _clear_round(context: Context) -> None:
    # an aborted or finished round leaves no secret behind in the node state
    _state_set(context, client=None, vector=None, global_hash=None, round=None)


def _train_handler(get_runtime: Callable) -> Callable[[Message, Context], Message]:
    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        round_config = dict(msg.content[REC_CONFIG])
        global_theta = record_to_arrays(msg.content[REC_GLOBAL])
        policy = site_policy(rt, context)
        layout = layout_of(rt.manifest)
        # a round whose protocol already started here is spent: re-training it would hand the server a second copy
        # of the same update to difference against (P5; see ReplayGuard)
        ReplayGuard(rt.state.slot(REPLAY_SLOT)).check_fresh(int(round_config["server-round"]))
        theta, n, metrics = rt.train_round(global_theta, round_config)
        loss = metrics.get("loss", metrics.get("total", 0.0))
        # the update, not the parameters, enters the vector: its values are small, so the fixed-point grid is fine
        update = {k: np.asarray(v, np.float64) - np.asarray(global_theta[k], np.float64) for k, v in theta.items()}
        vector = encode(layout, policy, update, int(n), {"train_loss": float(loss) / METRIC_RANGE})
        _state_set(
            context,
            client=None,
            vector=vector.tobytes(),
            global_hash=theta_hash(layout, global_theta),
            round=int(round_config["server-round"]),
        )
        # the update stays here: the reply says only "trained" (no count, no metric, P7)
        return Message(RecordDict({REC_SECAGG: ConfigRecord({"ready": 1})}), reply_to=msg)

    return handler


def _stage_handler(stage: str, get_runtime: Callable) -> Callable[[Message, Context], Message]:
    def handler(msg: Message, context: Context) -> Message:
        rt = get_runtime(msg, context)
        request = msg.content[REC_SECAGG]["msg"]
        if not isinstance(request, bytes):
            raise SecureAggregationConfigError("secure-aggregation request without a bytes 'msg' field")
        policy = site_policy(rt, context)
        layout = layout_of(rt.manifest)
        client = SecAggClient(
            rt.site_id,
            rt.identity_private_key(),
            site_roster(rt, context),
            policy,
            layout,
            replay_guard=ReplayGuard(rt.state.slot(REPLAY_SLOT)),
        )
        try:
            if stage == STAGES[0]:
                vector, gh = _state_get(context, "vector"), _state_get(context, "global_hash")
                if vector is None or gh is None:
                    raise SecureAggregationConfigError(f"site {rt.site_id} has no trained update for this round")
                client.set_input(np.frombuffer(vector, dtype=np.uint32).copy(), gh, _state_get(context, "round"))
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
            _state_set(context, client=client.export(), vector=None)
        return Message(RecordDict({REC_SECAGG: ConfigRecord({"msg": reply})}), reply_to=msg)

    return handler


def register_client_actions(app: Any, get_runtime: Callable[[Message, Context], Any]) -> None:
    """Attach the six ``train.secagg_*`` actions to ``app`` (a ``flwr.clientapp.ClientApp``).

    ``get_runtime(msg, context)`` returns the site's ``SiteRuntime`` (``site_id``, ``state``, ``manifest``,
    ``train_round``, ``identity_private_key``). Errors propagate to the app's guard mod, which turns them into a
    generic error reply: the server sees a dropout, never a reason or a key (P18).
    """
    app.train("secagg_" + TRAIN_ACTION)(_train_handler(get_runtime))
    for stage in STAGES:
        app.train("secagg_" + stage)(_stage_handler(stage, get_runtime))
