"""Asking a finished run "what happens under π": one evaluation-only round on the run's state (paper §V).

:func:`run_whatif` re-opens a run folder — its configuration, the final Θc (``theta_c.npz``) and the sites' state
folders with each site's own Θs — and runs the simulation engine with :func:`make_whatif_server_app` instead of the
training federation: the sites are identified, receive Θc with the question (``queries.whatif.WhatIfRequest``)
inside an ordinary evaluation request, and answer with the evaluation sums; nothing is trained. The round continues
the run's audit ledgers (a fresh round number, receipts, checkpoints), so ``fcd audit verify`` covers the question
too. The merged answer is also written to ``<run>/whatif/<query id>.json``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from flwr.serverapp import ServerApp

from fcd_secure._io import atomic_write_text, read_npz
from fcd_secure.audit import RECEIPTS_MESSAGE_TYPE
from fcd_secure.config import RunConfig
from fcd_secure.federation import learner
from fcd_secure.queries.evaluation import evaluate_federated
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import config_from_context
from fcd_secure.federation.secure.secure_evaluation import secure_evaluation_for
from fcd_secure.apps.server_app import FederationError, hello, server_audit, wait_for_nodes
from fcd_secure.engines.simulation import run_simulated
from fcd_secure.apps.site import default_site_id
from fcd_secure._io import jsonable
from fcd_secure.queries.whatif import WHATIF_DIR, WhatIfRequest
from fcd_secure.manifest import FULL, THETA_C
from fcd_secure.errors import FcdError

__all__ = ["WhatIfError", "ask_sites", "make_whatif_server_app", "open_run", "run_whatif"]


class WhatIfError(FcdError, RuntimeError):
    """A run folder that cannot answer a what-if question (unfinished, no site state, another model layout)."""


def _next_round(audit) -> int:
    """The first round number the server ledger has not used (a later session continues the run's chain)."""
    rounds = [getattr(e, "round", None) for e in audit.ledger.entries()]
    return max((int(r) for r in rounds if r is not None), default=0) + 1


def ask_sites(grid, cfg: RunConfig, theta: dict[str, np.ndarray], request: WhatIfRequest) -> dict[str, Any]:
    """One evaluation-only round on ``grid``: identify the sites, send Θc with the question, merge their sums, close
    the sites' and the server's audit ledgers for the round. Nothing is trained.

    Raises:
        FederationError: sites missing or inconsistent, or a model layout that is not the run's.
        WhatIfError: ``theta`` does not match the model the sites build.
    """
    fed = cfg.federation
    n_sites = cfg.data.n_sites
    comm = Comm(grid, poll_s=fed.poll_s, audit=server_audit(cfg))
    comm.round = _next_round(comm.audit)
    nodes = wait_for_nodes(grid, n_sites, fed.node_wait_s)
    sites = hello(comm, nodes[:n_sites] if len(nodes) == n_sites else nodes, fed.round_timeout_s, n_sites)
    model = learner.build_model(cfg, sites[0].dims)
    manifest = learner.manifest_of(model)
    if manifest.layout_hash != sites[0].layout_hash:
        raise FederationError("the server's model layout differs from the sites' (different code or config)")
    comm.audit.record_manifest(manifest)
    part = THETA_C if fed.sync == "dss" else FULL
    expected = learner.get_params(model, part)
    bad = sorted(set(expected) ^ set(theta)) or [k for k in expected if np.shape(theta[k]) != expected[k].shape]
    if bad:
        raise WhatIfError(f"theta_c.npz does not match the run's model ({bad[0]}); was the code or config changed?")
    theta = {k: np.asarray(theta[k], dtype=expected[k].dtype) for k in expected}
    order = [s.node_id for s in sites]
    # a run in secure mode asks through secure aggregation too: its sites refuse a clear-text evaluation
    res = evaluate_federated(comm, order, theta, cfg, part, quick=False, sites=sites, whatif=request,
                             secure=secure_evaluation_for(cfg, manifest), round_id=comm.round)
    res["round"] = comm.round
    comm.round += 1
    comm.send(comm.audit.owed_nodes(), RECEIPTS_MESSAGE_TYPE, comm.audit.final_contents(), fed.round_timeout_s)
    comm.audit.close()
    return res


def make_whatif_server_app(theta: dict[str, np.ndarray], request: WhatIfRequest, sink: dict,
                           cfg: RunConfig | None = None):
    """A ServerApp that asks :func:`ask_sites` once and puts the merged result in ``sink["result"]``."""
    app = ServerApp()

    @app.main()
    def main(grid, context) -> None:
        sink["result"] = ask_sites(grid, config_from_context(context, cfg), theta, request)

    return app


def open_run(run_dir: str | Path) -> tuple[RunConfig, dict[str, np.ndarray]]:
    """The configuration (state folder resolved) and the final Θc of a finished run folder.

    Raises:
        WhatIfError: no such run, an unfinished run, or no site state next to it.
        ConfigError: the run's config.toml cannot be read.
    """
    run_dir = Path(run_dir)
    for name in ("config.toml", "theta_c.npz", "summary.json"):
        if not (run_dir / name).is_file():
            raise WhatIfError(f"{run_dir}: no {name} (not a finished run folder of `fcd run`)")
    cfg = RunConfig.load(run_dir / "config.toml")
    # the state root as recorded, else the default one inside the run folder (a folder moved after the run)
    candidates = [Path(cfg.state_dir)] if cfg.state_dir else []
    candidates.append(run_dir / "state")
    state = next((c for c in candidates if (c / default_site_id(0)).is_dir()), None)
    if state is None:
        raise WhatIfError(f"{run_dir}: the sites' state (Θs) is not in {' or '.join(map(str, candidates))}; a run "
                          "of `fcd deploy` or `fcd server run` keeps each site's Θs on that site, so `fcd whatif` "
                          "cannot ask it: the run's own answers (its [evaluation] policies) are in "
                          f"{run_dir / 'summary.json'} (policies, identified)")
    cfg = cfg.model_copy(update={"state_dir": str(state.resolve()), "out": str(run_dir.resolve())})
    return cfg, read_npz(run_dir / "theta_c.npz")


def run_whatif(run_dir: str | Path, request: WhatIfRequest, num_cpus: int | None = None) -> dict[str, Any]:
    """Ask ``request`` of a finished run on the simulation engine; the result is also written to
    ``<run_dir>/whatif/<query id>.json``.

    Raises:
        WhatIfError: see :func:`open_run`.
        DataError: a policy names a label or context column the run's data does not have (raised on the sites;
            check first with :func:`fcd_secure.queries.whatif.check_policies`).
    """
    cfg, theta = open_run(run_dir)

    def factory(c, sink):
        return make_whatif_server_app(theta, request, sink, c)

    res = run_simulated(cfg, server_app_factory=factory, num_cpus=num_cpus)
    out = {"run": str(Path(run_dir)), "query_id": request.query_id, "dataset": cfg.data.dataset, "seed": cfg.seed,
           **res}
    atomic_write_text(Path(run_dir) / WHATIF_DIR / f"{request.query_id}.json", json.dumps(jsonable(out), indent=2))
    return out
