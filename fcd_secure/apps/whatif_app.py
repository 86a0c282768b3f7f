"""The what-if ServerApp: the server loop with no training round and one evaluation that carries the question.

:class:`WhatIfLoop` fills in ``apps.server_loop.ServerLoop``: the sites are identified and the model checked as in
training, then Θc of the finished run goes to every site with the question (``queries.request.WhatIfRequest``) inside
an ordinary evaluation request, and the sites answer with the evaluation sums; nothing is trained, and the run's
checkpoint and ``rounds.csv`` are left as they are. The round continues the run's audit ledgers (the first round
number the server ledger has not used, the receipts, the checkpoints), so ``fcd audit verify`` covers the question
too. The engine that re-opens a run folder and runs this app is ``engines.whatif_run``; on a deployed run the
coordinator's signed question run reaches :func:`answer_question` through the deployed ServerApp
(``apps.server_app``, ``federation.asked_runs``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
from flwr.app import Context
from flwr.serverapp import Grid, ServerApp

from fcd_secure._io import atomic_write_text, jsonable, read_npz
from fcd_secure.apps.server_loop import ServerLoop
from fcd_secure.audit import ServerAudit
from fcd_secure.config import RunConfig
from fcd_secure.errors import FcdError
from fcd_secure.federation.asked_runs import QuestionStart
from fcd_secure.federation.records import config_from_context
from fcd_secure.queries.evaluation import evaluate_federated
from fcd_secure.queries.per_entity import WHATIF_DIR
from fcd_secure.queries.request import EvaluationRequest, WhatIfRequest
from fcd_secure.queries.selection import restored_round


class WhatIfError(FcdError, RuntimeError):
    """A run folder that cannot answer a what-if question (unfinished, no site state, another model layout)."""


def next_round(audit: ServerAudit) -> int:
    """The first round number the server ledger has not used (a later session continues the run's chain)."""
    rounds = [getattr(e, "round", None) for e in audit.ledger.entries()]
    return max((int(r) for r in rounds if r is not None), default=0) + 1


class WhatIfLoop(ServerLoop[dict[str, Any]]):
    """One evaluation-only round: identify the sites, send ``theta`` with ``request``, merge their sums, close the
    sites' and the server's audit ledgers for the round.

    Args:
        grid: Flower's Grid of the running ServerApp.
        cfg: the finished run's config (its state folder).
        theta: the finished run's global parameters (``theta_c.npz``).
        request: the question.
        restore_round: the round whose Θs each site answers with (the run's selected round).
        recorded: what the run's own evaluations sent its sites besides the question (:func:`recorded_fields`).
    """

    def __init__(self, grid: Grid, cfg: RunConfig, theta: dict[str, np.ndarray], request: WhatIfRequest,
                 restore_round: int | None = None, recorded: dict[str, str] | None = None) -> None:
        super().__init__(grid, cfg)
        self.asked = theta
        self.request = request
        self.restore_round = restore_round
        self.recorded = dict(recorded or {})

    @property
    def rounds(self) -> int:
        return 0

    def opening_round(self) -> int:
        return next_round(self.comm.audit)

    def on_open(self) -> None:
        """Take the run's Θc in place of the initial one, once it matches the model the sites build.

        Raises:
            WhatIfError: ``theta`` does not match the model the sites build.
        """
        expected, theta = self.theta, self.asked
        bad = sorted(set(expected) ^ set(theta)) or [k for k in expected if np.shape(theta[k]) != expected[k].shape]
        if bad:
            raise WhatIfError(f"theta_c.npz does not match the run's model ({bad[0]}); was the code or config changed?")
        self.theta = {k: np.asarray(theta[k], dtype=expected[k].dtype) for k in expected}

    def evaluate(self) -> dict[str, Any]:
        # a run in secure mode asks through secure aggregation too: its sites refuse a clear-text evaluation
        # the run's answers came from its selected round: Θc of that round (theta_c.npz) with each site's Θs of it
        request = EvaluationRequest.for_run(self.cfg, quick=False, part=self.part, whatif=self.request,
                                            restore_round=self.restore_round, **self.recorded)
        res = evaluate_federated(self.comm, self.order, self.theta, self.cfg, request, secure=self.secure_eval,
                                 round_id=self.comm.round)
        res["round"] = self.comm.round
        return res

    def closing_round(self) -> int:
        return self.comm.round + 1

    def result(self, answer: dict[str, Any]) -> dict[str, Any]:
        return answer


def ask_sites(grid: Grid, cfg: RunConfig, theta: dict[str, np.ndarray], request: WhatIfRequest,
              restore_round: int | None = None, recorded: dict[str, str] | None = None) -> dict[str, Any]:
    """Ask ``request`` of the sites on ``grid`` once (:class:`WhatIfLoop`), each site answering with its Θs of
    ``restore_round`` (the run's selected round; None: its latest) and what the run's evaluations sent it
    (``recorded``, :func:`recorded_fields`); returns the merged answer.

    Raises:
        FederationError: sites missing or inconsistent, or a model layout that is not the run's.
        WhatIfError: ``theta`` does not match the model the sites build.
    """
    return WhatIfLoop(grid, cfg, theta, request, restore_round, recorded).run()


def selected_round(run_dir: str | Path, cfg: RunConfig) -> int | None:
    """The round a finished run answered with (its ``summary.json`` selection; None: the last round's parameters)."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return restored_round(summary.get("selection"), cfg.federation.rounds)


def recorded_fields(run_dir: str | Path) -> dict[str, str]:
    """The :class:`~fcd_secure.queries.request.EvaluationRequest` fields a finished run's evaluations sent its sites
    besides the question, from its ``summary.json``: the consortium's standardisation statistics
    (``data.standardize = "secure"``) and its shared behaviour model (``evaluation.behaviour_model = "shared"`` or
    ``"shared_slopes"``), each where the run had one, so that a question is answered on the rows and with the
    propensities the run used."""
    summary = json.loads((Path(run_dir) / "summary.json").read_text())
    return {field: json.dumps(summary[key]) for field, key in (("statistics", "standardization"),
                                                               ("behaviour", "behaviour_model"))
            if summary.get(key) is not None}


def run_round_values(run_dir: str | Path, cfg: RunConfig, request: WhatIfRequest) -> dict[str, Any] | None:
    """The run's late rounds' values (``queries.round_values``, its ``summary.json``) of the question's policies that
    are the run's own, definition and name alike: the ranking checks a pair against them where the question asks them
    at the run's horizon (``EvaluationAnswer.checked_rounds``). A question's own policy that only shares a name with
    one of the run's is left out (its pairs are not checked, and the ranking line says so)."""
    from fcd_secure.queries.request import request_from_config  # noqa: PLC0415

    late = json.loads((Path(run_dir) / "summary.json").read_text()).get("round_values")
    if not late:
        return None
    own = {p.name: p for p in request_from_config(cfg).policies}
    same = {p.name for p in request.policies if own.get(p.name) == p}
    rounds = {r: {k: v for k, v in vals.items() if k in same} for r, vals in (late.get("rounds") or {}).items()}
    return {**late, "rounds": {r: v for r, v in rounds.items() if v}} if any(rounds.values()) else None


def write_answer(run_dir: str | Path, cfg: RunConfig, request: WhatIfRequest, res: dict[str, Any]) -> dict[str, Any]:
    """The answer as ``fcd whatif`` keeps it, written to ``<run_dir>/whatif/<query id>.json``; returns it."""
    out = {"run": str(Path(run_dir)), "query_id": request.query_id, "dataset": cfg.data.dataset, "seed": cfg.seed,
           **res}
    out.setdefault("round_values", run_round_values(run_dir, cfg, request))
    atomic_write_text(Path(run_dir) / WHATIF_DIR / f"{request.query_id}.json", json.dumps(jsonable(out), indent=2))
    return out


def answer_question(grid: Grid, cfg: RunConfig, start: QuestionStart) -> dict[str, Any]:
    """The deployed what-if (``federation.asked_runs``): the signed question asked of the sites once with the run's
    Θc (``<out>/theta_c.npz``, the selected round's), answered under ``<out>/whatif/``. The sites answer with what
    they recorded for the run, not with anything this app says beyond the Θc and the question they check.

    Raises:
        WhatIfError: the run folder has no Θc, or ``theta_c.npz`` does not match the model the sites build.
        FederationError: sites missing or inconsistent.
    """
    run_dir = Path(cfg.out or "")
    theta_path = run_dir / "theta_c.npz"
    if not cfg.out or not theta_path.is_file() or not (run_dir / "summary.json").is_file():
        raise WhatIfError(f"{run_dir}: not a finished run folder (theta_c.npz, summary.json)")
    request = WhatIfRequest.from_json(start.question)
    res = ask_sites(grid, cfg, read_npz(theta_path), request, selected_round(run_dir, cfg))
    return write_answer(run_dir, cfg, request, res)


def make_whatif_server_app(theta: dict[str, np.ndarray], request: WhatIfRequest, sink: dict,
                           cfg: RunConfig | None = None, restore_round: int | None = None,
                           recorded: dict[str, str] | None = None) -> ServerApp:
    """A ServerApp that asks :func:`ask_sites` once and puts the merged result in ``sink["result"]``."""
    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        sink["result"] = ask_sites(grid, config_from_context(context, cfg), theta, request, restore_round, recorded)

    return app
