"""A local deployment of the app on Flower's Deployment Engine (the pinned Flower), secure unless asked otherwise.

``LocalDeployment`` plays, on one machine (127.0.0.1), the coordinator and every hospital:

* **provisioning** (:meth:`LocalDeployment.prepare`, before any process starts; every bad input is an error naming
  its file and field): a CA and the SuperLink's certificate with SANs for the host (``engines.pki``), or the
  operator's own (``tls_dir``, checked: present, not expired, signed by the CA, naming the host); per site a
  folder of its own (mode 0700) with its state, its policy (``federation.site_policy``: written from the run's
  options, or the hospital's own file checked against the consortium minimum), its EC P-384 SuperNode key, its
  SuperExec secret and the roster of every site's Ed25519 identity key (public keys only); the app project and the
  SHA-256 of the exact FAB ``flwr run`` will build from it, pinned in every site's policy;
* **processes** (:meth:`LocalDeployment.start`): one ``flower-superlink`` with TLS and SuperNode authentication
  (``--enable-supernode-auth``; ``--disable-runtime-dependency-installation``, so it never reaches a package
  index), each site's public key registered with ``flwr supernode register``, and per site one
  ``flower-supernode`` (``--isolation process``, its own ``FLWR_HOME``, node config naming only the site's own
  folder) plus the site's own SuperExec (``engines.site_exec``), which runs only the pinned app;
* **the run** (:meth:`LocalDeployment.run`): ``flwr run`` of the pinned app with the resolved ``RunConfig`` as its
  run config, then the audit evidence (ledgers with their receipts, key fingerprints, public keys and certificates;
  never a private key) collected into ``<out>/evidence/``, which ``fcd audit verify`` checks with the pinned keys.

``insecure_dev=True`` is today's development mode and the only way to get it: no TLS, no node authentication, and
Flower's own SuperExec (which runs any submitted app). It logs a warning and marks the run folder (``INSECURE-DEV``
and ``"insecure_dev": true`` in ``summary.json``).

Every process starts in its own session and is stopped by its PID (process group) at the end, on success and on
failure. The sites share one OS user here, so "no site reads another's keys" holds by configuration: each site's
processes are given only its own folder. Open-source Flower's Control API is unauthenticated; the SuperLink here
(``_flower.superlink_main``) answers Control and Runtime API requests only from this OS user on this host, and the
sites' app pinning and the coordinator's signature on every run start (``federation.run_ticket``) are what make a
foreign ``flwr run`` harmless to them.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import tomli_w

from fcd_secure._flower.internals import fab_bytes
from fcd_secure._flower.pins import FLWR_VERSION
from fcd_secure._io import FolderPath, atomic_write_bytes, atomic_write_text, load_or_create_secret
from fcd_secure.audit import SERVER_LEDGER_FILE, SITE_LEDGER_FILE, load_or_create_identity_key
from fcd_secure.audit.signing import public_key_bytes
from fcd_secure.fingerprints import fingerprint
from fcd_secure.config import RunConfig
from fcd_secure.engines.pki import (
    CA_CERT,
    DEFAULT_HOSTS,
    SERVER_CERT,
    TLSFiles,
    check_tls_dir,
    load_node_key,
    make_node_key,
    make_tls_dir,
    node_key_fingerprint,
    write_node_public,
)
from fcd_secure._flower.waits import IDLE_POLL_ENV, idle_poll_s
from fcd_secure.apps.sandbox import DENY_ENV
from fcd_secure.federation.records import RUN_CONFIG_KEY
from fcd_secure.federation.run_ticket import CONSORTIUM_ENV, COORDINATOR_KEY_ENV, RUN_TICKET_KEY, sign_run_ticket
from fcd_secure.federation.secure.setup import ROSTER_FILE, write_roster
from fcd_secure.apps.site import default_site_id
from fcd_secure.federation.site_policy import POLICY_FILE, SitePolicy, SitePolicyError
from fcd_secure.federation.state import SERVER_DIR, IDENTITY_FILE, SiteState
from fcd_secure._flower.wake import WAKE_ENV, WAKE_FILE
from fcd_secure.errors import FcdError

APP_NAME = "fcd-secure-app"
PUBLISHER = "fcdsecure"
CONNECTION = "fcd-local"
INSECURE_MARKER = "INSECURE-DEV"
EVIDENCE_DIR = "evidence"
#: the SuperLink: Flower's own, whose Control and Runtime APIs answer only this OS user on this host
#: (``_flower.superlink_main``, docs/threats.md P35)
SUPERLINK = (sys.executable, "-m", "fcd_secure._flower.superlink_main")
#: the site's SuperNode: Flower's own, with its hard-wired idle sleeps capped, started again when it exits
#: (a restarted SuperLink; ``_flower.supernode_main``)
SUPERNODE = (sys.executable, "-m", "fcd_secure._flower.supernode_main")
#: the SuperLink's state (runs, messages, objects, registered SuperNode keys) in its memory, Flower's default. With
#: a SQLite file every Fleet API request ran SQL on disk: with ten idle sites the SuperLink used 0.7 of a core, three
#: quarters of it in SQLite (py-spy on loopback). The cost: a restarted SuperLink has forgotten the registered keys,
#: so every start registers them again (``provisioning.server.start_server``).
FLWR_IN_MEMORY = ":flwr-in-memory:"
#: names inside a site's folder
NODE_KEY, NODE_PUB, EXEC_SECRET = "node_auth.key", "node_auth.pub", "superexec.secret"


class DeploymentError(FcdError, RuntimeError):
    """The local deployment could not start or the run failed; the message names the file or log to read."""


class DeploymentInputError(DeploymentError):
    """A deployment asked for something a secure deployment refuses (too few sites, secure aggregation off without
    ``insecure_dev``): bad input, found before any process starts."""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin(name: str) -> str:
    """The Flower executables of this interpreter's environment (the venv's bin, not whatever is on PATH)."""
    cand = Path(sys.executable).parent / name
    if cand.exists():
        return str(cand)
    found = shutil.which(name)
    if not found:
        raise DeploymentError(f"{name} not found next to {sys.executable} or on PATH (is flwr installed?)")
    return found


#: the SuperExec's wait between two ``AcquireTask`` polls (s): on a site without its own executor (``--insecure-dev``)
#: every message is a task, and Flower's 1 s default adds a second to each
SITE_TASK_POLL_S = 0.1
#: the same on the coordinator, where the one task of a run is its ServerApp: Flower's default. Each poll costs the
#: SuperLink an HTTP request for as long as it runs; the price is up to a second before a run's ServerApp starts
#: (the measured cost of a faster poll: docs/hospital.md, "the coordinator's SuperExec")
SERVER_TASK_POLL_S = 1.0


def flower_env(home: Path, task_poll_s: float = SITE_TASK_POLL_S) -> dict[str, str]:
    """The environment of a Flower process whose home is ``home``: telemetry and update checks off, this
    interpreter's executables first on ``PATH``, one torch thread, the SuperExec polling every ``task_poll_s``."""
    env = dict(os.environ)
    env.update(
        FLWR_HOME=str(home),
        FLWR_TELEMETRY_ENABLED="0",  # Flower telemetry posts events off-machine by default
        FLWR_DISABLE_UPDATE_CHECK="1",
        FLWR_SUPEREXEC_TASK_POLL_INTERVAL=str(task_poll_s),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        OMP_NUM_THREADS="1",  # several ClientApp processes share the cores
    )
    return env


