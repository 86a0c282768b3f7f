"""The server side of the Flower app: DSS rounds (paper §III, Table II) on the Message API.

``run_federation(grid, cfg)`` is the one code path of every engine (simulation, deployment) and every mode
(plain / secure aggregation, DSS / full sync). :class:`TrainingLoop` fills in the server loop
(``apps.server_loop.ServerLoop``: identify the sites, build and check the model, resume, checkpoint each round,
close the ledgers):

1. round 0 (``data.standardize = "secure"``): the consortium's standardisation statistics under secure aggregation;
   then (``evaluation.behaviour_model = "shared"`` or ``"shared_slopes"``) the consortium's shared behaviour model,
   one secure round per step of its Newton fit (``federation.secure.secure_behaviour``), sent with every evaluation
   request;
2. per round: sample k of N sites (seeded, ``ClientSampler``), ``flow.run_round`` (the aggregation flow,
   ``flows.make_flow``), a cheap federated PEHE every ``eval_every`` rounds (the round is then scored for the
   truth-free selection, ``queries.selection``);
3. the chosen round's full federated evaluation (with its DR-learner), then the run folder (``apps.outputs``).

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
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fcd_secure._flower.waits import shorten_grid_backoff
from fcd_secure.apps.outputs import write_config, write_run_folder
from fcd_secure.apps.server_loop import (
    FederationError,
    ProgressHook,
    ServerLoop,
    SiteInfo,
    describe_site_error,
    error_rows,
    state_root,
)
from fcd_secure.config import RunConfig
from fcd_secure.errors import FcdError
from fcd_secure.federation.flows import make_flow
from fcd_secure.federation.asked_runs import question_start_of
from fcd_secure.federation.records import RUN_CONFIG_KEY, AggregationFlow, config_from_context
from fcd_secure.federation.run_ticket import (
    CONSORTIUM_ENV,
    COORDINATOR_KEY_ENV,
    AcceptedRuns,
    RunTicket,
    verify_run_ticket,
)
from fcd_secure.federation.sampler import ClientSampler
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_MODEL_KEY, secure_behaviour_model
from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY, secure_statistics
from fcd_secure.federation.state import SERVER_DIR
from fcd_secure.manifest import Manifest
from fcd_secure.queries import dr_learner
from fcd_secure.queries.evaluation import evaluate_federated
from fcd_secure.queries.request import EvaluationRequest
from fcd_secure.queries.round_values import late_round_values
from fcd_secure.queries.selection import KeptParams, RoundScore, choose_round, restored_round

#: the checkpoint's field of the run's site errors so far (:meth:`TrainingLoop.checkpoint_state`)
SITE_ERRORS_KEY = "site_errors"


class SimulatedCrash(FcdError, RuntimeError):
    """Raised by ``federation.crash_after_round`` (tests of resume after a server crash)."""


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


def _peek_next(sampler: ClientSampler, order: list[int]) -> list[int]:
    """The node ids the sampler will draw for the next round, without drawing them (a secure flow sets that round's
    keys up ahead; the checkpoint keeps the sampler as an uninterrupted run has it)."""
    state = sampler.get_state()
    try:
        return [order[i] for i in sampler.sample()]
    finally:
        sampler.set_state(state)


class TrainingLoop(ServerLoop[FederationResult]):
    """The training federation on :class:`~fcd_secure.apps.server_loop.ServerLoop`: round 0's statistics when asked,
    ``federation.rounds`` rounds through the aggregation flow (each scored every ``eval_every`` rounds), the round
    selection and the final federated evaluation of the chosen round (module docstring)."""

    #: set by :meth:`on_open`, once the sites are identified and any checkpoint restored
    resumed_from: int  # the last round of the checkpoint this process started from (0: a fresh run)
    kept: KeptParams  # the server's Θc of every scored round, for the round selection
    flow: AggregationFlow
    statistics: dict[str, list[float]] | None  # round 0's standardisation statistics (data.standardize = "secure")
    stats_conf: dict[str, str]  # the statistics as every request to the sites carries them
    behaviour: str | None  # the shared behaviour model (JSON) every evaluation request carries, None: the sites' own
    sync_bytes: int  # the synchronised part's size (the uplink formula of rounds.csv)
    cum_up: int
    cum_down: int
    #: set by :meth:`evaluate`
    selection: dict

    def open(self) -> None:
        if self.cfg.out:
            write_config(self.cfg.out, self.cfg)  # from the start: a killed run can be resumed (--resume) or re-run
        super().open()

    def on_open(self) -> None:
        cfg = self.cfg
        self.resumed_from = self.start - 1
        self.kept = KeptParams(state_root(cfg) / SERVER_DIR / "selection")
        self.flow = make_flow(cfg, self.manifest)
        # round 0 (data.standardize = "secure"): the z-score statistics from per-site sums under secure aggregation
        self.statistics = self.saved.get(STATISTICS_KEY) if self.start > 1 else None
        if cfg.data.standardize == "secure" and self.statistics is None:
            self.statistics = secure_statistics(self.comm, self.order, self.theta, cfg, self.manifest)
            self.say("statistics", {"columns": len(self.statistics["x_mean"]) + len(self.statistics["a_mean"])})
        self.stats_conf = {STATISTICS_KEY: json.dumps(self.statistics)} if self.statistics is not None else {}
        # before training (the scored rounds' selection weights by it): the shared behaviour model, when the run asks
        self.behaviour = self.saved.get(BEHAVIOUR_MODEL_KEY) if self.start > 1 else None
        if cfg.evaluation.shares_behaviour_model and self.behaviour is None:
            step, steps = secure_behaviour_model(self.comm, self.order, self.theta, cfg, self.manifest,
                                                 self.sites[0].dims)
            self.behaviour = json.dumps(step.to_json())
            self.say("behaviour_model", {"newton_steps": steps, "coefficients": int(step.coef.size)})
        self.sync_bytes = int(self.manifest.nbytes(self.part))
        self.cum_up = int(sum(r["uplink_bytes"] for r in self.history))
        self.cum_down = int(sum(r["downlink_bytes"] for r in self.history))

    def checkpoint_extra(self) -> dict:
        return {**({STATISTICS_KEY: self.statistics} if self.statistics is not None else {}),
                **({BEHAVIOUR_MODEL_KEY: self.behaviour} if self.behaviour is not None else {})}

    def checkpoint_state(self) -> dict:
        # the sites' errors so far, the earlier processes' included: a resumed run's records keep every round a
        # site missed (rounds.csv alone kept them, summary.json and the report forgot them)
        return {**self.checkpoint_extra(), SITE_ERRORS_KEY: self.all_site_errors()}

    def all_site_errors(self) -> list[dict]:
        """Every site error of the run: those of the processes it resumed from, then this process's."""
        return [*self.saved.get(SITE_ERRORS_KEY, []), *error_rows(self.comm)]

    def train_round(self, rnd: int) -> dict:
        """Sample k of N sites (seeded), one round of the aggregation flow, a cheap federated evaluation when the
        round is scored; returns the round's row of ``rounds.csv``."""
        comm, fed = self.comm, self.fed
        chosen = self.sampler.sample()
        node_ids = [self.order[i] for i in chosen]
        t_round = time.perf_counter()
        n_rec = len(comm.ledger.records)
        n_err = len(comm.site_errors)
        outcome = self.flow.run_round(
            comm, node_ids, rnd, self.theta, {"part": self.part, "local-epochs": fed.local_epochs,
                                            "min-local-steps": fed.min_local_steps, **self.stats_conf},
            next_node_ids=_peek_next(self.sampler, self.order) if rnd < fed.rounds else None)
        round_errors = error_rows(comm, n_err)
        for e in round_errors:
            self.say("site_error", e)
        if fed.crash_after_round is not None and rnd == fed.crash_after_round:
            raise SimulatedCrash(f"simulated server crash after round {rnd} (before its checkpoint)")
        if outcome.theta_c is not None:
            self.theta = outcome.theta_c
        recs = comm.ledger.records[n_rec:]
        up = sum(r.payload_bytes for r in recs if r.direction == "up")
        down = sum(r.payload_bytes for r in recs if r.direction == "down")
        self.cum_up += up
        self.cum_down += down
        row = {
            "round": rnd,
            "sites": " ".join(self.sites[i].site_id for i in chosen),
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
            "uplink_formula_bytes": int(len(outcome.participants) * self.sync_bytes),
            "cum_uplink_bytes": int(self.cum_up),
            "cum_downlink_bytes": int(self.cum_down),
            "round_s": round(time.perf_counter() - t_round, 3),
            "pehe": None,
            "ate_error": None,
            "factual_auc": None,
        }
        if fed.eval_every and (rnd % fed.eval_every == 0 or rnd == fed.rounds):
            row.update(self._score_round(rnd))
        return row

    def _score_round(self, rnd: int) -> dict:
        """A scored round: every site keeps its Θs and adds its validation sums; the server keeps Θc. Returns the
        round's evaluation columns of ``rounds.csv``."""
        self.kept.keep(rnd, self.theta)
        request = EvaluationRequest.for_run(self.cfg, quick=True, part=self.part, keep_round=rnd,
                                            statistics=self.stats_conf.get(STATISTICS_KEY), behaviour=self.behaviour)
        quick = evaluate_federated(self.comm, self.order, self.theta, self.cfg, request, secure=self.secure_eval,
                                   round_id=rnd)
        cols = {"pehe": quick.get("pehe"), "ate_error": quick.get("ate_error"), "factual_auc": quick.get("factual_auc")}
        sel = quick.get("selection")
        if sel:
            cols["selection"] = sel
            cols.update(d1=sel["d1"], d1_se=sel["d1_se"], d1_alarm=sel["alarm"], validation_fit=sel["validation_fit"],
                        dh=sel.get("dh"), dh_se=sel.get("dh_se"), dh_ess=sel.get("dh_ess"))
        nc = quick.get("natural_course")
        if nc:  # the natural-course check of this candidate round, beside D₁ (queries.natural_course)
            cols["natural_course"] = {k: v for k, v in nc.items() if k != "steps"}
            cols.update(nc_max_z=nc.get("max_abs_z"), nc_gap=nc.get("mean_abs_gap"))
        if quick.get("dr_learner_fit"):
            cols["dr_learner_fit"] = quick["dr_learner_fit"]  # consortium totals only (queries.dr_learner)
        if quick.get("round_values"):
            # the policies' values this round (queries.round_values), at the horizon and from the sites they came
            cols.update(round_values=quick["round_values"], round_values_sites=quick.get("round_values_sites"),
                        round_values_horizon=self.cfg.evaluation.horizon)
        return cols

    def evaluate(self) -> dict:
        """The round selection, then the full federated evaluation of the chosen round's model.

        Raises:
            FederationError: every round this process ran was aborted.
        """
        fed, history = self.fed, self.history
        ran = [r for r in history if r["round"] >= self.start]
        if ran and all(r["aborted"] for r in ran):
            # a "result" from an untrained model would look like a finished run; refuse it
            errs = error_rows(self.comm)
            named = sorted({describe_site_error(e["site_id"], e["error"]) for e in errs})
            raise FederationError(
                f"every round of this run was aborted ({len(ran)} rounds; last: {ran[-1]['aborted_reason']})"
                + (f"; {'; '.join(named)}" if named else "")
                + ". The sites' own logs say more (set FCD_SITE_DEBUG=1 for site-local tracebacks)",
                errs,
            )
        self.selection = select_round(self.cfg, history)
        restore = restored_round(self.selection, fed.rounds)
        if restore is not None:
            self.theta = self.kept.load(restore)  # the chosen round's Θc; each site restores its own Θs of it
        # the DR-learner of the chosen round: β from the consortium's validation sums, predicted on each site's test
        # rows
        dr_fit = dr_learner.solve(
            next((r.get("dr_learner_fit") for r in history if r["round"] == self.selection["round"]), None),
            self.n_sites)
        self.say("selected", self.selection)
        self.say("evaluating", {})
        n_err = len(self.comm.site_errors)
        request = EvaluationRequest.for_run(self.cfg, quick=False, part=self.part, restore_round=restore,
                                            dr_learner_beta=dr_fit.get("beta"),
                                            statistics=self.stats_conf.get(STATISTICS_KEY), behaviour=self.behaviour)
        final_eval = evaluate_federated(self.comm, self.order, self.theta, self.cfg, request, secure=self.secure_eval,
                                        round_id=fed.rounds + 1, dr_fit_steps=int(dr_fit.get("n") or 0))
        final_eval["dr_learner"] = {**dr_fit, "round": self.selection["round"], **(final_eval.get("dr_learner") or {})}
        # the late rounds' values of the run's policies: a ranking's '>' must hold in each (queries.round_values)
        late = late_round_values(history, self.cfg.evaluation.horizon)
        final_eval["round_values"] = {"horizon": self.cfg.evaluation.horizon, "rows": "validation",
                                      "rounds": late} if late else None
        for e in error_rows(self.comm, n_err):
            self.say("site_error", e)
        return final_eval

    def closing_round(self) -> int:
        return self.fed.rounds + 1

    def result(self, answer: dict) -> FederationResult:
        return FederationResult(
            theta=self.theta,
            part=self.part,
            history=self.history,
            final_eval=answer,
            manifest=self.manifest,
            sites=self.sites,
            traffic_rows=self.comm.ledger.to_rows(),
            wall_s=time.perf_counter() - self.t0,
            resumed_from=self.resumed_from,
            site_errors=self.all_site_errors(),
            extra={"selection": self.selection, **self.checkpoint_extra()},
        )


