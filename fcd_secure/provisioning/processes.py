"""Long-lived processes of an installation (SuperLink, SuperNode, site executor), started detached and stopped by PID.

Each folder that runs processes keeps ``run/pids.json`` (name → PID and command) and ``run/logs/``. A process is
started in its own session, so stopping it signals its whole process group (SIGTERM, then SIGKILL after a grace
period) and never any process by name.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

from fcd_secure._io import atomic_write_text

PIDS_FILE = "pids.json"


def run_dir(home: Path) -> Path:
    d = home / "run"
    (d / "logs").mkdir(parents=True, exist_ok=True)
    return d


def read_pids(home: Path) -> dict[str, dict]:
    p = home / "run" / PIDS_FILE
    return json.loads(p.read_text()) if p.is_file() else {}


def _write_pids(home: Path, pids: dict[str, dict]) -> None:
    atomic_write_text(run_dir(home) / PIDS_FILE, json.dumps(pids, indent=1))


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, finished but not yet reaped, does not)."""
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return True


def spawn(home: Path, name: str, args: list[str], env: dict[str, str]) -> int:
    """Start ``args`` detached (own session), log to ``run/logs/<name>.log``, record its PID; returns the PID."""
    log = run_dir(home) / "logs" / f"{name}.log"
    with open(log, "ab") as f:
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=home, start_new_session=True)
    pids = read_pids(home)
    pids[name] = {"pid": p.pid, "args": args[:2], "log": str(log)}
    _write_pids(home, pids)
    return p.pid


def status(home: Path) -> dict[str, dict]:
    """``{name: {"pid", "running", "log"}}`` of the recorded processes."""
    return {n: {"pid": v["pid"], "running": alive(int(v["pid"])), "log": v.get("log")} for n, v in read_pids(home).items()}


def descendants(pid: int) -> list[int]:
    """Every process below ``pid`` (children start their own sessions too: flower-superlink's SuperExec and
    ServerApp, a SuperNode's tasks), read from ``/proc``."""
    parent: dict[int, int] = {}
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                parent[int(d.name)] = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += kids
        todo += kids
    return out


def find_below(pid: int, program: str) -> int | None:
    """The PID of a live process below ``pid`` (:func:`descendants`) that runs ``program`` (the base name of its
    executable or, for a script run by an interpreter, of the script: the first two words of its command line), or
    None. Each call reads all of ``/proc``: a caller that waits on the process found checks it with :func:`alive`."""
    for child in descendants(pid):
        try:
            words = Path(f"/proc/{child}/cmdline").read_bytes().split(b"\0")[:2]
        except OSError:
            continue
        if any(Path(w.decode(errors="replace")).name == program for w in words) and alive(child):
            return child
    return None


def runs_below(pid: int, program: str) -> bool:
    """Whether a live process below ``pid`` runs ``program`` (:func:`find_below`)."""
    return find_below(pid, program) is not None


def _same_command(pid: int, args: list[str]) -> bool:
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    return bool(args) and all(a.encode() in cmdline for a in args[1:2]) and any(
        Path(c.decode(errors="replace")).name == Path(args[0]).name for c in cmdline[:2])


def _signal(pids: list[int], sig: int) -> None:
    for pid in pids:
        for kill in (os.killpg, os.kill):
            try:
                kill(pid, sig)
            except (ProcessLookupError, PermissionError):
                pass


def stop(home: Path, grace_s: float = 10.0) -> dict[str, int]:
    """Stop every recorded process and everything below it (later-started first): SIGTERM, then SIGKILL; returns
    ``{name: pid}`` of the recorded ones."""
    pids = read_pids(home)
    # a stale record's PID may belong to another process by now: only ours (same command) is signalled
    order = [int(v["pid"]) for _n, v in reversed(list(pids.items())) if _same_command(int(v["pid"]), v.get("args", []))]
    tree = [p for root in order for p in [root, *descendants(root)]]
    _signal(tree, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and any(alive(p) for p in tree):
        time.sleep(0.2)
    _signal([p for p in tree if alive(p)], signal.SIGKILL)
    _write_pids(home, {})
    return {n: int(v["pid"]) for n, v in pids.items()}


def port_taken(host: str, port: int) -> str | None:
    """``address:port`` of ``host`` where another process listens already, or ``None`` when the port is free there.

    A bind with ``SO_REUSEADDR`` fails with ``EADDRINUSE`` only while a socket listens on the address, not for
    connections left in TIME_WAIT (Linux socket(7), ``SO_REUSEADDR``); the probe socket is closed at once. An
    address that is not this host's (``EADDRNOTAVAIL``) is left to the server to refuse.
    """
    for family, kind, proto, _name, addr in socket.getaddrinfo(host, port, type=socket.SOCK_STREAM):
        with socket.socket(family, kind, proto) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(addr)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    return f"{addr[0]}:{addr[1]}"
    return None


def wait_for_port(host: str, port: int, pid: int, wait_s: float, what: str) -> None:
    """Wait until ``host:port`` accepts connections.

    Raises:
        RuntimeError: the process exited or the port stayed closed (the message names the log to read).
    """
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        if not alive(pid):
            raise RuntimeError(f"{what} (PID {pid}) exited; see its log")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not open {host}:{port} within {wait_s:.0f} s")
