"""End-to-end federation (real ClientApp/ServerApp, real model and data) through ``fcd run``: the run folder, the
round's accounting, the sites' state across a crash and resume, DSS against full sync, the DP-SGD seam.

These claims are the federation's, not the engine's, so every run here is on the in-process engine
(``fcd run --engine inprocess``, ``engines.inprocess``: the same ServerApp, ClientApp and messages, pinned to Flower's
simulation engine bit for bit in ``test_federation_inprocess.py``; ``fcd run`` on the simulation engine itself is
``test_cli_run.py``'s). The shared run is one ``fcd run`` (3 rounds, via the CLI); the tests that use it form one
xdist group, so they run once, on one worker.
"""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from conftest import CHEAP_EVALUATION

from typer.testing import CliRunner  # noqa: E402

from fcd_secure.cli.main import app as fcd_app  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.federation.state import SiteState  # noqa: E402
from fcd_secure.manifest import FULL, THETA_C, THETA_S  # noqa: E402

SITES, K, ROUNDS, SEED = 4, 2, 3, 0
#: the tests that read the shared simulation-engine runs (module-scoped fixtures) run on one xdist worker
shared_runs = pytest.mark.xdist_group("federation-sim-runs")
FILES = ("config.toml", "config.json", "theta_c.npz", "manifest.json", "rounds.csv", "rounds.json", "traffic.csv",
         "summary.json", "pehe_vs_round.png", "utility_vs_uplink.png")


def tiny_cfg(**over):
    """The module's in-process runs: their claims are Θc, the rounds' history, the bytes and the ledgers, never a
    policy's value, so their closing evaluation is :data:`conftest.CHEAP_EVALUATION` (the CLI run keeps the preset's
    four policies: its summary is checked)."""
    fed = {"clients_per_round": K, "rounds": ROUNDS, "eval_every": 0, "secure_aggregation": False}
    fed.update(over.pop("federation", {}))
    return build_config("tiny", {"seed": SEED, "data": {"n_sites": SITES}, "federation": fed,
                                 "evaluation": CHEAP_EVALUATION, **over})


def load_theta(path):
    with np.load(path) as z:
        return {k: z[k] for k in z.files}


@pytest.fixture(scope="module")
def cli_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("run") / "r"
    res = CliRunner().invoke(
        fcd_app,
        ["run", "--preset", "tiny", "--sites", str(SITES), "--rounds", str(ROUNDS), "--seed", str(SEED),
         "--eval-every", "2", "--no-secure-aggregation", "--engine", "inprocess", "--out", str(out), "--json"],
    )
    assert res.exit_code == 0, res.output
    env = json.loads(res.stdout.strip().splitlines()[-1])
    assert env["status"] == "ok" and env["exit_code"] == 0, env
    return out, env["data"]


@shared_runs
def test_run_folder_is_complete_and_summary_parses(cli_run):
    out, printed = cli_run
    for f in FILES:
        assert (out / f).is_file() and (out / f).stat().st_size > 0, f
    summary = json.loads((out / "summary.json").read_text())
    assert summary == printed
    assert summary["rounds"] == ROUNDS and summary["seed"] == SEED and summary["sync"] == "dss"
    for key in ("pehe", "ate_error", "value_error_mean", "factual_auc"):
        assert summary[key] is not None and np.isfinite(summary[key]), key
    assert set(summary["policies"]) == {"never", "always", "early_on", "late_on"}
    # off-policy estimates: full-horizon and first-H-steps forms; a NaN always comes with its support warning
    for pol in summary["policies"].values():
        for est in ("ipw", "snipw", "dr", "ipw_h2", "snipw_h2", "dr_h2"):
            r = pol[est]
            assert (r["value"] is None) == (r["warning"] is not None), (est, r)
            assert r["n_consistent"] >= 0
    assert any(p["dr_h2"]["n_consistent"] > 0 and p["dr_h2"]["value"] is not None for p in summary["policies"].values())
    assert summary["versions"]["flwr"] == "1.42.0"
    rounds = pd.read_csv(out / "rounds.csv")
    assert list(rounds["round"]) == [1, 2, 3] and (rounds["participants"] == K).all()
    assert rounds["pehe"].notna().tolist() == [False, True, True]  # every 2 rounds and at the end
    manifest = json.loads((out / "manifest.json").read_text())
    theta_c_names = {e["name"] for e in manifest["entries"] if e["part"] == THETA_C}
    assert set(load_theta(out / "theta_c.npz")) == theta_c_names  # Θc only, keyed by manifest names
    # the default model.ipw = 'auto' weights DKT-Synth's logged propensities on each site: the behaviour head that
    # supplies the weights' numerator is site-private (Θs) and never reaches the server's parameters
    heads = [e for e in manifest["entries"] if e["name"].startswith("propensity_head.")]
    assert heads and {e["part"] for e in heads} == {THETA_S}