def run_federation(
    grid: Grid, cfg: RunConfig, progress: ProgressHook | None = None, stop: threading.Event | None = None
) -> FederationResult:
    """Run the whole federation of ``cfg`` over ``grid`` (see the module docstring for the steps).

    Args:
        grid: Flower's Grid of the running ServerApp.
        cfg: the resolved run config.
        progress: called with ``(event, info)`` on ``connected`` (``sites``), ``resumed`` (``round``: the last
            finished round), ``statistics`` (``columns``), ``site_error`` (``round``, ``action``, ``site_id``,
            ``error``), ``round`` (the row of ``rounds.csv``), ``selected`` (the round selection) and ``evaluating``.
        stop: set it to stop the run at the next wait for the sites (Ctrl-C, SIGTERM in the process that runs the
            engine); the checkpoint and ``rounds.csv`` are those of the last finished round.

    Raises:
        FederationError: sites missing or inconsistent, no state folder, or every round aborted.
        StateError: a checkpoint of another training configuration.
        fcd_secure.federation.messaging.RunStopped: ``stop`` was set.
    """
    return TrainingLoop(grid, cfg, progress, stop).run()


def select_round(cfg: RunConfig, history: list[dict]) -> dict:
    """The evaluated round the run answers with (``federation.select``; ``queries.selection.choose_round``), marked
    ``selected`` in ``history``'s rows."""
    last = int(history[-1]["round"]) if history else cfg.federation.rounds
    scores = [RoundScore.from_round(r) for r in history if r.get("selection")]
    if cfg.federation.select == "last":
        choice = {**choose_round(scores, last), "rule": "last", "round": last,
                  "reason": "federation.select = 'last': the last round is kept"}
    else:
        choice = choose_round(scores, last)
    for r in history:
        r["selected"] = r["round"] == choice["round"]
    return choice


