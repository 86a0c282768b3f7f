"""The natural-course check (``evaluation.natural_course``, ``queries.natural_course``): the simulator under the
logging policy against the logs, per step, from additive sums.

On the small exact world of ``tests/test_sequential_dr.py`` (its own mechanism is the right simulator), the check
rolled out under the logging policy passes with the world's mechanism and flags a simulator whose outcome
probabilities are off by 0.1; the sites' sums add up to the pooled logs' figures; a site's registered query sends
only its declared names, on the rows its evaluation kind names.
"""

from __future__ import annotations

import os

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.evaluation.natural_course import STEP_FIELDS, natural_course_summary, step_gap_sums  # noqa: E402
from fcd_secure.queries.natural_course import LoggingPolicyPlan, NaturalCourse  # noqa: E402

from test_sequential_dr import ANCHORS, World, logged, logging_probs  # noqa: E402


def check(sim: World, ds, seed: int = 4) -> dict:
    out = sim.simulate_policy(ds, LoggingPolicyPlan(logging_probs, seed), ANCHORS, 4, seed)
    sums = step_gap_sums(out.probs.mean(1), ds.Y, ds.M)
    return natural_course_summary(*(sums[k] for k in STEP_FIELDS), level=0.9)


def test_the_right_simulator_passes_a_wrong_one_is_flagged():
    ds = logged(4000, seed=2)
    right, wrong = check(World(), ds), check(World(shift=0.1), ds)
    assert right["passes"] is True and right["max_abs_z"] < right["z_crit"], right
    assert right["mean_abs_gap"] < 0.03 and right["p_value"] > 0.01
    assert wrong["passes"] is False and wrong["max_abs_z"] > 5, wrong
    assert wrong["mean_abs_gap"] > 0.08  # 0.1 a step, compounded through the simulated histories
    assert [r["t"] for r in right["steps"]] == [0, 1, 2, 3] and right["df"] == 4
    # each step's observed mean is the logs' own
    np.testing.assert_allclose([r["observed"] for r in right["steps"]], ds.Y.mean(0), atol=1e-6)


def test_site_sums_add_up_to_the_pooled_logs_and_few_rows_send_zeros():
    ds = logged(600, seed=3)
    sim = World().simulate_policy(ds, LoggingPolicyPlan(logging_probs, 1), ANCHORS, 2, 1).probs.mean(1)
    whole = step_gap_sums(sim, ds.Y, ds.M)
    halves = [step_gap_sums(sim[rows], ds.Y[rows], ds.M[rows]) for rows in (slice(0, 250), slice(250, None))]
    for k in STEP_FIELDS:
        np.testing.assert_allclose(halves[0][k] + halves[1][k], whole[k])
    M = ds.M.copy()
    M[5:, 3] = 0  # step 3 logged for 5 rows only: below a floor of 20, the step sends nothing
    few = step_gap_sums(sim, ds.Y, M, min_n=20)
    assert all(few[k][3] == 0 for k in STEP_FIELDS) and few["n"][2] == 600


def test_the_query_sends_declared_names_on_the_rows_of_its_kind(tiny_dkt_site):
    from dataclasses import replace

    from fcd_secure.queries import registry
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.request import EvaluationRequest

    cfg, data, model = tiny_dkt_site
    q = NaturalCourse()
    full = site_metrics(model, data, cfg, EvaluationRequest(n_samples=1), queries=[q])
    assert set(full) == {"natcourse.sites", "natcourse.rows_test"} | {f"natcourse.y.{k}" for k in STEP_FIELDS}
    assert set(full) <= set(registry.metric_names([], None)) | set(registry.metric_lists())
    assert all(len(full[f"natcourse.y.{k}"]) == data.test.L for k in STEP_FIELDS)
    assert full["natcourse.y.n"][0] == data.test.n
    ans = merge_site_metrics([full, full], None, queries=[q])["natural_course"]
    assert ans["rows"] == "test" and ans["sites"] == 2 and ans["steps"][0]["n"] == 2 * data.test.n
    # a scored round: the validation rows (none here below the site's floor: nothing sent), never the test rows
    val = data.validation.subset(np.arange(data.validation.n))
    scored = EvaluationRequest(quick=True, keep_round=1)
    assert site_metrics(model, data, cfg, scored, queries=[q]) == {}
    big = replace(data, validation=replace(data.test, name="validation"))
    sent = site_metrics(model, big, cfg, scored, queries=[q])
    assert sent["natcourse.rows_test"] == 0.0 and sent["natcourse.y.n"][0] == data.test.n
    assert val.n < 20
    # a plain quick evaluation (no scored round) does not run it
    assert site_metrics(model, data, cfg, EvaluationRequest(quick=True), queries=[q]) == {}
