"""The experiments layer on the real DKT-Synth oracle (tiny preset): the one centralised reference behind both
`fcd train --centralised` and the `centralised` row of `fcd ablate`, the ablation outputs, and the one mean ± s.d.
table."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
from typer.testing import CliRunner

from fcd_secure.config import build_config
from fcd_secure.experiments import matched_epochs, mean_sd_table, run_centralised
from fcd_secure.experiments.centralised import train_centralised
from fcd_secure.federation import learner
from fcd_secure.model.baselines import SIMULATORS

SITES = 3
POLICIES = {"never", "always", "early_on", "late_on"}


@pytest.fixture(scope="module")
def cfg():
    return build_config("tiny", {"data": {"n_sites": SITES}, "federation": {"clients_per_round": 1, "secure_aggregation": False}})


def _last_json(stdout: str) -> dict:
    """The data of the one JSON envelope a ``--json`` command prints (its status must be ok)."""
    env = json.loads(stdout.strip().splitlines()[-1])
    assert env["status"] == "ok" and env["exit_code"] == 0, env
    return env["data"]


# -- tables ---------------------------------------------------------------------------------------------------------


def test_mean_sd_table_groups_in_order_and_counts_nan():
    rows = [
        {"variant": "b", "seed": 0, "pehe": 0.1, "ate_error": None},
        {"variant": "a", "seed": 0, "pehe": 0.3, "ate_error": 0.02},
        {"variant": "b", "seed": 1, "pehe": 0.2, "ate_error": math.nan},
        {"variant": "a", "seed": 1, "pehe": 0.5, "ate_error": 0.04},
    ]
    t = mean_sd_table(rows, by="variant", metrics={"pehe": "pehe", "ate": "ate_error"})
    assert [r["variant"] for r in t] == ["b", "a"]
    b, a = t
    assert b["pehe_mean"] == pytest.approx(0.15) and b["pehe_sd"] == pytest.approx(np.std([0.1, 0.2], ddof=1))
    assert b["pehe_fmt"] == "0.150±0.071" and b["pehe_n"] == 2
    assert b["ate_n"] == 0 and b["ate_fmt"] == "n/a" and math.isnan(b["ate_mean"])
    assert a["ate_fmt"] == "0.030±0.014"
    one = mean_sd_table([{"m": "x", "v": 0.5}], by="m", metrics=["v"])[0]
    assert one["v_sd"] == 0.0 and one["v_fmt"] == "0.500±0.000"


# -- the centralised reference ------------------------------------------------------------------------------------


def test_matched_epochs_rule(cfg):
    assert matched_epochs(cfg) == 1  # 2 rounds × 1 of 3 sites → 0.67 passes, at least 1
    more = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"rounds": 9, "local_epochs": 2})})
    assert matched_epochs(more) == 6
    # a floor of local steps raises each site's passes (learner.round_epochs); the reference follows their mean
    floor = more.model_copy(update={"federation": more.federation.model_copy(update={"min_local_steps": 10})})
    passes = [learner.round_epochs(2, 10, learner.load_site_data(cfg, i).train.n, cfg.model.batch_size)
              for i in range(SITES)]
    assert max(passes) > 2 and matched_epochs(floor) == max(1, round(9 / SITES * sum(passes) / SITES))


def test_centralised_tiny_end_to_end_finite(cfg, one_torch_thread):
    res = run_centralised(cfg, tuple(SIMULATORS), epochs=1)
    assert set(res["methods"]) == set(SIMULATORS)
    assert res["epochs"] == 1 and res["n_sites"] == SITES and res["n_train"] > 0
    for name, m in res["methods"].items():
        for key in ("pehe", "ate_error", "value_error_mean", "factual_auc", "ate_hat"):
            assert np.isfinite(m[key]), (name, key)
        assert 0 <= m["ate_error"] <= m["pehe"] + 1e-12  # Cauchy–Schwarz
        assert set(m["policies"]) == POLICIES
        assert all(0 < p["value_sim"] < 1 and np.isfinite(p["value_error"]) for p in m["policies"].values())
    json.dumps(res)  # JSON-able as printed by the CLI


def test_centralised_training_is_deterministic_and_seeded(cfg, one_torch_thread):
    sim1, fit1 = train_centralised(SIMULATORS["naive"], cfg, 2)
    sim2, fit2 = train_centralised(SIMULATORS["naive"], cfg, 2)
    assert fit1 == fit2
    p1, p2 = sim1.get_params("full"), sim2.get_params("full")
    assert all(np.array_equal(p1[n], p2[n]) for n in p1)
    sim3, _ = train_centralised(SIMULATORS["naive"], cfg.model_copy(update={"seed": 1}), 2)
    assert any(not np.array_equal(p1[n], v) for n, v in sim3.get_params("full").items())


def test_fcd_train_and_fcd_ablate_centralised_row_agree(tmp_path, one_torch_thread):
    """Same seed and epochs → the same numbers from `fcd train` and the `centralised` row of `fcd ablate`."""
    from fcd_secure.cli.main import app

    runner = CliRunner()
    tr = runner.invoke(app, ["train", "--preset", "tiny", "--sites", str(SITES), "--seed", "1",
                             "--epochs", "2", "--method", "fed_causaldiff", "--json"])
    assert tr.exit_code == 0, tr.output
    train_out = _last_json(tr.stdout)
    assert train_out["epochs"] == 2 and train_out["seeds"] == [1]
    m = train_out["runs"][0]["methods"]["fed_causaldiff"]
    # 6 rounds × 1 of 3 sites per round = 2 matched epochs
    ab = runner.invoke(app, ["ablate", "--preset", "tiny", "--sites", str(SITES), "--rounds", "6", "--seeds", "1",
                             "--seed", "1", "--variant", "centralised", "--out", str(tmp_path), "--json"])
    assert ab.exit_code == 0, ab.output
    table = _last_json(ab.stdout)
    row = table["per_seed"][0]
    assert row["variant"] == "centralised" and row["seed"] == 1
    for ours, theirs in (("pehe", "pehe"), ("ate_error", "ate_error"), ("value_error_mean", "value_error"),
                         ("factual_auc", "factual_auc")):
        assert np.isfinite(m[ours]) and m[ours] == row[theirs], ours
    assert table["rows"][0]["pehe_fmt"] == f"{m['pehe']:.3f}±0.000"
    for name in ("ablation.csv", "ablation.json", "utility_vs_uplink.png"):
        assert (tmp_path / name).stat().st_size > 0, name


def test_cli_train_seeds_summary_and_errors(one_torch_thread):
    from fcd_secure.cli.main import app

    runner = CliRunner()
    r = runner.invoke(app, ["train", "--preset", "tiny", "--sites", str(SITES), "--seeds", "2",
                            "--samples", "1", "--method", "naive", "--json"])
    assert r.exit_code == 0, r.output
    out = _last_json(r.stdout)
    assert out["seeds"] == [0, 1] and [run["seed"] for run in out["runs"]] == [0, 1]
    assert all(set(run["methods"]) == {"naive"} for run in out["runs"])
    (row,) = out["summary"]
    pehes = [run["methods"]["naive"]["pehe"] for run in out["runs"]]
    assert np.isfinite(pehes).all()
    assert row["method"] == "naive" and row["pehe_n"] == 2
    assert row["pehe_mean"] == pytest.approx(np.mean(pehes)) and row["pehe_sd"] == pytest.approx(np.std(pehes, ddof=1))
    bad = runner.invoke(app, ["train", "--preset", "huge", "--json"])
    assert bad.exit_code == 2 and "unknown preset" in bad.stdout
    meth = runner.invoke(app, ["train", "--preset", "tiny", "--method", "nope", "--json"])
    assert meth.exit_code == 2 and "unknown method" in meth.stdout
    steps = runner.invoke(app, ["train", "--preset", "tiny", "--steps", "99", "--json"])
    assert steps.exit_code == 2 and "sampler_steps" in steps.stdout
    abl = runner.invoke(app, ["ablate", "--preset", "tiny", "--variant", "nope"])
    assert abl.exit_code == 2 and "unknown variant" in abl.output
