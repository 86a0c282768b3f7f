"""No site or server runs without its privacy components: a missing or broken egress gate, secure-aggregation module
or server ledger is an error when the app is imported or built, never a silently disabled promise.

Also the ClientApp half of the egress gate (``apps.egress``): a gate without a site runtime sends nothing, and
the closing receipts message is answered by the gate inside a real ClientApp.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from test_audit_support import Server, Site, context, instruction

import fcd_secure
from fcd_secure.audit import GENERIC_ERROR_REASON, RECEIPTS_MESSAGE_TYPE
from fcd_secure.config import build_config

PACKAGE = Path(fcd_secure.__file__).resolve().parent
CLIENT_APP = "fcd_secure.apps.client_app"
SERVER_APP = "fcd_secure.apps.server_app"

#: (module made unimportable, app module that must then fail to import)
MISSING = [
    ("fcd_secure.apps.egress", CLIENT_APP),  # the gate's binding to a site
    ("fcd_secure.audit", CLIENT_APP),  # the gate's rules and the site ledger
    ("fcd_secure.apps.secure_site", CLIENT_APP),  # the sites' secure-aggregation actions
    ("fcd_secure.federation.secure.flow", SERVER_APP),  # the server's secure-aggregation flow
    ("fcd_secure.audit", SERVER_APP),  # the server ledger
]

_PROBE = textwrap.dedent(
    """
    import importlib, json, sys
    cases = json.loads(sys.argv[1])
    out = []
    for blocked, target in cases:
        for name in [m for m in sys.modules if m == "fcd_secure" or m.startswith("fcd_secure.")]:
            del sys.modules[name]
        if blocked:
            sys.modules[blocked] = None  # what Python does for a module that cannot be found: ImportError
        try:
            importlib.import_module(target)
            out.append("imported")
        except ImportError as exc:
            out.append("ImportError: " + str(exc))
        finally:
            if blocked:
                del sys.modules[blocked]
    print(json.dumps(out))
    """
)


def _probe(cases: list[tuple[str | None, str]], pythonpath: Path) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(pythonpath), "FLWR_TELEMETRY_ENABLED": "0", "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-c", _PROBE, json.dumps(cases)], capture_output=True, text=True, env=env, timeout=300, cwd=pythonpath
    )
    assert res.returncode == 0, res.stderr[-3000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


def test_a_missing_gate_secure_or_ledger_module_stops_the_app_at_import():
    controls = [(None, CLIENT_APP), (None, SERVER_APP)]
    got = _probe(controls + MISSING, PACKAGE.parent)
    assert got[: len(controls)] == ["imported", "imported"]  # the probe can tell the difference
    for (blocked, target), result in zip(MISSING, got[len(controls) :]):
        assert result.startswith("ImportError") and blocked in result, (blocked, target, result)


def test_a_package_copy_without_the_egress_gate_module_cannot_build_a_clientapp(tmp_path):
    copy = tmp_path / "fcd_secure"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / "apps" / "egress.py").unlink()
    got = _probe([(None, CLIENT_APP), (None, "fcd_secure.engines.simulation")], tmp_path)
    for result in got:
        assert result.startswith("ImportError") and "fcd_secure.apps.egress" in result, result


def test_a_broken_gate_factory_means_no_clientapp(monkeypatch):
    from fcd_secure.apps import egress
    from fcd_secure.apps.client_app import make_client_app

    class GateBroken(RuntimeError):
        pass

    def broken(get_site):
        raise GateBroken("the egress gate cannot be built")

    monkeypatch.setattr(egress, "make_egress_gate", broken)
    with pytest.raises(GateBroken):
        make_client_app(build_config("tiny"))
    monkeypatch.undo()
    app = make_client_app(build_config("tiny"))
    assert len(app._mods) == 2 and app._mods[0].__name__ == "egress_gate"  # the gate is the outermost mod


def test_the_server_never_runs_without_its_ledger(tmp_path):
    from fcd_secure.apps.server_app import run_federation
    from fcd_secure.apps.server_loop import FederationError, server_audit

    # no state folder: refused before any message is sent (the grid is never touched)
    with pytest.raises(FederationError, match="state folder"):
        run_federation(None, build_config("tiny"))
    # a run folder alone is enough: the ledger and its key live under <out>/state/_server
    audit = server_audit(build_config("tiny", {"out": str(tmp_path / "run")}))
    server_dir = tmp_path / "run" / "state" / "_server"
    assert audit.ledger.path.parent == server_dir / "audit"
    key = server_dir / "identity_ed25519.key"
    assert key.stat().st_size == 32 and key.stat().st_mode & 0o077 == 0


# -- the egress gate inside the ClientApp ----------------------------------------------------------------------------
def test_federation_gate_without_a_runtime_sends_nothing(tmp_path):
    from fcd_secure.apps.egress import make_egress_gate_mod

    gate = make_egress_gate_mod(None)
    site = Site(tmp_path)
    reply = gate(instruction("train", 1), None, site.train_handler())
    assert reply.has_error() and reply.error.reason == GENERIC_ERROR_REASON


def test_receipts_action_is_answered_by_the_gate_inside_a_real_clientapp(tmp_path):
    """A real ClientApp with the gate outermost: the closing receipts message is answered by the gate (the
    registered handler is never reached) and the last round gets its signed checkpoint."""
    from flwr.clientapp import ClientApp

    from fcd_secure.apps.egress import register_receipts_action

    site, server = Site(tmp_path), Server(tmp_path)
    app = ClientApp(mods=[site.gate])
    app.train()(site.train_handler())
    register_receipts_action(app)
    reply = app(server.downlink("train", 1, 11), context(11))
    server.receive(reply, site.site_id)
    ack = app(server.downlink(RECEIPTS_MESSAGE_TYPE, 1, 11), context(11))
    assert ack.has_content() and not ack.has_error()
    kinds = [l["kind"] for l in site.ledger.lines()]
    # the closing ack carries the site's last checkpoint for the server to countersign, so it is recorded after it
    assert kinds[-3:] == ["receipt", "checkpoint", "upload"]
    assert "fcd.audit.head" in ack.content
    bare = ClientApp()
    register_receipts_action(bare)
    with pytest.raises(Exception):
        bare(server.downlink(RECEIPTS_MESSAGE_TYPE, 1, 11), context(11))
