"""``SiteRuntime``: everything one site does, independent of Flower's process model.

A site is identified by its *site id* (``node_config["site-id"]`` in deployment, ``site-<partition-id>`` in
simulation), never by Flower's random node id. Its private state lives on disk (``federation.state``) and is
loaded for every message, because in deployment every message runs in a fresh ``flwr-clientapp`` process and in
simulation one Ray actor serves every site (the pinned Flower's simulation engine: module globals leak across
simulated nodes; ``Context.state`` is lost on restart). The only process-wide caches are the loaded data split,
which is a pure function of the run config, and the manifest, a pure function of the model config and the data's
dims.

Paper §III "Decoupled synchronisation": ``train_round`` loads Θs_i from disk, sets the global Θc, trains one local
epoch on the site's own data and returns only Θc (or every parameter but the site-bound ones in the "w/o DSS"
ablation). Θs_i, the optimiser and RNG state are committed to disk atomically before the reply leaves.

The run config a message carries is a *request*: the site's own policy (``federation.site_policy``) decides the
effective settings (``SiteRuntime.cfg``), and a request asking for less protection is refused on every message
(:meth:`SiteRuntime.admit`, recorded by the egress gate).
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np

from fcd_secure._io import Kept
from fcd_secure.audit import Refusal
from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.queries.cohort import COHORT_SLOT, CohortRecord, select_rows
from fcd_secure.federation.learner import SiteData
from fcd_secure.federation.asked_runs import (
    ANSWERED_SLOT,
    WHATIF_RULE,
    AnsweredRun,
    AnsweredRuns,
    QuestionStart,
    check_question,
    question_start_of,
    theta_digest,
)
from fcd_secure.federation.records import EVALUATE_MESSAGE_TYPE, RUN_CONFIG_KEY, TRAIN_MESSAGE_TYPE
from fcd_secure.federation.run_ticket import ticket_session_id
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_MODEL_KEY
from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY, statistics_from_config
from fcd_secure.federation.site_policy import SitePolicy, load_site_policy
from fcd_secure.federation.state import SiteState, StateError
from fcd_secure.manifest import FULL, THETA_C, THETA_S, Manifest

#: the site's record of its data cut (``SiteRuntime._record_split``)
SPLIT_SLOT = "split.json"
#: Message types that carry numbers in clear: refused by a site in secure mode (P20).
PLAIN_MESSAGE_TYPES = (TRAIN_MESSAGE_TYPE, EVALUATE_MESSAGE_TYPE)


def default_site_id(site_index: int) -> str:
    return f"site-{int(site_index):02d}"


#: each (model config, data dims)'s Θc/Θs manifest: a pure function of the two (``learner.build_model``), read by the
#: egress gate on every message; building a model to read it costs more than the rest of the gate's context
_MANIFESTS: Kept[tuple[str, tuple[tuple[str, int], ...]], Manifest] = Kept(16)


class SiteRuntime:
    """One site: identity, policy, data, model, on-disk state. Built per message; cheap apart from the model build.

    Args:
        cfg: the run config as requested (the server's, or the simulation's).
        site_id: the site's stable id.
        site_index: the site's index in the federation (its data slice in a simulated split).
        state_root: the folder holding this site's state directory.
        policy: the site's own policy; ``None`` loads it from ``<state_root>/<site_id>/site_policy.toml`` (or the
            strict defaults).
        own_table: ``(spec, table)`` of a deployed site's own table (node config ``own-spec``/``own-table``, set by
            ``fcd site start``); the request's data section then names nothing the site reads.
    """

    def __init__(
        self, cfg: RunConfig, site_id: str, site_index: int, state_root: str, policy: SitePolicy | None = None,
        own_table: tuple[str, str] | None = None,
    ) -> None:
        import torch  # noqa: PLC0415

        self.site_id = site_id
        self.site_index = int(site_index)
        self.own_table = own_table
        self.state = SiteState(state_root, site_id)
        self.policy = policy if policy is not None else load_site_policy({}, state_root, site_id)
        self.request = cfg
        #: the effective settings (within the policy) and, if the request asks for less, the refusal
        self.cfg, self.refusal = self.policy.admit(cfg)
        if torch.get_num_threads() != self.cfg.federation.site_threads:
            torch.set_num_threads(self.cfg.federation.site_threads)
        #: the signed session id of the deployed run this message belongs to (``from_context``; None: simulation)
        self.run_session: str | None = None
        #: the signed question of a question run about an earlier deployed run (``federation.asked_runs``)
        self.question: QuestionStart | None = None
        self._data: SiteData | None = None
        #: the consortium's standardisation statistics of this request (``data.standardize = "secure"``)
        self.statistics: dict[str, list[float]] | None = None
        #: the consortium's shared behaviour model of this request (``config.EvaluationSection.shares_behaviour_model``)
        self.behaviour = None
        self._model = None
        self._manifest = None

    # -- construction from a Flower Context --------------------------------------------------------------
    @classmethod
    def from_context(cls, context, cfg: RunConfig, *, own_config: bool = True) -> "SiteRuntime":
        """The site of a message: identity and state folder from ``node_config`` (``site-id``, ``site-index`` or
        ``partition-id``, ``state-dir``, ``site-policy``); the run's ``state_dir`` only when ``own_config`` (the
        config is the site's own, as in simulation), never from a config the server sent.

        Raises:
            StateError: the site cannot tell which site it is or where its state lives.
            SitePolicyError: the site's policy file is missing (when named) or invalid.
        """
        nc = dict(context.node_config)
        if "site-index" in nc:
            index = int(nc["site-index"])
        elif "partition-id" in nc:
            index = int(nc["partition-id"])
        else:
            raise StateError("node_config has neither 'site-index' nor 'partition-id': cannot tell which site this is")
        site_id = str(nc.get("site-id") or default_site_id(index))
        state_root = str(nc.get("state-dir") or (cfg.state_dir if own_config else None) or "")
        if not state_root:
            raise StateError("no state directory: set node_config 'state-dir' (a server never chooses it)")
        own = (str(nc["own-spec"]), str(nc["own-table"])) if nc.get("own-spec") and nc.get("own-table") else None
        rt = cls(cfg, site_id, index, state_root, load_site_policy(nc, state_root, site_id), own_table=own)
        if not own_config:  # a deployed run: its executor verified the coordinator's signed run start (P34)
            rt.run_session = ticket_session_id(context.run_config)
            rt.question = question_start_of(context.run_config, RUN_CONFIG_KEY)
        return rt

    # -- admission -----------------------------------------------------------------------------------------
    def admit(self, message_type: str) -> None:
        """Refuse a message the site's policy does not allow, before anything is computed.

        Raises:
            Refusal: ``site_policy`` (the run's config asks for less protection than the policy; every message of
                that run is refused) or ``downgrade`` (a clear-text action of a site in secure mode, P20).
        """
        if self.refusal is not None:
            raise self.refusal
        if self.cfg.federation.secure_aggregation and message_type in PLAIN_MESSAGE_TYPES:
            raise Refusal("downgrade", "message", message_type)

    def refuse_in_question_run(self, what: str) -> None:
        """A question run answers its one signed question, nothing else: no training round (its DP spend, its
        updates) and no round-0 moment sums (P64).

        Raises:
            Refusal: rule ``whatif_run``, key ``what``.
        """
        if self.question is not None:
            raise Refusal(WHATIF_RULE, "message", what)

    # -- lazily built parts ------------------------------------------------------------------------------
    @property
    def data(self) -> SiteData:
        if self._data is None:
            if self.own_table is not None:
                from fcd_secure.data.cohorts import site_secret  # noqa: PLC0415

                spec, table = self.own_table
                # the cut is the site's: its own secret, its policy's fractions (admit), never the run's seed (P40)
                self._data = learner.load_own_site_data(self.cfg, spec, table, self.site_index, self.statistics,
                                                        self.behaviour, secret=site_secret(self.state.dir))
            else:
                self._data = learner.load_site_data(self.cfg, self.site_index, self.statistics, self.behaviour)
            self._record_split(self._data)
        return self._data

    def _record_split(self, data: SiteData) -> None:
        """Record the site's cut in ``slots/split.json`` (fractions, rows per side, a digest of each side's entities
        under the split secret's key order): an operator and ``fcd audit`` can see that every run used one cut."""
        import hashlib  # noqa: PLC0415
        import json  # noqa: PLC0415

        from fcd_secure._io import atomic_write_text  # noqa: PLC0415
        from fcd_secure.data.cohorts import row_ids  # noqa: PLC0415

        def digest(ds) -> str | None:
            return None if ds is None else hashlib.sha256("\n".join(sorted(set(row_ids(ds)))).encode()).hexdigest()[:16]

        parts = {"train": data.train, "validation": data.validation, "test": data.test}
        entry = {"test_fraction": self.cfg.data.test_fraction, "validation_fraction": self.cfg.data.validation_fraction,
                 "rows": {k: (0 if v is None else int(v.n)) for k, v in parts.items()},
                 "entities_sha256": {k: digest(v) for k, v in parts.items()}}
        path = self.state.slot(SPLIT_SLOT)
        try:
            doc = json.loads(path.read_text()) if path.exists() else {}
        except ValueError:
            doc = {}
        cuts = doc.get("cuts", [])
        if entry not in cuts:
            atomic_write_text(path, json.dumps({"cuts": cuts + [entry]}, indent=1, sort_keys=True))

    @property
    def secure_statistics(self) -> bool:
        """Whether this site standardises with the secure round 0's statistics (always, with its own table)."""
        return self.own_table is not None or self.cfg.data.standardize == "secure"

    def adopt_statistics(self, config: dict[str, Any]) -> None:
        """Take the consortium's standardisation statistics from a training or evaluation request (secure mode).

        Raises:
            StateError: the run standardises securely and the request carries no statistics (the site would
                otherwise train on unscaled data), or they do not fit the site's columns.
        """
        if not self.secure_statistics:
            return
        stats = statistics_from_config(config)
        if stats is None:
            raise StateError("data.standardize = 'secure' and the request carries no standardisation statistics")
        self.statistics = stats
        self._data = None

    def adopt_behaviour(self, config: dict[str, Any]) -> None:
        """Take the consortium's shared behaviour model from an evaluation request (``evaluation.behaviour_model =
        "shared"`` or ``"shared_slopes"``, completed with the site's own intercepts: ``federation.learner
        .with_propensities``): the site's validation and test rows are then weighted by it, never by a model of its
        own.

        Raises:
            StateError: the run shares the behaviour model and the request carries none (the site would answer
                without the propensities the run asked for), or one with or without per-site intercepts where the
                run's setting says otherwise.
            SharedFitError: the model does not fit the site's dimensions.
        """
        from fcd_secure.federation.secure.secure_behaviour import step_from_config  # noqa: PLC0415

        ev = self.cfg.evaluation
        if not ev.shares_behaviour_model:
            return
        step = step_from_config(config, BEHAVIOUR_MODEL_KEY, self.dims["n_actions"])
        if step is None:
            raise StateError(f"evaluation.behaviour_model = {ev.behaviour_model!r} and the request carries no shared "
                             "behaviour model")
        if step.own_intercepts != ev.own_intercepts:
            # the site's own settings say whether it completes the model with its own intercepts, not the server's
            raise StateError(f"evaluation.behaviour_model = {ev.behaviour_model!r} and the request's shared model "
                             f"{'has' if step.own_intercepts else 'has no'} per-site intercepts")
        self.behaviour = learner.shared_behaviour_model(self.dims, step)
        self._data = None

    def behaviour_fit_sums(self, config: dict[str, Any]) -> dict[str, Any]:
        """One step of the consortium's shared behaviour model: this site's sums over its training rows as loaded
        (``federation.learner.behaviour_fit_sums``; ``federation.secure.secure_behaviour``).

        Raises:
            StateError: the run does not share the behaviour model (the site's own never leaves it), the request
                carries no step, or a step with or without per-site intercepts where the run's setting says otherwise.
            SharedFitError: more coefficients than a shared fit takes.
        """
        from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_STEP_KEY, step_from_config  # noqa: PLC0415

        self.refuse_in_question_run("behaviour_fit")
        if not self.cfg.evaluation.shares_behaviour_model or self.statistics is not None:
            raise StateError("behaviour-model sums are only taken in a run with evaluation.behaviour_model = "
                             "'shared' or 'shared_slopes', over the rows as loaded")
        step = step_from_config(config, BEHAVIOUR_STEP_KEY, self.dims["n_actions"])
        if step is None:
            raise StateError(f"a behaviour-model step without its {BEHAVIOUR_STEP_KEY!r}")
        if step.coef is not None and step.own_intercepts != self.cfg.evaluation.own_intercepts:
            # the site's settings decide whether its intercepts are profiled out of what it sends
            raise StateError(f"evaluation.behaviour_model = {self.cfg.evaluation.behaviour_model!r} and a "
                             f"behaviour-model step {'with' if step.own_intercepts else 'without'} per-site intercepts")
        return learner.behaviour_fit_sums(self.data, step)

    def preprocessing_sums(self) -> dict[str, Any]:
        """Round 0: this site's moment sums over its unscaled non-test rows (``federation.secure.secure_stats``).

        Raises:
            StateError: the run does not standardise securely (its data are scaled already).
        """
        from fcd_secure.data.moments import moment_sums  # noqa: PLC0415

        self.refuse_in_question_run("moment_sums")
        if not self.secure_statistics or self.statistics is not None:
            raise StateError("moment sums are only taken in a secure-standardisation run, over unscaled data")
        sums = moment_sums(self.data.train)
        if self.data.validation is not None:
            # the whole training split (validation rows included), as the pooled statistics of a simulation are; the
            # site's fixed non-test rows, so two runs can never differ by one patient (P40)
            extra = moment_sums(self.data.validation)
            sums = {k: (np.asarray(v) + np.asarray(extra[k])).tolist() if isinstance(v, list) else v + extra[k]
                    for k, v in sums.items()}
        return sums

    @property
    def dataset_train(self):
        return self.data.train

    @property
    def dataset_test(self):
        return self.data.test

    @property
    def dims(self) -> dict[str, int]:
        return learner.dims_of(self.data.train, self.data.n_sites)

    @property
    def model(self):
        if self._model is None:
            self._model = learner.build_model(self.cfg, self.dims)
        return self._model

    @property
    def manifest(self) -> Manifest:
        if self._manifest is None:
            key = (learner.model_config(self.cfg).model_dump_json(), tuple(sorted(self.dims.items())))
            self._manifest = _MANIFESTS.get(key, lambda: self.model.manifest())
        return self._manifest

    @property
    def secagg_policy(self):
        """The secure-aggregation parameters this site pins (``[secagg]`` of its policy)."""
        return self.policy.secagg

    @property
    def layout_hash(self) -> str:
        return str(self.manifest.layout_hash)

    def identity_private_key(self) -> bytes:
        """Raw Ed25519 private key of this site (created on first use, kept in the site state directory)."""
        return self.state.identity_private_key()

    # -- training ----------------------------------------------------------------------------------------
    def train_round(self, global_theta: dict[str, np.ndarray], round_config: dict[str, Any]) -> tuple[dict[str, np.ndarray], int, dict]:
        """Train one round from the global parameters; returns ``(synchronised params, n_train, metrics)``.

        ``round_config``: ``server-round`` (int), ``part`` (``THETA_C`` for DSS, ``FULL`` for the w/o-DSS
        ablation), ``local-epochs``, ``min-local-steps`` (the round's passes: ``learner.round_epochs``). The returned
        arrays are exactly the manifest entries of ``part``.
        """
        import torch  # noqa: PLC0415

        self.refuse_in_question_run("training")
        server_round = int(round_config["server-round"])
        self.adopt_statistics(round_config)
        part = str(round_config.get("part", THETA_C))
        if part not in (THETA_C, FULL):
            raise ValueError(f"round config 'part' must be {THETA_C!r} or {FULL!r}, got {part!r}")
        train = self.policy.training_data(self.data.train)  # the site decides whether its propensities weight training
        local_epochs = int(round_config.get("local-epochs", self.cfg.federation.local_epochs))
        epochs = learner.round_epochs(local_epochs,
                                      int(round_config.get("min-local-steps", self.cfg.federation.min_local_steps)),
                                      train.n, self.cfg.model.batch_size)
        self.policy.check_local_passes(epochs, local_epochs)  # the site caps a round's work, not the server (P69)
        self.state.check_layout(self.layout_hash)
        snap = self.state.begin_round(server_round)

        model = self.model
        if snap is not None:
            model.set_params(THETA_S, snap.theta_s)
        model.set_params(part, global_theta)  # strict: exactly the part's names and shapes
        optimizer = model.optimizer
        if snap is not None and snap.optimizer_state is not None:
            optimizer.load_state_dict(torch.load(io.BytesIO(snap.optimizer_state), weights_only=True))
        if snap is not None and snap.rng_state is not None:
            torch.set_rng_state(torch.load(io.BytesIO(snap.rng_state), weights_only=True))

        seed = learner.round_seed(self.cfg.seed, server_round, self.site_index)
        if self.cfg.dp.enabled:  # === the DP-SGD seam: the privacy layer wraps model, optimiser and loader ===
            metrics = learner.train_local_dp(
                model, train, self.cfg, self.site_index, self.data.n_sites, epochs, seed, optimizer,
                self.state.dir, server_round,
            )
        else:
            metrics = learner.train_local(
                model, train, self.cfg, self.site_index, self.data.n_sites, epochs=epochs, seed=seed, optimizer=optimizer
            )
        out = model.get_params(part)
        theta_s = model.get_params(THETA_S)
        for name, arr in out.items():
            if not np.all(np.isfinite(arr)):
                raise FloatingPointError(f"local training produced a non-finite parameter ({name})")
        opt_buf, rng_buf = io.BytesIO(), io.BytesIO()
        torch.save(optimizer.state_dict(), opt_buf)
        torch.save(torch.get_rng_state(), rng_buf)
        self.state.commit(server_round, self.layout_hash, theta_s, opt_buf.getvalue(), rng_buf.getvalue())
        n = int(self.data.train.n)
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float, np.floating, np.integer))}
        clean["n"] = float(n)
        return out, n, clean

    # -- evaluation ----------------------------------------------------------------------------------------
    def load_for_eval(self, global_theta: dict[str, np.ndarray], part: str = THETA_C, restore_round: int | None = None):
        """The site's model with the given global parameters and its own latest Θs, or the Θs it kept when it scored
        ``restore_round`` (the round the run's selection chose, ``queries.selection``); nothing is written."""
        return self._model_with(self._theta_s_of(restore_round), global_theta, part)

    def _theta_s_of(self, restore_round: int | None) -> dict[str, np.ndarray] | None:
        """The site's Θs kept when it scored ``restore_round``, else its latest (None: the initial Θs)."""
        from fcd_secure.queries.selection import KeptParams  # noqa: PLC0415

        if restore_round is not None:
            return KeptParams(self.state.slot("selection_theta_s")).load(restore_round)
        snap = self.state.load()
        return None if snap is None else snap.theta_s

    def _model_with(self, theta_s: dict[str, np.ndarray] | None, global_theta: dict[str, np.ndarray], part: str):
        model = self.model
        if theta_s is not None:
            model.set_params(THETA_S, theta_s)
        # "w/o DSS" (part = full) synchronises Θs too (not its site-bound part): the global one replaces the local copy
        model.set_params(part, global_theta)
        # the range of its own training rows bounds the rollouts (model.clamp_contexts); kept here, never sent
        model.keep_context_range(self.data.train)
        return model

    def answered_run(self, global_theta: dict[str, np.ndarray], request) -> AnsweredRun:  # noqa: ANN001
        """What this site answered the run a question run asks about (its own record, never the server's say-so),
        once the message's Θc and question are that run's and the coordinator's as signed (P61-P63).

        Raises:
            Refusal: rule ``whatif_run`` (``federation.asked_runs``).
        """
        assert self.question is not None
        answered = AnsweredRuns(self.state.slot(ANSWERED_SLOT)).load(self.question.run_session)
        check_question(self.question, None if request.whatif is None else request.whatif.to_json(), answered,
                       global_theta)
        return answered

    def evaluation_rows(self, requested: int | None) -> np.ndarray:
        """The test rows this site evaluates when ``requested`` rows are asked for (only a request), recorded.

        Raises:
            Refusal: rule ``eval_cohort`` (``queries.cohort``).
        """
        record = CohortRecord(self.state.slot(COHORT_SLOT))
        return select_rows(self.data.test, self.site_id, requested, self.policy.evaluation, record)

    def evaluate(self, global_theta: dict[str, np.ndarray], eval_config: dict[str, Any]) -> dict[str, float]:
        """Aggregate-only evaluation sums of this site over the rows it chose (``queries.evaluation``).

        Raises:
            EvaluationRequestError: a request field of the wrong type (``queries.request``).
            Refusal: rule ``eval_cohort`` (the cohort rules of ``queries.cohort``).
        """
        from fcd_secure.queries.evaluation import site_metrics  # noqa: PLC0415
        from fcd_secure.queries.request import EvaluationRequest  # noqa: PLC0415
        from fcd_secure.queries.selection import KeptParams  # noqa: PLC0415

        request = EvaluationRequest.from_config(eval_config)
        if self.question is not None:  # a question about an earlier deployed run: its model from the site's record
            answered = self.answered_run(global_theta, request)
            # the scale and the shared behaviour model the site answered the run with, from its record (the
            # request's own are not read)
            self.adopt_statistics({STATISTICS_KEY: answered.statistics} if answered.statistics else {})
            if self.cfg.evaluation.shares_behaviour_model and answered.behaviour is None:
                # refused rather than answered with propensities the run did not use
                raise StateError("a question about a run with a shared behaviour model, and the site's record of "
                                 "the run keeps no shared model")
            self.adopt_behaviour({BEHAVIOUR_MODEL_KEY: answered.behaviour} if answered.behaviour else {})
            rows = self.evaluation_rows(request.max_rows)
            model = self._model_with(answered.theta_s, global_theta, request.part)
            return site_metrics(model, self.data, self.cfg, request, rows=rows, site_dir=self.state.dir,
                                questions=self.policy.questions)
        self.adopt_statistics(eval_config)
        self.adopt_behaviour(eval_config)
        theta_s = self._theta_s_of(request.restore_round)
        if self.run_session is not None and not request.quick:
            # the deployed run's answer: what it is answered with is kept under the run's signed session id, before
            # the cohort rules may decline it, so a later question about the run is answered with exactly this
            AnsweredRuns(self.state.slot(ANSWERED_SLOT)).record(self.run_session, theta_s, theta_digest(global_theta),
                                                                 request.statistics,
                                                                 request.behaviour if self.behaviour is not None
                                                                 else None)
        rows = self.evaluation_rows(request.max_rows)
        model = self._model_with(theta_s, global_theta, request.part)
        if request.keep_round is not None:  # a scored round: keep this Θs for the selection
            snap = self.state.load()
            KeptParams(self.state.slot("selection_theta_s")).keep(request.keep_round,
                                                                   None if snap is None else snap.theta_s)
        # a scored round's validation split is scored whole, so its floor is the one a whole test split must reach
        # (P22; SiteContext.floor)
        return site_metrics(model, self.data, self.cfg, request, rows=rows, site_dir=self.state.dir,
                            questions=self.policy.questions)
