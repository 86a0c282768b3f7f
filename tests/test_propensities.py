"""Hospital logs without propensities (``evaluation.propensity.RecordPropensity``, ``federation.learner
.with_propensities``, ``queries.propensities``): each site models its own logging policy on its training rows, its
validation and test rows carry the estimates, every weighted answer runs on them, and the answer says where its
propensities came from, how far they overlap and how well the sites' models are calibrated."""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.schema import SiteDataset  # noqa: E402
from fcd_secure.evaluation.propensity import PROPENSITY_FLOOR, RecordPropensity  # noqa: E402
from fcd_secure.federation.learner import BEHAVIOUR_CODES, with_propensities  # noqa: E402
from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics  # noqa: E402
from fcd_secure.queries.propensities import PropensitySource  # noqa: E402
from fcd_secure.queries.registry import metric_lists, metric_names  # noqa: E402
from fcd_secure.queries.request import EvaluationRequest  # noqa: E402


def recorded_world(n: int, seed: int, L: int = 6) -> SiteDataset:
    """Orders that read only the record: P(a_t = 1) = σ(−1 + 2·y_{t−1} + 1.5·x + 1{a_{t−1} = 1}), logged exactly."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=n)
    T, Y, P = np.zeros((n, L), np.int64), np.zeros((n, L), np.float32), np.ones((n, L), np.float64)
    for t in range(L):
        prev_y = Y[:, t - 1] if t else np.zeros(n)
        prev_a = T[:, t - 1] if t else np.zeros(n)
        p1 = 1 / (1 + np.exp(-(-1 + 2 * prev_y + 1.5 * x + (prev_a == 1))))
        T[:, t] = rng.random(n) < p1
        P[:, t] = np.where(T[:, t] == 1, p1, 1 - p1)
        Y[:, t] = rng.random(n) < 0.3 + 0.3 * T[:, t]
    return SiteDataset(X=x[:, None].astype(np.float32), A=np.zeros((n, L, 1), np.float32), T=T, Y=Y,
                       M=np.ones((n, L), np.float32), n_actions=2, P=P, name=f"recorded_{seed}")


def test_a_site_model_of_a_logging_policy_that_reads_the_record_recovers_its_propensities():
    train, test = recorded_world(3000, 1), recorded_world(1000, 2)
    model = RecordPropensity(2, 1, 1).fit(train.without_propensities())
    err = np.abs(model.logged_probs(test) - test.P)[test.M > 0]
    assert err.mean() < 0.02 and err.max() < 0.1
    cal = model.calibration(test).sum(axis=0)  # [n, Σp, Σy] per decile: predicted ≈ observed where calibrated
    ok = cal[0] > 200
    assert np.all(np.abs(cal[1][ok] - cal[2][ok]) / cal[0][ok] < 0.05)


def test_a_site_fits_its_behaviour_model_once_per_training_rows():
    """A site reloads its data on every request that brings the consortium's statistics: the same training rows give
    the same fitted model (the fit is deterministic), other rows a new one."""
    from fcd_secure.federation.learner import _behaviour_model

    train = recorded_world(400, 3).without_propensities()
    first = _behaviour_model(train)
    assert _behaviour_model(replace(train, name="reloaded")) is first
    assert _behaviour_model(recorded_world(400, 4).without_propensities()) is not first
    fresh = RecordPropensity(2, 1, 1).fit(train)
    test = recorded_world(200, 5)
    assert np.array_equal(first.logged_probs(test), fresh.logged_probs(test))


def test_without_a_propensity_column_the_sites_estimate_them_and_the_answers_say_so(tiny_dkt_site):
    cfg, data, model = tiny_dkt_site
    blind = replace(data, train=data.train.without_propensities(), test=data.test.without_propensities(),
                    validation=None if data.validation is None else data.validation.without_propensities())
    assert with_propensities(blind, "logged").propensities == "none"
    site = with_propensities(blind, "auto")
    assert site.propensities == "estimated" and site.train.P is None  # never on the rows the model was fitted on
    valid = site.test.M > 0
    assert (site.test.P[valid] >= PROPENSITY_FLOOR).all() and (site.test.P[valid] <= 1).all()
    assert with_propensities(data, "auto").propensities == "logged"  # a logged column is used as it is

    sums = site_metrics(model, site, cfg, EvaluationRequest(n_samples=1))
    assert set(sums) <= set(metric_names(["never", "always", "early_on", "late_on"], cfg.evaluation.ope_horizon)) | set(
        metric_lists())
    answer = merge_site_metrics([sums], None)
    prop = answer["propensities"]
    assert prop["source"] == "estimated" and prop["sites"] == {"logged": 0, "estimated": 1, "none": 0}
    assert 0 <= prop["below_floor_share"] < 1 and prop["calibration"] and prop["calibration_error"] is not None
    assert "sequential exchangeability given the recorded history" in prop["assumptions"]
    assert "one_step_effect" in answer  # the weighted answers run on the estimates

    logged = merge_site_metrics([site_metrics(model, data, cfg, EvaluationRequest(n_samples=1),
                                              queries=[PropensitySource()])], None)["propensities"]
    assert logged["source"] == "logged" and "calibration" not in logged


def test_a_site_that_logs_one_action_only_has_no_propensities_and_says_why(tiny_dkt_site):
    _, data, _ = tiny_dkt_site
    one = replace(data.train, T=np.zeros_like(data.train.T), P=None)
    site = with_propensities(replace(data, train=one, test=data.test.without_propensities()), "auto")
    assert site.propensities == "none" and site.test.P is None and "1 action" in site.propensity_note
    # what its hello tells the server is the status decided here, not a reading of the note's wording
    assert site.behaviour == "none-one-action" and BEHAVIOUR_CODES[site.behaviour].startswith("none: its training")
    blind = replace(data, test=data.test.without_propensities())
    assert with_propensities(blind, "logged").behaviour == "none-unlogged"
    assert with_propensities(data, "auto").behaviour == "logged"


def test_two_sites_one_logged_one_estimated_are_a_mixed_answer():
    parts = [{"overlap.logged": 1.0, "overlap.estimated": 0.0, "overlap.none": 0.0, "overlap.steps": 10.0,
              "overlap.below_floor": 0.0},
             {"overlap.logged": 0.0, "overlap.estimated": 1.0, "overlap.none": 0.0, "overlap.steps": 30.0,
              "overlap.below_floor": 3.0}]
    got = merge_site_metrics(parts, None, queries=[PropensitySource()])["propensities"]
    assert got["source"] == "mixed" and got["below_floor_share"] == pytest.approx(3 / 40)
    assert "calibration" not in got  # one site sent no reliability sums: a partial table is not shown


def _logged_table(n_entities: int = 300, seed: int = 1):
    """A long table whose ``p`` is the true probability of the logged drug (a softmax of the lab value)."""
    import pandas as pd

    from tests.conftest import make_long_table

    df = make_long_table(n_entities, seed)
    rng = np.random.default_rng(seed)
    df["lab"] = df["lab"].fillna(5.0)
    logits = np.stack([np.zeros(len(df)), 0.3 * (df["lab"] - 5), -0.3 * (df["lab"] - 5)], axis=1)
    probs = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
    taken = np.array([rng.choice(3, p=q) for q in probs])
    df["drug"] = np.array(["none", "insulin", "metformin"])[taken]
    df["p"] = probs[np.arange(len(df)), taken]
    return pd.DataFrame(df)


def test_data_validate_refuses_a_propensity_column_naming_the_rows_issue_43_item_6(long_case):
    """Issue 43 item 6: values outside (0, 1] or missing on some rows are refused, naming the rows; a column that is
    not the probability of the logged action (its weights do not average to one per action) is named with the action
    by ``fcd data validate`` (a warning: the column may be the probability of a coarser action than the spec's)."""
    from fcd_secure.data.preprocess import dataset_from_files, propensity_balance_warnings
    from fcd_secure.data.spec import DataError

    good = _logged_table()
    spec, table = long_case(good)
    _, ds = dataset_from_files(spec, table)  # the true logging probabilities pass
    names = list(ds.meta["action_names"])
    assert ds.P is not None and propensity_balance_warnings(ds.T, ds.P, ds.M, names, "p") == []
    for change, needle in (
        (lambda d: d.assign(p=d["p"].where(d.index != 7)), "propensity is missing on 1 row(s)"),
        (lambda d: d.assign(p=d["p"].where(d.index != 9, 1.5)), "is outside (0, 1]"),
    ):
        spec, table = long_case(change(good.copy()))
        with pytest.raises(DataError, match=needle.replace("(", r"\(").replace(")", r"\)")) as err:
            dataset_from_files(spec, table)
        assert err.value.to_dict().get("column") == "p" and err.value.to_dict().get("row") in (7, 9)
    # the probability of "insulin" on every row, whatever was given; a constant: the other drugs' weights are off
    for change in (lambda d: d.assign(p=np.where(d["drug"] == "insulin", d["p"], 1 - d["p"])),
                   lambda d: d.assign(p=0.97)):
        spec, table = long_case(change(good.copy()))
        _, bad = dataset_from_files(spec, table)
        said = propensity_balance_warnings(bad.T, bad.P, bad.M, names, "p")
        assert said and all("do not sum sensibly" in line and "column 'p'" in line for line in said)
