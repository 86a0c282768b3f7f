"""The app on Flower's Deployment Engine: real SuperLink, SuperNodes and site executors on 127.0.0.1.

One secure deployment (TLS, SuperNode authentication, the sites' own executors running only the pinned app, secure
aggregation, 4 sites) is shared by the attacks and the run, in this order:

* SuperNodes without a key or with an unregistered key are refused by the SuperLink;
* a second local process submits its own app with ``flwr run`` (the Control API is unauthenticated in open-source
  Flower): every site refuses it, records the refusal, and the app's code never runs (it would copy a site key);
  at the same time it submits the consortium's own app with a run config the coordinator did not sign: the
  ServerApp refuses it;
* the consortium's run: Θc equals the simulation engine's within the quantisation bound, and ``fcd audit verify``
  of the collected evidence with the pinned keys exits 0; no private key is in the run folder.

``--insecure-dev`` (today's development mode) is checked apart: plain FedAvg equals the simulation engine and the
run folder is marked. The reference of both comparisons is the in-process engine (``engines.inprocess``), which
``test_federation_inprocess.py`` pins to Flower's simulation engine bit for bit on a secure run (whose messages carry every kind a plain run sends):
it spares each test a Ray start. Every process is stopped by PID (process group) in a ``finally``; ports are chosen
at run time. A cold ClientApp process per message makes these tests slow (minutes).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import CHEAP_EVALUATION  # the closing evaluation: no assertion here reads a policy's value


from fcd_secure.audit import POLICY_ERROR_CODE, POLICY_REASON_PREFIX  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.federation.records import RUN_CONFIG_KEY  # noqa: E402

pytestmark = pytest.mark.deployment

#: generous protocol deadlines: on two shared cores one cold ClientApp process can take a minute
SLOW = {stage: 900.0 for stage in ("train", "advertise_keys", "share_keys", "masked_input", "consistency", "unmask")}


def _cfg(out, *, secure: bool, sites: int):
    return build_config(
        "tiny",
        {
            "seed": 0,
            "data": {"n_sites": sites},
            "federation": {"clients_per_round": sites, "rounds": 1, "eval_every": 0, "secure_aggregation": secure,
                           "round_timeout_s": 900.0, "node_wait_s": 600.0},
            "secagg": {"deadlines": SLOW},
            "evaluation": CHEAP_EVALUATION,
            "out": str(out),
        },
    )


def _reference(cfg, state: Path):
    """``cfg``'s rounds on the in-process engine with their state in ``state``: ``(Θc after the last round, the
    rounds' rows)`` (``engines.inprocess.run_rounds``: the run folder and the closing evaluation are no part of the
    comparison; with one round, that Θc is the run's)."""
    from fcd_secure.engines.inprocess import run_rounds

    return run_rounds(cfg.model_copy(update={"state_dir": str(state)}))


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (exited, not yet reaped) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().split(") ")[-1].split()[0] != "Z"
    except OSError:
        return False


def _processes_under(folder: Path) -> list[int]:
    out = []
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(folder) in cmd and "pytest" not in cmd and _alive(int(pid)):
                out.append(int(pid))
    return out


def _all_gone(dep, workdir: Path) -> None:
    deadline = time.monotonic() + 30
    while (any(_alive(p) for p in dep.pids()) or _processes_under(workdir)) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not any(_alive(p) for p in dep.pids()), "a deployment process survived stop()"
    assert not _processes_under(workdir), "a child of the deployment survived stop()"


