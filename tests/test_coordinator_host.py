"""The coordinator host (docs/threats.md P35): only the coordinator's OS user drives the SuperLink, and the server
does not start with the CA's private key on the host.

The attack, as run against a real deployment: the Control API answered every process on 127.0.0.1 ("an address
check, not authentication"); as the unprivileged user ``nobody``, ``flwr ls`` listed every run, ``flwr stop`` stopped
any run and ``flwr run`` started one whose ServerApp ran as the coordinator and read its keys. Here the real
``fcd server start`` SuperLink entry point (``_flower.superlink_main``) is started by the test process (the
coordinator), and Flower's own ``flwr`` CLI is run once as the coordinator and once as another local user: a process
started as root that drops to ``nobody`` (setuid) after importing the CLI — the interpreter of this venv lives under
``/root``, which ``nobody`` cannot execute, so ``runuser`` cannot start it.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

#: Flower's ``flwr`` CLI as another OS user: imported with the coordinator's rights, then the process drops to
#: ``AS_UID`` (groups, gid, uid) before the command runs, so every socket it opens belongs to that user
AS_USER = """
import importlib, os, sys
import flwr.cli.app as cli_app
for name in ("flwr.cli.ls", "flwr.cli.stop", "flwr.cli.run", "flwr.cli.run.run", "flwr.cli.build", "httpx", "ssl"):
    try:
        importlib.import_module(name)
    except ImportError:
        pass
uid = int(os.environ.pop("AS_UID"))
os.setgroups([]); os.setgid(uid); os.setuid(uid)
assert os.getuid() == uid and os.geteuid() == uid
sys.argv = ["flwr", *sys.argv[1:]]
cli_app.app()
"""


def _nobody() -> int:
    if os.getuid() != 0:
        pytest.skip("switching to another local user needs root; this test process is not root")
    try:
        return pwd.getpwnam("nobody").pw_uid
    except KeyError:
        pytest.skip("no user 'nobody' on this machine")


def _cli_home(folder: Path, port: int, ca: Path, owner: int | None = None) -> Path:
    import tomli_w

    folder.mkdir(parents=True)
    shutil.copyfile(ca, folder / "ca.crt")
    conn = {"address": f"127.0.0.1:{port}", "root-certificates": str(folder / "ca.crt")}
    (folder / "config.toml").write_text(tomli_w.dumps({"superlink": {"default": "c", "c": conn}}))
    if owner is not None:
        for p in (folder, *folder.iterdir()):
            os.chown(p, owner, owner)
    return folder


def _flwr(home: Path, *args: str, uid: int | None = None) -> tuple[int, str]:
    from fcd_secure.engines.deployment import _bin, flower_env

    env = flower_env(home)
    cmd = [_bin("flwr"), *args] if uid is None else [sys.executable, "-c", AS_USER, *args]
    if uid is not None:
        env["AS_UID"] = str(uid)
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=home)
    return r.returncode, " ".join((r.stdout + r.stderr).split())


@pytest.mark.deployment
def test_another_local_user_cannot_list_stop_or_run(tmp_path, superlink):
    """P35: ``flwr ls``, ``flwr stop`` and ``flwr run`` from another local user fail with the SuperLink's refusal;
    the coordinator's own ``flwr ls`` still works."""
    from fcd_secure.engines.deployment import write_app_project

    uid = _nobody()
    port, ca, _key = superlink  # the session's shared SuperLink (conftest)
    code, out = _flwr(_cli_home(tmp_path / "coordinator", port, ca), "ls", "c")
    assert code == 0 and "Listing all runs" in out and "refused" not in out, out

    # the attacker's own folder, where it can read it (pytest's tmp_path is the coordinator's, mode 0700)
    base = Path(tempfile.mkdtemp(prefix="fcd-attacker-"))
    try:
        base.chmod(0o755)
        attacker = _cli_home(base / "home", port, ca, owner=uid)
        app = write_app_project(attacker / "app", "any-consortium")
        for p in (app, *app.iterdir()):
            os.chown(p, uid, uid)
        for args in (("ls", "c"), ("stop", "4242", "c"), ("run", str(app), "c")):
            code, out = _flwr(attacker, *args, uid=uid)
            assert code != 0, (args, out)
            assert "answers only the coordinator's OS user" in out and f"uid {uid}" in out, (args, out)
    finally:
        shutil.rmtree(base)


