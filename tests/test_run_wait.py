"""What ``fcd server run`` watches while it waits for a run (``provisioning.server._submit_and_wait``): whether a
ServerApp process runs under the coordinator's SuperLink, read from ``/proc`` (``provisioning.processes.runs_below``),
so that the SuperLink is asked for the run's status (a ``flwr ls`` process each time) only when none does; and the
SuperNode keys a consortium's start registers in one process (``engines.deployment.register_node_keys``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from fcd_secure.provisioning.processes import alive, descendants, find_below, runs_below

#: a parent that starts ``argv[1]`` with this interpreter (as Flower's SuperExec starts ``flwr-serverapp``: a script
#: run by the venv's python) and waits for it
PARENT = "import subprocess, sys; subprocess.Popen([sys.executable, sys.argv[1]], start_new_session=True).wait()"


def _wait_for(predicate, what: str, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_a_program_below_a_process_is_found_by_its_script_name_and_not_once_it_ended(tmp_path):
    script = tmp_path / "flwr-serverapp"
    script.write_text("import time\ntime.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", PARENT, str(script)])
    try:
        _wait_for(lambda: runs_below(parent.pid, "flwr-serverapp"), "the child never showed under its parent")
        assert not runs_below(parent.pid, "flwr-clientapp")  # another program's name
        (child,) = descendants(parent.pid)
        assert find_below(parent.pid, "flwr-serverapp") == child  # the PID a waiting run then checks alone
        os.kill(child, signal.SIGKILL)
        _wait_for(lambda: not runs_below(parent.pid, "flwr-serverapp"), "the ended child still counted")
    finally:
        parent.kill()
        parent.wait()
    assert not alive(parent.pid)


def test_registrations_that_fail_are_each_named_with_their_exit_code_and_logged_in_order(tmp_path):
    """No SuperLink is needed to fail: ``flwr supernode register`` refuses a key file that is not there before it
    connects. Both run in one process, one after the other; the log holds each one's output in the order the keys
    were given."""
    from fcd_secure.engines.deployment import register_node_keys

    log = tmp_path / "register.log"
    # relative to the calls' folder: short enough that Flower's error box does not wrap the names
    keys = {"site0": Path("missing0.pub"), "site1": Path("missing1.pub")}
    failed = register_node_keys(keys, tmp_path / "cli", tmp_path, log)
    assert list(failed) == ["site0", "site1"] and all(rc != 0 for rc in failed.values()), failed
    text = " ".join(log.read_text().split())
    assert text.index("missing0.pub") < text.index("missing1.pub"), text