def _theta(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


FOREIGN_CLIENT = '''
from pathlib import Path
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.clientapp import ClientApp

app = ClientApp()


@app.train()
def steal(msg, context):
    nc = context.node_config
    key = Path(str(nc["state-dir"])) / str(nc["site-id"]) / "identity_ed25519.key"
    loot = key.read_bytes()
    Path(str(context.run_config["marker"]) + "-" + str(nc["site-id"])).write_bytes(loot)
    return Message(RecordDict({"loot": ConfigRecord({"key": loot})}), reply_to=msg)
'''

FOREIGN_SERVER = '''
import json, time
from pathlib import Path
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import ServerApp

app = ServerApp()


@app.main()
def main(grid, context):
    deadline = time.monotonic() + 300
    while len(list(grid.get_node_ids())) < 4 and time.monotonic() < deadline:
        time.sleep(0.5)
    nodes = list(grid.get_node_ids())
    msgs = [Message(RecordDict({"x": ConfigRecord({"a": 1})}), dst_node_id=n, message_type="train") for n in nodes]
    replies = list(grid.send_and_receive(msgs, timeout=900))
    out = {"nodes": len(nodes), "replies": len(replies),
           "errors": [[int(r.error.code), r.error.reason] for r in replies if r.has_error()]}
    Path(str(context.run_config["marker"]) + "-server.json").write_text(json.dumps(out))
'''


def _foreign_app(folder: Path, marker: Path) -> Path:
    import tomli_w

    (folder / "foreign_app").mkdir(parents=True)
    (folder / "foreign_app" / "__init__.py").write_text("")
    (folder / "foreign_app" / "client.py").write_text(FOREIGN_CLIENT)
    (folder / "foreign_app" / "server.py").write_text(FOREIGN_SERVER)
    (folder / "pyproject.toml").write_text(tomli_w.dumps({
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {"name": "foreign-app", "version": "1.0.0", "license": "Apache-2.0", "dependencies": ["flwr"]},
        "tool": {"hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
                 "flwr": {"app": {"publisher": "attacker",
                                  "components": {"serverapp": "foreign_app.server:app", "clientapp": "foreign_app.client:app"},
                                  "config": {"marker": str(marker)}}}},
    }))
    return folder


def _start_rogue_supernodes(dep, tmp_path: Path, keys: dict[str, Path | None]) -> dict[str, subprocess.Popen]:
    """SuperNodes that try to join the deployment, one per ``{name: private key or None}``, all at once (each mostly
    waits for the SuperLink's answer), each logging to ``<name>.log``. ``--isolation process``: a refused SuperNode
    has no use for the SuperExec process Flower's default isolation would start beside it."""
    from fcd_secure.engines.deployment import _bin, flower_env, free_port

    procs = {}
    for name, key in keys.items():
        args = [_bin("flower-supernode"), "--root-certificates", str(dep.tls.ca_cert), "--superlink",
                f"127.0.0.1:{dep.port}", "--host", "127.0.0.1", "--port", str(free_port()), "--max-retries", "1",
                "--max-wait-time", "60", "--isolation", "process", "--node-config", 'site-id="intruder" site-index=0']
        if key is not None:
            args += ["--auth-supernode-private-key", str(key)]
        with open(tmp_path / f"{name}.log", "wb") as fh:
            procs[name] = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT,
                                           env=flower_env(tmp_path / f"{name}-home"), start_new_session=True)
    return procs


def _rogue_outcomes(procs: dict[str, subprocess.Popen], tmp_path: Path, wait_s: float = 240) -> dict[str, tuple[int, str]]:
    """Each rogue SuperNode's exit code and log (:func:`_start_rogue_supernodes`); one still running after
    ``wait_s`` is killed with its process group and fails the wait."""
    deadline = time.monotonic() + wait_s
    out = {}
    try:
        for name, p in procs.items():
            rc = p.wait(timeout=max(1.0, deadline - time.monotonic()))
            out[name] = rc, (tmp_path / f"{name}.log").read_text(errors="replace")
    finally:
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    return out


