"""The coordinator's processes and runs: ``fcd server start|stop|status|run``.

``start`` runs one ``flower-superlink`` with the consortium's TLS certificate and SuperNode authentication on the
host the consortium names; its Control API (unauthenticated in open-source Flower, and on the same port as the Fleet
API in the pinned Flower) answers only the coordinator host (``--control-api-address``, ``provisioning.superlink_main``);
it registers each enrolled site's SuperNode key
(``flwr supernode register``) at every start, because the SuperLink keeps its state in memory
(``deployment.FLWR_IN_MEMORY``). ``run`` submits the consortium's pinned app (``flwr run``) with a run config in which
every site reads its own table (the server names none) and standardises with statistics from the secure round 0
(``federation.secure.secure_stats``); it waits for the run folder and collects the coordinator's evidence (server
ledger, signed roster, CA certificate, fingerprints) into ``<out>/evidence/``. The hospitals add their own ledgers
there for an auditor (``fcd audit verify``).
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import tomli_w

from fcd_secure._io import atomic_write_bytes, atomic_write_text
from fcd_secure.audit import SERVER_LEDGER_FILE, load_or_create_identity_key
from fcd_secure.audit.signing import public_key_bytes
from fcd_secure.engines.deployment import (CONNECTION, FLWR_IN_MEMORY, SERVER_TASK_POLL_S, _bin, flower_env,
                                           register_node_keys, signed_run_config)
from fcd_secure.provisioning import processes
from fcd_secure.provisioning.bundle import ROSTER_TYPE
from fcd_secure.provisioning.consortium import Coordinator, ProvisioningError
from fcd_secure._flower.superlink_main import DEFAULT_CONTROL_HOST
from fcd_secure.provisioning.signed import read_document
from fcd_secure.apps.sandbox import DENY_ENV
from fcd_secure.federation.asked_runs import QuestionStart, config_text
from fcd_secure.federation.run_ticket import CONSORTIUM_ENV, COORDINATOR_KEY_ENV, ticket_session_id
from fcd_secure.federation.secure.setup import ROSTER_FILE, write_roster
from fcd_secure.federation.state import IDENTITY_FILE, SERVER_DIR
from fcd_secure.fingerprints import fingerprint

#: what the server's run config names as the table: each site reads its own (node config ``own-table``)
SITE_OWN_TABLE = "site-own"
LINK = "superlink"
#: the file of a deployed run folder naming the signed session of the run start that answered it
RUN_START_FILE = "run_start.json"


def _server_root(co: Coordinator) -> Path:
    return co.home / "server"


def _address(co: Coordinator) -> tuple[str, int]:
    host, _, port = co.config().superlink.rpartition(":")
    return host, int(port)


def _cli_home(co: Coordinator) -> Path:
    home = _server_root(co) / "cli-home"
    home.mkdir(parents=True, exist_ok=True)
    conn = {"address": co.config().superlink, "root-certificates": str(co.pki / "ca.crt")}
    atomic_write_text(home / "config.toml", tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: conn}}))
    return home


def roster(co: Coordinator) -> dict[str, dict[str, str]]:
    """The signed roster, verified against the coordinator's own key."""
    return read_document(co.roster_path, ROSTER_TYPE, co.fingerprint())["payload"]["sites"]


#: where ``fcd consortium init`` writes the CA's private key (``engines.pki.make_tls_dir``)
CA_KEY_FILE = "ca.key"


def check_ca_key_offline(co: Coordinator) -> None:
    """Refuse to serve while the CA's private key is on the coordinator host (docs/threats.md P35).

    The CA key signs the certificates every site trusts; the SuperLink needs only its own certificate and key. The
    processes the server starts (the SuperLink, its executor, every ServerApp) run as the coordinator's OS user, so
    a key in the coordinator's folder is a key they can read: it must be moved offline after provisioning, as
    ``fcd consortium init`` says.

    Raises:
        ProvisioningError: ``pki/ca.key`` (or a ``ca.key`` anywhere in the coordinator's folder) exists.
    """
    found = sorted(str(p) for p in co.home.rglob(CA_KEY_FILE))
    if found:
        raise ProvisioningError(f"{found[0]}: the CA's private key is on the coordinator host (field: file); move it "
                                "offline (it signs the certificates every site trusts) before fcd server start")


