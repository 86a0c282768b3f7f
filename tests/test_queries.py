"""The answers layer as typed queries (``queries.base``, ``queries.registry``, ``queries.request``).

Each answer is one registered :class:`~fcd_secure.queries.base.Query` that declares the names it sends; the egress
gate's evaluation allow-list is derived from those declarations and nothing else, a site sends only declared names,
the evaluation request is typed and validated on the site, and a question's per-policy terms are computed once per
site whatever number of parts read them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.data.policy import DEFAULT_POLICY_NAMES, load_policy_refs  # noqa: E402
from fcd_secure.queries import registry  # noqa: E402
from fcd_secure.queries.base import Query, Totals  # noqa: E402
from fcd_secure.queries.evaluation import site_metrics  # noqa: E402
from fcd_secure.queries.policy_values import PolicyValues  # noqa: E402
from fcd_secure.queries.request import EvaluationRequest, EvaluationRequestError, WhatIfRequest  # noqa: E402


def test_every_name_a_query_may_send_has_one_owner():
    owners: dict[str, str] = {}
    queries = [q for q in registry.QUERIES if not isinstance(q, PolicyValues)]
    parts = [p for q in registry.QUERIES if isinstance(q, PolicyValues) for p in q.parts]
    assert len({q.name for q in queries} | {p.name for p in parts}) == len(queries) + len(parts)
    for owner in [*queries, *parts]:
        for name in owner.names(list(DEFAULT_POLICY_NAMES), 2):
            assert name not in owners, f"{name} is declared by {owners.get(name)} and {owner.name}"
            owners[name] = owner.name


def test_the_gate_allows_exactly_the_declared_evaluation_names():
    """The allow-list is the registry's declarations: a query that is not registered gets nothing out, a registered
    one gets exactly its names out (the ``eval/`` names besides the round-0 moment sums)."""
    from fcd_secure.apps.egress import federation_policy
    from fcd_secure.data.moments import KEYS as MOMENT_KEYS
    from fcd_secure.evaluation.propensity import SHARED_FIT_LISTS, SHARED_FIT_SCALARS

    pol = federation_policy(2, DEFAULT_POLICY_NAMES)
    evals = {m for m in pol.allowed_metrics if m.startswith("eval/")}
    # and the shared behaviour model's sums (tests/test_shared_behaviour.py)
    moments = {f"eval/{k}" for k in MOMENT_KEYS if k.endswith(".n")} | {f"eval/{k}" for k in SHARED_FIT_SCALARS}
    assert evals - moments == {f"eval/{n}" for n in registry.metric_names(DEFAULT_POLICY_NAMES, 2)}
    moment_lists = {f"eval/{k}" for k in MOMENT_KEYS} | {f"eval/{k}" for k in SHARED_FIT_LISTS}
    assert {k: v for k, v in pol.allowed_metric_lists.items() if k.startswith("eval/") and k not in moment_lists} == \
        {f"eval/{k}": v for k, v in registry.metric_lists().items()}

    class Leaky(Query):
        name = "leaky"

        def names(self, policy_names, ope_horizon):
            return ["leaky.value"]

        def site_sums(self, ctx):
            return {"leaky.value": 1.0}

        def merge(self, totals, ctx, answer):
            answer["leaky"] = totals["leaky.value"]

    assert "leaky.value" not in registry.metric_names(DEFAULT_POLICY_NAMES, 2)
    assert "leaky.value" in registry.metric_names(DEFAULT_POLICY_NAMES, 2, (*registry.QUERIES, Leaky()))


def test_a_site_sends_only_declared_names(tiny_dkt_site):
    """A full evaluation of a scored round with the DR-learner's β and a question of five policies (static,
    incremental, share), every registered query answering: each name the site sends is declared."""
    cfg, data, model = tiny_dkt_site
    pols = load_policy_refs(["never", "always", "late_on", "incremental_on_x2", "share_on_20"])
    request = EvaluationRequest(n_samples=1, whatif=WhatIfRequest(policies=pols, reference="never"), keep_round=1,
                                dr_learner_beta=[0.01] * 12)
    sent = site_metrics(model, data, cfg, request)
    names = set(registry.metric_names([p.name for p in pols], cfg.evaluation.ope_horizon)) | set(registry.metric_lists())
    assert set(sent) <= names, sorted(set(sent) - names)
    for prefix in ("effect.", "onestep.", "drl.effect.", "select.", "drl.fit.", "policy.", "whatif.dr.", "ope.",
                   "whatif.support.", "whatif.pik.", "whatif.id."):
        assert any(k.startswith(prefix) for k in sent), prefix  # every query answered


def test_a_questions_policies_are_rolled_out_once_each_whatever_reads_them(tiny_dkt_site, monkeypatch):
    cfg, data, model = tiny_dkt_site
    calls: list[str] = []
    real = model.simulate_policy

    def counted(ds, policy, *args, **kwargs):  # the real rollout from t = 0, counted
        if kwargs.get("start_t", 0) == 0:  # the sequential DR's rollouts from later logged histories are its own
            calls.append(getattr(policy, "name", "logged actions"))
        return real(ds, policy, *args, **kwargs)

    monkeypatch.setattr(model, "simulate_policy", counted)
    pols = load_policy_refs(["never", "always", "share_on_20"])
    question = WhatIfRequest(policies=pols, reference="never")
    site_metrics(model, data, cfg, EvaluationRequest(n_samples=1, whatif=question), queries=[registry.POLICY_VALUES])
    # the logged actions' replay (the factual rectifier) and one rollout per policy: the values, the doubly robust,
    # off-policy, support and identified parts all read the same terms
    assert sorted(calls) == sorted(["logged actions", "never", "always", "share_on_20"])


def test_the_evaluation_request_is_typed_and_refused_on_the_site_when_malformed():
    question = WhatIfRequest(policies=load_policy_refs(["never", "always"]), reference="always", horizon=3)
    req = EvaluationRequest(n_samples=2, max_rows=40, whatif=question, keep_round=3, restore_round=2,
                            dr_learner_beta=[0.5, -0.25], statistics='{"x_mean": [0.0]}')
    config = req.to_config()
    assert all(isinstance(v, (bool, int, float, str)) for v in config.values())  # a Flower ConfigRecord's types
    back = EvaluationRequest.from_config({**config, "eval-round": 7, "purpose": "stats"})  # transport fields ignored
    assert back.to_config() == config and back.whatif.query_id == question.query_id
    assert (back.keep_round, back.restore_round, back.dr_learner_beta, back.max_rows) == (3, 2, [0.5, -0.25], 40)
    assert EvaluationRequest.from_config({"max-rows": -1}).max_rows is None  # "all rows"
    for bad, field in (({"keep-round": "three"}, "keep-round"), ({"n-samples": 0}, "n-samples"),
                       ({"whatif": '{"policies": []}'}, "whatif"), ({"quick": "maybe"}, "quick")):
        with pytest.raises(EvaluationRequestError, match=field):
            EvaluationRequest.from_config(bad)
    # a malformed β is no answer, never a crash on a server's value
    assert EvaluationRequest.from_config({"dr-learner": "{"}).dr_learner_beta is None


def test_totals_know_which_sites_sent_each_sum():
    t = Totals.of_sites([{"a": 1.0, "b": [1.0, 2.0]}, {"a": 2.0}, {"a": 0.5, "c": 3.0}])
    assert t.sites == 3 and t["a"] == 3.5 and t["b"].tolist() == [1.0, 2.0]
    assert t.all_sent("a") and not t.all_sent("b") and t.reported_by("c") == 1 and not t.all_sent("missing")
    assert set(t) == {"a", "b", "c"}  # no bookkeeping keys among the sums
    secure = Totals({"a": 3.5}, sites=3)  # secure aggregation reveals totals over every summed site
    assert secure.all_sent("a") and np.isclose(secure["a"], 3.5)


def test_no_declared_name_looks_like_a_propensity_to_the_egress_gate():
    """The gate refuses any key that names a propensity (``audit.rules.PROPENSITY_NAME``: ``propens…``, a ``.p``
    segment, ...): a query whose sums were named so would have every plain-mode reply refused (the propensities
    query first named its sums ``propensity.*`` and ``.p``; secure mode hid it, every plain run failed)."""
    from fcd_secure.audit.rules import PROPENSITY_NAME

    names = [*registry.metric_names(DEFAULT_POLICY_NAMES, 2), *registry.metric_lists()]
    assert not [n for n in names if PROPENSITY_NAME.search(n)]
