"""Sensitivity to unmeasured confounding (issue 43 item 3, ``queries.sensitivity``): Γ-bounds of the one-step effect
under the marginal sensitivity model, from site sums, on a world whose hidden confounder has a known strength."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.data.worlds.hidden_confounder import one_step_hidden_confounder
from fcd_secure.queries.answers import EvaluationAnswer
from fcd_secure.queries.base import Totals
from fcd_secure.queries.registry import metric_names
from fcd_secure.queries.sensitivity import GAMMAS, REPORTED, bound_sums, box_bound_terms, merge_sensitivity


def _sums(arrays, gammas=GAMMAS):
    """The ``sens.*`` sums of the toy world's one site (T = 1 the a_on arm)."""
    return bound_sums(*arrays, 1, 0, gammas)


def test_the_gate_allows_every_sensitivity_sum():
    assert {f"sens.g{k}.hi.s" for k in range(len(GAMMAS))} <= set(metric_names([], None))


def test_at_gamma_one_the_bounds_are_the_aipw_estimate_and_they_widen_with_gamma():
    arrays, _, _ = one_step_hidden_confounder(4_000, 0, 1.0)
    Y, M, T, P, mu_on, mu_off = arrays
    aipw = float(np.mean(mu_on - mu_off + np.where(T == 1, (Y - mu_on) / P, 0) - np.where(T == 0, (Y - mu_off) / P, 0)))
    got = merge_sensitivity(Totals(_sums(arrays), sites=1), 0.9, binary=True)
    one = got["grid"][0]
    assert one["gamma"] == 1.0 and one["low"] == pytest.approx(aipw) and one["high"] == pytest.approx(aipw)
    widths = [r["high"] - r["low"] for r in got["grid"]]
    assert all(b >= a - 1e-12 for a, b in zip(widths, widths[1:])) and widths[-1] > 0.2
    assert [b["gamma"] for b in got["bounds"]] == list(REPORTED)


@pytest.mark.parametrize("seed", range(5))
def test_at_the_worlds_true_gamma_the_bounds_cover_the_truth_that_the_estimate_misses(seed):
    """Issue 43 target: hidden confounding of known strength; the Γ-bounds at the world's true Γ include the truth on
    every seed, while the estimate that assumes no unrecorded confounder (Γ = 1) excludes it."""
    arrays, truth, gamma = one_step_hidden_confounder(6_000, seed, 1.0)
    grid = tuple(sorted({1.0, gamma}))
    got = merge_sensitivity(Totals(_sums(arrays, grid), sites=1), 0.9, binary=True, gammas=grid)
    at_one, at_true = got["grid"][0], got["grid"][-1]
    assert not at_one["low_ci"] <= truth <= at_one["high_ci"], (truth, at_one)  # the confounder biases it
    assert at_true["low_ci"] <= truth <= at_true["high_ci"], (truth, gamma, at_true)


def test_the_smallest_gamma_that_reverses_the_sign_is_read_on_the_grid_and_rendered():
    arrays, _, _ = one_step_hidden_confounder(4_000, 3, 1.0)
    got = merge_sensitivity(Totals(_sums(arrays), sites=1), 0.9, binary=True)
    flip = got["gamma_sign_change"]
    assert got["sign_at_1"] != 0 and flip in GAMMAS and flip > 1
    before = [r for r in got["grid"] if r["gamma"] < flip]
    assert all(not r["low_ci"] <= 0 <= r["high_ci"] for r in before)
    sens = EvaluationAnswer.from_json({"sensitivity": got}).sensitivity
    assert f"Γ = {flip:g} could reverse its sign" in sens.verdict()
    assert len(sens.lines()) == len(REPORTED) and "no unrecorded confounder" in sens.lines()[0]


def test_a_gamma_below_one_is_refused():
    arrays, _, _ = one_step_hidden_confounder(10, 0, 1.0)
    with pytest.raises(ValueError, match="at least 1"):
        box_bound_terms(*arrays, 1, 0, 0.9)


# -- over the horizon asked (``HorizonSensitivity``) -------------------------------------------------------------------
def _sequential(n: int = 1500, seed: int = 1):
    """The sequential world of ``tests/test_sequential_dr.py`` (confounding by the last outcome, four steps) with the
    world's own Q̂ and V̂ for two policies, as a site computes them."""
    from test_sequential_dr import ANCHORS, L, World, logged, policy  # noqa: PLC0415

    from fcd_secure.queries.logged import target_probs  # noqa: PLC0415
    from fcd_secure.queries.sequential_dr import history_q  # noqa: PLC0415

    ds = logged(n, seed)
    names = ["always", "incremental_on_x2"]
    pols = [policy(p, ds) for p in names]
    pis = [target_probs(p, ds, *ANCHORS) for p in pols]
    qv = history_q(World(shift=0.1), ds, pols, pis, ANCHORS, L, n_samples=2, seed=11)
    return ds, names, pis, qv, L