def start_server(co: Coordinator, wait_s: float = 60.0, control_api_address: str = DEFAULT_CONTROL_HOST) -> dict[str, Any]:
    """Start the SuperLink and register every enrolled site's SuperNode key.

    Args:
        co: the coordinator.
        wait_s: how long to wait for the SuperLink's port.
        control_api_address: the coordinator host's address: with the address the SuperLink listens on (the
            ServerApp's executor and the coordinator's own ``flwr`` calls to it come from there), the only client
            addresses whose Control API and Runtime API requests the SuperLink answers
            (``provisioning.superlink_main``); every other client gets HTTP 403 there.

    Raises:
        ProvisioningError: already running, the CA's private key still on this host, no site enrolled yet,
            ``control_api_address`` is not an IP address, or another process listens on the consortium's port
            (named, before anything starts or any key is registered).
        RuntimeError: the SuperLink did not start or a registration failed (the message names the log).
    """
    root = _server_root(co)
    if any(p["running"] for p in processes.status(root).values()):
        raise ProvisioningError(f"{root}: the server is running already (fcd server status / stop)")
    check_ca_key_offline(co)
    sites = co.enrolled()
    if not sites:
        raise ProvisioningError(f"{co.home}: no site enrolled yet (fcd consortium add-site)")
    try:
        control = str(ipaddress.ip_address(control_api_address))
    except ValueError:
        raise ProvisioningError(f"--control-api-address {control_api_address!r}: expected the coordinator host's IP "
                                "address (the client address its flwr calls come from)") from None
    host, port = _address(co)
    # a port another process listens on would be "open" at once below, and every site's key would be registered with
    # that process (another consortium's SuperLink) while this SuperLink fails in its log with "address in use"
    taken = processes.port_taken(host, port)
    if taken:
        raise ProvisioningError(
            f"{taken}: port {port} is in use by another process (another consortium's SuperLink, or one started "
            f"outside fcd server start); nothing was started and no site was registered: stop that process, or "
            f"give this consortium another port (consortium.toml superlink = {co.config().superlink!r})")
    own = sorted({info[4][0] for info in socket.getaddrinfo(host, port, proto=socket.IPPROTO_TCP)} - {control})
    root.mkdir(parents=True, exist_ok=True)
    args = [sys.executable, "-m", "fcd_secure._flower.superlink_main",
            *[a for ip in (control, *own) for a in ("--control-api-address", ip)],
            "--ssl-ca-certfile", str(co.pki / "ca.crt"), "--ssl-certfile",
            str(co.pki / "server.pem"), "--ssl-keyfile", str(co.pki / "server.key"), "--enable-supernode-auth",
            "--host", host, "--port", str(port), "--database", FLWR_IN_MEMORY,
            "--disable-runtime-dependency-installation"]
    env = {**flower_env(root / "link-home", SERVER_TASK_POLL_S),
           # the ServerApp refuses a run the coordinator did not sign for this consortium (apps.server_app, P34)
           COORDINATOR_KEY_ENV: public_key_bytes(co.key()).hex(), CONSORTIUM_ENV: co.config().consortium_id,
           # a ServerApp reads neither the coordinator's signing key nor the SuperLink's TLS key (apps.sandbox)
           DENY_ENV: os.pathsep.join(str(p) for p in (co.key_path, co.pki / "server.key"))}
    pid = processes.spawn(root, LINK, args, env)
    processes.wait_for_port(host, port, pid, wait_s, "the SuperLink")
    if not processes.alive(pid):  # the port was taken between the check and the bind: what answered is not ours
        raise RuntimeError(f"the SuperLink (PID {pid}) exited; see {processes.run_dir(root) / 'logs' / (LINK + '.log')}")
    cli = _cli_home(co)
    log = processes.run_dir(root) / "logs" / "register.log"
    # every start: the SuperLink's state lives in its memory (module docstring)
    failed = register_node_keys({sid: co.site_dir(sid) / "node.pub" for sid in sites}, cli, root, log)
    if failed:
        raise RuntimeError(f"registering the SuperNode key of site(s) {', '.join(failed)} failed (exit "
                           f"{', '.join(str(rc) for rc in failed.values())}); see {log}")
    return {"pid": pid, "superlink": co.config().superlink, "registered": sorted(sites), "control_api_address": control,
            "control_api_clients": [control, *own]}


