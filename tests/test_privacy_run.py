"""DP-SGD composes with secure aggregation in one real ``fcd run --preset tiny --dp-epsilon 8`` (on the in-process
engine: the same ServerApp, ClientApp and secure aggregation as Flower's simulation engine, pinned to it bit for bit
in ``test_federation_inprocess.py``; the claim here is DP's, not the engine's).

Every participating site trains through its write-ahead ledger; the masked vectors carry DP-trained updates; the
report read from the run folder equals the accountant on the ledgers; DP is visible in the run header, the result
table and ``summary.json``. The same run, resumed for one more round than its sites planned their budget for, is
refused by every site: the run stops, names the budget as the reason (ε and the cap) and exits 5. Both tests read the
one run (a module-scoped fixture) and form one xdist group, so it happens once, on one worker.
"""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.privacy.ledger import Ledger
from fcd_secure.privacy.planner import epsilon

SITES = 4
pytestmark = pytest.mark.xdist_group("privacy-run")


@pytest.fixture(scope="module")
def dp_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("dp") / "run"
    # test splits above the sites' evaluation cohort floor (20 rows), so every site takes part in the secure evaluation
    conf = out.parent / "larger_test_split.toml"
    conf.write_text("[data]\ntest_fraction = 0.5\n\n[federation]\nsecure_aggregation = true\n")
    # secure aggregation is the default: no flag needed; every site trains in both rounds
    res = CliRunner().invoke(
        app,
        ["run", "--config", str(conf), "--preset", "tiny", "--dp-epsilon", "8", "--sites", str(SITES),
         "--clients-per-round", str(SITES), "--eval-every", "0", "--engine", "inprocess", "--out", str(out)],
        env={"COLUMNS": "80", "FLWR_TELEMETRY_ENABLED": "0"},
    )
    return out, res


@pytest.mark.slow
def test_fcd_run_tiny_with_dp_and_secure_aggregation(dp_run):
    out, res = dp_run
    assert res.exit_code == 0, res.output[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["secure_aggregation"] is True
    config = json.loads((out / "config.json").read_text())
    assert config["dp"]["enabled"] is True and config["dp"]["epsilon"] == 8

    rep = CliRunner().invoke(app, ["privacy", "report", str(out), "--json"])
    assert rep.exit_code == 0, rep.output
    report = json.loads(rep.stdout)["data"]
    sites = report["sites"]
    # every site that took part in a round has a ledger with that many committed rounds, and ε within the cap
    assert len(sites) == SITES
    for s in sites:
        state = Ledger(s["ledger"]).load()
        assert all(seg.status == "committed" and seg.steps > 0 for seg in state.segments)
        assert 0 < s["epsilon_spent"] <= 8.0
        assert s["epsilon_spent"] == pytest.approx(epsilon(state.history(), state.delta, state.accountant))
        assert s["batch_terms_under_dp"] == "off"
    assert report["consortium"]["epsilon"] <= 8.0
    assert (out / "privacy_report.md").exists() and (out / "privacy_epsilon.png").exists()

    # DP is visible everywhere: the header, summary.json (ε per site and the consortium's) and the result table
    header = res.stderr.splitlines()[0]
    assert "DP-SGD ε ≤ 8 per site" in header and "secure aggregation" in header
    dp = summary["dp"]
    assert dp["enabled"] is True and dp["epsilon_cap"] == 8
    by_site = {s["site"]: s["epsilon_spent"] for s in sites}
    assert dp["epsilon_spent"] == pytest.approx(by_site) and set(by_site) == set(summary["site_ids"])
    assert dp["consortium_epsilon"] == pytest.approx(max(by_site.values()))
    assert "ε spent, consortium" in res.stdout and "ε spent, site-03" in res.stdout
    assert max(len(line) for line in res.stdout.splitlines()) <= 80


@pytest.mark.slow
def test_an_exhausted_budget_stops_the_run_naming_epsilon(dp_run):
    out, first = dp_run
    assert first.exit_code == 0, first.output[-3000:]
    ledgers_before = {p: p.read_text() for p in out.rglob("ledger-*.json")}
    res = CliRunner().invoke(app, ["run", "--resume", str(out), "--rounds", "3", "--engine", "inprocess", "--json"],
                             env={"FLWR_TELEMETRY_ENABLED": "0"})
    assert res.exit_code == 5, res.output[-3000:]
    env = json.loads(res.stdout)
    assert (env["status"], env["exit_code"], env["error_code"]) == ("error", 5, "DP_BUDGET_EXHAUSTED")
    assert "stopped: DP budget exhausted (ε" in env["message"] and "of 8)" in env["message"]
    assert {e["error"] for e in env["data"]["site_errors"]} == {"budget_exhausted"}
    assert "resuming from round 2" in res.stderr
    assert "stopped: DP budget exhausted" in res.stderr  # as it happens, not only at the end
    # the refusal spent nothing: each ledger is as it was (the write-ahead reservation was refused)
    assert {p: p.read_text() for p in out.rglob("ledger-*.json")} == ledgers_before
