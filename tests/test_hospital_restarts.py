"""The hospital study's deployed runs across a coordinator restart (issue 45 items 2, 3, 4 and 5), with real Flower
processes on 127.0.0.1: a coordinator and four hospitals (the secure-aggregation minimum), each in its own home.

Measured before: restarting the coordinator took every site down (the SuperNodes got HTTP 401 on their heartbeat
and exited, their executors with them; every hospital had to run ``fcd site start`` again); a run spent each site's
whole lifetime ε; ledgers copied by hand and not again after the next run read as TAMPERED, naming node numbers.

Here, in order:

1. ``fcd server run --dp-epsilon 1`` (one round, secure aggregation, DP): it trains, and exits 1 because every site
   declines the final evaluation of the tiny world (test splits below the cohort floor): no answer, said by the exit
   code; ``fcd audit collect`` gathers the
   sites' ledgers and DP records; ``fcd audit verify`` with the pinned fingerprints: compliant;
2. ``fcd server stop`` and ``start`` (the coordinator restarted): no site is restarted by hand; their supervisors
   keep running and start each SuperNode again, which re-activates its key under the new SuperLink;
3. ``fcd server run`` again with two rounds: it resumes from round 1 of the checkpoint and trains round 2 on the
   sites that survived the restart (exit 1 again: no answer from the tiny world), with ``--set`` reaching the run's
   config;
4. the first run's copies of the site ledgers beside the second run's server ledger: partial ("stale evidence"),
   never tampered; ``fcd audit collect`` again: compliant.

Every process is stopped by PID in a ``finally``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import pytest
from test_hospital_deployment import N_SITES, free_port, invoke

from fcd_secure._flower.supernode_main import BACKOFF_MAX_S, BACKOFF_S, STABLE_S, next_backoff
from fcd_secure.cli import audit as audit_cli
from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import server as server_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.provisioning.processes import alive, read_pids

pytestmark = pytest.mark.deployment


def test_restart_backoff_doubles_and_resets_after_a_stable_run():
    waits = [BACKOFF_S]
    for _ in range(8):
        waits.append(next_backoff(waits[-1], 1.0))
    assert waits[:3] == [1.0, 2.0, 4.0] and max(waits) == BACKOFF_MAX_S
    assert next_backoff(BACKOFF_MAX_S, STABLE_S) == BACKOFF_S


def _verify(ev: Path, fps: list[str]) -> tuple[int, dict]:
    fp = json.loads((ev / "fingerprints.json").read_text())
    args = ["verify", str(ev), "--server-key", fp["server"]]
    for f in fps:
        args += ["--site-key", f]
    return invoke(audit_cli.app, args)


def _bad(env: dict) -> list[str]:
    return [f["message"] for f in (env.get("data") or {}).get("findings", []) if f["severity"] != "note"]


def test_sites_survive_a_coordinator_restart_and_the_evidence_stays_honest(tmp_path, one_torch_thread):
    from fcd_secure.data.long_tables import write_site_tables
    from fcd_secure.data.registry import load_federated

    fd = load_federated("dkt-synth", n_sites=N_SITES, preset="tiny", seed=0)
    spec, tables = write_site_tables(fd.train, fd.test, tmp_path / "data", "dkt-synth-long")
    co = tmp_path / "coordinator"
    code, env = invoke(consortium_cli.app, ["init", "--home", str(co), "--id", "restarts", "--spec", str(spec),
                                            "--port", str(free_port()), "--min-trajectories", "20"])
    assert code == 0, env
    coordinator_fp = env["data"]["coordinator_fingerprint"]
    homes = [tmp_path / f"hospital{i}" for i in range(N_SITES)]
    site_fps = []
    for i, home in enumerate(homes):
        code, env = invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(tables[i]), "--home", str(home),
                                          "--site-id", f"site{i}", "--min-trajectories", "20"])
        assert code == 0, env
        site_fps.append(env["data"]["identity_fingerprint"])
        code, env = invoke(consortium_cli.app, ["add-site", str(home / "enrolment_request.json"), "--home", str(co),
                                                "--fingerprint", site_fps[-1]])
        assert code == 0, env
    (tmp_path / "offline").mkdir()
    shutil.move(co / "pki" / "ca.key", tmp_path / "offline" / "ca.key")
    started: list[Path] = []
    site_args = [a for h in homes for a in ("--site-home", str(h))]
    try:
        code, env = invoke(server_cli.app, ["start", "--home", str(co)])
        assert code == 0, env
        started.append(co / "server")
        for i, home in enumerate(homes):
            code, env = invoke(site_cli.app, ["join", str(co / "bundles" / f"site{i}.json"), "--home", str(home),
                                              "--coordinator-fingerprint", coordinator_fp])
            assert code == 0, env
            code, env = invoke(site_cli.app, ["start", "--home", str(home)])
            assert code == 0, env
            started.append(home)
        site_pids = {h: {n: int(v["pid"]) for n, v in read_pids(h).items()} for h in homes}

        # 1. a run that spends a share of each site's lifetime cap, its evidence collected and verified
        first = tmp_path / "run1"
        code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(first), "--rounds", "1", "--dp",
                                            "--dp-epsilon", "1", "--timeout", "900"])
        # the tiny world's test splits are below the sites' cohort floor: every site declines the final evaluation,
        # the run trained and has no answer, and the command says so by its exit code (issue 45 item 5)
        assert code == 1 and env["error_code"] == "RUN_FAILED", (env["message"], env.get("hint"))
        assert "could not evaluate" in env["message"] and "declined" in env["message"], env["message"]
        summary = json.loads((first / "summary.json").read_text())
        assert summary["site_errors"] == [] and summary["secure_aggregation"] is True
        code, env = invoke(audit_cli.app, ["collect", str(first / "evidence"), *site_args])
        assert code == 0, env
        assert {(first / "evidence" / "sites" / f"site{i}" / "site_ledger.jsonl").is_file() for i in range(N_SITES)} == {True}
        assert list((first / "evidence" / "sites" / "site0" / "privacy").glob("ledger-*.json"))  # the DP records too
        code, env = _verify(first / "evidence", site_fps)
        assert code == 0, _bad(env)
        from fcd_secure.privacy.report import site_budgets  # noqa: PLC0415

        spent = {sid: b["epsilon_spent"] for sid, b in site_budgets([h / "state" for h in homes]).items()}
        assert len(spent) == N_SITES and all(0 < e <= 1.0 + 1e-6 for e in spent.values()), spent  # not the cap of 8

        # 2. the coordinator restarted; no hospital touches its processes
        code, env = invoke(server_cli.app, ["stop", "--home", str(co)])
        assert code == 0, env
        time.sleep(3)  # the SuperNodes notice the SuperLink is gone
        code, env = invoke(server_cli.app, ["start", "--home", str(co)])
        assert code == 0, env
        for h in homes:  # the site's recorded processes (supervisor, executor) never stopped
            assert all(alive(p) for p in site_pids[h].values()), (h, read_pids(h))

        # 3. the next run resumes from the checkpoint on the same sites
        second = tmp_path / "run2"
        code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(second), "--rounds", "2", "--dp",
                                            "--dp-epsilon", "1", "--set", "federation.node_wait_s=300",
                                            "--timeout", "900"])
        assert code == 1 and "could not evaluate" in env["message"], (env["message"], env.get("hint"))
        summary = json.loads((second / "summary.json").read_text())
        assert summary["resumed_from_round"] == 1 and summary["rounds"] == 2
        assert json.loads((second / "config.json").read_text())["federation"]["node_wait_s"] == 300
        supernode_logs = [(h / "run" / "logs" / "supernode.log") for h in homes]
        assert any("starting it again" in p.read_text() for p in supernode_logs if p.exists())
    finally:
        for folder in reversed(started):
            pids = [int(v["pid"]) for v in read_pids(folder).values()]
            if folder.name == "server":
                invoke(server_cli.app, ["stop", "--home", str(co)])
            else:
                invoke(site_cli.app, ["stop", "--home", str(folder)])
            assert not any(alive(p) for p in pids), f"a process of {folder} survived stop"

    # 4. the first run's copies of the site ledgers are stale beside the second run's server ledger
    ev = second / "evidence"
    shutil.copytree(first / "evidence" / "sites", ev / "sites")
    code, env = _verify(ev, site_fps)
    assert code == 4 and env["status"] == "partial", _bad(env)
    partial = _bad(env)
    assert partial and all("stale evidence" in m for m in partial), partial
    assert not any("node " in m.split("stale")[0] for m in partial), partial  # sites by name, not node numbers
    code, env = invoke(audit_cli.app, ["collect", str(ev), *site_args])
    assert code == 0, env
    code, env = _verify(ev, site_fps)
    assert code == 0, _bad(env)
