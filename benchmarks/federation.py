"""Federation figures: wall time per round and uplink bytes of DSS (plain and secure) against full sync.

Prints, per configuration, the median seconds per round (rounds 2..R; round 1 includes Ray and data start-up), the
whole run's wall time, the uplink MB measured from the serialized Flower messages and the paper's formula
(participating sites × synchronised parameter bytes, Table II) beside it.

    .venv/bin/python benchmarks/federation.py --quick          # tiny preset, 2 rounds, DSS secure vs full sync
    .venv/bin/python benchmarks/federation.py --preset default # the README run's sizes
    .venv/bin/python benchmarks/federation.py --json
    .venv/bin/python benchmarks/federation.py --deployment --sites 4 10   # Deployment Engine vs simulation
    .venv/bin/python benchmarks/federation.py --deployment --quick        # 4 sites, 2 rounds, warm executors
    .venv/bin/python benchmarks/federation.py --superlink-requests  # SuperLink CPU per request, middlewares scoped or not
    .venv/bin/python benchmarks/federation.py --superlink-requests --quick   # 200 requests instead of 2,000

``--deployment`` prints, per number of sites, the secure-aggregation round's seconds on the simulation engine and
on the Deployment Engine over loopback (the hospital path: consortium, one home per site with its own DKT-Synth
table, the CA's private key moved out of the coordinator's folder before the server starts, TLS and SuperNode
authentication, secure round 0), with the site executor warm (one ClientApp process per site) and cold (a fresh
process per message), side by side in one run (3 rounds unless ``--rounds``). DP-SGD is off in both engines, which
each site's own policy then allows (``[dp] required = false``, and the consortium's minimum alike); ``--dp`` keeps
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


def simulation_rounds(n_sites: int, rounds: int, preset: str, seed: int, dp: bool = False) -> list[float]:
    """Seconds per secure round on the simulation engine (DKT-Synth, every site every round; DP-SGD when ``dp``)."""
    from fcd_secure.config import build_config
    from fcd_secure.engines.simulation import run_simulated

    cfg = build_config(preset, {"seed": seed, "data": {"n_sites": n_sites}, "dp": {"enabled": dp},
                                "federation": {"rounds": rounds, "clients_per_round": n_sites, "secure_aggregation": True,
                                               "eval_every": 0}})
    res = run_simulated(cfg)  # no run folder: the figure is the rounds' own seconds
    return [h["round_s"] for h in res.history]


def deployment_rounds(n_sites: int, rounds: int, preset: str, seed: int, warm: bool,
                      dp: bool = False) -> tuple[list[float], float]:
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
        submit_run(co, tmp / "run", rounds=rounds, dp=dp, preset=preset, seed=seed, timeout_s=3600)
        wall = time.perf_counter() - t0
        # where a deployment's minutes go besides its rounds (stderr: the figures stay on stdout)
        print(f"[deployment, {n_sites} sites, {'warm' if warm else 'cold'}] provisioning {t_provisioned - t_start:.1f} s, "
              f"SuperLink and sites started {t0 - t_provisioned:.1f} s, run {wall:.1f} s", file=sys.stderr, flush=True)
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


def compare_engines(sites: list[int], rounds: int, preset: str, seed: int, as_json: bool,
                    executors: tuple[str, ...] = ("warm", "cold"), dp: bool = False) -> None:
    rows = []
    for n in sites:
        sim = simulation_rounds(n, rounds, preset, seed, dp)
        row = {"sites": n, "simulation s / round": _steady(sim), "simulation round 1 s": sim[0]}
        for warm in (e == "warm" for e in executors):
            dep, wall = deployment_rounds(n, rounds, preset, seed, warm, dp)
            label = "warm" if warm else "cold"
            row[f"deployment ({label}) s / round"] = _steady(dep)
            row[f"deployment ({label}) / simulation"] = _steady(dep) / row["simulation s / round"]
            row[f"deployment ({label}) round 1 s"] = dep[0]
            row[f"deployment ({label}) rounds s"] = " ".join(f"{x:.1f}" for x in dep)
            row[f"deployment ({label}) run wall s"] = wall
        row["load"] = os.getloadavg()[0]
        rows.append(row)
        print(json.dumps(row), flush=True)
    machine = (f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · preset {preset} · "
               f"{rounds} rounds · DP-SGD {'on' if dp else 'off'}")
    if as_json:
        print(json.dumps({"machine": machine, "rows": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"deployment vs simulation, secure aggregation ({machine})")
    for k in rows[0]:
        t.add_column(k, justify="right")
    for r in rows:
        t.add_row(*(f"{v:.2f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console().print(t)


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
                    help="tiny preset, 2 rounds, DSS secure aggregation vs full sync (one Ray start each); with "
                         "--deployment: 4 sites, 2 rounds, warm executors; with --superlink-requests: 200 requests")
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
    if args.deployment:
        compare_engines(args.sites or ([4] if args.quick else [4, 10]), args.rounds or (2 if args.quick else 3),
                        "tiny" if args.quick else args.preset, args.seed, args.json,
                        tuple(args.executors or (["warm"] if args.quick else ["warm", "cold"])), args.dp)
        return
    from fcd_secure.config import build_config
    from fcd_secure.engines.simulation import run_simulated

    preset = "tiny" if args.quick else args.preset
    # two rounds: the figure is the median round from round 2 on (round 1 carries Ray's and the data's start-up)
    rounds = 2 if args.quick else args.rounds
    configs = [("DSS plain FedAvg", {"sync": "dss", "secure_aggregation": False}),
               ("DSS secure aggregation", {"sync": "dss", "secure_aggregation": True}),
               ("full sync (w/o DSS)", {"sync": "full", "secure_aggregation": False})]
    if args.quick:  # each configuration is a Ray start: the two ends of the table (secure DSS, plain full sync)
        configs = configs[1:]
    rows = []
    for label, fed in configs:
        over = {"seed": args.seed, "federation": {**fed, "eval_every": 0, **({"rounds": rounds} if rounds else {})}}
        # no run folder: the figures are the result's history (a run folder adds its plots and files to the wall)
        cfg = build_config(preset, over)
        t0 = time.perf_counter()
        res = run_simulated(cfg)
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
    machine = f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · preset {preset}"
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