def server_status(co: Coordinator) -> dict[str, Any]:
    return {"processes": processes.status(_server_root(co)), "superlink": co.config().superlink}


def stop_server(co: Coordinator) -> dict[str, int]:
    return processes.stop(_server_root(co))


#: config keys a consortium run fixes (every enrolled site on its own table, secure aggregation and standardisation,
#: the coordinator's run and state folders): ``fcd server run --set`` may not change them
FIXED_KEYS = ("seed", "data.dataset", "data.spec", "data.table", "data.n_sites", "data.standardize",
              "federation.rounds", "federation.clients_per_round", "federation.secure_aggregation", "dp.enabled",
              "dp.run_epsilon", "out", "state_dir")


def run_config_for(co: Coordinator, out: Path, *, rounds: int, dp: bool, preset: str, seed: int,
                   dp_epsilon: float | None = None, settings: Sequence[str] = ()):
    """The run config the coordinator submits: every enrolled site, secure aggregation, secure standardisation.

    Args:
        dp_epsilon: the ε this run may add to each site's spend (``dp.run_epsilon``: a share of each site's
            lifetime cap, which every site checks against what it has left); None: up to each site's cap.
        settings: ``KEY=VALUE`` assignments of any other config key (``fcd run --set``).

    Raises:
        fcd_secure.config.ConfigError: an unknown key or bad value, or a key in :data:`FIXED_KEYS`.
    """
    from fcd_secure.config import ConfigError, build_config, settings_overrides  # noqa: PLC0415

    over = settings_overrides(settings)
    for text in settings:
        key = text.partition("=")[0].strip()
        if key in FIXED_KEYS:
            raise ConfigError(f"--set {key}: a consortium run fixes it (its own option, or the consortium's: "
                              f"{', '.join(FIXED_KEYS)})")
    n = len(co.enrolled())
    fixed = {
        "seed": seed,
        "data": {"dataset": "spec", "spec": str(co.spec_path), "table": SITE_OWN_TABLE, "n_sites": n,
                 "standardize": "secure"},
        "federation": {"rounds": rounds, "clients_per_round": n, "secure_aggregation": True},
        "dp": {"enabled": dp, **({"run_epsilon": dp_epsilon} if dp_epsilon is not None else {})},
        "out": str(out.resolve()),
        "state_dir": str((_server_root(co) / "state").resolve()),
    }
    for key, value in fixed.items():
        if isinstance(value, dict):
            over.setdefault(key, {}).update(value)
        else:
            over[key] = value
    return build_config(preset, over)


#: how often, at most, a waiting ``fcd server run`` asks the SuperLink whether its run ended without results (each
#: ask is a ``flwr ls`` process: about 1.5 s of CPU); while no ServerApp has shown, the first ask comes after
#: :data:`RUN_STATUS_FIRST_POLL_S` and the interval doubles up to this, so a run that fails before its ServerApp
#: starts is reported in seconds too
RUN_STATUS_POLL_S = 10.0
#: a run's ServerApp process shows under the SuperLink one SuperExec poll (``SERVER_TASK_POLL_S``) and a process
#: start after the submission (up to a second and more), and once it showed it is asked about the moment it ends: an
#: ask at 1 s often came before it and found the run not started yet, for a ``flwr ls`` that the wait blocks on
RUN_STATUS_FIRST_POLL_S = 5.0
#: the same while a ServerApp process runs under the coordinator's SuperLink: a run cannot have ended without
#: results while its ServerApp still runs, and the moment none runs the next ask comes at once. A long run then costs
#: one ``flwr ls`` per minute instead of one per :data:`RUN_STATUS_POLL_S` (on two cores, 0.15 of a core)
RUN_STATUS_SERVERAPP_POLL_S = 60.0
#: the program Flower's SuperExec starts for each run on the coordinator (flwr 1.42, ``flwr.supercore.superexec``)
SERVERAPP_PROGRAM = "flwr-serverapp"