def register_node_keys(keys: dict[str, Path], cli_home: Path, cwd: Path, logfile: Path,
                       timeout_s: float = 120.0) -> dict[str, int]:
    """``flwr supernode register`` of each ``{name: public key file}`` on the SuperLink of ``cli_home``'s
    connection: the SuperLink then accepts the SuperNode holding each matching private key. The registrations run
    one after another in one process (``_flower.register``: the ``flwr`` command itself, its CLI imported once, where
    a process per key paid about 1.1 s of CPU each for the import alone); their output is appended to ``logfile`` in
    the order of ``keys``.

    Returns:
        ``{name: exit code}`` of the registrations that failed (empty when every key is registered); one that had not
        ended when the process ended is reported with the process's exit code (-9: it ran past ``timeout_s`` and was
        killed).
    """
    logfile.parent.mkdir(parents=True, exist_ok=True)
    fd, result = tempfile.mkstemp(prefix="register-", suffix=".jsonl", dir=logfile.parent)
    os.close(fd)
    try:
        with open(logfile, "ab") as log:
            p = subprocess.Popen([sys.executable, "-m", "fcd_secure._flower.register", "--connection", CONNECTION,
                                  "--result", result, *(f"{name}={key}" for name, key in keys.items())],
                                 stdout=log, stderr=subprocess.STDOUT, env=flower_env(cli_home), cwd=cwd)
            try:
                p.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        ended = {}
        for line in Path(result).read_text().splitlines():
            row = json.loads(line)
            ended[row["name"]] = int(row["exit_code"])
    finally:
        os.unlink(result)
    codes = {name: ended.get(name, p.returncode or 1) for name in keys}
    return {name: code for name, code in codes.items() if code != 0}


