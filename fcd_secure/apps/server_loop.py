"""The one server loop of every ServerApp of the package: open, the rounds, one evaluation, close.

As in Flower's strategies (``flwr.serverapp.strategy.Strategy.start`` in the pinned Flower: the base class owns the loop, a
strategy fills in what a round configures and aggregates), :class:`ServerLoop` owns the order every server run
follows, and its subclasses fill in the hooks (:meth:`ServerLoop.on_open`, :meth:`ServerLoop.train_round`,
:meth:`ServerLoop.evaluate`, :meth:`ServerLoop.result`):

1. open: wait for the sites (:func:`wait_for_nodes`), ``query.hello`` each one (:func:`hello`: site id, site index,
   dims, manifest layout hash), build the model from the run seed (every site builds the same initialisation),
   check its layout against the sites' and record it in the server's audit ledger;
2. resume from ``<state root>/_server/checkpoint.npz`` if present (same training hash required) and rewrite
   ``<out>/rounds.csv`` from its history;
3. per round not yet done: the subclass's round (:meth:`ServerLoop.train_round` gives the row of ``rounds.csv``),
   then the checkpoint, the server ledger's signed checkpoint of the round, one line appended to ``rounds.csv``;
4. one evaluation (:meth:`ServerLoop.evaluate`);
5. close: the sites' audit receipts still owed, in one last message each, and the server ledger closed.

The training federation (``apps.server_app.TrainingLoop``) runs ``federation.rounds`` rounds; the what-if question
(``apps.whatif_app.WhatIfLoop``) is the same loop with no training round (so no checkpoint and no ``rounds.csv``
are touched) and one evaluation that carries the question.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

import numpy as np
from flwr.app import ConfigRecord, RecordDict
from flwr.serverapp import Grid

from fcd_secure.apps.outputs import RoundsLog
from fcd_secure.audit import (
    RECEIPTS_MESSAGE_TYPE,
    SITE_ERRORS,
    ServerAudit,
    load_or_create_identity_key,
    site_error_name,
)
from fcd_secure.config import RunConfig
from fcd_secure.errors import FcdError
from fcd_secure.federation import learner
from fcd_secure.federation.flows import synchronised_part
from fcd_secure.federation.messaging import NO_REPLY, Comm
from fcd_secure.federation.records import HELLO_MESSAGE_TYPE, REC_HELLO
from fcd_secure.federation.sampler import ClientSampler
from fcd_secure.federation.secure.secure_evaluation import SecureEvaluation, secure_evaluation_for
from fcd_secure.federation.state import SERVER_DIR, ServerCheckpoint, StateError
from fcd_secure.manifest import Manifest, Part

ProgressHook = Callable[[str, dict], None]
Answer = TypeVar("Answer")  # what a loop's run returns


class FederationError(FcdError, RuntimeError):
    """The federation cannot proceed (sites missing, inconsistent sites, every round aborted).

    Args:
        message: what happened, naming the sites.
        site_errors: the sites' error reports so far (``{"round", "action", "site_id", "error"}``).
    """

    def __init__(self, message: str, site_errors: list[dict] | None = None) -> None:
        super().__init__(message)
        self.site_errors = list(site_errors or [])


@dataclass
class SiteInfo:
    node_id: int
    site_id: str
    site_index: int
    layout_hash: str
    dims: dict[str, int]
    #: its propensity status (``federation.learner.BEHAVIOUR_CODES``)
    behaviour: str = "logged"


def describe_site_error(site_id: str, error: str) -> str:
    """``site-03: data does not match the spec`` (the reason of the audit's closed vocabulary, or no reply)."""
    if error == NO_REPLY:
        return f"{site_id}: did not answer in time"
    return f"{site_id}: {SITE_ERRORS.get(error, SITE_ERRORS['internal'])[1]}"


def error_rows(comm: Comm, since: int = 0) -> list[dict]:
    """The sites' error reports from the ``since``-th on, as ``summary.json`` and :class:`FederationError` give
    them, each by the site's name once ``hello`` has named its node (Flower's node ids are no identity)."""
    return [
        {"round": e.round, "action": e.action, "site_id": comm.site_of.get(e.node_id, e.site_id), "error": e.error}
        for e in comm.site_errors[since:]
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
            error_rows(comm, since),
        )
    infos: list[SiteInfo] = []
    for nid in node_ids:
        h = replies[nid].content[REC_HELLO]
        dims = {k[len("dim-"):]: int(v) for k, v in h.items() if k.startswith("dim-")}
        behaviour = str(h.get("behaviour", "logged"))
        if behaviour not in learner.BEHAVIOUR_CODES:
            raise FederationError(f"{h['site-id']} says its propensities are {behaviour!r}, not one of "
                                  f"{sorted(learner.BEHAVIOUR_CODES)}")
        infos.append(SiteInfo(nid, str(h["site-id"]), int(h["site-index"]), str(h["layout-hash"]), dims, behaviour))
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


def name_sites_without_propensities(answer: dict, sites: list[SiteInfo]) -> None:
    """Issue 43 item 6: the answer names the sites whose propensities were missing, and why (from their hello: the
    sums of ``queries.propensities`` say how many, under secure aggregation never which)."""
    missing = {s.site_id: learner.BEHAVIOUR_CODES[s.behaviour] for s in sites if s.behaviour.startswith("none")}
    if isinstance(answer.get("propensities"), dict):
        answer["propensities"]["missing_at"] = missing


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


class ServerLoop(Generic[Answer]):
    """The server's run over ``grid`` (module docstring: open, rounds, evaluation, close); :meth:`run` runs it once.

    A subclass sets :attr:`rounds` and fills in the hooks; the state the hooks share is on the instance:
    ``comm`` (the server's door to the sites), ``sites`` and ``order`` (their node ids by site index), ``manifest``,
    ``part`` (the synchronised part), ``theta`` (the global parameters), ``secure_eval`` (the evaluation's secure
    transport, ``None`` in a plain run), ``sampler``, ``history`` (the rows of the rounds so far, a resumed run's
    included), ``start`` (the first round this process runs) and ``saved`` (the resumed checkpoint's extra fields).

    Args:
        grid: Flower's Grid of the running ServerApp.
        cfg: the resolved run config.
        progress: called with ``(event, info)`` on ``connected`` (``sites``), ``resumed`` (``round``: the last
            finished round), ``round`` (the row of ``rounds.csv``) and whatever the hooks report.
        stop: set it to stop the run at the next wait for the sites (``federation.messaging.RunStopped``).
    """

    def __init__(
        self, grid: Grid, cfg: RunConfig, progress: ProgressHook | None = None, stop: threading.Event | None = None
    ) -> None:
        self.grid = grid
        self.cfg = cfg
        self.fed = cfg.federation
        self.n_sites = cfg.data.n_sites
        self.say: ProgressHook = progress or (lambda _event, _info: None)
        self.stop = stop
        self.t0: float  # perf_counter at the start of run(): the run's wall time
        self.sampler = ClientSampler(cfg.seed, self.n_sites, self.fed.clients_per_round)
        self.history: list[dict] = []
        self.start = 1
        self.saved: dict = {}
        self.comm: Comm
        self.sites: list[SiteInfo] = []
        self.order: list[int] = []
        self.manifest: Manifest
        self.part: Part
        self.theta: dict[str, np.ndarray] = {}
        self.secure_eval: SecureEvaluation | None = None
        self._checkpoint: ServerCheckpoint | None = None
        self._rounds_log: RoundsLog | None = None

    @property
    def rounds(self) -> int:
        """The training rounds of the run (0: an evaluation-only run, which keeps no checkpoint)."""
        return self.fed.rounds

    def run(self) -> Answer:
        """Open, resume, the rounds not yet done, the evaluation, close; returns :meth:`result`."""
        self.t0 = time.perf_counter()
        self.open()
        if self.rounds:
            self.resume()
        self.on_open()
        for rnd in range(self.start, self.rounds + 1):
            self.comm.round = rnd
            row = self.train_round(rnd)
            self.history.append(row)
            self.checkpoint(rnd)
            self.say("round", row)
        answer = self.evaluate()
        name_sites_without_propensities(answer, self.sites)
        self.close()
        return self.result(answer)

    # -- the loop's own steps ------------------------------------------------------------------------------------

    def open(self) -> None:
        """Connect the server's audit, identify the sites, build the model and check its layout against theirs.

        Raises:
            FederationError: no state folder, sites missing or inconsistent, or a model layout not the sites'.
        """
        fed = self.fed
        self.comm = Comm(self.grid, poll_s=fed.poll_s, audit=server_audit(self.cfg), stop=self.stop)
        self.comm.round = self.opening_round()
        nodes = wait_for_nodes(self.grid, self.n_sites, fed.node_wait_s)
        self.sites = hello(self.comm, nodes[:self.n_sites] if len(nodes) == self.n_sites else nodes,
                           fed.round_timeout_s, self.n_sites)
        self.order = [s.node_id for s in self.sites]
        self.say("connected", {"sites": [s.site_id for s in self.sites]})
        model = learner.build_model(self.cfg, self.sites[0].dims)
        self.manifest = model.manifest()
        if self.manifest.layout_hash != self.sites[0].layout_hash:
            raise FederationError("the server's model layout differs from the sites' (different code or config)")
        self.comm.audit.record_manifest(self.manifest)  # the layout the server runs with, for the auditor
        self.part = synchronised_part(self.cfg)
        self.theta = model.get_params(self.part)
        # in secure mode the evaluation sums travel through secure aggregation too: no per-site sum reaches the server
        self.secure_eval = secure_evaluation_for(self.cfg, self.manifest)

    def resume(self) -> None:
        """Continue from the run's checkpoint, if there is one, and rewrite ``rounds.csv`` from its history.

        Raises:
            StateError: a checkpoint of another training configuration, or of another model.
        """
        ckpt = self._checkpoint = ServerCheckpoint(state_root(self.cfg))
        if ckpt.exists():
            done, theta_ck, sampler_state, h, saved = ckpt.load()
            if h != self.cfg.training_hash():
                raise StateError(
                    f"{ckpt.path}: checkpoint belongs to a different training configuration; use a fresh state "
                    "directory"
                )
            if sorted(theta_ck) != sorted(self.theta):
                raise StateError(f"{ckpt.path}: checkpoint parameters do not match the model manifest")
            self.theta = {k: theta_ck[k].astype(self.theta[k].dtype) for k in self.theta}
            self.sampler.set_state(sampler_state)
            self.history = list(saved.get("history", []))
            self.saved = saved
            self.start = done + 1
            self.say("resumed", {"round": done})
        if self.cfg.out:
            self._rounds_log = RoundsLog(self.cfg.out)
            self._rounds_log.start(self.history)

    def checkpoint(self, rnd: int) -> None:
        """Round ``rnd`` is done: the checkpoint, the server ledger's signed checkpoint, its line in ``rounds.csv``."""
        assert self._checkpoint is not None  # resume() made it: a loop with rounds resumes first
        self._checkpoint.save(rnd, self.theta, self.sampler.get_state(), self.cfg.training_hash(),
                              extra={"history": self.history, **self.checkpoint_state()})
        self.comm.audit.checkpoint(rnd)  # signs the server ledger's checkpoint closing this round
        if self._rounds_log is not None:
            self._rounds_log.append(self.history[-1])

    def close(self) -> None:
        """Close the sites' ledgers (the receipts still owed, in one last message each) and the server's."""
        comm = self.comm
        comm.round = self.closing_round()
        comm.send(comm.audit.owed_nodes(), RECEIPTS_MESSAGE_TYPE, comm.audit.final_contents(), self.fed.round_timeout_s)
        comm.audit.close()

    # -- hooks ---------------------------------------------------------------------------------------------------

    def opening_round(self) -> int:
        """The protocol round ``hello`` is recorded under (0: before the first training round)."""
        return 0

    def on_open(self) -> None:
        """Called once the sites are identified and any checkpoint restored, before the first round."""

    def train_round(self, rnd: int) -> dict:
        """Run round ``rnd`` (update ``self.theta``); returns its row of ``rounds.csv``."""
        raise NotImplementedError(f"{type(self).__name__} runs {self.rounds} rounds but defines no train_round")

    def checkpoint_extra(self) -> dict:
        """Fields the checkpoint keeps besides the history (a resumed run finds them in ``self.saved``)."""
        return {}

    def checkpoint_state(self) -> dict:
        """What the checkpoint keeps besides the history: :meth:`checkpoint_extra` and what the loop itself
        carries across a resume."""
        return self.checkpoint_extra()

    def evaluate(self) -> dict:
        """The run's one evaluation after the rounds: the merged answer of the sites."""
        raise NotImplementedError

    def closing_round(self) -> int:
        """The protocol round of the closing receipts."""
        raise NotImplementedError

    def result(self, answer: dict) -> Answer:
        """What :meth:`run` returns, made once the ledgers are closed, from :meth:`evaluate`'s answer."""
        raise NotImplementedError