def _flwr(co: Coordinator, *args: str) -> str | None:
    """Stdout of one ``flwr`` call on the coordinator's connection, or None when it fails or hangs."""
    try:
        res = subprocess.run([_bin("flwr"), *args], capture_output=True, env=flower_env(_cli_home(co)),
                             cwd=_server_root(co), timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return res.stdout.decode("utf-8", "replace") if res.returncode == 0 else None


def _run_status(co: Coordinator, run_id: int) -> str | None:
    """Flower's status of ``run_id`` (``finished:completed``, ``finished:failed``, ``running``, ...), or None."""
    text = _flwr(co, "ls", CONNECTION, "--run-id", str(run_id), "--format", "json")
    try:
        runs = json.loads(text or "")["runs"]
    except (ValueError, KeyError, TypeError):
        return None
    return next((str(r.get("status")) for r in runs if str(r.get("run-id")) == str(run_id)), None)


def _run_error(co: Coordinator, run_id: int) -> str:
    """The ServerApp's last exception line in the run's log (e.g. which sites refused, and at which step)."""
    text = _flwr(co, "log", str(run_id), CONNECTION, "--show") or ""
    lines = re.findall(r"^[\w.]+(?:Error|Exception): .+$", text, flags=re.M)
    return lines[-1][:800] if lines else "the ServerApp's log names no exception"


def _running(co: Coordinator) -> bool:
    return any(p["running"] for p in processes.status(_server_root(co)).values())


def _server_app_pid(co: Coordinator) -> int | None:
    """The PID of a ServerApp process (:data:`SERVERAPP_PROGRAM`) under the coordinator's SuperLink, or None (read
    from ``/proc``, no request to the SuperLink)."""
    link = processes.read_pids(_server_root(co)).get(LINK)
    return None if link is None else processes.find_below(int(link["pid"]), SERVERAPP_PROGRAM)


def _signed(co: Coordinator, config_text_: str) -> dict[str, str]:
    """The run config of a run start signed by the coordinator (P34) for its consortium and pinned app."""
    terms = co.config()
    return signed_run_config(co.key(), terms.consortium_id, terms.app_fab_sha256, config_text_)


def _submit_and_wait(co: Coordinator, run_config_doc: dict[str, str], done: Path, timeout_s: float) -> int | None:
    """``flwr run`` the consortium's app with ``run_config_doc`` and wait until the ServerApp writes ``done`` (its
    last file); returns Flower's run id (None when the log does not name it).

    Raises:
        RuntimeError: ``flwr run`` failed, the run did not finish in time, the SuperLink stopped, or the run ended
            without ``done`` (the ServerApp's exception named, from the SuperLink's log).
    """
    root = _server_root(co)
    run_config = root / "run-config.toml"
    atomic_write_text(run_config, tomli_w.dumps(run_config_doc), mode=0o600)
    if done.exists():
        done.unlink()
    log = processes.run_dir(root) / "logs" / "flwr-run.log"
    t0 = time.monotonic()
    logged = log.stat().st_size if log.exists() else 0
    # submit without --stream: the log stream is one more long request on the SuperLink's database, and a broken
    # stream says nothing about the run; the file the ServerApp writes last is what says it finished
    with open(log, "ab") as f:
        rc = subprocess.run([_bin("flwr"), "run", str(co.app_dir), CONNECTION, "--run-config", str(run_config)],
                            stdout=f, stderr=subprocess.STDOUT, env=flower_env(_cli_home(co)), cwd=root,
                            timeout=300).returncode
    if rc != 0:
        raise RuntimeError(f"flwr run failed (exit {rc}); see {log}")
    started = re.findall(rb"started run (\d+)", log.read_bytes()[logged:])
    run_id = int(started[-1]) if started else None
    deadline = t0 + timeout_s
    interval = RUN_STATUS_FIRST_POLL_S
    next_status = time.monotonic() + interval
    app_pid: int | None = None  # the run's ServerApp process once it showed: then only its PID is checked
    while not done.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"the run did not finish within {timeout_s:.0f} s; see {log} and `flwr log` on the SuperLink")
        if not _running(co):
            raise RuntimeError(f"the SuperLink stopped during the run; see {processes.run_dir(root) / 'logs'}")
        if app_pid is None:
            app_pid = _server_app_pid(co)
            if app_pid is not None:
                next_status = time.monotonic() + RUN_STATUS_SERVERAPP_POLL_S
        elif not processes.alive(app_pid):  # the ServerApp just ended: without results? (ask now, not in a while)
            app_pid = None
            next_status = time.monotonic()
        app_running = app_pid is not None
        if run_id is not None and time.monotonic() >= next_status and not done.exists():
            # a ServerApp that raised (every site refused, a checkpoint of other settings, ...) writes no
            # result: ask the SuperLink, or the command would wait out the whole timeout (docs/hospital.md,
            # "Frictions found", 3)
            status = _run_status(co, run_id)
            if status is not None and status.startswith("finished:") and status != "finished:completed" \
                    and not done.exists():
                raise RuntimeError(f"run {run_id} ended {status} without results: {_run_error(co, run_id)} (the "
                                   f"whole log: FLWR_HOME={_cli_home(co)} flwr log {run_id} {CONNECTION} --show)")
            interval = min(2 * interval, RUN_STATUS_POLL_S)
            next_status = time.monotonic() + (RUN_STATUS_SERVERAPP_POLL_S if app_running else interval)
        time.sleep(0.5)
    return run_id


