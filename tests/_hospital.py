"""The hospital consortium the deployment tests share: a coordinator and :data:`N_SITES` hospitals (the
secure-aggregation minimum) on 127.0.0.1 with real Flower processes, each in its own home folder with its own CSV
(DKT-Synth's tiny world written out as long tables, one per site), enrolled with fingerprints given out of band,
joined, preflight green, ``fcd server start`` and ``fcd site start`` ×4.

Starting it is most of the cost of the tests that use it (``test_hospital_deployment.py``, then
``test_whatif_deployed.py``: one xdist group, so one worker and one after another), so the session keeps one
(:class:`Hospitals`, the ``hospitals`` fixture of ``conftest.py``) and hands it to the next test that asks while it
runs. A test that leaves it in a state another test must not start from (its sites' policies changed) closes it
(:meth:`Hospitals.close`); the next test to ask then gets a fresh one, so no order of the tests breaks another's
preconditions. Every process is stopped by its own ``stop`` command and none may survive it.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import server as server_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.engines.deployment import free_port
from fcd_secure.federation.state import ServerCheckpoint
from fcd_secure.provisioning.processes import alive, read_pids, status
from fcd_secure.provisioning.site_install.tables import REGISTRY_ENV

N_SITES = 4
runner = CliRunner()


def invoke(app, args: list[str]) -> tuple[int, dict]:
    """A ``fcd`` sub-app's command in this process with ``--json``: its exit code and envelope."""
    res = runner.invoke(app, [*args, "--json"])
    try:
        return res.exit_code, json.loads(res.stdout)
    except json.JSONDecodeError:
        raise AssertionError(f"{args}: {res.stdout!r} {res.exception!r}") from None


@dataclass(frozen=True)
class Consortium:
    """A started consortium: the coordinator's home, the hospitals' homes, their pinned fingerprints, the site
    processes recorded right after ``fcd site start`` and what ``fcd server start`` answered."""

    root: Path
    co: Path
    port: int
    homes: list[Path]
    site_fps: list[str]
    site_pids: dict[Path, dict[str, int]]
    server_start: dict

    @property
    def site_args(self) -> list[str]:
        return [a for h in self.homes for a in ("--site-home", str(h))]

    @property
    def folders(self) -> list[Path]:
        """The folders whose processes it started, in the order it started them."""
        return [self.co / "server", *self.homes]

    def running(self) -> bool:
        """Whether every process it recorded (SuperLink, each site's SuperNode supervisor and executor) runs."""
        return all(p["running"] for f in self.folders for p in status(f).values()) and all(
            status(f) for f in self.folders)

    def trained_rounds(self) -> int:
        """The last round of the coordinator's checkpoint (0: no run trained yet); a run of the same training
        settings resumes after it (``apps.server_loop.ServerLoop.resume``)."""
        ckpt = ServerCheckpoint(self.co / "server" / "state")
        return ckpt.load()[0] if ckpt.exists() else 0


def _stop(folders: list[Path], co: Path) -> None:
    """Stop each folder's processes by its own ``stop`` command (later-started first); none may survive it."""
    for folder in reversed(folders):
        pids = [int(v["pid"]) for v in read_pids(folder).values()]
        if folder == co / "server":
            invoke(server_cli.app, ["stop", "--home", str(co)])
        else:
            invoke(site_cli.app, ["stop", "--home", str(folder)])
        assert not any(alive(p) for p in pids), f"a process of {folder} survived stop"


def start_consortium(root: Path) -> Consortium:
    """Enrol, join, preflight and start a coordinator and :data:`N_SITES` hospitals under ``root``; whatever
    started is stopped again when a step fails.

    The hosts' registry of site tables (``provisioning.site_install.tables``) is the consortium's own, whichever
    test starts it: an earlier run's homes, left in pytest's temp folders, hold tables of the same content."""
    import torch

    from fcd_secure.data.long_tables import write_site_tables
    from fcd_secure.data.registry import load_federated

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the in-process commands gain nothing from two threads on two shared cores
    started: list[Path] = []
    co = root / "coordinator"
    try:
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv(REGISTRY_ENV, str(root / "site_tables.json"))
            fd = load_federated("dkt-synth", n_sites=N_SITES, preset="tiny", seed=0)
            spec, tables = write_site_tables(fd.train, fd.test, root / "data", "dkt-synth-long")
            port = free_port()
            code, env = invoke(consortium_cli.app, ["init", "--home", str(co), "--id", "e2e", "--spec", str(spec),
                                                    "--port", str(port), "--min-trajectories", "20"])
            assert code == 0, env
            coordinator_fp = env["data"]["coordinator_fingerprint"]
            homes = [root / f"hospital{i}" for i in range(N_SITES)]
            site_fps = []
            for i, home in enumerate(homes):
                code, env = invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(tables[i]), "--home",
                                                  str(home), "--site-id", f"site{i}", "--min-trajectories", "20"])
                assert code == 0, env
                site_fps.append(env["data"]["identity_fingerprint"])
                code, env = invoke(consortium_cli.app, ["add-site", str(home / "enrolment_request.json"), "--home",
                                                        str(co), "--fingerprint", site_fps[-1]])
                assert code == 0, env
            # the CA's private key goes offline before the server starts (fcd server start refuses otherwise, P35)
            (root / "offline").mkdir()
            shutil.move(co / "pki" / "ca.key", root / "offline" / "ca.key")
            code, server_start = invoke(server_cli.app, ["start", "--home", str(co)])
            assert code == 0, server_start
            started.append(co / "server")
            for i, home in enumerate(homes):
                code, env = invoke(site_cli.app, ["join", str(co / "bundles" / f"site{i}.json"), "--home", str(home),
                                                  "--coordinator-fingerprint", coordinator_fp])
                assert code == 0, env
                code, env = invoke(site_cli.app, ["preflight", "--home", str(home)])
                assert code == 0, env["data"]["checks"] if env.get("data") else env
                code, env = invoke(site_cli.app, ["start", "--home", str(home)])
                assert code == 0, env
                started.append(home)
        site_pids = {h: {n: int(v["pid"]) for n, v in read_pids(h).items()} for h in homes}
        return Consortium(root, co, port, homes, site_fps, site_pids, server_start)
    except BaseException:
        _stop(started, co)
        raise
    finally:
        torch.set_num_threads(threads)


class Hospitals:
    """The session's one running consortium: :meth:`consortium` starts it on first use (and again after
    :meth:`close`, or when a process of it no longer runs); :meth:`close` stops it."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory) -> None:
        self._tmp = tmp_path_factory
        self._current: Consortium | None = None

    def consortium(self, *, untrained: bool = False) -> Consortium:
        """The running consortium; ``untrained``: one on which no run has trained yet (a fresh one if needed)."""
        if self._current is not None and (not self._current.running()
                                          or untrained and self._current.trained_rounds() > 0):
            self.close()
        if self._current is None:
            self._current = start_consortium(self._tmp.mktemp("hospitals"))
        return self._current

    def close(self) -> None:
        """Stop every process of the current consortium (none may survive its ``stop``); the next
        :meth:`consortium` starts a fresh one."""
        current, self._current = self._current, None
        if current is not None:
            _stop(current.folders, current.co)
