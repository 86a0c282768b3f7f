"""The hospital path end to end on 127.0.0.1, with real Flower processes: a coordinator and four hospitals (the
secure-aggregation minimum), each in its own home folder with its own CSV (DKT-Synth written out as long tables,
one per site). Enrolment with fingerprints given out of band, join, preflight green, ``server start``,
``site start`` ×4, a run every site refuses (reported with the ServerApp's reason within a status poll, not at the
end of the timeout), ``server run`` with secure aggregation and DP (statistics from the secure round 0; exit 1: the tiny world's sites
decline the final evaluation, so the run has no answer), then
``fcd audit verify`` of the collected evidence with the pinned fingerprints: exit 0 and the installation records
present. Every process is stopped by PID, in a ``finally``.
"""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fcd_secure.cli import audit as audit_cli
from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import server as server_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.provisioning.consortium import Coordinator
from fcd_secure.provisioning.processes import alive, read_pids
from fcd_secure.provisioning.server import submit_run

pytestmark = pytest.mark.deployment
runner = CliRunner()
N_SITES = 4


def invoke(app, args: list[str]) -> tuple[int, dict]:
    res = runner.invoke(app, [*args, "--json"])
    try:
        return res.exit_code, json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{args}: {res.stdout!r} {res.exception!r}") from None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _status(ca: Path, port: int, path: str, source: str) -> int:
    conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=30, source_address=(source, 0),
                                       context=ssl.create_default_context(cafile=str(ca)))
    try:
        conn.request("GET", path)
        return conn.getresponse().status
    finally:
        conn.close()


def assert_control_api_only_from_coordinator(ca: Path, port: int) -> None:
    """Flower 1.42 serves the Control API on the sites' port: from any address but the coordinator's it is 403."""
    other = "127.0.0.2"  # another host as far as the SuperLink can tell (Linux routes all of 127/8 to loopback)
    assert _status(ca, port, "/v1/control/list-runs", other) == 403
    assert _status(ca, port, "/v1/runtime/anything", other) == 403
    assert _status(ca, port, "/v1/control/list-runs", "127.0.0.1") != 403
    assert _status(ca, port, "/health", other) == 200  # the sites' side stays open


def test_hospital_path_end_to_end(tmp_path, one_torch_thread):
    from fcd_secure.data.long_tables import write_site_tables
    from fcd_secure.data.registry import load_federated

    fd = load_federated("dkt-synth", n_sites=N_SITES, preset="tiny", seed=0)
    spec, tables = write_site_tables(fd.train, fd.test, tmp_path / "data", "dkt-synth-long")
    co = tmp_path / "coordinator"
    port = free_port()
    code, env = invoke(consortium_cli.app, ["init", "--home", str(co), "--id", "e2e", "--spec", str(spec),
                                            "--port", str(port), "--min-trajectories", "20"])
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
    # the CA's private key goes offline before the server starts (fcd server start refuses otherwise, P35)
    (tmp_path / "offline").mkdir()
    shutil.move(co / "pki" / "ca.key", tmp_path / "offline" / "ca.key")
    started: list[Path] = []
    try:
        code, env = invoke(server_cli.app, ["start", "--home", str(co)])
        assert code == 0, env
        started.append(co / "server")
        assert env["data"]["control_api_address"] == "127.0.0.1"
        assert_control_api_only_from_coordinator(co / "pki" / "ca.crt", port)
        for i, home in enumerate(homes):
            code, env = invoke(site_cli.app, ["join", str(co / "bundles" / f"site{i}.json"), "--home", str(home),
                                              "--coordinator-fingerprint", coordinator_fp])
            assert code == 0, env
            code, env = invoke(site_cli.app, ["preflight", "--home", str(home)])
            assert code == 0, env["data"]["checks"] if env.get("data") else env
            code, env = invoke(site_cli.app, ["start", "--home", str(home)])
            assert code == 0, env
            started.append(home)
        # a run every site refuses (no DP under the default policy), submitted below the CLI's own check: the
        # ServerApp fails at hello and the coordinator learns it from the SuperLink within a status poll, not at
        # the end of --timeout (docs/hospital.md, friction 3)
        t0 = time.monotonic()
        with pytest.raises(RuntimeError, match="ended finished:failed without results: .*refused by the site's policy"):
            submit_run(Coordinator(co), tmp_path / "refused", rounds=1, dp=False, timeout_s=300)
        assert time.monotonic() - t0 < 120
        out = tmp_path / "run"
        code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(out), "--rounds", "1", "--dp",
                                            "--timeout", "900"])
        # the run trains; the tiny world's test splits are below the sites' cohort floor, so every site declines the
        # final evaluation: no answer, and the exit code says so (issue 45 item 5)
        assert code == 1 and "could not evaluate" in env["message"], (env["message"], env.get("hint"))
        assert env["data"]["secure_aggregation"] is True
        assert env["data"]["standardization"] is not None  # round 0 ran
        assert (out / "summary.json").is_file() and (out / "theta_c.npz").is_file()
        # the wall time of a deployment round, for the README's deployment section (printed with -s)
        rounds = json.loads((out / "rounds.json").read_text())
        print(f"\n[hospital deployment] round_s {[r['round_s'] for r in rounds]}, "
              f"round_seconds {env['data'].get('round_seconds')}")
    finally:
        for folder in reversed(started):
            pids = [int(v["pid"]) for v in read_pids(folder).values()]
            if folder.name == "server":
                invoke(server_cli.app, ["stop", "--home", str(co)])
            else:
                invoke(site_cli.app, ["stop", "--home", str(folder)])
            assert not any(alive(p) for p in pids), f"a process of {folder} survived stop"
    # each hospital hands its ledger to the auditor beside the coordinator's evidence
    ev = out / "evidence"
    for i, home in enumerate(homes):
        ledger = home / "state" / f"site{i}" / "slots" / "site_ledger.jsonl"
        (ev / "sites" / f"site{i}").mkdir(parents=True, exist_ok=True)
        shutil.copyfile(ledger, ev / "sites" / f"site{i}" / "site_ledger.jsonl")
    fps = json.loads((ev / "fingerprints.json").read_text())
    args = ["verify", str(ev), "--server-key", fps["server"]]
    for fp in site_fps:
        args += ["--site-key", fp]
    code, env = invoke(audit_cli.app, args)
    assert code == 0, [f for f in env["data"]["findings"] if f["severity"] != "note"] if env.get("data") else env
    events = {(i["site"], i["event"]) for i in env["data"]["installation"]}
    assert {(f"site{i}", e) for i in range(N_SITES) for e in ("init", "join", "preflight")} <= events