@shared_runs
def test_uplink_bytes_equal_the_per_round_and_per_message_accounting(cli_run):
    out, summary = cli_run
    rounds = pd.read_csv(out / "rounds.csv")
    traffic = pd.read_csv(out / "traffic.csv")
    assert summary["uplink_bytes"] == rounds["uplink_bytes"].sum() > 0
    train_up = traffic[(traffic.direction == "up") & (traffic.action == "train")]
    assert summary["uplink_bytes"] == train_up["payload_bytes"].sum()
    per_round = train_up.groupby("round")["payload_bytes"].sum()
    assert per_round.tolist() == rounds["uplink_bytes"].tolist()
    # per site and round: one reply from each sampled site, each at least its Θc bytes
    theta_bytes = sum(v.nbytes for v in load_theta(out / "theta_c.npz").values())
    assert (train_up.groupby(["round", "site_id"]).size() == 1).all()
    assert (train_up["payload_bytes"] > theta_bytes).all()
    assert summary["uplink_formula_bytes"] == ROUNDS * K * theta_bytes


@pytest.fixture(scope="module")
def crashed_and_resumed(tmp_path_factory):
    from fcd_secure.engines.inprocess import run_inprocess

    base = tmp_path_factory.mktemp("resume")
    state = base / "state"
    crash_cfg = tiny_cfg(federation={"crash_after_round": ROUNDS}, state_dir=str(state), out=str(base / "crashed"))
    with pytest.raises(Exception, match="simulated server crash after round 3"):
        run_inprocess(crash_cfg)
    committed = {p.name: SiteState(state, p.name).last_round for p in state.iterdir() if p.name.startswith("site-")}
    resumed = run_inprocess(tiny_cfg(state_dir=str(state), out=str(base / "resumed")))
    return committed, resumed, base


@shared_runs
def test_resume_after_a_server_crash_equals_an_uninterrupted_run(cli_run, crashed_and_resumed):
    committed, resumed, base = crashed_and_resumed
    # the crash came after the sites had committed round 3, before the server's checkpoint: they must replay it
    assert max(committed.values()) == ROUNDS
    assert resumed.resumed_from == ROUNDS - 1
    assert [r["round"] for r in resumed.history] == [1, 2, 3]
    reference = load_theta(cli_run[0] / "theta_c.npz")  # the uninterrupted 3-round run (same seed)
    got = load_theta(base / "resumed" / "theta_c.npz")
    assert set(got) == set(reference)
    for name in reference:
        np.testing.assert_array_equal(got[name], reference[name], err_msg=name)


@shared_runs
def test_same_seed_same_theta_and_a_different_seed_differs(cli_run, crashed_and_resumed):
    # the uninterrupted CLI run and the crash-and-resume produced the same Θc (above); here the per-round history of
    # both runs (sampled sites, sample counts, losses) must match too
    _, resumed, _ = crashed_and_resumed
    rounds = pd.read_csv(cli_run[0] / "rounds.csv")
    assert rounds["sites"].tolist() == [r["sites"] for r in resumed.history]
    np.testing.assert_allclose(rounds["train_loss"], [r["train_loss"] for r in resumed.history], rtol=0, atol=0)
    other = build_config("tiny", {"seed": SEED + 1}).training_hash()
    assert other != tiny_cfg().training_hash()


@shared_runs
def test_dss_uplink_is_smaller_than_full_sync_by_the_theta_s_share(cli_run, tmp_path):
    """Round 1 of the shared DSS run (same seed, so the same sampled sites) against one round of full sync."""
    from fcd_secure.engines.inprocess import run_inprocess

    dss = pd.read_csv(cli_run[0] / "rounds.csv").iloc[0]
    full = run_inprocess(tiny_cfg(federation={"sync": "full", "rounds": 1}, out=str(tmp_path / "full")))
    dss_up = int(dss["uplink_bytes"])
    full_up = int(full.history[0]["uplink_bytes"])
    m = full.manifest
    # full synchronisation sends Θs but its site-bound part: the behaviour head of the default IPW weighting
    sent_s = [e for e in m.entries if e.part == THETA_S and not e.site_bound]
    assert any(e.site_bound for e in m.entries) and set(m.names(FULL)) == set(m.names(THETA_C)) | {e.name for e in sent_s}
    theta_s_bytes = sum(e.nbytes for e in sent_s)
    assert full.history[0]["sites"] == dss["sites"]
    assert dss_up < full_up
    extra_per_site = (full_up - dss_up) / K
    # the difference is that Θs: its raw bytes plus Flower's per-array framing (a few hundred bytes per tensor)
    assert theta_s_bytes <= extra_per_site <= theta_s_bytes + 600 * len(sent_s)
    assert full.history[0]["uplink_formula_bytes"] == K * m.nbytes(FULL)
    assert dss["uplink_formula_bytes"] == K * m.nbytes(THETA_C)
    summary = json.loads((tmp_path / "full" / "summary.json").read_text())
    assert summary["synchronised_part"] == FULL


def test_dp_sgd_seam_charges_only_the_sampled_sites(tmp_path):
    from fcd_secure.engines.inprocess import run_inprocess

    res = run_inprocess(tiny_cfg(federation={"rounds": 1}, dp={"enabled": True, "epsilon": 8.0}, out=str(tmp_path / "dp")))
    assert not res.history[0]["aborted"] and res.history[0]["participants"] == K
    state = tmp_path / "dp" / "state"
    sampled = set(res.history[0]["sites"].split())
    for i in range(SITES):
        site = f"site-{i:02d}"
        ledgers = list((state / site / "privacy").glob("ledger-*.json"))
        assert bool(ledgers) == (site in sampled), site  # a site that did not train spent nothing
        if ledgers:
            assert json.loads(ledgers[0].read_text())  # the write-ahead ledger is valid JSON