def test_secure_deployment_refuses_intruders_and_foreign_apps_and_matches_simulation(tmp_path):
    from fcd_secure.audit.ledger import SITE_LEDGER_FILE
    from fcd_secure.audit.verify import verify_path
    from fcd_secure.engines.deployment import CONNECTION, LocalDeployment, _bin, flower_env
    from fcd_secure.engines.pki import make_node_key

    work = tmp_path / "dep"
    dep = LocalDeployment(_cfg(tmp_path / "dep-run", secure=True, sites=4), workdir=work)
    times = {}
    try:
        t0 = time.monotonic()
        dep.start()
        times["start"] = time.monotonic() - t0
        assert len(dep.pids()) == 9 and all(_alive(p) for p in dep.pids())  # SuperLink + 4 × (SuperNode, executor)
        for site in dep.sites:
            assert site.root.stat().st_mode & 0o777 == 0o700

        # -- intruding SuperNodes, started beside the attacks below (each mostly waits for the SuperLink's answer;
        # none is registered, so the consortium's four nodes stay the only ones the runs below see) --------------
        t0 = time.monotonic()
        make_node_key(tmp_path / "other.key", tmp_path / "other.pub")
        rogue_procs = _start_rogue_supernodes(dep, tmp_path, {"no-key": None, "wrong-key": tmp_path / "other.key"})

        # -- a foreign app submitted by another local process, and at the same time the consortium's own app
        # rebuilt and submitted with a run config of the attacker's (P34): two runs the sites must not serve, started
        # together (each mostly waits for its ServerApp process to start)
        import tomli_w

        marker = tmp_path / "stolen"
        attacker = tmp_path / "attacker-home"
        attacker.mkdir()
        (attacker / "config.toml").write_text((dep.cli_home / "config.toml").read_text())  # the CA is public
        foreign = _foreign_app(tmp_path / "foreign", marker)
        evil = dep.cfg.model_copy(update={"out": str(tmp_path / "attacker-out"), "seed": 7})
        (attacker / "run-config.toml").write_text(tomli_w.dumps({RUN_CONFIG_KEY: evil.to_json()}))
        with open(tmp_path / "unsigned-run.log", "wb") as fh:
            unsigned = subprocess.Popen([_bin("flwr"), "run", str(dep.app_dir), CONNECTION, "--run-config",
                                         str(attacker / "run-config.toml"), "--stream"], stdout=fh,
                                        stderr=subprocess.STDOUT, env=flower_env(attacker), start_new_session=True)
        try:
            with open(tmp_path / "foreign-run.log", "wb") as fh:
                subprocess.run([_bin("flwr"), "run", str(foreign), CONNECTION, "--stream"], stdout=fh,
                               stderr=subprocess.STDOUT, env=flower_env(attacker), timeout=1200, check=False)
            unsigned.wait(timeout=600)
        finally:
            if unsigned.poll() is None:
                os.killpg(unsigned.pid, 9)
                unsigned.wait()
        rogues = _rogue_outcomes(rogue_procs, tmp_path)
        times["intruders_foreign_and_unsigned_runs"] = time.monotonic() - t0
        rc, log = rogues["no-key"]
        assert rc != 0 and "must be registered" in log
        rc, log = rogues["wrong-key"]
        assert rc != 0 and "Failed to activate SuperNode" in log
        server_view = json.loads(Path(str(marker) + "-server.json").read_text())
        assert server_view["nodes"] == 4 and server_view["replies"] == 4
        assert all(code == POLICY_ERROR_CODE and reason == POLICY_REASON_PREFIX + "app_not_pinned" for code, reason in server_view["errors"])
        assert len(server_view["errors"]) == 4
        assert not list(tmp_path.glob("stolen-site-*")), "the foreign ClientApp ran on a site"
        for site in dep.sites:
            assert "is not pinned in the site policy; nothing ran" in (site.logs / "site-exec.log").read_text()
            lines = [json.loads(l) for l in site.ledger.read_text().splitlines()]
            refused = [l for l in lines if l["kind"] == "upload" and l["status"] == "refused"]
            assert [r["refusal"]["rule"] for r in refused] == ["app_not_pinned"] and refused[0]["payload_bytes"] == 0
        assert not (tmp_path / "attacker-out").exists(), "the coordinator's ServerApp ran an unsigned run config"
        assert "coordinator signature" in (tmp_path / "unsigned-run.log").read_text(errors="replace")
        # the ServerApp the run starts will not read the coordinator's keys, the CA's or any site's folder (P35)
        denied = dep._serverapp_denied()
        assert {dep.coordinator_key_path, dep.tls.server_key, dep.workdir / "pki" / "ca.key", work / "sites"} <= set(denied)

        # -- the consortium's run -------------------------------------------------------------------------
        t0 = time.monotonic()
        summary = dep.run(timeout_s=3000)
        times["run"] = time.monotonic() - t0

        # -- the signed run config resubmitted under a new Flower run id, without the key (P52) ---------------
        t0 = time.monotonic()
        summary_file = tmp_path / "dep-run" / "summary.json"
        stamp = summary_file.stat().st_mtime_ns
        with open(tmp_path / "replayed-run.log", "wb") as fh:
            subprocess.run([_bin("flwr"), "run", str(dep.app_dir), CONNECTION, "--run-config",
                            str(work / "run-config.toml"), "--stream"], stdout=fh, stderr=subprocess.STDOUT,
                           env=flower_env(attacker), timeout=600, check=False)
        times["replayed_run"] = time.monotonic() - t0
        replayed = " ".join((tmp_path / "replayed-run.log").read_text(errors="replace").split())
        assert "signed run start was already used by run" in replayed, replayed[-2000:]
        assert summary_file.stat().st_mtime_ns == stamp, "a replayed run start rewrote the run folder"
    finally:
        dep.stop()
    _all_gone(dep, work)
    print(f"\n[deployment timings, s] {json.dumps({k: round(v, 1) for k, v in times.items()})}")

    out = tmp_path / "dep-run"
    assert summary["rounds"] == 1 and summary["engine"] == "flower" and not summary.get("insecure_dev")
    assert not (out / "INSECURE-DEV").exists()
    # the evidence: ledgers, fingerprints, public keys; no private key anywhere in the run folder
    ev = out / "evidence"
    fps = json.loads((ev / "fingerprints.json").read_text())
    assert sorted(p.name for p in (ev / "sites").iterdir()) == [s.site_id for s in dep.sites]
    assert all((ev / "sites" / s.site_id / SITE_LEDGER_FILE).is_file() for s in dep.sites)
    for f in out.rglob("*"):
        if f.is_file():
            assert b"PRIVATE KEY" not in f.read_bytes(), f
            assert not f.name.endswith((".key", ".secret")), f
    res = verify_path(ev, site_keys=list(fps["sites"].values()), server_keys=[fps["server"]])
    assert res.exit_code == 0 and res.status == "compliant", [f.message for f in res.findings if f.severity != "note"]
    assert {r.rule for r in res.refusals} >= {"app_not_pinned"}

    # Θc equals the in-process engine's (the simulation engine's, bit for bit: test_federation_inprocess.py) within
    # the fixed-point bound of secure aggregation
    t0 = time.monotonic()
    want, ref_rounds = _reference(_cfg(tmp_path / "sim-run", secure=True, sites=4), tmp_path / "sim-state")
    times["simulation"] = time.monotonic() - t0
    got = _theta(out / "theta_c.npz")
    from fcd_secure.aggregation.secagg import SecAggPolicy, quantisation_bound

    n_total = ref_rounds[0]["n_total"]
    bound = quantisation_bound(SecAggPolicy(), 4, int(n_total))
    assert set(got) == set(want)
    for name in want:
        tol = 2 * bound + 2 * np.abs(want[name]).max() * 2.0**-23  # each side: fixed point + one float32 ulp
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=tol, err_msg=name)
    print(f"[deployment timings, s] {json.dumps({k: round(v, 1) for k, v in times.items()})}")