def test_the_control_api_asks_the_kernel_who_holds_the_connection():
    """P35: a request on a real loopback connection passes for the socket's owner and no one else; a client address
    with no socket on this host (another host) is refused."""
    from fcd_secure._flower.superlink_main import CoordinatorOnly, socket_owner

    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()
    try:
        # the Runtime API: the Control API also refuses a connection held by the SuperLink's own process tree (P50)
        scope = {"type": "http", "path": "/v1/runtime/pull-messages", "client": conn.getpeername(),
                 "server": conn.getsockname()}
        assert socket_owner(conn.getpeername(), conn.getsockname()) == os.getuid()
        assert CoordinatorOnly(None, ["127.0.0.1"]).refusal(scope) is None
        refused = CoordinatorOnly(None, ["127.0.0.1"], uids=[os.getuid() + 1]).refusal(scope)
        assert refused is not None and f"uid {os.getuid()}" in refused
        elsewhere = {**scope, "client": ("10.0.0.7", conn.getpeername()[1])}
        assert "unknown user" in CoordinatorOnly(None, ["10.0.0.7"]).refusal(elsewhere)
        assert "coordinator host" in CoordinatorOnly(None, ["127.0.0.1"]).refusal(elsewhere)
    finally:
        for s in (conn, client, listener):
            s.close()


def test_server_start_refuses_while_the_ca_key_is_on_the_host(tmp_path):
    """P35: the processes ``fcd server start`` runs are the coordinator's OS user; the CA key beside them would be
    theirs to read, so the server does not start until it is moved offline (and starts no process before)."""
    from test_hospital_install import invoke, make_consortium

    from fcd_secure.cli import server as server_cli

    c = make_consortium(tmp_path, n_sites=1, join=False)
    assert (c["co"] / "pki" / "ca.key").is_file()  # where fcd consortium init leaves it
    code, env = invoke(server_cli.app, ["start", "--home", str(c["co"])])
    assert code == 2 and "ca.key" in env["message"] and "offline" in env["message"], env
    assert not (c["co"] / "server" / "pids.json").exists() and not list((c["co"] / "server").glob("**/*.pid"))


#: a deployed ServerApp's start, in its own process (Landlock cannot be lifted): the restriction, then every read
SERVERAPP_START = """
import json, sys
from pathlib import Path
from fcd_secure.apps.server_app import keep_to_own_keys
from fcd_secure.apps.sandbox import SandboxError
from fcd_secure.config import build_config
home, out = Path(sys.argv[1]), Path(sys.argv[2])
cfg = build_config("tiny", {"out": str(out), "state_dir": str(home / "server" / "state")})
try:
    keep_to_own_keys(cfg, {"FCD_SERVERAPP_DENY": sys.argv[3]})
except SandboxError as exc:
    print(json.dumps({"skip": str(exc)})); sys.exit(0)
(out / "rounds.csv").write_text("round\\n1\\n")
seen = {}
for name in ("coordinator_ed25519.key", "pki/server.key", "pki/ca.crt", "consortium.toml",
             "server/state/_server/identity_ed25519.key"):
    try:
        seen[name] = (home / name).read_bytes().decode()
    except PermissionError:
        seen[name] = "denied"
seen["out"] = (out / "rounds.csv").read_text()
print(json.dumps(seen))
"""