def supernode_command(superlink: str, runtime_port: int, node_config: str, *, ca_cert: Path | None = None,
                      node_key: Path | None = None, secret: Path | None = None) -> list[str]:
    """A site's SuperNode (``_flower.supernode_main``) connecting to ``superlink``, serving its Runtime API on
    127.0.0.1:``runtime_port``: over TLS verified with ``ca_cert``, authenticated with ``node_key``, launching nothing
    itself (its tasks are acquired with ``secret`` by the site's executor); with no ``ca_cert``, ``--insecure``."""
    args = [*SUPERNODE, "--superlink", superlink, "--host", "127.0.0.1", "--port", str(runtime_port),
            "--node-config", node_config]
    if ca_cert is None:
        return [*args, "--insecure"]
    return [*args, "--root-certificates", str(ca_cert), "--auth-supernode-private-key", str(node_key),
            "--isolation", "process", "--superexec-auth-secret-file", str(secret)]


def supernode_env(flwr_home: Path, n_sites: int, wake_pipe: Path | None) -> dict[str, str]:
    """The SuperNode's environment: :func:`flower_env`, its idle poll for a consortium of ``n_sites``
    (``flower_waits.idle_poll_s``) and, when the site runs its own executor, the pipe it wakes it through."""
    env = {**flower_env(flwr_home), IDLE_POLL_ENV: str(idle_poll_s(n_sites))}
    if wake_pipe is not None:
        env[WAKE_ENV] = str(wake_pipe)
    return env


def executor_command(runtime_port: int, secret: Path, supernode_pid: int, wake_pipe: Path, *, warm: bool) -> list[str]:
    """The site's executor (``engines.site_exec serve``) for the SuperNode at 127.0.0.1:``runtime_port``."""
    return [sys.executable, "-m", "fcd_secure.engines.site_exec", "serve", "--runtime-api-address",
            f"127.0.0.1:{runtime_port}", "--secret-file", str(secret), "--parent-pid", str(supernode_pid),
            "--wake-pipe", str(wake_pipe), *(["--warm"] if warm else [])]


def write_app_project(folder: Path, consortium_id: str) -> Path:
    """The consortium's Flower app project: components are this installed package's apps; the run config is a
    placeholder filled per run (``flwr run -c``: the run config and the coordinator's signature over it,
    ``federation.run_ticket``), so the FAB, and therefore its pinned hash, is the same every run. The consortium id
    is part of the project (``[tool.fcd] consortium-id``): the app hash differs between consortia, so the pinned app
    of one consortium cannot be rebuilt from the installed package alone (docs/threats.md P34)."""
    folder.mkdir(parents=True, exist_ok=True)
    doc = {
        "build-system": {"requires": ["hatchling"], "build-backend": "hatchling.build"},
        "project": {
            "name": APP_NAME,
            "version": "1.0.0",
            "description": f"Fed-CausalDiff (fcd_secure) on the Flower Deployment Engine, consortium {consortium_id}",
            "license": "Apache-2.0",
            "dependencies": [f"flwr=={FLWR_VERSION}"],
        },
        "tool": {
            "hatch": {"build": {"targets": {"wheel": {"packages": ["."]}}}},
            "flwr": {
                "app": {
                    "publisher": PUBLISHER,
                    "components": {
                        "serverapp": "fcd_secure.apps.server_app:app",
                        "clientapp": "fcd_secure.apps.client_app:app",
                    },
                    "config": {RUN_CONFIG_KEY: "", RUN_TICKET_KEY: ""},
                }
            },
            "fcd": {"consortium-id": consortium_id},
        },
    }
    atomic_write_text(folder / "pyproject.toml", tomli_w.dumps(doc))
    atomic_write_text(folder / "README.md", "Generated by fcd deploy: the fcd_secure ServerApp/ClientApp as a Flower app.\n")
    return folder


