"""Targeted answers (issue 29 item 3, ``queries.targeted``): the identified one-step effect with its cluster-robust
interval, policy values on the horizons the logs support, estimates kept in the outcome's range, and the merge of
site sums equal to the pooled numbers."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.policy import bind_policy, load_policy_refs  # noqa: E402
from fcd_secure.queries.base import Totals  # noqa: E402
from fcd_secure.queries.targeted import (  # noqa: E402
    MIN_SUPPORT_ESS,
    ONE_STEP_FIELDS,
    horizon_diff_sums,
    horizon_grid,
    horizon_sums,
    merge_identified,
    merge_one_step,
    one_step_sums,
    one_step_truth,
)
from fcd_secure.queries.logged import target_probs  # noqa: E402
from fcd_secure.queries.registry import metric_names  # noqa: E402
from site_cases import sites_and_untrained_model  # noqa: E402

SMALL = {"seed": 0, "data": {"n_sites": 4, "alpha": 1000.0}}  # the tiny preset: 4 sites, 60 % test


@pytest.fixture(scope="module")
def sites():
    return sites_and_untrained_model(SMALL)


def test_the_gate_allows_every_key_the_targeted_answers_send():
    names = set(metric_names(["never"], 2))
    assert {f"onestep.{f}" for f in ONE_STEP_FIELDS} <= names
    assert {"whatif.id.h2.never.sw", "whatif.id.h2.never.true_sum", "whatif.id.h5.diff.never.sumsq"} <= names


def test_the_one_step_effect_merged_over_sites_is_the_pooled_aipw_mean_with_a_cluster_robust_interval(sites):
    cfg, data, model = sites
    parts, phis = [], []
    for d in data:
        truth = one_step_truth(d.oracle, d.site_index, np.arange(d.test.n), d.test.L, d.anchors)
        parts.append(one_step_sums(model, d.test, d.anchors, truth))
        a_off, a_on = d.anchors
        v = d.test
        on, off = model.one_step_probs(v, a_on), model.one_step_probs(v, a_off)
        valid = v.M > 0
        psi = np.where((v.T == a_on) & valid, (v.Y - on) / v.P, 0.0) - np.where((v.T == a_off) & valid, (v.Y - off) / v.P, 0.0)
        phis.append(np.where(valid, on - off + np.clip(psi, -50, 50), np.nan))
    got = merge_one_step(Totals.of_sites(parts), 0.9, binary=True)
    pooled = np.concatenate(phis)
    theta = np.nanmean(pooled)
    aipw = got["aipw"]
    assert aipw["estimate"] == pytest.approx(theta, abs=1e-9) and got["steps"] == int(np.isfinite(pooled).sum())
    # the cluster-robust SE: linearisation over entities
    S, m = np.nansum(pooled, 1), np.isfinite(pooled).sum(1)
    n = len(S)
    se = math.sqrt(((S - theta * m) ** 2).sum() * n / (n - 1)) / m.sum()
    assert aipw["se"] == pytest.approx(se, rel=1e-9)
    assert got["low"] < got["estimate"] < got["high"] and "true" in got and got["error"] >= 0


def test_a_site_without_propensities_sends_no_one_step_sums(sites):
    _, data, model = sites
    assert one_step_sums(model, data[0].test.without_propensities(), data[0].anchors) == {}
    assert merge_one_step(Totals.of_sites([{"n_test": 3.0}]), 0.9, True) is None


def _identified(data, model, names=("never", "always", "late_on"), ref="never", truths=False):
    parts = []
    for d in data:
        sub = d.test
        a_off, a_on = d.anchors
        grid = horizon_grid(sub.L)
        out, per = {}, {}
        for pol in load_policy_refs(list(names)):
            pol = bind_policy(pol, sub)
            sim = model.simulate_policy(sub, pol, d.anchors, 1, 0)
            tv = ({h: d.oracle.true_policy_value(pol, d.site_index, "test", horizon=h)[0] for h in grid}
                  if truths else None)
            sums, per[pol.name] = horizon_sums(pol.name, sub, target_probs(pol, sub, a_off, a_on),
                                               np.asarray(sim.probs, dtype=np.float64).mean(1), grid, tv)
            out.update(sums)
        for name in names:
            if name != ref:
                out.update(horizon_diff_sums(name, per[name], per[ref]))
        parts.append(out)
    total = Totals.of_sites(parts)
    return merge_identified(total, list(names), ref, 0.9, True, total.all_sent)


def test_each_policy_is_answered_on_its_longest_supported_horizon_and_effects_on_the_common_one(sites):
    _, data, model = sites
    got = _identified(data, model, truths=True)
    for name, d in got.items():
        rows = d["horizons"]
        assert [r["horizon"] for r in rows] == sorted(r["horizon"] for r in rows) and rows
        assert all(r["supported"] == (r["ess"] >= MIN_SUPPORT_ESS and r["reached"]) for r in rows)
        supported = [r["horizon"] for r in rows if r["supported"]]
        assert (d["answer"] or {}).get("horizon") == (supported[-1] if supported else None)
        assert all(0.0 <= r["estimate"] <= 1.0 and "true" in r for r in rows)
    never_ok = {r["horizon"] for r in got["never"]["horizons"] if r["supported"]}
    for name in ("always", "late_on"):
        mine = {r["horizon"] for r in got[name]["horizons"] if r["supported"]}
        common = never_ok & mine
        eff = got[name].get("effect")
        assert (eff or {}).get("horizon") == (max(common) if common else None)
    # late_on follows never until its late steps: on the first steps the effect is exactly zero, and it says so
    eff = got["late_on"]["effect"]
    assert eff is not None and eff["estimate"] == 0.0 and eff["se"] == 0.0 and eff["true"] == pytest.approx(0.0)


def test_an_estimate_outside_the_outcome_range_is_kept_at_the_bound_and_named():
    s = {"whatif.id.h1.p.n": 30.0, "whatif.id.h1.p.sum": 36.0, "whatif.id.h1.p.sumsq": 60.0,
         "whatif.id.h1.p.sw": 30.0, "whatif.id.h1.p.sww": 30.0}
    got = merge_identified(s, ["p"], None, 0.9, True, lambda k: k in s)["p"]["answer"]
    assert got["estimate"] == 1.0 and got["high"] == 1.0 and got["out_of_range"]["raw"] == pytest.approx(1.2)
    cont = merge_identified(s, ["p"], None, 0.9, False, lambda k: k in s)["p"]["answer"]
    assert cont["estimate"] == pytest.approx(1.2) and "out_of_range" not in cont


def test_a_horizon_below_the_support_floor_is_not_an_answer():
    s = {"whatif.id.h1.p.n": 100.0, "whatif.id.h1.p.sum": 50.0, "whatif.id.h1.p.sumsq": 30.0,
         # two entities carry all the weight: ESS = 2
         "whatif.id.h1.p.sw": 20.0, "whatif.id.h1.p.sww": 200.0}
    got = merge_identified(s, ["p"], None, 0.9, True, lambda k: k in s)["p"]
    assert got["answer"] is None and "effective entities" in got["why"] and got["horizons"][0]["ess"] == 2.0


def test_the_self_normalised_one_step_effect_and_its_variance_equal_the_pooled_computation(sites):
    _, data, model = sites
    parts, rows = [], []
    for d in data:
        parts.append(one_step_sums(model, d.test, d.anchors))
        a_off, a_on = d.anchors
        v = d.test
        on_p, off_p = model.one_step_probs(v, a_on), model.one_step_probs(v, a_off)
        valid = v.M > 0
        on, off = (v.T == a_on) & valid, (v.T == a_off) & valid
        rows.append(np.stack([np.where(valid, on_p - off_p, 0).sum(1), valid.sum(1),
                              np.where(on, (v.Y - on_p) / v.P, 0).sum(1), np.where(on, 1 / v.P, 0).sum(1),
                              np.where(off, (v.Y - off_p) / v.P, 0).sum(1), np.where(off, 1 / v.P, 0).sum(1)], 1))
    X = np.concatenate(rows)
    tot = X.sum(0)
    theta = tot[0] / tot[1] + tot[2] / tot[3] - tot[4] / tot[5]
    psi = ((X[:, 0] - tot[0] / tot[1] * X[:, 1]) / tot[1] + (X[:, 2] - tot[2] / tot[3] * X[:, 3]) / tot[3]
           - (X[:, 4] - tot[4] / tot[5] * X[:, 5]) / tot[5])
    n = len(X)
    got = merge_one_step(Totals.of_sites(parts), 0.9, binary=True)
    sn = got["self_normalised"]
    assert sn["estimate"] == pytest.approx(theta, abs=1e-7)  # float32 propensities
    assert sn["se"] == pytest.approx(math.sqrt((psi ** 2).sum() * n / (n - 1)), rel=1e-6)
    assert got["variant"] in ("aipw", "self_normalised") and got["aipw"]["estimate"] != sn["estimate"]


def _one_horizon_sums(sw: float, sww: float) -> dict[str, float]:
    """A policy "p" answered on h = 1 by 100 entities whose weight products sum to ``sw`` (squares ``sww``)."""
    return {"whatif.id.h1.p.n": 100.0, "whatif.id.h1.p.sum": 50.0, "whatif.id.h1.p.sumsq": 30.0,
            "whatif.id.h1.p.sw": sw, "whatif.id.h1.p.sww": sww}


def test_a_horizon_whose_mean_weight_product_falls_short_of_one_is_not_an_answer():
    """Exact weights average 1 (E[Π q/π] = 1); 100 entities with ESS 50 whose weights average 0.5 ± 0.07 reached
    about half of the policy's distribution: the rest would be the simulator's guess, so the horizon is refused with
    the reason, however large its ESS. The same mean with a standard error of 0.5 is noise, not a shortfall."""
    s = _one_horizon_sums(50.0, 50.0)  # 50 entities of weight 1, 50 of 0: ESS 50, mean 0.5, SE ≈ 0.05
    got = merge_identified(s, ["p"], None, 0.9, True, lambda k: k in s)["p"]
    row = got["horizons"][0]
    assert row["ess"] == pytest.approx(50.0) and row["weight_mean"] == pytest.approx(0.5)
    assert row["weight_se"] == pytest.approx(0.05025, abs=1e-4) and not row["reached"] and not row["supported"]
    assert got["answer"] is None and "mean weight product is 0.50" in got["why"]
    # one entity of weight 50 carries the mean: SE ≈ 0.5, ESS 1 (refused by the ESS floor)
    s = _one_horizon_sums(50.0, 2525.0)
    row = merge_identified(s, ["p"], None, 0.9, True, lambda k: k in s)["p"]["horizons"][0]
    assert row["reached"] and not row["supported"]


def test_the_identified_table_says_why_a_policy_the_logs_reach_only_in_part_is_not_identified():
    """What a clinician reads: the policy is "not identified", with the mean weight product that shows the part of
    the policy the logs never reached, instead of a DR value whose interval does not know it."""
    from rich.console import Console

    from fcd_secure.cli.whatif import identified_table

    s = _one_horizon_sums(50.0, 50.0)  # mean weight product 0.50 ± 0.05
    ident = merge_identified(s, ["p"], None, 0.9, True, lambda k: k in s)["p"]
    con = Console(record=True, width=100)
    con.print(identified_table({"policies": {"p": {"identified": ident}}, "whatif": {"level": 0.9}}))
    text = " ".join(con.export_text().split())
    assert "not identified" in text and "p: not identified — the logs reach only part of the policy" in text
    assert "mean weight product is 0.50 ± 0.05" in text