def test_a_deployed_server_app_cannot_read_the_coordinators_other_keys(tmp_path):
    """P35: a ServerApp runs as the coordinator's OS user; before it starts it gives up reading the coordinator's
    signing key and the SuperLink's TLS key (``fcd server start`` names them), and keeps its own ledger key."""
    import json

    home = tmp_path / "coordinator"
    for name, text in {"coordinator_ed25519.key": "signing", "pki/server.key": "tls", "pki/ca.crt": "public",
                       "consortium.toml": "terms", "server/state/_server/identity_ed25519.key": "ledger"}.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    denied = os.pathsep.join(str(home / n) for n in ("coordinator_ed25519.key", "pki/server.key"))
    r = subprocess.run([sys.executable, "-c", SERVERAPP_START, str(home), str(tmp_path / "run"), denied],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(f"this kernel cannot restrict a process (Landlock): {seen['skip']}")
    assert seen == {"coordinator_ed25519.key": "denied", "pki/server.key": "denied", "pki/ca.crt": "public",
                    "consortium.toml": "terms", "server/state/_server/identity_ed25519.key": "ledger",
                    "out": "round\n1\n"}


#: a deployed ServerApp, confined as it confines itself (``keep_to_own_keys``), then every write the finding made and
#: Flower's own ``flwr ls`` against the real SuperLink, from the confined process
SERVERAPP_WRITES = """
import json, os, subprocess, sys, sysconfig, tempfile
from pathlib import Path
from fcd_secure.apps.server_app import keep_to_own_keys
from fcd_secure.apps.sandbox import SandboxError
from fcd_secure.config import build_config
from fcd_secure.engines.deployment import _bin, flower_env
home, out, cli = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[4])
cfg = build_config("tiny", {"out": str(out), "state_dir": str(home / "server" / "state")})
try:
    keep_to_own_keys(cfg, {"FCD_SERVERAPP_DENY": sys.argv[3]})
except SandboxError as exc:
    print(json.dumps({"skip": str(exc)})); sys.exit(0)

def attempt(write):
    try:
        write()
        return "written"
    except PermissionError:
        return "denied"

probe = Path(sysconfig.get_paths()["purelib"]) / f"fcd-landlock-probe-{os.getpid()}.txt"
seen = {"site-packages": attempt(lambda: probe.write_text("planted"))}
if seen["site-packages"] == "written":
    probe.unlink()  # the shared environment is left as it was
seen["rename signing key"] = attempt(lambda: (home / "coordinator_ed25519.key").rename(home / "moved.key"))
seen["coordinator folder"] = attempt(lambda: (home / "consortium.toml").write_text("changed"))
seen["plant in coordinator folder"] = attempt(lambda: (home / "sitecustomize.py").write_text("x"))
seen["run folder"] = attempt(lambda: (out / "rounds.csv").write_text("round"))
seen["server state"] = attempt(lambda: (home / "server" / "state" / "_server" / "checkpoint.npz").write_bytes(b"x"))
seen["temporary file"] = attempt(lambda: tempfile.NamedTemporaryFile().close())
r = subprocess.run([_bin("flwr"), "ls", "c"], env=flower_env(cli), cwd=cli, capture_output=True, text=True,
                   timeout=300)
seen["flwr ls"] = " ".join((r.stdout + r.stderr).split())
print(json.dumps(seen))
"""


@pytest.mark.deployment
def test_P53_a_deployed_server_app_writes_only_its_run_and_cannot_call_the_control_api(tmp_path, superlink):
    """P50: from inside a deployed ServerApp, writes to the environment's site-packages and the coordinator's folder
    succeeded, the signing key could be renamed and ``flwr ls`` answered. Confined as a deployed ServerApp confines
    itself, each write outside its run folder and the server state is denied, and the real SuperLink refuses its
    Control API call; the coordinator's own ``flwr ls`` still works."""
    import json

    port, ca, _key = superlink  # the session's shared SuperLink (conftest)
    home = tmp_path / "coordinator"
    for name, text in {"coordinator_ed25519.key": "signing", "pki/server.key": "tls", "consortium.toml": "terms",
                       "server/state/_server/identity_ed25519.key": "ledger"}.items():
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(text)
    out = tmp_path / "run"
    cli = _cli_home(out / "cli", port, ca)  # beneath the run folder: Flower's CLI may write its own home
    denied = os.pathsep.join(str(home / n) for n in ("coordinator_ed25519.key", "pki/server.key"))
    r = subprocess.run([sys.executable, "-c", SERVERAPP_WRITES, str(home), str(out), denied, str(cli)],
                       capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": os.getcwd()})
    assert r.returncode == 0, r.stderr[-2000:]
    seen = json.loads(r.stdout.strip().splitlines()[-1])
    if "skip" in seen:
        pytest.skip(f"this kernel cannot restrict a process (Landlock): {seen['skip']}")
    flwr_ls = seen.pop("flwr ls")
    assert seen == {"site-packages": "denied", "rename signing key": "denied", "coordinator folder": "denied",
                    "plant in coordinator folder": "denied", "run folder": "written", "server state": "written",
                    "temporary file": "written"}, seen
    said = " ".join(flwr_ls.replace("│", " ").split())  # rich's error box, unwrapped
    assert "refused: the Control API does not answer a ServerApp" in said and "Run ID" not in said, flwr_ls
    assert (home / "coordinator_ed25519.key").read_text() == "signing"
    code, mine = _flwr(_cli_home(tmp_path / "coordinator-cli", port, ca), "ls", "c")
    assert code == 0 and "Listing all runs" in mine, mine
