"""Run the Flower app on Flower's simulation engine, in-process (the ``fcd run`` default).

``flwr.simulation.run_simulation`` is deprecated in the pinned Flower (:data:`fcd_secure._flower.pins.FLWR_VERSION`)
but is its only fully in-process path. Settings that matter on a 2-core machine: one Ray actor
(``client_resources.num_cpus = 2``), no dashboard, quiet logs, telemetry off. The ServerApp and ClientApp are the
same objects the deployment engine loads; only the config travels in their closures here.

Each simulated site enforces its own policy file like a deployed one (``federation.site_policy``): before the
engine starts, :func:`write_simulated_policies` writes, for every site that has none yet, the policy a hospital
would choose for this run's options (``SitePolicy.for_run``) into its state directory. A policy already there
is the site's and is kept: a later run that asks for less is refused by that site.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
from pathlib import Path

from fcd_secure.config import RunConfig
from fcd_secure.apps.client_app import make_client_app
from fcd_secure.federation.secure.setup import provision_roster
from fcd_secure.apps.server_app import make_server_app
from fcd_secure.apps.site import default_site_id
from fcd_secure.federation.site_policy import POLICY_FILE, SitePolicy


def quiet_flower_env() -> None:
    """Telemetry off (Flower posts events off-machine by default), no update check, errors-only logs."""
    os.environ["FLWR_TELEMETRY_ENABLED"] = "0"
    os.environ.setdefault("FLWR_DISABLE_UPDATE_CHECK", "1")
    os.environ.setdefault("FLWR_LOG_LEVEL", "ERROR")
    os.environ.setdefault("RAY_ACCEL_ENV_VAR_OVERRIDE_ON_ZERO", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # Ray starts its workers (the simulated sites) at nice 15 by default (raylet config ``worker_niceness``); on a
    # 2-core machine with two ordinary CPU-bound processes beside it, a nice-15 site gets about 1/30 of a core and
    # misses its round deadlines (measured: 26 of 1,333 tests in 28 min). The sites are the run's real work, so
    # they run at the caller's own priority.
    os.environ.setdefault("RAY_worker_niceness", "0")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    logging.getLogger("flwr").setLevel(logging.ERROR)


def backend_config(num_cpus: int = 2) -> dict:
    return {
        "client_resources": {"num_cpus": num_cpus, "num_gpus": 0.0},
        "init_args": {
            "num_cpus": num_cpus,
            "logging_level": "ERROR",
            "log_to_driver": False,
            "include_dashboard": False,
        },
    }


def provision_simulated_roster(cfg: RunConfig) -> None:
    """Secure mode needs each site's identity key pinned in a roster that sites read from configuration, never
    from the server (docs/threats.md P2). In a simulation all sites share one state root, so the operator's provisioning
    step is done here: keys are created in each site's state directory and the roster is written beside them."""
    provision_roster(cfg.state_dir, [default_site_id(i) for i in range(cfg.data.n_sites)])


def write_simulated_policies(cfg: RunConfig) -> list[Path]:
    """Write ``SitePolicy.for_run(cfg)`` into ``<state_dir>/<site>/site_policy.toml`` for every site without one.

    Returns:
        The policy file of every site (written now or already there).
    """
    policy = SitePolicy.for_run(cfg)
    paths = []
    for i in range(cfg.data.n_sites):
        path = Path(cfg.state_dir) / default_site_id(i) / POLICY_FILE
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            policy.write(path)
        paths.append(path)
    return paths


def run_simulated(
    cfg: RunConfig,
    progress=None,
    num_cpus: int | None = None,
    stop: threading.Event | None = None,
    server_app_factory=None,
):
    """Run the whole federation of ``cfg`` on the simulation engine.

    Args:
        cfg: the resolved run config; its state root defaults to ``<out>/state`` (a temp dir without an out folder).
        progress: the ServerApp's progress hook (``server_app.ProgressHook``).
        num_cpus: CPUs of the one Ray actor (default: up to 2).
        stop: set it (e.g. on Ctrl-C) to end the ServerApp's thread at its next wait (``server_app.run_federation``).
        server_app_factory: ``(cfg, sink) -> ServerApp`` for another server job on the same sites (e.g. the
            evaluation-only round of ``apps.whatif_app``), which puts its result in ``sink["result"]``; default
            the training federation (``server_app.make_server_app``).

    Returns:
        The ``server_app.FederationResult`` (or the other job's result); the run folder is written when ``cfg.out``
        is set.
    """
    quiet_flower_env()
    from flwr.simulation import run_simulation  # noqa: PLC0415 - imported after the environment is quiet

    # flwr sets DEBUG on its logger when imported; the level is $FLWR_LOG_LEVEL (quiet_flower_env: ERROR)
    logging.getLogger("flwr").setLevel(os.environ.get("FLWR_LOG_LEVEL", "ERROR"))

    root = cfg.state_root() or Path(tempfile.mkdtemp(prefix="fcd-state-"))
    cfg = cfg.model_copy(update={"state_dir": str(root)})
    Path(cfg.state_dir).mkdir(parents=True, exist_ok=True)
    write_simulated_policies(cfg)
    if cfg.federation.secure_aggregation:
        provision_simulated_roster(cfg)
    sink: dict = {}
    n_cpu = num_cpus or max(1, min(2, os.cpu_count() or 1))
    factory = server_app_factory or (lambda c, out: make_server_app(c, progress, out, stop))
    run_simulation(
        server_app=factory(cfg, sink),
        client_app=make_client_app(cfg),
        num_supernodes=cfg.data.n_sites,
        backend_config=backend_config(n_cpu),
    )
    if "result" not in sink:
        raise RuntimeError("the simulation ended without a result (see the log above)")
    return sink["result"]