def submit_run(co: Coordinator, out: str | Path, *, rounds: int = 1, dp: bool = True, preset: str = "tiny",
               seed: int = 0, timeout_s: float = 1800.0, dp_epsilon: float | None = None,
               settings: Sequence[str] = ()) -> dict[str, Any]:
    """Submit the pinned app to the running SuperLink, wait for the run folder, collect the evidence.

    Returns:
        ``summary.json`` of the run, with ``evidence`` (the folder) and ``round_seconds``.

    Raises:
        ProvisioningError: the server is not running.
        RuntimeError: the run did not finish in time (the message names the log).
    """
    root = _server_root(co)
    if not _running(co):
        raise ProvisioningError(f"{root}: the server is not running (fcd server start --home {co.home})")
    out = Path(out)
    cfg = run_config_for(co, out, rounds=rounds, dp=dp, preset=preset, seed=seed, dp_epsilon=dp_epsilon,
                         settings=settings)
    state = Path(cfg.state_dir)
    sites = roster(co)
    write_roster(state / ROSTER_FILE, {s: bytes.fromhex(r["identity_public_key"]) for s, r in sites.items()})
    server_key = load_or_create_identity_key(state / SERVER_DIR / IDENTITY_FILE)
    summary_path = out / "summary.json"
    doc = _signed(co, cfg.to_json())
    run_id = _submit_and_wait(co, doc, summary_path, timeout_s)
    # the signed session of the run start whose final evaluation answered the run: what a later question names
    # (``federation.asked_runs``; each site keeps what it answered under it)
    atomic_write_text(out / RUN_START_FILE, json.dumps({"session_id": ticket_session_id(doc), "flower_run_id": run_id,
                                                        "consortium_id": co.config().consortium_id}, indent=2))
    summary = json.loads(summary_path.read_text())
    ev = out / "evidence"
    ledger = state / SERVER_DIR / "audit" / SERVER_LEDGER_FILE
    if ledger.exists():
        atomic_write_bytes(ev / "server" / SERVER_LEDGER_FILE, ledger.read_bytes())
    atomic_write_bytes(ev / "public_keys" / "roster.json", co.roster_path.read_bytes())
    atomic_write_bytes(ev / "public_keys" / "ca.crt", (co.pki / "ca.crt").read_bytes())
    fps = {"server": fingerprint(public_key_bytes(server_key)), "coordinator": co.fingerprint(),
           "sites": {s: r["identity_fingerprint"] for s, r in sites.items()},
           "node_keys": {s: r["node_fingerprint"] for s, r in sites.items()}, "app_fab_sha256": co.config().app_fab_sha256}
    atomic_write_text(ev / "fingerprints.json", json.dumps(fps, indent=2))
    summary["evidence"] = str(ev)
    return summary