def signed_run_config(coordinator_key: bytes, consortium_id: str, app_fab_sha256: str, config_json: str) -> dict[str, str]:
    """The run config of a run start: the resolved ``RunConfig`` and the coordinator's signature over it, the app,
    the consortium and a fresh session id (``federation.run_ticket``, docs/threats.md P34)."""
    ticket = sign_run_ticket(coordinator_key, consortium_id=consortium_id, app_fab_sha256=app_fab_sha256,
                             run_config_text=config_json)
    return {RUN_CONFIG_KEY: config_json, RUN_TICKET_KEY: ticket}


def fab_sha256(app_dir: Path) -> str:
    """SHA-256 of the FAB ``flwr run`` builds from ``app_dir`` (the pinned Flower builds it deterministically)."""
    return hashlib.sha256(fab_bytes(app_dir)).hexdigest()


class SiteFiles:
    """The files every site folder holds under its ``root``: a local deployment's sites and an installed site's
    home (``site_install.home.SiteHome``) name them alike."""

    root: Path

    state_root = FolderPath("root", "state")
    policy = FolderPath("root", POLICY_FILE)
    node_key = FolderPath("root", NODE_KEY)
    node_pub = FolderPath("root", NODE_PUB)
    secret = FolderPath("root", EXEC_SECRET)


@dataclass(frozen=True)
class SiteFolder(SiteFiles):
    """One site's own folder (0700) and what is in it."""

    site_id: str
    index: int
    root: Path

    roster = FolderPath("root", ROSTER_FILE)
    home = FolderPath("root", "flwr-home")
    logs = FolderPath("root", "logs")

    @property
    def ledger(self) -> Path:
        return SiteState(self.state_root, self.site_id).slot(SITE_LEDGER_FILE)


