"""Each scored round's simulated values of the run's policies on the validation rows (``queries.round_values``): what
a ranking's '>' must agree with across the run's late rounds (``EvaluationAnswer.simulated_ranking``)."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest


def test_a_scored_round_sends_each_policys_count_and_value_sum_on_the_validation_rows(tiny_dkt_site):
    from fcd_secure.data.policy import bind_policy, load_policy_refs
    from fcd_secure.queries import registry
    from fcd_secure.queries.evaluation import merge_site_metrics, site_metrics
    from fcd_secure.queries.policy_terms import per_sample_values
    from fcd_secure.queries.request import EvaluationRequest
    from fcd_secure.queries.round_values import RoundValues

    world_cfg, data, model = tiny_dkt_site
    q = RoundValues()
    late = EvaluationRequest(quick=True, keep_round=world_cfg.federation.rounds, n_samples=2)
    big = replace(data, validation=replace(data.test, name="validation"))
    # DKT-Synth declares its unrecorded confounder (a student's readiness): nothing there is ranked, nothing is sent
    assert site_metrics(model, big, world_cfg, late, queries=[q]) == {}
    cfg = world_cfg.model_copy(update={"evaluation": world_cfg.evaluation.model_copy(
        update={"unrecorded_confounding": ""})})  # the run declares none
    # the tiny site's validation rows are below its cohort floor: nothing is sent; an unscored evaluation runs nothing,
    # and neither does a scored round of the run's first half
    assert data.validation.n < 20 and site_metrics(model, data, cfg, late, queries=[q]) == {}
    assert site_metrics(model, big, cfg, EvaluationRequest(quick=True), queries=[q]) == {}
    early = late.model_copy(update={"keep_round": 0})
    assert cfg.federation.rounds >= 2 and site_metrics(model, big, cfg, early, queries=[q]) == {}
    sent = site_metrics(model, big, cfg, late, queries=[q])
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
    again = site_metrics(model, big, cfg, late.model_copy(update={"keep_round": late.keep_round + 1}), queries=[q])
    assert again == sent
    merged = merge_site_metrics([sent, sent], None, queries=[q])["round_values"]
    assert merged == pytest.approx({p: sent[f"rvalue.{p}.s"] / sent[f"rvalue.{p}.n"] for p in names})


@pytest.mark.slow
def test_a_secure_run_keeps_its_late_rounds_values_and_its_answer_checks_the_ranking_against_them(tmp_path):
    """A real run (Flower's in-process engine, secure aggregation, three hospitals of a table of one's own): the
    scored rounds of its second half carry the policies' values in ``rounds.json``, its summary keeps them, and the
    server received no sum in the clear."""
    from conftest import GOOD_SPEC, make_long_table

    from fcd_secure.audit.ledger import SERVER_LEDGER_FILE
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.queries.answers import EvaluationAnswer

    df = make_long_table(600)
    df["hospital"] = [f"h{int(p[1:]) % 4}" for p in df["pid"]]  # the tiny preset's four sites, 150 patients each
    df.to_csv(tmp_path / "table.csv", index=False)
    (tmp_path / "spec.toml").write_text(GOOD_SPEC)
    cfg = build_config("tiny", {"seed": 0, "data": {"dataset": "spec", "spec": str(tmp_path / "spec.toml"),
                                                    "table": str(tmp_path / "table.csv"), "test_fraction": 0.2,
                                                    "n_sites": 4},
                                "federation": {"rounds": 4, "eval_every": 1, "clients_per_round": 4},
                                "evaluation": {"policies": ["never", "always"], "n_samples": 1, "max_rows": 32},
                                "state_dir": str(tmp_path / "state"), "out": str(tmp_path / "run")})
    assert cfg.federation.secure_aggregation
    res = run_inprocess(cfg)
    kept = {r["round"]: r["round_values"] for r in res.history if r.get("round_values")}
    assert sorted(kept) == [2, 3, 4]  # rounds ≥ rounds / 2
    assert all(set(v) == {"never", "always"} and all(0.0 <= x <= 1.0 for x in v.values()) for v in kept.values())
    out = tmp_path / "run"
    rounds = json.loads((out / "rounds.json").read_text())
    assert {r["round"]: r.get("round_values") for r in rounds if r.get("round_values")} == kept
    summary = json.loads((out / "summary.json").read_text())
    assert summary["round_values"] == {"horizon": None, "rows": "validation",
                                       "rounds": {str(k): v for k, v in kept.items()}}
    ans = EvaluationAnswer.of(summary)
    assert ans.checked_rounds is not None and ans.checked_rounds.names() == "rounds 2, 3, 4"
    received = [json.loads(x) for x in (tmp_path / "state" / "_server" / "audit" / SERVER_LEDGER_FILE)
                .read_text().splitlines() if x.strip()]
    received = [r for r in received if r["kind"] == "received"]
    assert received and not any(r["metrics"] or r["metric_lists"] or r["tensors"] for r in received)
    assert np.isfinite(ans.late_rounds.rounds["4"]["never"])


def test_the_late_rounds_are_the_second_half_at_the_horizon_asked_from_the_best_covered_rounds():
    from fcd_secure.queries.answers import LateRounds
    from fcd_secure.queries.round_values import late_round_values

    def row(r, sites=4, horizon=None, v=0.5):
        return {"round": r, "round_values": {"a": v, "b": 0.4}, "round_values_sites": sites,
                "round_values_horizon": horizon}

    # 25 rounds scored every 10 (and the last): rounds 20 and 25 are at or after half of 25
    assert sorted(late_round_values([{"round": 10}, row(20), row(25)], None)) == ["20", "25"]
    # a round one site left out is not compared with rounds every site answered
    assert sorted(late_round_values([row(20, sites=3), row(30), row(40)], None)) == ["30", "40"]
    # a resumed run that changed [evaluation] horizon: only the rounds simulated at the horizon asked
    assert sorted(late_round_values([row(20, horizon=5), row(30), row(40, horizon=5)], 5)) == ["20", "40"]
    assert late_round_values([row(20)], 5) == {}
    # a value that did not survive as a number (a non-finite sum written as null) is not compared, never a crash
    late = LateRounds.from_json({"rounds": {"20": {"a": None, "b": 0.4}, "30": {"a": float("nan"), "b": 0.4}}})
    assert late.agree("a", "b") is None
    late = LateRounds.from_json({"rounds": {"20": {"a": None, "b": 0.4}, "30": {"a": 0.6, "b": 0.4}}})
    assert late.agree("a", "b") is True and late.agree("b", "a") is False
