"""The hospital path without a running Flower: consortium init, enrolment, join, preflight (green and each red),
tampered bundles and foreign specs refused, install lines in the site ledger that ``fcd audit verify`` reports.

The SuperLink's TLS endpoint is played by a real TLS listener serving the consortium's own certificate (what
preflight checks is the TLS handshake with the pinned CA, nothing Flower-specific); the end-to-end run with a real
SuperLink is in ``test_hospital_deployment.py``.
"""

from __future__ import annotations

import email.utils
import json
import os
import socket
import ssl
import threading
import time
import tomllib
from pathlib import Path

import pytest
from conftest import GOOD_SPEC, make_long_table
from typer.testing import CliRunner

from fcd_secure.audit.entries import InstallLine, parse_line
from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.engines.pki import make_tls_dir

runner = CliRunner()


def invoke(app, args: list[str]) -> tuple[int, dict]:
    res = runner.invoke(app, [*args, "--json"])
    return res.exit_code, json.loads(res.stdout)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class TLSListener:
    """A TLS endpoint on 127.0.0.1 serving ``server.pem``/``server.key`` of ``pki``; it answers an HTTP request with
    a ``Date`` header ``date_offset_s`` away from this machine's clock (as the SuperLink's uvicorn does), or, with
    ``date_offset_s=None``, completes handshakes only."""

    def __init__(self, pki: Path, port: int, date_offset_s: float | None = 0.0) -> None:
        self.date_offset_s = date_offset_s
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(pki / "server.pem", pki / "server.key")
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", port))
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            try:
                conn.settimeout(2)
                with self.ctx.wrap_socket(conn, server_side=True) as tls:
                    if self.date_offset_s is not None:
                        head = b""
                        while b"\r\n\r\n" not in head:
                            chunk = tls.recv(4096)
                            if not chunk:
                                break
                            head += chunk
                        date = email.utils.formatdate(time.time() + self.date_offset_s, usegmt=True)
                        tls.sendall(f"HTTP/1.1 200 OK\r\nDate: {date}\r\nContent-Length: 2\r\n\r\n{{}}".encode())
            except (OSError, ssl.SSLError):
                pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=5)
        self.sock.close()


def make_consortium(tmp: Path, n_sites: int = 2, *, init_args: tuple[str, ...] = (), spec_text: str = GOOD_SPEC,
                    rows: int = 20, join: bool = True) -> dict:
    """A consortium in ``tmp/co`` with ``n_sites`` enrolled (and joined) sites; returns the paths and fingerprints."""
    (tmp / "spec.toml").write_text(GOOD_SPEC)
    port = free_port()
    code, env = invoke(consortium_cli.app, ["init", "--home", str(tmp / "co"), "--id", "demo", "--spec",
                                            str(tmp / "spec.toml"), "--port", str(port), "--min-trajectories", "5",
                                            *init_args])
    assert code == 0, env
    cfp = env["data"]["coordinator_fingerprint"]
    sites = []
    for i in range(n_sites):
        table = tmp / f"hospital{i}.csv"
        make_long_table(rows, seed=i).to_csv(table, index=False)
        spec = tmp / f"site{i}-spec.toml"
        spec.write_text(spec_text)
        home = tmp / f"site{i}"
        code, env = invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(table), "--home", str(home),
                                          "--site-id", f"h{i}", "--min-trajectories", "5"])
        assert code == 0, env
        code, added = invoke(consortium_cli.app, ["add-site", str(home / "enrolment_request.json"), "--home",
                                                  str(tmp / "co"), "--fingerprint", env["data"]["identity_fingerprint"]])
        assert code == 0, added
        sites.append({"home": home, "table": table, "spec": spec, "id": f"h{i}", "fp": env["data"]["identity_fingerprint"]})
    if join:
        for s in sites:
            code, env = invoke(site_cli.app, ["join", str(tmp / "co" / "bundles" / f"{s['id']}.json"), "--home",
                                              str(s["home"]), "--coordinator-fingerprint", cfp])
            assert code == 0, env
    return {"co": tmp / "co", "port": port, "cfp": cfp, "sites": sites}


