"""End to end on the in-process engine (``engines.inprocess``: Flower's ServerApp and ClientApp and its Message API
without Ray, pinned to the simulation engine bit for bit in ``test_federation_inprocess.py``): a federated run's site
ledgers verify clean, and the bytes they record equal the run's own communication accounting (``Comm``'s traffic
rows), site by site. The claim is about the ledgers and the accounting, not the engine, so it does not pay a Ray
start; the messages still cross the grid as transport copies (deflated and inflated), as on Flower's engines."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest


from fcd_secure.engines.inprocess import run_inprocess  # noqa: E402
from fcd_secure.manifest import THETA_C  # noqa: E402


@pytest.fixture(scope="module")
def federated_run(tmp_path_factory):
    import torch

    from fcd_secure.config import build_config

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("fedrun")
    cfg = build_config(
        "tiny",
        {
            "data": {"n_sites": 2},
            "federation": {"clients_per_round": 2, "rounds": 1, "eval_every": 0, "secure_aggregation": False},
            "evaluation": {"max_rows": 8, "n_samples": 1},
            "state_dir": str(root / "state"),
        },
    )
    result = run_inprocess(cfg)
    return root / "state", result


@pytest.mark.slow
def test_default_run_ledgers_verify_clean_and_match_communication_accounting(federated_run):
    from typer.testing import CliRunner

    from fcd_secure.audit.verify import verify_path
    from fcd_secure.cli.main import app

    from fcd_secure.audit.ledger import fingerprint, public_key_bytes

    state, result = federated_run
    # pinned to the identity keys the sites and the server hold (read from the key files, not from the evidence)
    site_pins, server_pins = [], []
    for key_file in sorted(state.rglob("identity_ed25519.key")):
        (server_pins if key_file.parent.name == "_server" else site_pins).append(fingerprint(public_key_bytes(key_file.read_bytes())))
    assert len(server_pins) == 1 and len(site_pins) == 2
    res = verify_path(state, site_keys=site_pins, server_keys=server_pins)
    assert res.exit_code == 0 and res.status == "compliant", [f.message for f in res.findings if f.severity != "note"]
    assert verify_path(state).exit_code == 3  # the same evidence, unpinned: unverified

    up = [r for r in result.traffic_rows if r["direction"] == "up"]
    entries = [json.loads(l) for p in state.rglob("site_ledger.jsonl") for l in p.read_text().splitlines()]
    # Comm names a node "node:<id>" until the hello exchange maps it to a site; the site ledgers name both
    site_of_node = {e["node_id"]: e["site_id"] for e in entries if e["kind"] == "upload"}
    comm_per_site: dict[str, int] = defaultdict(int)
    for r in up:
        comm_per_site[site_of_node[r["node_id"]]] += r["payload_bytes"]
    ledger_per_site = {site: v["payload_bytes"] for site, v in res.per_site().items()}
    assert ledger_per_site == dict(comm_per_site)
    assert res.totals()["payload_bytes"] == sum(r["payload_bytes"] for r in up) > 0
    assert res.totals()["messages"] == len(up)
    # whole messages too: the engine's message id and delivery stamp are not serialised, so both ends agree
    assert res.totals()["message_bytes"] == sum(r["message_bytes"] for r in up)
    # every training upload carried exactly the Θc layout of the run's manifest, nothing of Θs
    theta_c = set(result.manifest.names(THETA_C))
    train = [e for e in entries if e["kind"] == "upload" and e["action"] == "train"]
    assert len(train) == 2
    for entry in train:
        assert entry["status"] == "sent"
        assert {t["name"] for t in entry["tensors"]} == theta_c

    assert len(list(state.rglob("server_ledger.jsonl"))) == 1
    # the server's own ledger and its receipts reconcile with the sites', byte for byte
    assert res.server_totals["payload_bytes"] == res.totals()["payload_bytes"]
    assert res.server_totals["message_bytes"] == res.totals()["message_bytes"]
    for summary in res.ledgers:
        if summary.role == "site":
            assert summary.receipts == summary.uploads_sent + summary.uploads_refused + summary.uploads_error - 1
            assert summary.unreceipted == 1  # only the acknowledgement of the closing receipts message

    pins = [a for fp in site_pins for a in ("--site-key", fp)] + ["--server-key", server_pins[0]]
    cli = CliRunner().invoke(app, ["audit", "verify", str(state), "--json", *pins])
    assert cli.exit_code == 0, cli.output
    env = json.loads(cli.stdout)
    assert env["data"]["totals"]["payload_bytes"] == res.totals()["payload_bytes"]
    assert all(l["key_pinned"] for l in env["data"]["ledgers"])
