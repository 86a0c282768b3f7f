"""Each scored round's simulated values of the run's policies on the validation rows (``queries.round_values``): what
a ranking's '>' must agree with across the run's late rounds (``EvaluationAnswer.simulated_ranking``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from conftest import SMALL_SCORED_RUN


def test_a_scored_round_sends_each_policys_count_and_value_sum_on_the_validation_rows(tiny_dkt_site):
    from fcd_secure.data.policy import bind_policy, load_policy_refs
    from fcd_secure.queries import registry
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.policy_terms import per_sample_values
    from fcd_secure.queries.request import EvaluationRequest
    from fcd_secure.queries.round_values import RoundValues

    cfg, data, model = tiny_dkt_site
    q = RoundValues()
    scored = EvaluationRequest(quick=True, keep_round=3, n_samples=2)
    # the tiny site's validation rows are below its cohort floor: nothing is sent; an unscored evaluation runs nothing
    assert data.validation.n < 20 and site_metrics(model, data, cfg, scored, queries=[q]) == {}
    assert site_metrics(model, data, cfg, EvaluationRequest(quick=True), queries=[q]) == {}
    big = replace(data, validation=replace(data.test, name="validation"))
    sent = site_metrics(model, big, cfg, scored, queries=[q])
    names = [p.name for p in load_policy_refs(cfg.evaluation.policies)]
    assert set(sent) == {"rvalue.sites"} | {f"rvalue.{p}.{f}" for p in names for f in ("n", "s")}
    assert set(sent) <= set(registry.metric_names(names, None))  # the egress gate lets exactly these out
    # each sum is the policy's simulated values over the rows, with the run's seed (common random numbers)
    rows = big.validation
    for pol in load_policy_refs(cfg.evaluation.policies):
        sim = model.simulate_policy(rows, bind_policy(pol, rows), data.anchors, 2, int(cfg.seed), horizon=None)
        assert sent[f"rvalue.{pol.name}.n"] == rows.n
        assert sent[f"rvalue.{pol.name}.s"] == pytest.approx(float(per_sample_values(sim).mean(1).sum()), rel=1e-9)
    # the same model and rows give the same sums: only the model moves them between rounds
    assert site_metrics(model, big, cfg, scored.model_copy(update={"keep_round": 4}), queries=[q]) == sent
    merged = merge_site_metrics([sent, sent], None, queries=[q])["round_values"]
    assert merged == pytest.approx({p: sent[f"rvalue.{p}.s"] / sent[f"rvalue.{p}.n"] for p in names})


@pytest.mark.slow
@pytest.mark.xdist_group(SMALL_SCORED_RUN)
def test_a_secure_run_keeps_each_scored_rounds_values_and_answers_with_its_late_ones(small_scored_run):
    from fcd_secure.queries.answers import EvaluationAnswer

    cfg, res, _, out = small_scored_run
    assert cfg.federation.secure_aggregation and cfg.evaluation.policies == ["never"]
    kept = {r["round"]: r["round_values"] for r in res.history if r.get("round_values")}
    assert sorted(kept) == [1, 2] and all(0.0 <= v["never"] <= 1.0 for v in kept.values())
    rounds = json.loads((out / "rounds.json").read_text())
    assert {r["round"]: r.get("round_values") for r in rounds if r.get("round_values")} == kept
    summary = json.loads((out / "summary.json").read_text())
    late = summary["round_values"]
    assert late["horizon"] == cfg.evaluation.horizon and late["rows"] == "validation"
    assert late["rounds"] == {str(k): v for k, v in kept.items()}  # rounds ≥ half the last scored round: both
    ans = EvaluationAnswer.of(summary)
    assert ans.checked_rounds is not None and ans.checked_rounds.names() == "rounds 1, 2"
    assert np.isfinite(ans.late_rounds.rounds["2"]["never"])