def preflight(home: Path) -> tuple[int, dict]:
    code, env = invoke(site_cli.app, ["preflight", "--home", str(home), "--timeout", "2"])
    return code, {c["name"]: c for c in env["data"]["checks"]} if env.get("data") else env


def install_lines(home: Path, site_id: str) -> list[InstallLine]:
    path = home / "state" / site_id / "slots" / "site_ledger.jsonl"
    return [e for e in (parse_line(t) for t in path.read_text().splitlines()) if isinstance(e, InstallLine)]


def test_install_join_preflight_green_and_recorded(tmp_path):
    c = make_consortium(tmp_path)
    listener = TLSListener(c["co"] / "pki", c["port"])
    try:
        code, checks = preflight(c["sites"][0]["home"])
    finally:
        listener.close()
    assert code == 0, checks
    assert {n for n, ch in checks.items() if ch["status"] == "fail"} == set()
    assert checks["clock"]["status"] == "ok" and "SuperLink's clock" in checks["clock"]["message"], checks["clock"]
    assert {"joined", "spec", "table", "rows", "columns", "policy", "keys", "certificates", "clock", "telemetry",
            "disk", "versions", "superlink"} <= set(checks)
    s = c["sites"][0]
    events = [(e.event, e.facts.get("verdict")) for e in install_lines(s["home"], s["id"])]
    assert events == [("init", None), ("join", None), ("preflight", "ready")]
    # no private key ever leaves the site's folder: not in the request, not in the bundle
    key_hex = (s["home"] / "state" / s["id"] / "identity_ed25519.key").read_bytes().hex()
    node_key = (s["home"] / "node_auth.key").read_text()
    for f in (s["home"] / "enrolment_request.json", c["co"] / "bundles" / f"{s['id']}.json", c["co"] / "roster.json"):
        text = f.read_text()
        assert key_hex not in text and node_key.splitlines()[1] not in text
    # the join pinned the consortium's app in the site's own policy, and the roster of both sites for secagg
    policy = tomllib.loads((s["home"] / "site_policy.toml").read_text())
    consortium = tomllib.loads((c["co"] / "consortium.toml").read_text())
    assert policy["app"]["fab_sha256"] == [consortium["app_fab_sha256"]]
    # and who may start it (P34): the coordinator key that signed the bundle, for this consortium only
    from fcd_secure.fingerprints import fingerprint

    assert fingerprint(bytes.fromhex(policy["app"]["coordinator_key"])) == consortium["coordinator_fingerprint"]
    assert policy["app"]["consortium_id"] == consortium["consortium_id"]
    assert set(json.loads((s["home"] / "consortium" / "secagg_roster.json").read_text())["sites"]) == {"h0", "h1"}


def test_clock_check_is_one_sided_only_without_the_superlinks_date(tmp_path):
    c = make_consortium(tmp_path, n_sites=1)
    listener = TLSListener(c["co"] / "pki", c["port"], date_offset_s=None)  # a handshake, no HTTP answer
    try:
        code, checks = preflight(c["sites"][0]["home"])
    finally:
        listener.close()
    assert code == 0, checks
    assert checks["clock"]["status"] == "warn" and "one-sided" in checks["clock"]["message"], checks["clock"]


def test_audit_verify_reports_installation(tmp_path):
    from fcd_secure.audit.verify import verify_path

    c = make_consortium(tmp_path, n_sites=1)
    s = c["sites"][0]
    preflight(s["home"])
    res = verify_path(s["home"] / "state", site_keys=[s["fp"]], server_keys=None)
    inst = res.installations
    assert [(i["site"], i["event"]) for i in inst] == [("h0", "init"), ("h0", "join"), ("h0", "preflight")]
    assert inst[2]["facts"]["verdict"] == "not_ready" and "superlink" in inst[2]["facts"]["failed"]
    assert not [f for f in res.findings if f.severity in ("tampered", "violation")]


