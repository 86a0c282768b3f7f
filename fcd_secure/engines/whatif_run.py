"""Asking a finished run "what happens under π": one evaluation-only round on the run's state (paper §V).

:func:`run_whatif` re-opens a run folder — its configuration, the final Θc (``theta_c.npz``) and the sites' state
folders with each site's own Θs — and runs the simulation engine with the what-if ServerApp
(``apps.whatif_app.make_whatif_server_app``: the server loop with no training round and one evaluation carrying the
question) instead of the training federation; nothing is trained. The merged answer is also written to
``<run>/whatif/<query id>.json``. The question runs on the engine the run recorded (``summary.json``'s ``engine``,
:func:`recorded_engine`) unless the caller names one: both local engines give the same answer
(``engines.choice``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import json

import numpy as np

from fcd_secure._io import read_npz
from fcd_secure.apps.site import default_site_id
from fcd_secure.apps.whatif_app import (
    WhatIfError,
    make_whatif_server_app,
    recorded_fields,
    selected_round,
    write_answer,
)
from fcd_secure.config import RunConfig
from fcd_secure.engines.choice import Engine
from fcd_secure.engines.local import run_on
from fcd_secure.queries.request import WhatIfRequest

__all__ = ["open_run", "recorded_engine", "run_whatif"]


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
                          "of `fcd deploy` keeps each site's Θs on that site, so `fcd whatif` cannot ask it here (a "
                          "run of `fcd server run` is asked through its coordinator's SuperLink: its run folder has "
                          "run_start.json): the run's own answers (its [evaluation] policies) are in "
                          f"{run_dir / 'summary.json'} (policies, identified)")
    cfg = cfg.model_copy(update={"state_dir": str(state.resolve()), "out": str(run_dir.resolve())})
    return cfg, read_npz(run_dir / "theta_c.npz")


def recorded_engine(run_dir: str | Path) -> Engine:
    """The local engine a finished run folder's ``summary.json`` names.

    Raises:
        WhatIfError: no summary.json, or an engine name no local engine records.
    """
    path = Path(run_dir) / "summary.json"
    if not path.is_file():
        raise WhatIfError(f"{run_dir}: no summary.json (not a finished run folder of `fcd run`)")
    try:
        return Engine.of_summary(json.loads(path.read_text()).get("engine", Engine.SIMULATION.summary_name))
    except ValueError as exc:
        raise WhatIfError(f"{path}: {exc}") from None


def run_whatif(run_dir: str | Path, request: WhatIfRequest, engine: Engine | None = None) -> dict[str, Any]:
    """Ask ``request`` of a finished run on ``engine`` (default: the run's own, :func:`recorded_engine`); the result is
    also written to ``<run_dir>/whatif/<query id>.json``.

    Raises:
        WhatIfError: see :func:`open_run`.
        DataError: a policy names a label or context column the run's data does not have (raised on the sites;
            check first with :func:`fcd_secure.queries.vocabulary.bind_policies`).
    """
    cfg, theta = open_run(run_dir)
    # the run answered with its selected round: theta_c.npz is that round's Θc, and each site restores its Θs of it
    restore = selected_round(run_dir, cfg)
    recorded = recorded_fields(run_dir)  # the run's statistics and shared behaviour model, where it had them

    def factory(c, sink):
        return make_whatif_server_app(theta, request, sink, c, restore, recorded)

    res = run_on(engine or recorded_engine(run_dir), cfg, server_app_factory=factory)
    return write_answer(run_dir, cfg, request, res)