def test_horizon_bounds_are_the_sequential_dr_value_at_gamma_one_and_contain_every_weight_in_the_box():
    """Exact at Γ = 1 (both ends are DR_i of ``queries.sequential_dr``); at Γ > 1 the DR value computed with any true
    inverse weights inside the per-step boxes [A_t, B_t] lies between the ends, per entity (the bound is valid)."""
    from fcd_secure.queries.sensitivity import sequential_box_terms  # noqa: PLC0415
    from fcd_secure.queries.sequential_dr import sequential_dr_per_entity  # noqa: PLC0415

    ds, names, pis, qv, L = _sequential()
    rng = np.random.default_rng(0)
    for pi, (q, v) in zip(pis, qv):
        dr = sequential_dr_per_entity(ds.Y, ds.M, ds.P, pi, q, v, L)
        hi, lo = sequential_box_terms(ds.Y, ds.M, ds.P, pi, q, v, L, 1.0)
        np.testing.assert_allclose(hi, dr, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lo, dr, rtol=1e-12, atol=1e-12)
        for gamma in (1.5, 3.0):
            hi, lo = sequential_box_terms(ds.Y, ds.M, ds.P, pi, q, v, L, gamma)
            A, B = 1 + (1 / ds.P - 1) / gamma, 1 + (1 / ds.P - 1) * gamma
            for _ in range(5):
                inv = A + rng.random(ds.P.shape) * (B - A)  # a confounder's true 1/e*_t, inside its box
                moved = sequential_dr_per_entity(ds.Y, ds.M, 1 / inv, pi, q, v, L)
                assert (moved <= hi + 1e-9).all() and (moved >= lo - 1e-9).all()
            assert (hi - lo).mean() > 0


def test_horizon_sensitivity_from_site_sums_reads_sign_and_ranking_changes_and_the_gate_allows_its_names():
    """Two sites' sums merge into bounds whose Γ = 1 ends are the pooled sequential DR value, widening with Γ; the
    effect's and the ranking's smallest reversing Γ are read on the grid and rendered; no name is a propensity's."""
    from fcd_secure.audit.rules import PROPENSITY_NAME  # noqa: PLC0415
    from fcd_secure.queries.sensitivity import HorizonSensitivity, merge_horizon_sensitivity, sequential_box_terms  # noqa: PLC0415
    from fcd_secure.queries.sequential_dr import sequential_dr_per_entity  # noqa: PLC0415

    ds, names, pis, qv, L = _sequential(2000, 3)
    ends = {p: [sequential_box_terms(ds.Y, ds.M, ds.P, pi, q, v, L, g) for g in GAMMAS]
            for p, pi, (q, v) in zip(names, pis, qv)}
    halves = (np.arange(0, 1000), np.arange(1000, 2000))
    parts = []
    for rows in halves:  # what HorizonSensitivity.site_sums sends, on two sites
        out = {}
        for p in names:
            out[f"hsens.{p}.n"] = float(len(rows))
            for k in range(len(GAMMAS)):
                hi, lo = (e[rows] for e in ends[p][k])
                r_hi, r_lo = (e[rows] for e in ends["always"][k])
                out.update({f"hsens.{p}.g{k}.hi.sum": hi.sum(), f"hsens.{p}.g{k}.hi.sumsq": (hi * hi).sum(),
                            f"hsens.{p}.g{k}.lo.sum": lo.sum(), f"hsens.{p}.g{k}.lo.sumsq": (lo * lo).sum(),
                            f"hsens.{p}.g{k}.dhi.sumsq": ((hi - r_lo) ** 2).sum(),
                            f"hsens.{p}.g{k}.dlo.sumsq": ((lo - r_hi) ** 2).sum(), f"hsens.{p}.g{k}.over": 0.0})
        parts.append(out)
    got = merge_horizon_sensitivity(Totals.of_sites(parts), names, "always", 0.9, binary=True)
    for p, pi, (q, v) in zip(names, pis, qv):
        dr = sequential_dr_per_entity(ds.Y, ds.M, ds.P, pi, q, v, L).mean()
        one = got["values"][p]["grid"][0]
        assert one["low"] == pytest.approx(dr) and one["high"] == pytest.approx(dr)
        widths = [r["high_ci"] - r["low_ci"] for r in got["values"][p]["grid"]]
        assert all(b >= a - 1e-12 for a, b in zip(widths, widths[1:]))
    eff = got["effects"]["incremental_on_x2"]
    assert [b["gamma"] for b in eff["bounds"]] == list(REPORTED)
    flip = eff["gamma_sign_change"]
    assert flip is None or all(not r["low_ci"] <= 0 <= r["high_ci"] for r in eff["grid"] if r["gamma"] < flip)
    assert got["gamma_ranking_change"] in (*GAMMAS, None) and set(got["ranking"]) == set(names)
    rec = EvaluationAnswer.from_json({"sensitivity_horizon": got}).sensitivity_horizon
    text = "\n".join(rec.lines())
    assert "Γ = 1:" in text and "incremental_on_x2" in text and "ranking" in text
    # a value the sequential DR withholds (too little support) has no bounds, nor its effects, nor the ranking
    cut = merge_horizon_sensitivity(Totals.of_sites(parts), names, "always", 0.9, binary=True,
                                    withheld={"always": "only 3 effective entities"})
    assert cut["values"]["always"] == {"withheld": "only 3 effective entities"} and cut["values"]["incremental_on_x2"]
    assert cut["effects"]["incremental_on_x2"]["withheld"] and cut["ranking_withheld"] == ["always"]
    rec = EvaluationAnswer.from_json({"sensitivity_horizon": cut}).sensitivity_horizon
    assert "no ranking" in rec.ranking_verdict() and ["withheld"] * len(REPORTED) in [c for _, c, _ in rec.rows()]
    sent = HorizonSensitivity().names(names, None)
    assert not [k for k in sent if PROPENSITY_NAME.search(k)] and set(parts[0]) <= set(sent)
    assert set(sent) <= set(metric_names(names, None))