def question_coordinator(run_dir: str | Path, home: Path | None = None) -> Coordinator | None:
    """The coordinator a finished run folder of ``fcd server run`` is asked through (``home``, else the one whose
    server state the run names), or None for a run of another engine (``fcd run``: asked on its own state).

    Raises:
        ProvisioningError: the folder is not a finished consortium run (its file named), or ``home`` (given or
            found) is not a consortium folder, or the run is not this coordinator's (its state folder is another's).
    """
    from fcd_secure.config import ConfigError, RunConfig  # noqa: PLC0415

    run_dir = Path(run_dir)
    try:
        cfg = RunConfig.load(run_dir / "config.toml") if (run_dir / "config.toml").is_file() else None
    except ConfigError as exc:
        raise ProvisioningError(f"{run_dir / 'config.toml'}: {exc}") from None
    if cfg is None or cfg.data.table != SITE_OWN_TABLE:
        return None
    for name in ("summary.json", "theta_c.npz", RUN_START_FILE):
        if not (run_dir / name).is_file():
            raise ProvisioningError(
                f"{run_dir / name}: missing (field: file); a run of fcd server run that finished"
                + (" and was started by this version (it records the signed run start the sites answered)"
                   if name == RUN_START_FILE else "") + " is needed to ask it a question")
    if home is None:
        if not cfg.state_dir:
            raise ProvisioningError(f"{run_dir / 'config.toml'}: field state_dir: none recorded; give --home")
        home = Path(cfg.state_dir).parent.parent  # <home>/server/state (run_config_for)
    co = Coordinator(home)
    co.config()
    own = (_server_root(co) / "state").resolve()
    if Path(str(cfg.state_dir)).resolve() != own:
        raise ProvisioningError(f"{run_dir / 'config.toml'}: field state_dir: the run kept its state in "
                                f"{cfg.state_dir}, not in this coordinator's {own} (a run of another consortium)")
    return co


def ask_deployed(co: Coordinator, run_dir: str | Path, question_json: str, query_id: str,
                 timeout_s: float = 1800.0) -> dict[str, Any]:
    """Ask a question of a finished run of ``fcd server run`` as a new, signed run through the SuperLink
    (``federation.asked_runs``): each site answers with what it recorded for that run, under its own question budget,
    through secure aggregation. Returns the answer the ServerApp wrote to ``<run>/whatif/<query id>.json``.

    Args:
        co: the run's coordinator (:func:`question_coordinator`).
        run_dir: the run folder.
        question_json: the question (``WhatIfRequest.to_json()``).
        query_id: its id (``WhatIfRequest.query_id``): the answer's file name.

    Raises:
        ProvisioningError: the server is not running, or the run folder names no signed run start.
        RuntimeError: the question run failed or timed out (the ServerApp's exception named).
    """
    from fcd_secure.config import RunConfig  # noqa: PLC0415

    run_dir = Path(run_dir)
    if not _running(co):
        raise ProvisioningError(f"{_server_root(co)}: the server is not running (fcd server start --home {co.home})")
    try:
        session = str(json.loads((run_dir / RUN_START_FILE).read_text())["session_id"])
        start = QuestionStart(session, question_json)
    except (OSError, ValueError, KeyError, TypeError):
        raise ProvisioningError(f"{run_dir / RUN_START_FILE}: field session_id: not the signed run start's session "
                                "id") from None
    cfg = RunConfig.load(run_dir / "config.toml")
    answer = run_dir / "whatif" / f"{query_id}.json"
    _submit_and_wait(co, _signed(co, config_text(cfg.to_json(), start)), answer, timeout_s)
    return json.loads(answer.read_text())