def check_signed_run(context: Context, environ: dict[str, str] | None = None) -> RunTicket | None:
    """Refuse, before anything runs, a deployed run the coordinator did not sign (docs/threats.md P34).

    The coordinator's processes pin its public key and the consortium in the environment they give the SuperLink
    (``COORDINATOR_KEY_ENV``, ``CONSORTIUM_ENV``), which its executor passes on to this ServerApp: a run submitted
    by anyone else who reaches the Control API — even with the consortium's own app — writes no file and sends no
    message as the coordinator.

    Returns:
        the verified ticket, or ``None`` when the coordinator pinned no key (a local development deployment).

    Raises:
        fcd_secure.federation.run_ticket.RunTicketError: the coordinator pinned a key and the run is not signed by
            it for this consortium and exactly this run config.
    """
    env = os.environ if environ is None else environ
    key = env.get(COORDINATOR_KEY_ENV)
    if not key:
        return None
    return verify_run_ticket(dict(context.run_config or {}), coordinator_public_key=key,
                             consortium_id=env.get(CONSORTIUM_ENV) or None, fab_sha256=None)


def accept_run_start(ticket: RunTicket, run_id: int, run_cfg: RunConfig) -> None:
    """The server uses a signed run start once (docs/threats.md P52): recorded in the server's own state
    (``<state root>/_server/accepted_runs.json``), a ticket already run under another Flower run id, or first seen
    after its expiry, is refused before the run folder is touched (a replay would overwrite it).

    Raises:
        fcd_secure.federation.run_ticket.RunTicketError: a replayed or expired run start.
    """
    root = run_cfg.state_root()
    if root is not None:  # a run that keeps no state writes no folder a replay could overwrite
        AcceptedRuns(root / SERVER_DIR).accept(ticket, run_id)


