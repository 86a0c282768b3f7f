"""Frictions found walking the hospital path from the docs alone (issue 32 item 10; docs/hospital.md,
"Walkthrough, measured"), each checked by the command that had it:

* the docs named no way to get a table per site: ``fcd data export`` writes a built-in world as one long table per
  site plus the spec that reads them, and ``fcd data validate`` accepts what it writes;
* ``fcd server run --no-dp`` on a consortium whose minimum site policy requires DP (the default) was submitted, every
  site refused it at its first message, and the command waited out its whole ``--timeout``: it is now refused before
  anything is submitted, exit 2, naming ``dp.enabled`` and what to change;
* ``fcd whatif`` on a deployed run's folder said only "a run deployed with `fcd deploy` keeps it on each site": it now
  names ``fcd server run`` too and where that run's own answers are.

No Flower process starts here: each refusal comes before any.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from fcd_secure.cli import consortium as consortium_cli
from fcd_secure.cli import data as data_cli
from fcd_secure.cli import server as server_cli
from fcd_secure.cli import site as site_cli
from fcd_secure.cli.main import app as main_app
from fcd_secure.config import build_config
from fcd_secure.federation.state import ServerCheckpoint

from _hospital import invoke, runner


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tables")
    code, env = invoke(data_cli.app, ["export", "--out", str(out), "--dataset", "dkt-synth", "--preset", "tiny",
                                      "--sites", "4", "--seed", "0"])
    assert code == 0, env
    return out, env["data"]


def test_export_writes_one_table_per_site_that_validates(exported):
    out, data = exported
    assert data["spec"] == str(out / "spec.toml")
    assert [t["table"] for t in data["sites"]] == [str(out / f"site{i}.csv") for i in range(4)]
    sizes = []
    for i, t in enumerate(data["sites"]):
        df = pd.read_csv(t["table"])
        assert set(df["site"]) == {f"site{i}"}  # each hospital holds only its own rows
        assert df["entity"].nunique() == t["trajectories"]
        sizes.append(t["trajectories"])
    assert len(set(sizes)) > 1  # a Dirichlet split, not four copies
    code, env = invoke(data_cli.app, ["validate", "--spec", str(out / "spec.toml"), "--table", data["sites"][0]["table"]])
    assert code == 0, env
    # values in the world's own units: not z-scored per site (the secure round 0 computes the consortium's scale)
    col = pd.read_csv(data["sites"][0]["table"])["prior_score_proxy"].to_numpy()
    assert not np.isclose(col.mean(), 0.0, atol=1e-3) or not np.isclose(col.std(), 1.0, atol=1e-3)


def test_export_of_the_tumour_world_runs_with_the_default_preset(tmp_path):
    """`fcd data export --dataset tumour` with no --preset works (its default preset, "small", once did not exist for
    the tumour world; DKT-Synth's is exercised above)."""
    code, env = invoke(data_cli.app, ["export", "--out", str(tmp_path / "t"), "--dataset", "tumour", "--json"])
    assert code == 0, env
    assert (tmp_path / "t" / "spec.toml").exists() and (tmp_path / "t" / "site0.csv").exists()


def test_export_refuses_unknown_dataset(tmp_path):
    code, env = invoke(data_cli.app, ["export", "--out", str(tmp_path / "t"), "--dataset", "nope"])
    assert code == 2 and "--dataset" in env["message"]
    assert not (tmp_path / "t").exists()


def test_server_run_below_the_consortium_minimum_is_refused_before_submitting(exported, tmp_path):
    out, _ = exported
    co = tmp_path / "coord"
    code, env = invoke(consortium_cli.app, ["init", "--home", str(co), "--id", "walk", "--spec", str(out / "spec.toml"),
                                            "--port", "9", "--min-trajectories", "5"])
    assert code == 0, env
    run = tmp_path / "run"
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--no-dp"])
    assert code == 2 and "no site enrolled" in env["message"], env
    code, env = invoke(site_cli.app, ["init", "--spec", str(out / "spec.toml"), "--table", str(out / "site0.csv"),
                                      "--home", str(tmp_path / "site0"), "--site-id", "hospital0",
                                      "--min-trajectories", "5"])
    assert code == 0, env
    code, env = invoke(consortium_cli.app, ["add-site", str(tmp_path / "site0" / "enrolment_request.json"), "--home",
                                            str(co), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 0, env
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--no-dp"])
    assert code == 2, env
    assert env["message"].startswith("dp.enabled:") and "--no-dp" in env["hint"]
    assert not run.exists()  # nothing submitted, nothing written
    # the run the minimum allows passes the check and stops only at the missing SuperLink (no server started)
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--dp"])
    assert code == 2 and "server is not running" in env["message"], env
    # measured: a second `server run` with another --seed was submitted, the ServerApp failed at once on the shared
    # checkpoint ("belongs to a different training configuration") and the command waited out --timeout
    ServerCheckpoint(co / "server" / "state").save(3, {}, {}, "another-training")
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--dp", "--seed", "1"])
    assert code == 2 and "checkpoint (round 3)" in env["message"] and "move the checkpoint aside" in env["hint"], env
    assert not run.exists()


def test_whatif_on_a_deployed_run_says_where_its_answers_are(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    cfg = build_config("tiny", {"out": str(run), "state_dir": str(tmp_path / "coord" / "server" / "state")})
    (run / "config.toml").write_text(cfg.to_toml())
    np.savez(run / "theta_c.npz", w=np.zeros(1))
    (run / "summary.json").write_text("{}")
    res = runner.invoke(main_app, ["whatif", str(run), "--json"])
    env = json.loads(res.stdout)
    assert res.exit_code == 2, env
    assert "`fcd server run`" in env["message"] and "summary.json" in env["message"]


def test_server_run_states_what_its_one_line_would_hide(tmp_path):
    """Measured: one site killed mid-run; `fcd server run` printed only "run finished in 78.8 s" (exit 0) while the
    site had missed rounds 2-3 and the final evaluation was aborted with no answer; the same command run again
    resumed from the checkpoint without a word."""
    from fcd_secure.cli.server import run_warnings

    assert run_warnings({"resumed_from_round": 0, "site_errors": [], "final_eval_aborted": None}, tmp_path) == []
    killed = {"resumed_from_round": 0, "final_eval_aborted": "only 3 sites are ready, secure aggregation needs 4",
              "site_errors": [{"round": 2, "site_id": "hospital3", "error": "internal"},
                              {"round": 3, "site_id": "hospital3", "error": "internal"}],
              "failed_sites_final_eval": ["hospital0", "hospital1", "hospital2", "hospital3"]}
    w = run_warnings(killed, tmp_path)
    assert w[0].startswith("site hospital3 failed in round(s) 2, 3")
    assert w[1].startswith("final evaluation aborted: only 3 sites") and "fcd site start" in w[1]
    assert len(w) == 2  # an aborted evaluation is said once, not again per site
    w = run_warnings({"resumed_from_round": 3, "declined_sites_final_eval": ["hospital1"]}, tmp_path)
    assert w[0].startswith("resumed from round 3") and str(tmp_path / "server" / "state") in w[0]
    assert w[1] == "the answers leave out site(s) hospital1: they declined the final evaluation"
    w = run_warnings({"rounds": 1, "rounds_aborted": 1, "resumed_from_round": 1}, tmp_path)
    assert w[1].startswith("1 of 1 round(s) aborted")


def test_privacy_report_on_a_consortium_run_folder_says_the_ledgers_are_on_the_sites(tmp_path):
    """Measured: `fcd privacy report runs/dp` on a `fcd server run` folder said only "no privacy ledger found"."""
    run = tmp_path / "run"
    (run / "evidence").mkdir(parents=True)
    (run / "evidence" / "fingerprints.json").write_text("{}")
    (run / "config.json").write_text(json.dumps({"dp": {"enabled": True}}))
    res = runner.invoke(main_app, ["privacy", "report", str(run), "--json"])
    env = json.loads(res.stdout)
    assert res.exit_code == 2, env
    assert "each site keeps its own" in env["message"] and "SITE_HOME/state" in env["message"]


def test_a_run_that_ended_without_results_is_reported_with_its_reason(monkeypatch, tmp_path):
    """Measured: a ServerApp that raised (every site refused) left `fcd server run` waiting out --timeout. It now
    asks the SuperLink (at once when its ServerApp ended; while none showed, after RUN_STATUS_FIRST_POLL_S, then
    doubling up to RUN_STATUS_POLL_S) for the run's status and reports Flower's status and the ServerApp's
    exception. The `flwr` answers below are the ones the walkthrough's SuperLink gave (flwr 1.42 `ls --format json`
    and `log --show`); starting a SuperLink for this is tests/test_hospital_deployment.py's cost, not this file's."""
    import fcd_secure.provisioning.server as srv

    answers = {
        "ls": json.dumps({"success": True, "runs": [{"run-id": 8655400194198733930, "status": "finished:failed"}]}),
        "log": "12/04/2026 06:52:30:ERROR:ServerApp raised an exception\nTraceback (most recent call last):\n"
               "  File \"/x/fcd_secure/apps/server_app.py\", line 166, in hello\n    raise FederationError(\n"
               "fcd_secure.apps.server_app.FederationError: site-00, site-01, site-02, site-03: refused by the site's "
               "policy (at hello, before any training)\n\x1b[91mERROR \x1b[0m:     Exit Code: 201\n",
    }
    monkeypatch.setattr(srv, "_flwr", lambda co, *args: answers[args[0]])
    assert srv._run_status(None, 8655400194198733930) == "finished:failed"
    assert srv._run_status(None, 1) is None
    assert srv._run_error(None, 8655400194198733930) == (
        "fcd_secure.apps.server_app.FederationError: site-00, site-01, site-02, site-03: refused by the site's policy "
        "(at hello, before any training)")
    monkeypatch.setattr(srv, "_flwr", lambda co, *args: None)  # the SuperLink did not answer: keep waiting
    assert srv._run_status(None, 1) is None
    assert srv._run_error(None, 1) == "the ServerApp's log names no exception"


def test_server_run_takes_a_run_share_of_epsilon_and_any_other_key_but_not_the_consortiums(exported, tmp_path):
    """Issue 45 item 5: `fcd server run --dp-epsilon` (a share of each site's lifetime cap) and `--set KEY=VALUE`;
    what no site can have left, and the keys a consortium run fixes, are refused before anything is submitted."""
    out, _ = exported
    co = tmp_path / "coord"
    code, env = invoke(consortium_cli.app, ["init", "--home", str(co), "--id", "walk", "--spec", str(out / "spec.toml"),
                                            "--port", "9", "--min-trajectories", "5"])
    assert code == 0, env
    code, env = invoke(site_cli.app, ["init", "--spec", str(out / "spec.toml"), "--table", str(out / "site0.csv"),
                                      "--home", str(tmp_path / "site0"), "--site-id", "hospital0",
                                      "--min-trajectories", "5"])
    code, env = invoke(consortium_cli.app, ["add-site", str(tmp_path / "site0" / "enrolment_request.json"), "--home",
                                            str(co), "--fingerprint", env["data"]["identity_fingerprint"]])
    assert code == 0, env
    run = tmp_path / "run"
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--dp-epsilon", "50"])
    assert code == 2 and "--dp-epsilon 50" in env["message"] and "lifetime cap" in env["message"], env
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--set", "data.table=/x.csv"])
    assert code == 2 and "--set data.table: a consortium run fixes it" in env["message"], env
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--set", "model.hiden=3"])
    assert code == 2 and "did you mean model.hidden" in env["message"], env
    assert not run.exists()
    # what passes the checks reaches the submission (no server started here) with the share in its config
    from fcd_secure.provisioning.consortium import Coordinator
    from fcd_secure.provisioning.server import run_config_for

    cfg = run_config_for(Coordinator(co), run, rounds=2, dp=True, preset="tiny", seed=0, dp_epsilon=1.5,
                         settings=["model.hidden=24"])
    assert cfg.dp.run_epsilon == 1.5 and cfg.model.hidden == 24 and cfg.data.table == "site-own"
    code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--dp-epsilon", "1.5",
                                        "--set", "model.hidden=24"])
    assert code == 2 and "server is not running" in env["message"], env
