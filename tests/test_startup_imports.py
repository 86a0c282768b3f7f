"""What a process of the deployment imports before it does any work.

Every process of a deployment is a fresh Python interpreter: a site's SuperNode supervisor and SuperNode, its
executor, and under ``--insecure-dev`` one ``flwr-clientapp`` process per message. A module a process imports but
never uses costs it its import time on every start (``python -X importtime``). Each test runs one fresh interpreter
(``sys.modules`` of this process already holds everything) and asserts which heavy packages it loaded.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def loaded_after(code: str, packages: tuple[str, ...]) -> dict[str, bool]:
    """Run ``code`` in a fresh interpreter; for each top-level package, whether it was imported."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps({{p: p in sys.modules for p in {list(packages)!r}}}))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
           "FLWR_TELEMETRY_ENABLED": "0"}
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_supernode_supervisor_imports_no_flower():
    """The supervisor only starts and restarts its SuperNode child: Flower is the child's import."""
    assert loaded_after("import fcd_secure._flower.supernode_main", ("flwr",)) == {"flwr": False}


def test_client_app_imports_no_server_or_cli_code():
    """A site's ClientApp (one process per message under ``--insecure-dev``, one warm executor per site otherwise)
    loads neither the SuperLink's grid and state code (``_flower.waits``, the ServerApp's) nor Flower's CLI with
    FastAPI (``_flower.internals.fab_bytes``, the coordinator's): 1.1 s of CPU of a bare import. A process that
    runs Flower's ClientApp runtime (``flwr-clientapp``, the site executor) imports FastAPI and SQLAlchemy with that
    runtime, so there the saving is 0.1-0.3 s."""
    heavy = ("flwr.superlink.grid.http_grid", "flwr.cli.build", "fastapi", "sqlalchemy")
    assert loaded_after("import fcd_secure.apps.client_app", heavy) == dict.fromkeys(heavy, False)


def test_server_app_module_leaves_the_heavy_imports_to_its_background_thread():
    """The ServerApp module imports none of what ``apps.server_app.later_imports`` loads in the background once the
    first messages are out (torch, Opacus, scipy, matplotlib, pandas): a deployed ServerApp starts, checks the run's
    signature and sends its hello without them, and a refused run never pays them."""
    heavy = ("torch", "opacus", "scipy", "matplotlib", "pandas")
    assert loaded_after("import fcd_secure.apps.server_app", heavy) == dict.fromkeys(heavy, False)