def keep_to_own_keys(run_cfg: RunConfig, environ: dict[str, str] | None = None) -> None:
    """A deployed ServerApp gives up, before it starts, reading the coordinator's other keys (docs/threats.md P35):
    the files the coordinator's processes name in ``apps.sandbox.DENY_ENV`` (its signing key, the SuperLink's TLS
    key); and writing anywhere but beneath its run folder, the run's state root and a private temporary folder in
    the server state (P50: no ``.pth`` in site-packages, no renamed signing key).

    Raises:
        fcd_secure.apps.sandbox.SandboxError: files are named and the kernel cannot restrict the process (Landlock,
            Linux ≥ 5.13); the run does not start without the restriction the coordinator asked for.
    """
    import tempfile  # noqa: PLC0415

    from fcd_secure.apps.sandbox import confine, denied_from_env  # noqa: PLC0415

    denied = denied_from_env(environ)
    if not denied:
        return
    made = [Path(p) for p in (run_cfg.out, run_cfg.state_root()) if p]
    root = run_cfg.state_root()
    scratch = (root / SERVER_DIR / "tmp") if root is not None else None
    for folder in [*made, *([scratch] if scratch else [])]:
        # created before the restriction: a new file directly in a folder on the way is unreadable
        folder.mkdir(parents=True, exist_ok=True)
    if scratch is not None:  # tempfile (and matplotlib's fallback config folder) writes here, not in /tmp
        os.environ["TMPDIR"] = tempfile.tempdir = str(scratch)
    confine(denied, writable=made, also_allow=made)