def test_tampered_bundle_and_wrong_fingerprint_refused(tmp_path):
    c = make_consortium(tmp_path, n_sites=1, join=False)
    s = c["sites"][0]
    bundle = c["co"] / "bundles" / "h0.json"
    raw = bytearray(bundle.read_bytes())
    pos = raw.index(b"min_trajectories = 5") + len("min_trajectories = ")
    raw[pos] = ord("4")  # one byte: the consortium's minimum rows
    tampered = tmp_path / "tampered.json"
    tampered.write_bytes(bytes(raw))
    code, env = invoke(site_cli.app, ["join", str(tampered), "--home", str(s["home"]), "--coordinator-fingerprint", c["cfp"]])
    assert code == 2 and "signature does not verify" in env["message"], env
    code, env = invoke(site_cli.app, ["join", str(bundle), "--home", str(s["home"]), "--coordinator-fingerprint",
                                      "SHA256:" + "ab" * 32])
    assert code == 2 and "not by the expected key SHA256:" + "ab" * 32 in env["message"], env
    # P54: the signer's real fingerprint is not printed (it could be pasted back, skipping the out-of-band check)
    assert c["cfp"] not in json.dumps(env) and "out of band" in env["message"], env
    assert not (s["home"] / "consortium").exists()  # nothing pinned from a refused bundle
    code, env = invoke(site_cli.app, ["join", str(bundle), "--home", str(s["home"]), "--coordinator-fingerprint", c["cfp"]])
    assert code == 0, env


