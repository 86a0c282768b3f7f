"""The server side of the Flower app: DSS rounds (paper §III, Table II) on the Message API.

``run_federation(grid, cfg)`` is the one code path of every engine (simulation, deployment) and every mode
(plain / secure aggregation, DSS / full sync):

1. wait for the sites, ``query.hello`` each one (site id, site index, dims, manifest layout hash);
2. build the initial global parameters from the run seed (every site builds the same initialisation);
3. resume from ``<state root>/_server/checkpoint.npz`` if present (same training hash required);
4. per round: sample k of N sites (seeded, ``ClientSampler``), ``flow.run_round`` (the aggregation flow,
   ``flows.make_flow``), a cheap federated PEHE every ``eval_every`` rounds, checkpoint, one line appended to
   ``<out>/rounds.csv``;
5. a full federated evaluation, the sites' closing audit receipts, then the run folder (``apps.outputs``).

A site that fails answers with a fixed category of the audit's closed vocabulary (``fcd_secure.audit.SITE_ERRORS``:
its data does not match the spec, its DP budget is exhausted, its policy refused, or an internal error); the server
names the site and the category (``site-03: data does not match the spec``) in its progress events, in
``summary.json`` and in the :class:`FederationError` that ends a run no round of which could aggregate.

Every run keeps its state under one root (``RunConfig.state_root``: ``state_dir``, else ``<out>/state``): the
checkpoint and the server's audit ledger (``<root>/_server/audit``, signed with ``<root>/_server/identity_ed25519.key``)
live there. A run without such a root is refused; it never runs without its ledger.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.serverapp import Grid, ServerApp

from fcd_secure.audit import (
    RECEIPTS_MESSAGE_TYPE,
    SITE_ERRORS,
    ServerAudit,
    load_or_create_identity_key,
    site_error_name,
)
from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.queries.evaluation import evaluate_federated
from fcd_secure.federation.flows import make_flow
from fcd_secure._flower.waits import shorten_grid_backoff
from fcd_secure.federation.messaging import Comm
from fcd_secure.apps.outputs import RoundsLog, write_config, write_run_folder
from fcd_secure.federation.records import HELLO_MESSAGE_TYPE, REC_HELLO, config_from_context
from fcd_secure.federation.run_ticket import CONSORTIUM_ENV, COORDINATOR_KEY_ENV, verify_run_ticket
from fcd_secure.federation.sampler import ClientSampler
from fcd_secure.queries import dr_learner
from fcd_secure.federation.secure.secure_evaluation import secure_evaluation_for
from fcd_secure.queries.selection import KEEP_KEY, RESTORE_KEY, KeptParams, RoundScore, choose_round
from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY, secure_statistics
from fcd_secure.federation.state import SERVER_DIR, ServerCheckpoint, StateError
from fcd_secure.manifest import FULL, THETA_C, Manifest
from fcd_secure.errors import FcdError

ProgressHook = Callable[[str, dict], None]


class FederationError(FcdError, RuntimeError):
    """The federation cannot proceed (sites missing, inconsistent sites, every round aborted).

    Args:
        message: what happened, naming the sites.
        site_errors: the sites' error reports so far (``{"round", "action", "site_id", "error"}``).
    """

    def __init__(self, message: str, site_errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.site_errors = list(site_errors or [])


class SimulatedCrash(FcdError, RuntimeError):
    """Raised by ``federation.crash_after_round`` (tests of resume after a server crash)."""


@dataclass
class SiteInfo:
    node_id: int
    site_id: str
    site_index: int
    layout_hash: str
    dims: dict[str, int]


@dataclass
class FederationResult:
    theta: dict[str, np.ndarray]
    part: str
    history: list[dict]
    final_eval: dict
    manifest: Manifest
    sites: list[SiteInfo]
    traffic_rows: list[dict]
    wall_s: float
    resumed_from: int
    site_errors: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


def describe_site_error(site_id: str, error: str) -> str:
    """``site-03: data does not match the spec`` (the reason of the audit's closed vocabulary)."""
    return f"{site_id}: {SITE_ERRORS.get(error, SITE_ERRORS['internal'])[1]}"


def _error_rows(comm: Comm, since: int = 0) -> list[dict]:
    return [
        {"round": e.round, "action": e.action, "site_id": e.site_id, "error": e.error} for e in comm.site_errors[since:]
    ]


def wait_for_nodes(grid: Grid, n: int, timeout_s: float) -> list[int]:
    """Node ids once ``n`` nodes are connected (under run_simulation the list starts empty)."""
    deadline = time.monotonic() + timeout_s
    while True:
        nodes = sorted(int(x) for x in grid.get_node_ids())
        if len(nodes) >= n:
            return nodes
        if time.monotonic() > deadline:
            raise FederationError(f"only {len(nodes)} of {n} sites connected within {timeout_s:.0f} s")
        time.sleep(0.1)


def _hello_failures(failed: list[tuple[int, str]], answered: list[str], n_sites: int) -> str:
    """Name the sites that failed ``hello`` as well as the server can.

    A failing site never said who it is; but when every answering site has a default id (``site-<index>``, the
    simulation's), the missing ids are the failing sites, and they are named when that pairing is unambiguous (one
    failure, or the same error at every failing site). Otherwise the Flower node ids are given.
    """
    from fcd_secure.apps.site import default_site_id  # noqa: PLC0415

    errors = sorted({e for _, e in failed})
    expected = [default_site_id(i) for i in range(n_sites)]
    missing = [sid for sid in expected if sid not in answered]
    if set(answered) <= set(expected) and len(missing) == len(failed) and len(errors) == 1:
        what = "did not answer in time" if errors[0] == "timeout" else SITE_ERRORS[errors[0]][1]
        return f"{', '.join(missing)}: {what}"
    parts = [
        f"node {nid}: {'did not answer in time' if e == 'timeout' else SITE_ERRORS[e][1]}" for nid, e in failed
    ]
    return "; ".join(parts)


def hello(comm: Comm, node_ids: list[int], timeout_s: float, n_sites: int) -> list[SiteInfo]:
    """Identify every connected site; returns them ordered by site index (0..n_sites-1, each exactly once).

    Raises:
        FederationError: a site answered with an error or not at all (the message names it and the reason).
    """
    since = len(comm.site_errors)
    replies = comm.send(node_ids, HELLO_MESSAGE_TYPE, RecordDict({REC_HELLO: ConfigRecord({})}), timeout_s)
    failed: list[tuple[int, str]] = []
    answered: list[str] = []
    for nid in node_ids:
        rep = replies.get(nid)
        if rep is None or rep.has_error():
            failed.append((nid, site_error_name(rep.error.code) if rep is not None else "timeout"))
        else:
            answered.append(str(rep.content[REC_HELLO]["site-id"]))
    if failed:
        raise FederationError(
            f"{_hello_failures(failed, answered, n_sites)} (at hello, before any training)",
            _error_rows(comm, since),
        )
    infos: list[SiteInfo] = []
    for nid in node_ids:
        h = replies[nid].content[REC_HELLO]
        dims = {k[len("dim-"):]: int(v) for k, v in h.items() if k.startswith("dim-")}
        infos.append(SiteInfo(nid, str(h["site-id"]), int(h["site-index"]), str(h["layout-hash"]), dims))
    infos.sort(key=lambda s: s.site_index)
    if [s.site_index for s in infos] != list(range(n_sites)):
        raise FederationError(f"site indices must be 0..{n_sites - 1} exactly once, got {[s.site_index for s in infos]}")
    if len({s.site_id for s in infos}) != len(infos):
        raise FederationError(f"duplicate site ids: {[s.site_id for s in infos]}")
    for s in infos[1:]:
        if s.layout_hash != infos[0].layout_hash or s.dims != infos[0].dims:
            raise FederationError(
                f"{s.site_id} has a different model layout or data dims from {infos[0].site_id} "
                f"({s.dims} vs {infos[0].dims}); all sites must share one schema"
            )
    for s in infos:
        comm.site_of[s.node_id] = s.site_id
    return infos


def _peek_next(sampler: ClientSampler, order: list[int]) -> list[int]:
    """The node ids the sampler will draw for the next round, without drawing them (a secure flow sets that round's
    keys up ahead; the checkpoint keeps the sampler as an uninterrupted run has it)."""
    state = sampler.get_state()
    try:
        return [order[i] for i in sampler.sample()]
    finally:
        sampler.set_state(state)


def state_root(cfg: RunConfig) -> Path:
    """The run's state root (checkpoint, server ledger); a run without one is refused.

    Raises:
        FederationError: the config has neither ``state_dir`` nor ``out``.
    """
    root = cfg.state_root()
    if root is None:
        raise FederationError(
            "the run has no state folder (set state_dir or out): the server's checkpoint and audit ledger live there"
        )
    return root


def server_audit(cfg: RunConfig) -> ServerAudit:
    """The server half of the audit (server ledger + receipts), under ``<state root>/_server/audit``."""
    root = state_root(cfg) / SERVER_DIR
    return ServerAudit(root / "audit", load_or_create_identity_key(root / "identity_ed25519.key"))


def run_federation(
    grid: Grid, cfg: RunConfig, progress: ProgressHook | None = None, stop: threading.Event | None = None
) -> FederationResult:
    """Run the whole federation of ``cfg`` over ``grid`` (see the module docstring for the steps).

    Args:
        grid: Flower's Grid of the running ServerApp.
        cfg: the resolved run config.
        progress: called with ``(event, info)`` on ``connected`` (``sites``), ``resumed`` (``round``: the last
            finished round), ``site_error`` (``round``, ``action``, ``site_id``, ``error``), ``round`` (the row of
            ``rounds.csv``) and ``evaluating``.
        stop: set it to stop the run at the next wait for the sites (Ctrl-C, SIGTERM in the process that runs the
            engine); the checkpoint and ``rounds.csv`` are those of the last finished round.

    Raises:
        FederationError: sites missing or inconsistent, no state folder, or every round aborted.
        StateError: a checkpoint of another training configuration.
        fcd_secure.federation.messaging.RunStopped: ``stop`` was set.
    """
    t0 = time.perf_counter()
    fed = cfg.federation
    n_sites = cfg.data.n_sites
    say = progress or (lambda _event, _info: None)
    if cfg.out:
        write_config(cfg.out, cfg)  # from the start: a killed run can be resumed (--resume) or re-run (--config)
    comm = Comm(grid, poll_s=fed.poll_s, audit=server_audit(cfg), stop=stop)
    nodes = wait_for_nodes(grid, n_sites, fed.node_wait_s)
    sites = hello(comm, nodes[:n_sites] if len(nodes) == n_sites else nodes, fed.round_timeout_s, n_sites)
    order = [s.node_id for s in sites]
    say("connected", {"sites": [s.site_id for s in sites]})

    model = learner.build_model(cfg, sites[0].dims)
    manifest = learner.manifest_of(model)
    if manifest.layout_hash != sites[0].layout_hash:
        raise FederationError("the server's model layout differs from the sites' (different code or config)")
    comm.audit.record_manifest(manifest)  # the layout the server runs with, for the auditor to compare with each site's
    part = THETA_C if fed.sync == "dss" else FULL
    theta = learner.get_params(model, part)
    sampler = ClientSampler(cfg.seed, n_sites, fed.clients_per_round)
    history: list[dict] = []
    start = 1
    extra_ck: dict | None = None
    ckpt = ServerCheckpoint(state_root(cfg))
    if ckpt.exists():
        done, theta_ck, sampler_state, h, extra_ck = ckpt.load()
        if h != cfg.training_hash():
            raise StateError(
                f"{ckpt.path}: checkpoint belongs to a different training configuration; use a fresh state directory"
            )
        if sorted(theta_ck) != sorted(theta):
            raise StateError(f"{ckpt.path}: checkpoint parameters do not match the model manifest")
        theta = {k: theta_ck[k].astype(theta[k].dtype) for k in theta}
        sampler.set_state(sampler_state)
        history = list(extra_ck.get("history", []))
        start = done + 1
        say("resumed", {"round": done})
    resumed_from = start - 1

    kept = KeptParams(state_root(cfg) / SERVER_DIR / "selection")
    log_rounds = RoundsLog(cfg.out) if cfg.out else None
    if log_rounds is not None:
        log_rounds.start(history)
    flow = make_flow(cfg, manifest)
    # in secure mode the evaluation sums travel through secure aggregation too: no per-site sum reaches the server
    secure_eval = secure_evaluation_for(cfg, manifest)
    # round 0 (data.standardize = "secure"): the z-score statistics from per-site sums under secure aggregation
    statistics = (extra_ck or {}).get(STATISTICS_KEY) if start > 1 else None
    if cfg.data.standardize == "secure" and statistics is None:
        statistics = secure_statistics(comm, order, theta, cfg, manifest)
        say("statistics", {"columns": len(statistics["x_mean"]) + len(statistics["a_mean"])})
    stats_conf = {STATISTICS_KEY: json.dumps(statistics)} if statistics is not None else {}
    sync_bytes = int(manifest.nbytes(part))
    cum_up = int(sum(r["uplink_bytes"] for r in history))
    cum_down = int(sum(r["downlink_bytes"] for r in history))
    for rnd in range(start, fed.rounds + 1):
        comm.round = rnd
        chosen = sampler.sample()
        node_ids = [order[i] for i in chosen]
        t_round = time.perf_counter()
        n_rec = len(comm.ledger.records)
        n_err = len(comm.site_errors)
        outcome = flow.run_round(comm, node_ids, rnd, theta, {"part": part, "local-epochs": fed.local_epochs, **stats_conf},
                                 next_node_ids=_peek_next(sampler, order) if rnd < fed.rounds else None)
        round_errors = _error_rows(comm, n_err)
        for e in round_errors:
            say("site_error", e)
        if fed.crash_after_round is not None and rnd == fed.crash_after_round:
            raise SimulatedCrash(f"simulated server crash after round {rnd} (before its checkpoint)")
        if outcome.theta_c is not None:
            theta = outcome.theta_c
        recs = comm.ledger.records[n_rec:]
        up = sum(r.payload_bytes for r in recs if r.direction == "up")
        down = sum(r.payload_bytes for r in recs if r.direction == "down")
        cum_up += up
        cum_down += down
        row = {
            "round": rnd,
            "sites": " ".join(sites[i].site_id for i in chosen),
            "participants": len(outcome.participants),
            "failures": len(outcome.failures),
            # updates the flow refused to average, with the site and the reason (robust plain FedAvg)
            "dropped": "; ".join(f"{site}: {why}" for site, why in outcome.metrics.get("dropped", {}).items()),
            "aborted": outcome.theta_c is None,
            "aborted_reason": outcome.metrics.get("aborted") if outcome.theta_c is None else None,
            "site_errors": " ".join(sorted({f"{e['site_id']}:{e['error']}" for e in round_errors})) or None,
            "n_total": outcome.n_total,
            "train_loss": outcome.metrics.get("train_loss"),
            "uplink_bytes": int(up),
            "downlink_bytes": int(down),
            "uplink_message_bytes": int(sum(r.message_bytes for r in recs if r.direction == "up")),
            "uplink_formula_bytes": int(len(outcome.participants) * sync_bytes),
            "cum_uplink_bytes": int(cum_up),
            "cum_downlink_bytes": int(cum_down),
            "round_s": round(time.perf_counter() - t_round, 3),
            "pehe": None,
            "ate_error": None,
            "factual_auc": None,
        }
        if fed.eval_every and (rnd % fed.eval_every == 0 or rnd == fed.rounds):
            # a scored round: every site keeps its Θs and adds its validation sums; the server keeps Θc
            kept.keep(rnd, theta)
            quick = evaluate_federated(
                comm, order, theta, cfg, part, quick=True, sites=sites, secure=secure_eval, round_id=rnd,
                extra={**stats_conf, KEEP_KEY: rnd},
            )
            row["pehe"] = quick.get("pehe")
            row["ate_error"] = quick.get("ate_error")
            row["factual_auc"] = quick.get("factual_auc")
            sel = quick.get("selection")
            if sel:
                row["selection"] = sel
                row.update(d1=sel["d1"], d1_se=sel["d1_se"], d1_alarm=sel["alarm"], validation_fit=sel["validation_fit"],
                           dh=sel.get("dh"), dh_se=sel.get("dh_se"), dh_ess=sel.get("dh_ess"))
            if quick.get("dr_learner_fit"):
                row["dr_learner_fit"] = quick["dr_learner_fit"]  # consortium totals only (queries.dr_learner)
        history.append(row)
        ckpt.save(rnd, theta, sampler.get_state(), cfg.training_hash(),
                  extra={"history": history, **({STATISTICS_KEY: statistics} if statistics is not None else {})})
        comm.audit.checkpoint(rnd)  # signs the server ledger's checkpoint closing this round
        if log_rounds is not None:
            log_rounds.append(row)
        say("round", row)

    ran = [r for r in history if r["round"] >= start]
    if ran and all(r["aborted"] for r in ran):
        # a "result" from an untrained model would look like a finished run; refuse it
        errs = _error_rows(comm)
        named = sorted({describe_site_error(e["site_id"], e["error"]) for e in errs})
        raise FederationError(
            f"every round of this run was aborted ({len(ran)} rounds; last: {ran[-1]['aborted_reason']})"
            + (f"; {'; '.join(named)}" if named else "")
            + ". The sites' own logs say more (set FCD_SITE_DEBUG=1 for site-local tracebacks)",
            errs,
        )
    selection = select_round(cfg, history)
    final_conf = dict(stats_conf)
    if selection["round"] != fed.rounds and selection["rule"] != "last":
        theta = kept.load(selection["round"])  # the chosen round's Θc; each site restores its own Θs of that round
        final_conf[RESTORE_KEY] = selection["round"]
    # the DR-learner of the chosen round: β from the consortium's validation sums, predicted on each site's test rows
    dr_fit = dr_learner.solve(next((r.get("dr_learner_fit") for r in history if r["round"] == selection["round"]), None),
                              n_sites)
    final_conf.update(dr_learner.request_field(dr_fit))
    say("selected", selection)
    say("evaluating", {})
    n_err = len(comm.site_errors)
    final_eval = evaluate_federated(
        comm, order, theta, cfg, part, quick=False, sites=sites, secure=secure_eval, round_id=fed.rounds + 1,
        extra=final_conf, dr_fit_steps=int(dr_fit.get("n") or 0),
    )
    final_eval["dr_learner"] = {**dr_fit, "round": selection["round"], **(final_eval.get("dr_learner") or {})}
    for e in _error_rows(comm, n_err):
        say("site_error", e)
    # close the sites' ledgers: the receipts still owed, in one last message each
    comm.round = fed.rounds + 1
    comm.send(comm.audit.owed_nodes(), RECEIPTS_MESSAGE_TYPE, comm.audit.final_contents(), fed.round_timeout_s)
    comm.audit.close()
    return FederationResult(
        theta=theta,
        part=part,
        history=history,
        final_eval=final_eval,
        manifest=manifest,
        sites=sites,
        traffic_rows=comm.ledger.to_rows(),
        wall_s=time.perf_counter() - t0,
        resumed_from=resumed_from,
        site_errors=_error_rows(comm),
        extra={"selection": selection, **({STATISTICS_KEY: statistics} if statistics is not None else {})},
    )


def select_round(cfg: RunConfig, history: list[dict]) -> dict:
    """The evaluated round the run answers with (``federation.select``; ``queries.selection.choose_round``), marked
    ``selected`` in ``history``'s rows."""
    last = int(history[-1]["round"]) if history else cfg.federation.rounds
    scores = [RoundScore.from_row(r["selection"]) for r in history if r.get("selection")]
    if cfg.federation.select == "last":
        choice = {**choose_round(scores, last), "rule": "last", "round": last,
                  "reason": "federation.select = 'last': the last round is kept"}
    else:
        choice = choose_round(scores, last)
    for r in history:
        r["selected"] = r["round"] == choice["round"]
    return choice


def check_signed_run(context: Context, environ: dict[str, str] | None = None) -> None:
    """Refuse, before anything runs, a deployed run the coordinator did not sign (docs/threats.md P34).

    The coordinator's processes pin its public key and the consortium in the environment they give the SuperLink
    (``COORDINATOR_KEY_ENV``, ``CONSORTIUM_ENV``), which its executor passes on to this ServerApp: a run submitted
    by anyone else who reaches the Control API — even with the consortium's own app — writes no file and sends no
    message as the coordinator.

    Raises:
        fcd_secure.federation.run_ticket.RunTicketError: the coordinator pinned a key and the run is not signed by
            it for this consortium and exactly this run config.
    """
    env = os.environ if environ is None else environ
    key = env.get(COORDINATOR_KEY_ENV)
    if key:
        verify_run_ticket(dict(context.run_config or {}), coordinator_public_key=key,
                          consortium_id=env.get(CONSORTIUM_ENV) or None, fab_sha256=None)


def keep_to_own_keys(run_cfg: RunConfig, environ: dict[str, str] | None = None) -> None:
    """A deployed ServerApp gives up reading the coordinator's other keys before it starts (docs/threats.md P35):
    the files the coordinator's processes name in ``apps.sandbox.DENY_ENV`` (its signing key, the SuperLink's TLS key).

    Raises:
        fcd_secure.apps.sandbox.SandboxError: files are named and the kernel cannot restrict the process (Landlock,
            Linux ≥ 5.13); the run does not start without the restriction the coordinator asked for.
    """
    from fcd_secure.apps.sandbox import denied_from_env, deny_reading  # noqa: PLC0415

    denied = denied_from_env(environ)
    if not denied:
        return
    made = [Path(p) for p in (run_cfg.out, run_cfg.state_dir) if p]
    for folder in made:  # created before the restriction: a new file directly in a folder on the way is unreadable
        folder.mkdir(parents=True, exist_ok=True)
    deny_reading(denied, also_allow=made)


def make_server_app(
    cfg: RunConfig | None = None,
    progress: ProgressHook | None = None,
    sink: dict | None = None,
    stop: threading.Event | None = None,
) -> ServerApp:
    """A ServerApp bound to ``cfg`` (simulation) or reading ``fcd-config`` from the run config (deployment).

    The run folder is written inside the ServerApp, so both engines produce the same files; ``sink`` (if given)
    also receives the ``FederationResult`` for in-process callers; ``stop`` is :func:`run_federation`'s.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        if cfg is None:  # the Deployment Engine's grid: replies are pulled with Flower's 1 s-doubling backoff
            shorten_grid_backoff()
            check_signed_run(context)
        run_cfg = config_from_context(context, cfg)
        if cfg is None:
            keep_to_own_keys(run_cfg)
        result = run_federation(grid, run_cfg, progress, stop)
        if run_cfg.out:
            write_run_folder(run_cfg.out, run_cfg, result)
        if sink is not None:
            sink["result"] = result

    return app


#: Deployment entry point (``serverapp = "fcd_secure.apps.server_app:app"``).
app = make_server_app(None)
