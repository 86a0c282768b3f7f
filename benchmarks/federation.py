"""Federation figures: wall time per round and uplink bytes of DSS (plain and secure) against full sync.

Prints, per configuration, the median seconds per round (rounds 2..R; round 1 includes Ray and data start-up), the
whole run's wall time, the uplink MB measured from the serialized Flower messages and the paper's formula
(participating sites × synchronised parameter bytes, Table II) beside it. The full forms run Flower's simulation
engine; the quick forms (which check that the script runs end to end and prints its figures) run the in-process
engine (``engines.inprocess``: the same ServerApp round loop, ClientApp and messages, without Ray's start), so their
seconds are not the simulation engine's (``--engine`` picks either).

    .venv/bin/python benchmarks/federation.py --quick          # tiny preset, 2 rounds, in-process engine
    .venv/bin/python benchmarks/federation.py --preset default # the README run's sizes
    .venv/bin/python benchmarks/federation.py --json
    .venv/bin/python benchmarks/federation.py --deployment --sites 4 10   # Deployment Engine vs simulation
    .venv/bin/python benchmarks/federation.py --deployment --quick        # 4 sites, 2 rounds, warm, in-process reference
    .venv/bin/python benchmarks/federation.py --superlink-requests  # SuperLink CPU per request, middlewares scoped or not
    .venv/bin/python benchmarks/federation.py --superlink-requests --quick   # 200 requests instead of 2,000

``--deployment`` prints, per number of sites, the secure-aggregation round's seconds on the simulation engine and
on the Deployment Engine over loopback (the hospital path: consortium, one home per site with its own DKT-Synth
table, the CA's private key moved out of the coordinator's folder before the server starts, TLS and SuperNode
authentication, secure round 0), with the site executor warm (one ClientApp process per site) and cold (a fresh
process per message), side by side in one run (3 rounds unless ``--rounds``): one row per number of sites and
executor kind, printed on stdout the moment that deployment finished (progress on stderr; ``--json``: one object at
the end); a deployment that fails gets a row saying why, the others still run, and the script exits 1. DP-SGD is
off in both engines, which each site's own policy then allows (``[dp] required = false``, and the consortium's minimum alike); ``--dp`` keeps
the strict default policies and trains with DP-SGD in both engines. The figure
per engine is the median round from round 2 on (a round whose protocol keys were set up during the round before:
three round trips); round 1 (five) is printed beside it.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: the engines a reference run may take: Flower's simulation engine (Ray: the full forms' figures) or the in-process
#: engine (the same ServerApp round loop, ClientApp and messages without Ray's start; the quick forms, which check
#: that the script runs and prints, not Ray's cost)
ENGINES = ("simulation", "in-process")


#: the quick forms' closing evaluation (its figures are not this script's): two policies, one rollout each, at most
#: 32 test rows a site (above the sites' cohort floor of 20); the profile of a tiny 2-round run put 40 % of its CPU
#: in the paper's four policies' rollouts
QUICK_EVALUATION = {"policies": ["never", "always"], "n_samples": 1, "max_rows": 32}


def run_engine(cfg, engine: str):  # noqa: ANN001, ANN201 - a RunConfig in, a FederationResult out
    """``cfg`` run on ``engine`` (:data:`ENGINES`)."""
    if engine == "simulation":
        from fcd_secure.engines.simulation import run_simulated

        return run_simulated(cfg)
    from fcd_secure.engines.inprocess import run_inprocess

    return run_inprocess(cfg)


def simulation_rounds(n_sites: int, rounds: int, preset: str, seed: int, dp: bool = False,
                      engine: str = "simulation", evaluation: dict | None = None) -> list[float]:
    """Seconds per secure round on the reference ``engine`` (DKT-Synth, every site every round; DP-SGD when ``dp``;
    the closing evaluation's keys ``evaluation`` when given)."""
    from fcd_secure.config import build_config

    cfg = build_config(preset, {"seed": seed, "data": {"n_sites": n_sites}, "dp": {"enabled": dp},
                                "federation": {"rounds": rounds, "clients_per_round": n_sites, "secure_aggregation": True,
                                               "eval_every": 0}, **({"evaluation": evaluation} if evaluation else {})})
    if engine == "in-process":  # the rounds alone: the figure is their own seconds (no closing evaluation)
        from fcd_secure.engines.inprocess import run_rounds

        return [r["round_s"] for r in run_rounds(cfg)[1]]
    res = run_engine(cfg, engine)  # no run folder: the figure is the rounds' own seconds
    return [h["round_s"] for h in res.history]


def deployment_rounds(n_sites: int, rounds: int, preset: str, seed: int, warm: bool,
                      dp: bool = False, evaluation: dict | None = None) -> tuple[list[float], float]:
    """Seconds per secure round on the Deployment Engine over loopback (module docstring), and the run's wall.

    Without ``dp`` the consortium's minimum policy and every site's own ``site_policy.toml`` say ``[dp] required =
    false`` (a hospital's explicit choice in its policy file; the strict default refuses a run without DP-SGD)."""
    import csv
    from pathlib import Path

    from fcd_secure.data.long_tables import write_site_tables
    from fcd_secure.data.registry import load_federated
    from fcd_secure.federation.site_policy import SitePolicy
    from fcd_secure.provisioning.bundle import add_site
    from fcd_secure.provisioning.consortium import PreflightTerms, init_consortium
    from fcd_secure.provisioning.processes import stop
    from fcd_secure.provisioning.server import CA_KEY_FILE, start_server, submit_run
    from fcd_secure.provisioning.site_install.home import SiteHome, init_site, join_site
    from fcd_secure.provisioning.site_install.runner import start_site
    from fcd_secure.provisioning.site_install.tables import REGISTRY_ENV

    t_start = time.perf_counter()
    tmp = Path(tempfile.mkdtemp(prefix="fcd-bench-deploy-"))
    # a throwaway deployment: its own registry of site homes (the same tables each run would be refused, P46)
    os.environ[REGISTRY_ENV] = str(tmp / "site_tables.json")
    fd = load_federated("dkt-synth", n_sites=n_sites, preset=preset, seed=seed)
    spec, tables = write_site_tables(fd.train, fd.test, tmp / "data", "dkt-synth-long")
    def policy(p: SitePolicy) -> SitePolicy:
        return p if dp else p.model_copy(update={"dp": p.dp.model_copy(update={"required": False})})

    co = init_consortium(tmp / "co", "bench", spec, port=_free_port(), preflight=PreflightTerms(min_trajectories=1),
                         site_policy=policy(SitePolicy()))
    homes = []
    for i in range(n_sites):
        r = init_site(tmp / f"site{i}", spec, tables[i], f"site{i}", min_trajectories=1)  # the consortium's floor
        add_site(co, tmp / f"site{i}" / "enrolment_request.json", r["identity_fingerprint"])
        homes.append(SiteHome.at(tmp / f"site{i}"))
        policy(SitePolicy.load(homes[-1].policy)).write(homes[-1].policy)
    # every site is enrolled: the CA's private key leaves the coordinator's folder before the server starts, as a
    # hospital consortium's operator moves it (docs/hospital.md; start_server refuses while it is there, P35)
    offline = tmp / "offline"
    offline.mkdir()
    shutil.move(co.pki / CA_KEY_FILE, offline / CA_KEY_FILE)
    started = []
    t_provisioned = time.perf_counter()
    try:
        start_server(co)
        started.append(co.home / "server")
        for i, h in enumerate(homes):
            join_site(h.root, co.bundle_path(f"site{i}"), co.fingerprint())
            start_site(h, warm=warm)
            started.append(h.root)
        t0 = time.perf_counter()
        submit_run(co, tmp / "run", rounds=rounds, dp=dp, preset=preset, seed=seed, timeout_s=3600,
                   settings=[f"evaluation.{k}={json.dumps(v)}" for k, v in (evaluation or {}).items()])
        wall = time.perf_counter() - t0
        # where a deployment's minutes go besides its rounds (stderr: the figures stay on stdout)
        _progress(f"deployment, {n_sites} sites, {'warm' if warm else 'cold'}: provisioning {t_provisioned - t_start:.1f} s, "
                  f"SuperLink and sites started {t0 - t_provisioned:.1f} s, run {wall:.1f} s")
        with open(tmp / "run" / "rounds.csv") as f:
            per_round = [float(r["round_s"]) for r in csv.DictReader(f)]
    finally:
        for folder in reversed(started):
            stop(folder)
    return per_round, wall


def _steady(per_round: list[float]) -> float:
    """The median round from round 2 on: round 1 sets up its own protocol keys (five round trips), every later
    round had its keys set up during the round before (three; ``federation.secure.flow``)."""
    return statistics.median(per_round[1:] or per_round)


def _progress(msg: str) -> None:
    """Progress on stderr, the figures stay on stdout (benchmarks/README.md)."""
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _row_line(r: dict) -> str:
    """One executor kind's figures, printed the moment its deployment finished (a full run takes many minutes)."""
    if "error" in r:
        return f"{r['sites']} sites, {r['executor']} executors: deployment failed ({r['error']})"
    return (f"{r['sites']} sites, {r['executor']} executors: {r['reference']} s / round {r['reference s / round']:.2f} "
            f"(round 1 {r['reference round 1 s']:.2f}), deployment s / round {r['deployment s / round']:.2f} "
            f"(rounds {r['deployment rounds s']}), deployment / reference {r['deployment / reference']:.2f}×, "
            f"run wall s {r['run wall s']:.1f}, load {r['load']:.1f}")


def compare_engines(sites: list[int], rounds: int, preset: str, seed: int, as_json: bool,
                    executors: tuple[str, ...] = ("warm", "cold"), dp: bool = False, engine: str = "simulation",
                    evaluation: dict | None = None) -> int:
    """Each number of sites: the reference run on ``engine`` once, then the deployment with each executor kind, each
    row printed as soon as it is measured (stdout; with ``--json`` the rows come together at the end). Returns the exit status: 1
    when a deployment failed (its row says so; the other kinds still run). ``evaluation``: keys of both runs' closing
    evaluation (the quick form's :data:`QUICK_EVALUATION`; the in-process reference runs its rounds alone,
    ``engines.inprocess.run_rounds``)."""
    rows = []
    for n in sites:
        _progress(f"{engine} engine, {n} sites, {rounds} rounds")
        sim = simulation_rounds(n, rounds, preset, seed, dp, engine, evaluation)
        for kind in executors:
            _progress(f"deployment, {n} sites, {kind} executors, {rounds} rounds (load {os.getloadavg()[0]:.1f})")
            row = {"sites": n, "executor": kind, "reference": engine, "reference s / round": _steady(sim),
                   "reference round 1 s": sim[0]}
            try:
                dep, wall = deployment_rounds(n, rounds, preset, seed, kind == "warm", dp, evaluation)
            except RuntimeError as exc:  # a failed run (submit_run names its log) ends only its own row
                row["error"] = str(exc).splitlines()[0][:300]
            else:
                row.update({"deployment s / round": _steady(dep), "deployment / reference": _steady(dep) / _steady(sim),
                            "deployment round 1 s": dep[0], "deployment rounds s": " ".join(f"{x:.1f}" for x in dep),
                            "run wall s": wall})
            row["load"] = os.getloadavg()[0]
            rows.append(row)
            (_progress if as_json else print)(_row_line(row))
            sys.stdout.flush()
    machine = (f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · preset {preset} · "
               f"{rounds} rounds · DP-SGD {'on' if dp else 'off'}")
    if as_json:
        print(json.dumps({"machine": machine, "rows": rows}))
    else:
        from rich.console import Console
        from rich.table import Table

        t = Table(title=f"deployment vs the {engine} engine, secure aggregation ({machine})")
        columns = list(dict.fromkeys(k for r in rows for k in r))
        for k in columns:
            t.add_column(k, justify="right")
        for r in rows:
            t.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in (r.get(k, "") for k in columns)))
        Console().print(t)
    return 1 if any("error" in r for r in rows) else 0