def test_add_site_refuses_foreign_spec_and_wrong_fingerprint(tmp_path):
    c = make_consortium(tmp_path, n_sites=1)
    table = tmp_path / "other.csv"
    make_long_table(20, seed=5).to_csv(table, index=False)
    other_spec = tmp_path / "other-spec.toml"
    other_spec.write_text(GOOD_SPEC.replace("max_len = 4", "max_len = 5"))
    code, env = invoke(site_cli.app, ["init", "--spec", str(other_spec), "--table", str(table), "--home",
                                      str(tmp_path / "other"), "--site-id", "h9", "--min-trajectories", "5"])
    assert code == 0
    req = str(tmp_path / "other" / "enrolment_request.json")
    code, out = invoke(consortium_cli.app, ["add-site", req, "--home", str(c["co"]), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 2 and "another data spec" in out["message"], out
    code, out = invoke(consortium_cli.app, ["add-site", str(c["sites"][0]["home"] / "enrolment_request.json"),
                                            "--home", str(c["co"]), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 2 and "not by the expected key " + env["data"]["identity_fingerprint"] in out["message"], out
    real = json.loads((c["sites"][0]["home"] / "enrolment_request.json").read_text())["payload"]["identity_fingerprint"]
    assert real not in json.dumps(out) and "out of band" in out["message"], out  # P54: only the expected value


def test_site_init_refuses_a_table_that_does_not_match_its_spec(tmp_path):
    (tmp_path / "spec.toml").write_text(GOOD_SPEC)
    make_long_table(20).drop(columns=["lab"]).to_csv(tmp_path / "t.csv", index=False)
    code, env = invoke(site_cli.app, ["init", "--spec", str(tmp_path / "spec.toml"), "--table", str(tmp_path / "t.csv"),
                                      "--home", str(tmp_path / "s"), "--site-id", "h0"])
    assert code == 2 and "lab" in env["message"], env
    assert not (tmp_path / "s" / "site.toml").exists()


def _red(case: str, tmp_path: Path, monkeypatch) -> tuple[str, str, dict]:
    init_args: tuple[str, ...] = ()
    if case == "cert_10_days":
        init_args = ("--cert-days", "10")
    elif case == "versions":
        init_args = ("--pin", "flwr=1.0.0")
    c = make_consortium(tmp_path, n_sites=1, init_args=init_args)
    s = c["sites"][0]
    pki = c["co"] / "pki"
    if case == "table":
        make_long_table(20).drop(columns=["ward"]).to_csv(s["table"], index=False)
    elif case == "rows":  # the table shrank after enrolment (add-site refuses one below the floor)
        make_long_table(3).to_csv(s["table"], index=False)
    elif case == "spec":
        (s["home"] / "spec.toml").write_text(GOOD_SPEC.replace('kind = "categorical"', 'kind = "categorical"\nmissing = "indicator"'))
    elif case == "key_mode":
        os.chmod(s["home"] / "node_auth.key", 0o644)
    elif case == "wrong_ca":
        pki = make_tls_dir(tmp_path / "other-pki", ("127.0.0.1", "localhost"))
    elif case == "telemetry":
        monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "1")
    offset = {"clock_ahead": -120.0, "clock_behind": 120.0}.get(case, 0.0)
    listener = None if case == "unreachable" else TLSListener(pki, c["port"], date_offset_s=offset)
    try:
        code, checks = preflight(s["home"])
    finally:
        if listener:
            listener.close()
    assert code == 1, checks
    return code, checks


RED = {
    # case: (check that fails, words in its message)
    "table": ("table", "ward"),
    "spec": ("spec", "differs from the consortium"),
    "rows": ("rows", "at least 5"),
    "key_mode": ("keys", "readable by others"),
    "cert_10_days": ("certificates", "expires in 10 days"),
    "wrong_ca": ("superlink", "pinned CA"),
    "versions": ("versions", "flwr 1.42.0 (consortium pins 1.0.0)"),
    "telemetry": ("telemetry", "FLWR_TELEMETRY_ENABLED=0"),
    "unreachable": ("superlink", "unreachable"),
    "clock_ahead": ("clock", "s ahead of the SuperLink's"),
    "clock_behind": ("clock", "s behind the SuperLink's"),
}


@pytest.mark.parametrize("case", sorted(RED))
def test_preflight_red(case, tmp_path, monkeypatch):
    _code, checks = _red(case, tmp_path, monkeypatch)
    name, words = RED[case]
    assert checks[name]["status"] == "fail", checks
    assert words in checks[name]["message"], checks[name]
    others = {n for n, ch in checks.items() if ch["status"] == "fail"} - {name}
    assert others == set(), checks  # exactly the broken thing is red


def test_control_api_answers_only_the_coordinator_host():
    """``fcd server start``'s SuperLink: the Control and Runtime API paths are refused (403) from other client
    addresses before Flower sees the request; the Fleet API and health are passed through (the running SuperLink
    is checked in ``test_hospital_deployment.py``)."""
    import asyncio

    from fcd_secure._flower.superlink_main import CoordinatorOnly, split_args

    seen = []

    async def flower(scope, receive, send):
        seen.append(scope["path"])
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    # a real loopback connection of this process (the coordinator's OS user): the Control API also asks the kernel
    # who holds the client's socket (P35, tests/test_coordinator_host.py)
    listener = socket.create_server(("127.0.0.1", 0))
    peer = socket.create_connection(listener.getsockname())
    conn, _ = listener.accept()

    def status(path: str, client: str | None) -> int:
        sent = []

        async def send(event):
            sent.append(event)

        scope = {"type": "http", "path": path, "client": (client, conn.getpeername()[1]) if client else None,
                 "server": conn.getsockname()}
        asyncio.run(CoordinatorOnly(flower, ["127.0.0.1"])(scope, None, send))
        return sent[0]["status"]

    assert status("/v1/control/start-run", "10.0.0.7") == 403
    assert status("/v1/runtime/acquire-task", "127.0.0.2") == 403
    assert status("/v1/control/start-run", None) == 403
    assert seen == []
    # the Runtime API: the Control API also refuses a connection this process holds, as it refuses its own process
    # tree's (P50; the coordinator's own flwr passes in tests/test_coordinator_host.py, against a real SuperLink)
    assert status("/v1/runtime/acquire-task", "127.0.0.1") == 200
    assert status("/v1/control/start-run", "127.0.0.1") == 403 and seen == ["/v1/runtime/acquire-task"]
    assert status("/v1/fleet/pull-messages", "10.0.0.7") == 200
    assert status("/health", "10.0.0.7") == 200
    for sock in (conn, peer, listener):
        sock.close()
    assert split_args(["--port", "1"]) == (["127.0.0.1"], ["--port", "1"])
    assert split_args(["--control-api-address", "10.0.0.1", "--host", "h", "--control-api-address=10.0.0.2"]) == (
        ["10.0.0.1", "10.0.0.2"], ["--host", "h"])


def test_superlink_skips_flowers_middlewares_only_where_they_pass_requests_through(monkeypatch):
    """``fcd server start``'s SuperLink scopes Flower's Control-API middlewares to ``/v1/control/`` and its Fleet
    event-log middleware to ``/v1/fleet/`` with a plugin loaded; node authentication, protobuf and error translation
    keep seeing every request, in Flower's order (the running SuperLink is ``test_hospital_deployment.py``)."""
    import warnings

    import flwr.superlink.main as flower_main
    from flwr.superlink.routers.control.middlewares import ControlAuthenticationMiddleware
    from flwr.superlink.routers.fleet.middlewares import FleetEventLogMiddleware
    from flwr.superlink.routers.fleet.node_auth import NodeAuthMiddleware
    from starlette.testclient import TestClient

    from fcd_secure._flower.superlink_main import PASS_THROUGH, Scoped, scope_middlewares

    app = flower_main.create_app()
    before = [m.cls for m in app.user_middleware]
    assert sorted(scope_middlewares(app)) == sorted(PASS_THROUGH)
    after = [m.args[0] if m.cls is Scoped else m.cls for m in app.user_middleware]
    assert after == before  # same layers, same order
    unscoped = {m.cls.__name__ for m in app.user_middleware if m.cls is not Scoped}
    assert {"NodeAuthMiddleware", "ProtobufTranslationMiddleware", "BaseHTTPMiddleware"} <= unscoped

    reached = []
    for cls in (ControlAuthenticationMiddleware, FleetEventLogMiddleware, NodeAuthMiddleware):
        def spy(self, request, call_next, _orig=cls.dispatch, _name=cls.__name__):
            reached.append((_name, request.url.path))
            return _orig(self, request, call_next)
        monkeypatch.setattr(cls, "dispatch", spy)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        client = TestClient(app)
        for path in ("/v1/fleet/pull-messages", "/v1/runtime/pull-messages", "/v1/control/list-runs"):
            client.post(path, content=b"", headers={"content-type": "application/protobuf"})
        names = lambda path: {n for n, p in reached if p == path}  # noqa: E731
        assert names("/v1/control/list-runs") >= {"ControlAuthenticationMiddleware", "NodeAuthMiddleware"}
        assert names("/v1/fleet/pull-messages") == {"NodeAuthMiddleware"}  # no event-log plugin: passed through
        assert names("/v1/runtime/pull-messages") == {"NodeAuthMiddleware"}
    # with an event-log plugin loaded, Fleet requests reach its middleware again (behind node authentication)
    fleet_log = PASS_THROUGH["FleetEventLogMiddleware"]
    scope = lambda path: {"type": "http", "path": path, "headers": [], "app": app}  # noqa: E731
    assert fleet_log(scope("/v1/fleet/pull-messages"))
    app.state.fleet_event_log_plugin = object()
    assert not fleet_log(scope("/v1/fleet/pull-messages")) and fleet_log(scope("/v1/runtime/pull-messages"))
    control = PASS_THROUGH["ControlAuthenticationMiddleware"]
    assert not control(scope("/v1/control/start-run")) and control(scope("/v1/controlx")) and control(scope("/health"))

    # a Flower whose middlewares differ is refused, not half-scoped
    bare = flower_main.create_app()
    bare.user_middleware[:] = [m for m in bare.user_middleware if m.cls is not ControlAuthenticationMiddleware]
    with pytest.raises(RuntimeError, match="expected the middlewares"):
        scope_middlewares(bare)
