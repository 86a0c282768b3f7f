"""DP-SGD composes with secure aggregation in one real ``fcd run --preset tiny --dp-epsilon 8`` (Flower simulation).

Every participating site trains through its write-ahead ledger; the masked vectors carry DP-trained updates; the
report read from the run folder equals the accountant on the ledgers.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.privacy.ledger import Ledger
from fcd_secure.privacy.planner import epsilon


@pytest.mark.slow
def test_fcd_run_tiny_with_dp_and_secure_aggregation(tmp_path, monkeypatch):
    monkeypatch.setenv("FLWR_TELEMETRY_ENABLED", "0")
    out = tmp_path / "run"
    # secure aggregation is the default: no flag needed
    res = CliRunner().invoke(
        app,
        ["run", "--preset", "tiny", "--dp-epsilon", "8", "--sites", "5", "--clients-per-round", "4",
         "--eval-every", "0", "--out", str(out), "--json"],
    )
    assert res.exit_code == 0, res.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["secure_aggregation"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["dp"]["enabled"] is True and config["dp"]["epsilon"] == 8

    rep = CliRunner().invoke(app, ["privacy", "report", str(out), "--json"])
    assert rep.exit_code == 0, rep.output
    report = json.loads(rep.output)
    sites = report["sites"]
    # every site that took part in a round has a ledger with that many committed rounds, and ε within the cap
    assert len(sites) >= 3
    for s in sites:
        state = Ledger(s["ledger"]).load()
        assert all(seg.status == "committed" and seg.steps > 0 for seg in state.segments)
        assert 0 < s["epsilon_spent"] <= 8.0
        assert s["epsilon_spent"] == pytest.approx(epsilon(state.history(), state.delta, state.accountant))
        assert s["batch_terms_under_dp"] == "off"
    assert report["consortium"]["epsilon"] <= 8.0
    assert (out / "privacy_report.md").exists() and (out / "privacy_epsilon.png").exists()