def test_insecure_dev_deployment_matches_simulation_and_is_marked(tmp_path):
    from fcd_secure.engines.deployment import LocalDeployment

    work = tmp_path / "dep"
    cfg = _cfg(tmp_path / "dep-run", secure=False, sites=3)
    cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"clients_per_round": 2})})
    dep = LocalDeployment(cfg, workdir=work, insecure_dev=True)
    try:
        dep.start()
        assert len(dep.pids()) == 4 and all(_alive(p) for p in dep.pids())  # SuperLink + 3 SuperNodes
        t0 = time.monotonic()
        summary = dep.run(timeout_s=1800)
        print(f"\n[insecure-dev deployment run: {time.monotonic() - t0:.1f} s]")
    finally:
        dep.stop()
    _all_gone(dep, work)
    out = tmp_path / "dep-run"
    assert summary["insecure_dev"] is True and (out / "INSECURE-DEV").is_file()
    assert json.loads((out / "summary.json").read_text())["insecure_dev"] is True
    assert json.loads((out / "evidence" / "fingerprints.json").read_text())["insecure_dev"] is True
    # node config carried each site's identity and its own folder
    assert sorted(p.name for p in (work / "sites").iterdir()) == ["site-00", "site-01", "site-02"]
    assert all((work / "sites" / s / "site_policy.toml").is_file() for s in ("site-00", "site-01", "site-02"))
    got, (want, _) = _theta(out / "theta_c.npz"), _reference(cfg, tmp_path / "sim-state")
    assert set(got) == set(want)
    for name in want:
        np.testing.assert_allclose(got[name], want[name], rtol=0, atol=1e-6, err_msg=name)