class LocalDeployment:
    """SuperLink + one SuperNode (and site executor) per site on 127.0.0.1; a context manager that always stops them.

    Args:
        cfg: the resolved run config (its ``out`` is the run folder).
        workdir: where the coordinator's and the sites' folders, logs and the app project go (default: a temp dir).
        port: the SuperLink port (default: a free one).
        insecure_dev: development mode (module docstring); everything else is secure.
        tls_dir: the operator's ``ca.crt``, ``server.pem``, ``server.key`` (default: made for ``hosts``).
        node_keys_dir: the operator's ``<site-id>.key`` SuperNode keys (EC P-384; default: made per site).
        site_policies_dir: the hospitals' own ``<site-id>.toml`` policies (default: written from the run's options).
        keep: leave the processes running after the run.
        warm: each site's executor runs its tasks in one warm process (``engines.site_exec``, as ``fcd site
            start`` does), not in a fresh process per message; the app hash is checked on every task either way.
        log: where progress lines go.
    """

    def __init__(
        self,
        cfg: RunConfig,
        workdir: str | Path | None = None,
        port: int | None = None,
        *,
        insecure_dev: bool = False,
        tls_dir: str | Path | None = None,
        node_keys_dir: str | Path | None = None,
        site_policies_dir: str | Path | None = None,
        keep: bool = False,
        warm: bool = True,
        log: Callable[[str], None] = print,
    ) -> None:
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="fcd-deploy-"))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.workdir = self.workdir.resolve()
        self.port = port or free_port()
        self.insecure_dev = bool(insecure_dev)
        self.tls_dir = Path(tls_dir) if tls_dir else None
        self.node_keys_dir = Path(node_keys_dir) if node_keys_dir else None
        self.site_policies_dir = Path(site_policies_dir) if site_policies_dir else None
        self.keep = keep
        self.warm = bool(warm)
        self.log = log
        self.procs: list[tuple[str, subprocess.Popen]] = []
        out = cfg.out or str(self.workdir / "run")
        self.server_root = self.workdir / "server"
        self.cfg = cfg.model_copy(update={"out": str(Path(out).resolve()), "state_dir": str((self.server_root / "state").resolve())})
        self.sites = [
            SiteFolder(default_site_id(i), i, self.workdir / "sites" / default_site_id(i)) for i in range(cfg.data.n_sites)
        ]
        self.tls: TLSFiles | None = None
        self.app_dir = self.workdir / "app"
        self.cli_home = self.workdir / "cli-home"
        self.logs = self.workdir / "logs"
        self.pinned_fab: str | None = None
        #: this deployment's coordinator: it signs every run start (``federation.run_ticket``), the sites pin its key
        self.coordinator_key_path = self.server_root / "coordinator_ed25519.key"
        self.consortium_id: str | None = None
        self.prepared = False

    # -- provisioning (no process yet) ---------------------------------------------------------------------------
    def prepare(self) -> None:
        """Check every input and provision the coordinator and the sites (module docstring).

        Raises:
            PKIError: a missing, expired or mismatched certificate, or a node key of another curve.
            SitePolicyError: a site policy that does not parse, or is weaker than the consortium minimum.
            DeploymentInputError: a secure deployment with too few sites, or secure aggregation off.
        """
        fed = self.cfg.federation
        if not self.insecure_dev:
            if not fed.secure_aggregation:
                raise DeploymentInputError(
                    "federation.secure_aggregation: a secure deployment aggregates securely; "
                    "--no-secure-aggregation needs --insecure-dev"
                )
            if len(self.sites) < self.cfg.secagg.min_sites:
                raise DeploymentInputError(
                    f"data.n_sites: a secure deployment needs at least {self.cfg.secagg.min_sites} sites (secagg.min_sites), got {len(self.sites)}"
                )
        self.logs.mkdir(parents=True, exist_ok=True)
        self.server_root.mkdir(parents=True, exist_ok=True)
        os.chmod(self.server_root, 0o700)
        coordinator = public_key_bytes(load_or_create_identity_key(self.coordinator_key_path))
        self.consortium_id = f"local-{fingerprint(coordinator).removeprefix('SHA256:')[:12]}"
        write_app_project(self.app_dir, self.consortium_id)
        self.pinned_fab = fab_sha256(self.app_dir)
        policies = self._site_policies()  # parse and check before anything is written
        if not self.insecure_dev:
            self.tls = check_tls_dir(self.tls_dir) if self.tls_dir else check_tls_dir(make_tls_dir(self.workdir / "pki", DEFAULT_HOSTS))
            keys = {s.site_id: load_node_key(self.node_keys_dir / f"{s.site_id}.key") for s in self.sites} if self.node_keys_dir else {}
        roster: dict[str, bytes] = {}
        for site, policy in zip(self.sites, policies):
            site.root.mkdir(parents=True, exist_ok=True)
            os.chmod(site.root, 0o700)
            site.logs.mkdir(exist_ok=True)
            policy.write(site.policy)
            roster[site.site_id] = public_key_bytes(SiteState(site.state_root, site.site_id).identity_private_key())
            if not self.insecure_dev:
                if self.node_keys_dir:
                    shutil.copyfile(self.node_keys_dir / f"{site.site_id}.key", site.node_key)
                    os.chmod(site.node_key, 0o600)
                    write_node_public(keys[site.site_id], site.node_pub)
                elif not site.node_key.exists():
                    make_node_key(site.node_key, site.node_pub)
                load_or_create_secret(site.secret)
        for site in self.sites:
            write_roster(site.roster, roster)
        # the coordinator holds the roster too: a site that misbehaves in secure aggregation is named on signed evidence
        write_roster(self.server_root / "state" / ROSTER_FILE, roster)
        (self.server_root / "state" / SERVER_DIR).mkdir(parents=True, exist_ok=True)
        load_or_create_identity_key(self.server_root / "state" / SERVER_DIR / IDENTITY_FILE)
        self._write_cli_config()
        self.prepared = True

    def _serverapp_denied(self) -> list[Path]:
        """What a ServerApp of this deployment must not read: the coordinator's signing key, the SuperLink's TLS key,
        the CA's key when it is beside the certificate (a local deployment makes its own CA) and every site's folder
        (one OS user plays every party here)."""
        keys = [] if self.tls is None else [self.tls.server_key, self.tls.ca_cert.parent / "ca.key"]
        return [self.coordinator_key_path, *(k for k in keys if k.exists()), self.workdir / "sites"]

    def _coordinator_public(self) -> str:
        return public_key_bytes(load_or_create_identity_key(self.coordinator_key_path)).hex()

    def _pin_coordinator(self, policy: SitePolicy, path: Path | None) -> SitePolicy:
        """The policy with this deployment's coordinator key and consortium pinned (a hospital's own file may pin
        them already, then they must be these)."""
        key, cid = self._coordinator_public(), self.consortium_id
        app = policy.app
        if app.coordinator_key not in (None, key) or app.consortium_id not in (None, cid):
            raise SitePolicyError(f"{path}: field app.coordinator_key / app.consortium_id pins another coordinator "
                                  f"or consortium than this deployment's ({cid})")
        return policy.model_copy(update={"app": app.model_copy(update={"coordinator_key": key, "consortium_id": cid})})

    def _site_policies(self) -> list[SitePolicy]:
        pin = (self.pinned_fab,) if self.pinned_fab else ()
        if self.site_policies_dir is None:
            return [self._pin_coordinator(SitePolicy.for_run(self.cfg, fab_sha256=pin), None) for _ in self.sites]
        minimum = SitePolicy() if not self.insecure_dev else SitePolicy(secure={"required": False})
        out = []
        for site in self.sites:
            path = self.site_policies_dir / f"{site.site_id}.toml"
            if not path.is_file():
                raise SitePolicyError(f"{path}: missing (field: file): every site needs its policy")
            policy = SitePolicy.load(path)
            policy.check_meets(minimum, str(path))
            if not policy.app.fab_sha256:  # this hospital accepts the consortium's app as provisioned here
                policy = policy.model_copy(update={"app": policy.app.model_copy(update={"fab_sha256": pin})})
            elif self.pinned_fab not in policy.app.fab_sha256:
                raise SitePolicyError(f"{path}: field app.fab_sha256 does not pin the consortium's app {self.pinned_fab}")
            out.append(self._pin_coordinator(policy, path))
        return out

    def _write_cli_config(self) -> None:
        self.cli_home.mkdir(parents=True, exist_ok=True)
        conn: dict = {"address": f"127.0.0.1:{self.port}"}
        if self.tls is None:
            conn["insecure"] = True
        else:
            conn["root-certificates"] = str(self.tls.ca_cert)
        atomic_write_text(self.cli_home / "config.toml", tomli_w.dumps({"superlink": {"default": CONNECTION, CONNECTION: conn}}))

    # -- processes -------------------------------------------------------------------------------------------
    def _spawn(self, name: str, args: list[str], home: Path, logfile: Path, env: dict | None = None) -> subprocess.Popen:
        home.mkdir(parents=True, exist_ok=True)
        logfile.parent.mkdir(parents=True, exist_ok=True)
        with open(logfile, "ab") as logf:
            p = subprocess.Popen(
                args, stdout=logf, stderr=subprocess.STDOUT, env=env or flower_env(home), cwd=self.workdir,
                start_new_session=True,
            )
        self.procs.append((name, p))
        return p

    def _link_args(self) -> list[str]:
        if self.tls is None:
            return ["--insecure"]
        return ["--ssl-ca-certfile", str(self.tls.ca_cert), "--ssl-certfile", str(self.tls.server_cert),
                "--ssl-keyfile", str(self.tls.server_key), "--enable-supernode-auth"]

    def start(self, wait_s: float = 120.0) -> None:
        """Start the SuperLink, register the sites' keys, start every site's SuperNode and executor."""
        if not self.prepared:
            self.prepare()
        if self.insecure_dev:
            self.log("[deploy] WARNING: --insecure-dev: no TLS, no SuperNode authentication, any submitted app runs "
                     "on the sites; for development only, never with patient data")
        self._spawn(
            "superlink",
            [*SUPERLINK, *self._link_args(), "--host", "127.0.0.1", "--port", str(self.port),
             "--database", FLWR_IN_MEMORY, "--disable-runtime-dependency-installation"],
            self.server_root / "link-home", self.logs / "superlink.log",
            {**flower_env(self.server_root / "link-home", SERVER_TASK_POLL_S),
             # the ServerApp refuses a run this deployment's coordinator did not sign (apps.server_app)
             COORDINATOR_KEY_ENV: self._coordinator_public(), CONSORTIUM_ENV: str(self.consortium_id),
             # the ServerApp reads no key of the coordinator's or of any site's (apps.sandbox)
             **({} if self.insecure_dev else {DENY_ENV: os.pathsep.join(str(p) for p in self._serverapp_denied())})},
        )
        self._wait_for_link(wait_s)
        if self.tls is not None:
            self.register({site.site_id: site.node_pub for site in self.sites})
        n = len(self.sites)
        for site in self.sites:
            node_config = (
                f'site-id="{site.site_id}" site-index={site.index} num-partitions={n} '
                f'state-dir="{site.state_root}" site-policy="{site.policy}" secagg-roster="{site.roster}"'
            )
            runtime_port = free_port()
            tls = {} if self.tls is None else {"ca_cert": self.tls.ca_cert, "node_key": site.node_key, "secret": site.secret}
            pipe = site.home / WAKE_FILE  # the SuperNode wakes the site's executor through it
            node = self._spawn(
                f"supernode-{site.site_id}", supernode_command(f"127.0.0.1:{self.port}", runtime_port, node_config, **tls),
                site.home, site.logs / "supernode.log", supernode_env(site.home, n, pipe if tls else None),
            )
            if tls:
                self._spawn(f"site-exec-{site.site_id}",
                            executor_command(runtime_port, site.secret, node.pid, pipe, warm=self.warm),
                            site.home, site.logs / "site-exec.log")
        mode = "INSECURE-DEV" if self.insecure_dev else "TLS + SuperNode auth + pinned app"
        self.log(f"[deploy] SuperLink on 127.0.0.1:{self.port} ({mode}), {n} sites; logs in {self.workdir}")

    def register(self, keys: dict[str, Path]) -> None:
        """Register each ``{site id: SuperNode public key}`` (:func:`register_node_keys`): the SuperLink then accepts
        the SuperNode holding the matching private key.

        Raises:
            DeploymentError: a registration failed (the message names the keys and the log).
        """
        logfile = self.logs / "register.log"
        failed = register_node_keys(keys, self.cli_home, self.workdir, logfile)
        if failed:
            raise DeploymentError(f"registering {', '.join(str(keys[n]) for n in failed)} failed (exit "
                                  f"{', '.join(str(rc) for rc in failed.values())}); see {logfile}")

    def _wait_for_link(self, wait_s: float) -> None:
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            for name, p in self.procs:
                if p.poll() is not None:
                    raise DeploymentError(f"{name} exited with code {p.returncode}; see {self.logs}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.2)
        raise DeploymentError(f"the SuperLink did not open 127.0.0.1:{self.port} within {wait_s:.0f} s")

    # -- the run -----------------------------------------------------------------------------------------------
    def run(self, timeout_s: float = 1800.0) -> dict:
        """``flwr run`` the pinned app with this run's config, wait, collect the evidence; returns ``summary.json``.

        Raises:
            DeploymentError: the run did not finish in time or ended without a run folder.
        """
        run_config = self.workdir / "run-config.toml"
        atomic_write_text(run_config, tomli_w.dumps(signed_run_config(
            load_or_create_identity_key(self.coordinator_key_path), str(self.consortium_id), str(self.pinned_fab),
            self.cfg.to_json())))
        summary_path = Path(self.cfg.out) / "summary.json"
        if summary_path.exists():
            summary_path.unlink()
        p = self._spawn(
            "flwr-run", [_bin("flwr"), "run", str(self.app_dir), CONNECTION, "--run-config", str(run_config), "--stream"],
            self.cli_home, self.logs / "flwr-run.log",
        )
        deadline = time.monotonic() + timeout_s
        while p.poll() is None and not summary_path.exists():
            if time.monotonic() > deadline:
                raise DeploymentError(f"the run did not finish within {timeout_s:.0f} s; see {self.logs}")
            time.sleep(0.5)
        t_end = time.monotonic() + 30  # the stream may end a moment before the ServerApp's files land
        while not summary_path.exists() and time.monotonic() < t_end:
            time.sleep(0.5)
        if not summary_path.exists():
            raise DeploymentError(f"the run ended without a run folder; see {self.logs / 'flwr-run.log'}")
        summary = json.loads(summary_path.read_text())
        if self.insecure_dev:
            summary["insecure_dev"] = True
            atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False))
            atomic_write_text(Path(self.cfg.out) / INSECURE_MARKER,
                              "This run used fcd deploy --insecure-dev: no TLS, no SuperNode authentication, no app "
                              "pinning. Development only; not evidence of a secure deployment.\n")
        self.collect_evidence()
        return summary

    def collect_evidence(self) -> Path:
        """Copy what an auditor needs into ``<out>/evidence/``: ledgers (with their receipts), key fingerprints,
        public keys and certificates. Private keys never go there."""
        ev = Path(self.cfg.out) / EVIDENCE_DIR
        server_ledger = self.server_root / "state" / SERVER_DIR / "audit" / SERVER_LEDGER_FILE
        if server_ledger.exists():
            atomic_write_bytes(ev / "server" / SERVER_LEDGER_FILE, server_ledger.read_bytes())
        for site in self.sites:
            if site.ledger.exists():
                atomic_write_bytes(ev / "sites" / site.site_id / SITE_LEDGER_FILE, site.ledger.read_bytes())
            if site.node_pub.exists():
                atomic_write_bytes(ev / "public_keys" / f"{site.site_id}.node.pub", site.node_pub.read_bytes())
        if self.sites and self.sites[0].roster.exists():
            atomic_write_bytes(ev / "public_keys" / ROSTER_FILE, self.sites[0].roster.read_bytes())
        if self.tls is not None:
            for f in (CA_CERT, SERVER_CERT):
                atomic_write_bytes(ev / "public_keys" / f, (self.tls.ca_cert.parent / f).read_bytes())
        atomic_write_text(ev / "fingerprints.json", json.dumps(self.fingerprints(), indent=2))
        return ev

    def fingerprints(self) -> dict:
        """The key fingerprints to pin out of band (``fcd audit verify --site-key/--server-key``), from the keys."""
        server_key = load_or_create_identity_key(self.server_root / "state" / SERVER_DIR / IDENTITY_FILE)
        out = {
            "server": fingerprint(public_key_bytes(server_key)),
            "sites": {s.site_id: fingerprint(public_key_bytes(SiteState(s.state_root, s.site_id).identity_private_key()))
                      for s in self.sites},
            "app_fab_sha256": self.pinned_fab,
            "insecure_dev": self.insecure_dev,
        }
        if self.tls is not None:
            out["ca"] = self.tls.ca_fingerprint
            out["node_keys"] = {s.site_id: node_key_fingerprint(s.node_pub.read_bytes()) for s in self.sites if s.node_pub.exists()}
        return out

    # -- shutdown ------------------------------------------------------------------------------------------------
    def stop(self, grace_s: float = 10.0) -> None:
        """SIGTERM every process group we started (sites first, SuperLink last), SIGKILL what remains."""
        order = [x for x in self.procs if x[0] != "superlink"] + [x for x in self.procs if x[0] == "superlink"]
        for _name, p in order:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace_s
        for _name, p in order:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for _name, p in order:
            try:  # the group too: flower-superexec, site executors' tasks and flwr-clientapp children live in it
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass

    def pids(self) -> list[int]:
        return [p.pid for _n, p in self.procs]

    def __enter__(self) -> "LocalDeployment":
        return self

    def __exit__(self, *exc) -> None:
        if not self.keep:
            self.stop()