def later_imports() -> None:
    """What a deployed ServerApp imports only once its first messages are out: the model code with torch and Opacus
    (``federation.learner.build_model``, right after the sites' hello), ``scipy.stats`` (the natural-course check of
    the closing evaluation, ``evaluation.natural_course``; with it ``scipy.special`` and ``scipy.optimize``, which
    ``evaluation.propensity`` imports at its first fit), matplotlib (the run folder's plots, ``evaluation.plots``)
    and pandas (the run folder's traffic table, ``apps.outputs.write_run_folder``)."""
    import pandas  # noqa: F401, PLC0415
    import scipy.stats  # noqa: F401, PLC0415

    import fcd_secure.evaluation.plots  # noqa: F401, PLC0415
    import fcd_secure.model.networks  # noqa: F401, PLC0415


def import_in_background(load: Callable[[], None] = later_imports) -> threading.Thread:
    """Run ``load`` (imports) in a daemon thread while the caller goes on (a deployed ServerApp: waiting for its
    sites' hello, a network round trip of seconds). Measured on one deployed 4-site run (a sampler of the ServerApp's
    main thread): torch and Opacus took a quarter of its wall time, imported one after the other with the hello wait.

    Nothing depends on the thread: the code that needs a module imports it as it always did, and Python's per-module
    import lock makes it wait for an import the thread has under way (importlib, "The import system": a module is
    initialised once). An import that fails in the thread is reported by it (``threading.excepthook``) and fails
    again, with the same error, where the run needs the module: nothing is skipped.
    """
    thread = threading.Thread(target=load, name="fcd-later-imports", daemon=True)
    thread.start()
    return thread


def make_server_app(
    cfg: RunConfig | None = None,
    progress: ProgressHook | None = None,
    sink: dict | None = None,
    stop: threading.Event | None = None,
) -> ServerApp:
    """A ServerApp bound to ``cfg`` (simulation) or reading ``fcd-config`` from the run config (deployment).

    The run folder is written inside the ServerApp, so both engines produce the same files; ``sink`` (if given)
    also receives the ``FederationResult`` for in-process callers; ``stop`` is :func:`run_federation`'s. A deployed
    run start that carries a signed question (``federation.asked_runs``) asks it of a finished run instead
    (``apps.whatif_app.answer_question``): no training, the answer under ``<out>/whatif/``.
    """
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        ticket = None
        if cfg is None:  # the Deployment Engine's grid: replies are pulled with Flower's 1 s-doubling backoff
            shorten_grid_backoff()
            ticket = check_signed_run(context)
        run_cfg = config_from_context(context, cfg)
        if ticket is not None:
            accept_run_start(ticket, int(context.run_id), run_cfg)
        if cfg is None:
            keep_to_own_keys(run_cfg)
            # a fresh process: its later imports overlap its first messages. Started only now: a signed run start
            # only, and confined like the thread that starts it (Landlock restricts the calling thread and the
            # threads it creates after, landlock_restrict_self(2))
            import_in_background()
            question = question_start_of(context.run_config, RUN_CONFIG_KEY)
            if question is not None:  # the coordinator's signed question about a finished run: nothing is trained
                from fcd_secure.apps.whatif_app import answer_question  # noqa: PLC0415 - it builds on this module's loop

                answer = answer_question(grid, run_cfg, question)
                if sink is not None:
                    sink["result"] = answer
                return
        result = run_federation(grid, run_cfg, progress, stop)
        if run_cfg.out:
            write_run_folder(run_cfg.out, run_cfg, result)
        if sink is not None:
            sink["result"] = result

    return app


#: Deployment entry point (``serverapp = "fcd_secure.apps.server_app:app"``).
app = make_server_app(None)