def superlink_request_cpu(requests: int = 2000) -> dict[str, float]:
    """CPU milliseconds one request costs Flower's SuperLink app (``flwr.superlink.main.create_app``, in process,
    no network, no TLS: the ASGI app alone, ``GET /health`` through every middleware), as Flower builds it and with
    ``provisioning.superlink_main.scope_middlewares``; alternated, best of three each."""
    import asyncio
    import warnings

    import flwr.superlink.main as flower_main

    from fcd_secure._flower.superlink_main import scope_middlewares

    warnings.filterwarnings("ignore")

    async def drive(app) -> float:
        scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "https",
                 "path": "/health", "raw_path": b"/health", "query_string": b"", "root_path": "",
                 "headers": [(b"host", b"127.0.0.1")], "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 9091)}

        async def receive():
            return {"type": "http.request", "body": b"", "more_body": False}

        async def send(event):
            if event["type"] == "http.response.start" and event["status"] != 200:
                raise RuntimeError(f"/health answered {event['status']}")

        for _ in range(100):  # build the middleware stack, warm caches
            await app(dict(scope), receive, send)
        t0 = time.process_time()
        for _ in range(requests):
            await app(dict(scope), receive, send)
        return (time.process_time() - t0) / requests * 1e3

    best = {"flower": float("inf"), "scoped": float("inf")}
    for _ in range(3):
        for label in best:
            app = flower_main.create_app()
            if label == "scoped":
                scope_middlewares(app)
            best[label] = min(best[label], asyncio.run(drive(app)))
    return {"SuperLink ms CPU / request (Flower's middlewares)": best["flower"],
            "SuperLink ms CPU / request (scoped)": best["scoped"],
            "scoped / Flower": best["scoped"] / best["flower"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true",
                    help="tiny preset, 2 rounds, the in-process engine (no Ray start); with --deployment: 4 sites, "
                         "2 rounds, warm executors, the in-process engine as reference; with --superlink-requests: "
                         "200 requests")
    ap.add_argument("--engine", choices=ENGINES, default=None,
                    help="the engine of the simulated runs and of --deployment's reference (default simulation; "
                         "--quick: in-process)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--deployment", action="store_true", help="Deployment Engine vs simulation (module docstring)")
    ap.add_argument("--sites", type=int, nargs="+", default=None,
                    help="with --deployment: numbers of sites (default 4 10; --quick: 4)")
    ap.add_argument("--executors", nargs="+", choices=["warm", "cold"], default=None,
                    help="with --deployment: the site executor modes to measure (default warm cold; --quick: warm)")
    ap.add_argument("--dp", action="store_true",
                    help="with --deployment: DP-SGD on in both engines (the sites' strict default policy)")
    ap.add_argument("--superlink-requests", action="store_true",
                    help="the SuperLink app's CPU per request, Flower's middlewares vs scoped (superlink_request_cpu)")
    args = ap.parse_args()
    if args.superlink_requests:
        print(json.dumps(superlink_request_cpu(200 if args.quick else 2000)))
        return

    import torch

    torch.set_num_threads(1)
    engine = args.engine or ("in-process" if args.quick else "simulation")
    if args.deployment:
        sys.exit(compare_engines(args.sites or ([4] if args.quick else [4, 10]), args.rounds or (2 if args.quick else 3),
                                 "tiny" if args.quick else args.preset, args.seed, args.json,
                                 tuple(args.executors or (["warm"] if args.quick else ["warm", "cold"])), args.dp,
                                 engine, QUICK_EVALUATION if args.quick else None))
    from fcd_secure.config import build_config

    preset = "tiny" if args.quick else args.preset
    # two rounds: the figure is the median round from round 2 on (round 1 carries Ray's and the data's start-up)
    rounds = 2 if args.quick else args.rounds
    configs = [("DSS plain FedAvg", {"sync": "dss", "secure_aggregation": False}),
               ("DSS secure aggregation", {"sync": "dss", "secure_aggregation": True}),
               ("full sync (w/o DSS)", {"sync": "full", "secure_aggregation": False})]
    if args.quick:  # the two ends of the table (secure DSS, plain full sync)
        configs = configs[1:]
    rows = []
    for label, fed in configs:
        over = {"seed": args.seed, "federation": {**fed, "eval_every": 0, **({"rounds": rounds} if rounds else {})}}
        if args.quick:  # the run's closing evaluation is no figure here: two policies, one rollout, 32 rows a site
            over["evaluation"] = QUICK_EVALUATION
        # no run folder: the figures are the result's history (a run folder adds its plots and files to the wall)
        cfg = build_config(preset, over)
        t0 = time.perf_counter()
        res = run_engine(cfg, engine)
        wall = time.perf_counter() - t0
        per_round = [h["round_s"] for h in res.history]
        rows.append({
            "config": label,
            "rounds": len(per_round),
            "seconds / round (median, rounds ≥ 2)": statistics.median(per_round[1:] or per_round),
            "run wall s": wall,
            "MB uplink (measured)": sum(h["uplink_bytes"] for h in res.history) / 1e6,
            "MB uplink (paper formula)": sum(h["uplink_formula_bytes"] for h in res.history) / 1e6,
            "MB downlink (measured)": sum(h["downlink_bytes"] for h in res.history) / 1e6,
        })
    machine = (f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · preset {preset} · "
               f"{engine} engine")
    if args.json:
        print(json.dumps({"machine": machine, "rows": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"federation ({machine})")
    for k in rows[0]:
        t.add_column(k, justify="left" if k == "config" else "right")
    for r in rows:
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console().print(t)


if __name__ == "__main__":
    main()
