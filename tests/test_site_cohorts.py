"""The site owns its data identity: its train / validation / test cut and its what-if cohorts (issue 31 items 1-2,
issue 32 item 6; docs/threats.md P40-P43)."""

from __future__ import annotations

import stat

import numpy as np
import pytest

from conftest import GOOD_SPEC, make_long_table

SPEC_ONE_SITE = GOOD_SPEC.replace('site = "hospital"\n', "")


def _site_cfg(spec, table, test_fraction: float, seed: int):
    from fcd_secure.config import build_config

    return build_config("tiny", {"seed": seed, "data": {"dataset": "spec", "spec": str(spec), "table": str(table),
                                                        "test_fraction": test_fraction, "n_sites": 4}})


def test_P40_no_server_fraction_or_seed_moves_a_deployed_sites_cut(tmp_path, long_case):
    """P40. The attack: two runs asking a deployed site (its own table, the strict default policy) for test fractions
    0.2 and 0.2035, or for seeds 0 and 1. Before, the site cut its table with the run's values: the round-0 secure
    preprocessing sums (over its training rows) of the two runs differed by exactly one patient's statics, lab sums
    and action counts, and the evaluation cohorts by that patient. Now the cut is the site's (its split secret, its
    policy's fractions): every run sees the same training, validation and test entities, the same round-0 sums and
    the same evaluation rows."""
    from fcd_secure.apps.site import SPLIT_SLOT, SiteRuntime
    from fcd_secure.data.cohorts import SECRET_FILE, row_ids
    from fcd_secure.federation.site_policy import SitePolicy

    spec, table = long_case(make_long_table(112), SPEC_ONE_SITE)  # 0.2 vs 0.2035 of 112: 22 or 23 rows before
    state = tmp_path / "state"
    seen = []
    for tf, seed in ((0.2, 0), (0.2035, 0), (0.2, 1), (0.6, 7)):
        site = SiteRuntime(_site_cfg(spec, table, tf, seed), "site-00", 0, str(state), policy=SitePolicy(),
                           own_table=(str(spec), str(table)))
        assert site.cfg.data.test_fraction == 0.2  # the policy's fraction, not the request's
        sums = site.preprocessing_sums()
        parts = {k: sorted(row_ids(getattr(site.data, k))) for k in ("train", "validation", "test")}
        rows = site.evaluation_rows(None).tolist()
        seen.append((sums, parts, rows))
    first = seen[0]
    assert set(first[1]["test"]).isdisjoint(first[1]["train"]) and set(first[1]["validation"]).isdisjoint(
        first[1]["train"] + first[1]["test"])
    assert len(first[1]["validation"]) > 0 and len(first[1]["test"]) >= 20
    for other in seen[1:]:
        assert other[0] == first[0]  # round-0 totals: identical, not one patient apart
        assert other[1] == first[1]
        assert other[2] == first[2]
    # the evaluation record follows the patients, not their scaling: the consortium's statistics move when any
    # site's data do, and a new scaling must not open a fresh record (P22's repeats and overlaps count across runs)
    from fcd_secure.data.moments import standardizer_for
    from fcd_secure.queries.cohort import split_fingerprint

    test = site.data.test
    fps = {split_fingerprint(standardizer_for(test, {"x_mean": [m], "x_std": [2.0], "a_mean": [m], "a_std": [3.0]})
                             .apply(test), "site-00") for m in (0.0, 5.0)}
    assert fps == {split_fingerprint(test, "site-00")}
    # the secret is the site's own, kept private on its disk; the cut is recorded once
    secret = state / "site-00" / SECRET_FILE
    assert secret.stat().st_size == 32 and stat.S_IMODE(secret.stat().st_mode) == 0o600
    import json

    cuts = json.loads((state / "site-00" / "slots" / SPLIT_SLOT).read_text())["cuts"]
    assert len(cuts) == 1 and cuts[0]["test_fraction"] == 0.2
    # another site (another secret) cuts the same table differently: the order is the secret's, nobody else's
    other = SiteRuntime(_site_cfg(spec, table, 0.2, 0), "site-01", 0, str(state), policy=SitePolicy(),
                        own_table=(str(spec), str(table)))
    assert sorted(row_ids(other.data.test)) != first[1]["test"]


def test_P40_simulated_sites_cut_from_a_secret_derived_from_the_dataset_seed(long_case):
    """P40 in simulation: each simulated site's secret comes from the dataset seed and its index, the fractions sit
    on a 5 % grid, so test fractions 0.2 and 0.2035 are one cut (before: one patient apart at 57 rows), and the cut
    is exactly the keyed order of the entity ids under that secret."""
    from fcd_secure.data.cohorts import row_ids, seeded_secret, split_rows
    from fcd_secure.data.partition import site_split_seed
    from fcd_secure.federation import learner

    spec, table = long_case(make_long_table(57 * 3))  # three hospitals of 57 patients
    a = [learner.load_site_data(_site_cfg(spec, table, 0.2, 3), i) for i in range(3)]
    b = [learner.load_site_data(_site_cfg(spec, table, 0.2035, 3), i) for i in range(3)]
    for i, (x, y) in enumerate(zip(a, b)):
        assert row_ids(x.test) == row_ids(y.test) and row_ids(x.train) == row_ids(y.train)
        everyone = row_ids(x.train) + row_ids(x.validation) + row_ids(x.test)
        secret = seeded_secret(site_split_seed(3, i))
        rest, test = split_rows(everyone, 0.2, secret)
        assert sorted(row_ids(x.test)) == sorted(everyone[j] for j in test)
        fit, val = split_rows([everyone[j] for j in rest], 0.2, secret)
        assert sorted(row_ids(x.validation)) == sorted(everyone[rest[j]] for j in val)


# -- what-if questions: budgeted as cohorts (P41), read on the site's grid (P42), in the table's units (P43) -------
def _threshold(name: str, value: float, when: str = "above"):
    from fcd_secure.data.policy import Policy

    return Policy.model_validate({"name": name, "rule": {
        "kind": "threshold", "signal": "context:lab", "when": when, "value": float(value), "lookback": 1,
        "then": "insulin", "otherwise": "none"}})


@pytest.fixture(scope="module")
def mgdl_site(tmp_path_factory):
    """A simulated hospital (3 of them, 150 patients each, 30 test rows) whose lab is in mg/dL (about 150 ± 60)."""
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.config import build_config
    from fcd_secure.federation.site_policy import SitePolicy

    tmp = tmp_path_factory.mktemp("mgdl")
    df = make_long_table(450)
    df["lab"] = df["lab"] * 30.0
    df.to_csv(tmp / "table.csv", index=False)
    (tmp / "spec.toml").write_text(GOOD_SPEC)
    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(tmp / "spec.toml"),
                                         "table": str(tmp / "table.csv"), "test_fraction": 0.2},
                                "state_dir": str(tmp / "state")})

    def site(state: str = "state"):
        return SiteRuntime(cfg, "site-00", 0, str(tmp / state), policy=SitePolicy.for_run(cfg))

    return site


def _labs(data):
    """Each test row's first logged lab in mg/dL (the column is z-scored in the data)."""
    from fcd_secure.data.policy import context_scales

    col = list(data.test.meta["a_names"]).index("lab")
    mean, sd = context_scales(data.test)[col]
    return data.test.A[:, 0, col] * sd + mean


def test_P41_a_question_of_thresholds_one_patient_apart_is_refused(mgdl_site):
    """P41. The attack: one what-if question of 32 threshold policies "insulin when lab > c" with c between
    neighbouring patients' first labs. Each neighbouring pair's cohorts differ in one patient, whose logged steps
    stop being consistent with π: the difference of the two answers' OPE sums is that patient's 1/P and action
    (7 questions leaked 10 of 11 patients before). Now the site charges the question against its differencing
    budget: cohorts closer than its policy's min_difference (20 entities) are refused before anything runs, and so
    is a later question whose cohort is close to one answered before (the record in its state)."""
    from fcd_secure.audit import Refusal
    from fcd_secure.data.policy import bind_policy
    from fcd_secure.manifest import THETA_C
    from fcd_secure.queries.budget import QUESTION_SLOT, cohort_difference, cohort_signature
    from fcd_secure.queries.request import WhatIfRequest

    site = mgdl_site()
    data = site.data
    labs = np.sort(_labs(data))
    cuts = (labs[:-1] + labs[1:]) / 2
    assert len(cuts) >= 29
    pols = [_threshold(f"lab_above_{i}", c) for i, c in enumerate(cuts[:29])]
    # the mechanism: neighbouring thresholds touch cohorts one patient apart
    sig = [cohort_signature(bind_policy(p, data.test), data.test, data.anchors, data.test.L) for p in pols]
    gaps = [cohort_difference(a, b) for a, b in zip(sig, sig[1:])]
    assert min(gaps) == 1
    theta = site.model.get_params(THETA_C)
    question = WhatIfRequest(policies=pols, reference=pols[0].name)
    with pytest.raises(Refusal) as exc:
        site.evaluate(theta, {"whatif": question.to_json(), "n-samples": 1})
    assert (exc.value.rule, exc.value.key) == ("eval_cohort", "policy_difference")
    # the paper's policies differ on every patient: answered, and their cohorts recorded on the site
    paper = WhatIfRequest(policies=[_threshold("never_fires", 1e9), _threshold("always_fires", -1e9)],
                          reference="never_fires")
    out = mgdl_site().evaluate(theta, {"whatif": paper.to_json(), "n-samples": 1})
    assert out["policy.never_fires.n"] == data.test.n
    assert (site.state.dir / "slots" / QUESTION_SLOT).exists()
    # one threshold on its own, a few patients from the answered "never" cohort as the site reads it (on its grid):
    # refused by the record
    from fcd_secure.data.policy import snap_threshold

    never = cohort_signature(bind_policy(_threshold("n", 1e9), data.test), data.test, data.anchors, data.test.L)

    def gap(value):
        snapped = bind_policy(snap_threshold(_threshold("t", value), data.train, 10)[0], data.test)
        s = cohort_signature(snapped, data.test, data.anchors, data.test.L)
        return cohort_difference(s, never)

    few = _threshold("few", next(c for c in cuts[::-1] if 0 < gap(c) < 20))
    alone = WhatIfRequest(policies=[few], reference=few.name)
    with pytest.raises(Refusal) as exc:
        mgdl_site().evaluate(theta, {"whatif": alone.to_json(), "n-samples": 1})
    assert (exc.value.rule, exc.value.key) == ("eval_cohort", "answered_cohort")


def test_P42_thresholds_are_read_on_the_sites_quantile_grid(mgdl_site):
    """P42. Thresholds placed between two patients are not the site's cut points: the site reads a threshold on a
    continuous context column at the nearest of its own deciles (computed on its training rows, never sent), and
    one beyond its data becomes ±inf. 29 thresholds between neighbouring test patients become at most 11 rules."""
    from fcd_secure.data.policy import snap_threshold

    data = mgdl_site().data
    labs = np.sort(_labs(data))
    snapped = [snap_threshold(_threshold("t", c), data.train, 10) for c in (labs[:-1] + labs[1:]) / 2]
    values = {p.rule.value for p, _ in snapped}
    assert len(values) <= 11
    assert all(note["rank"] * 10 == round(note["rank"] * 10) for _, note in snapped)
    high, note = snap_threshold(_threshold("t", 10_000.0), data.train, 10)
    assert high.rule.value == np.inf and note["rank"] == 1.0
    # a rule on the outcome is not a context threshold: unchanged
    from fcd_secure.data.policy import Policy

    out = Policy.model_validate({"name": "o", "rule": {"kind": "threshold", "value": 0.5}})
    assert snap_threshold(out, data.train, 10)[0] is out


def test_P43_thresholds_are_in_the_tables_units_and_a_silent_one_is_reported(mgdl_site):
    """P43. ``value = 180`` (mg/dL) on a z-scored lab column was compared with z-scores and never fired, silently.
    Now a threshold is in the table's own units (the site's data carry the column's scale), and a threshold that
    fires on none of a site's rows is reported (``whatif.fires.<π>`` = 0 from every site; ``never_fires``)."""
    from fcd_secure.data.policy import bind_policy
    from fcd_secure.manifest import THETA_C
    from fcd_secure.queries.evaluation import merge_site_metrics
    from fcd_secure.queries.request import WhatIfRequest

    site = mgdl_site("state-p46")
    data = site.data
    labs = _labs(data)
    assert (labs > 180).any() and np.abs(data.test.A[:, 0, list(data.test.meta["a_names"]).index("lab")]).max() < 10
    pol = bind_policy(_threshold("insulin_above_180", 180.0), data.test)
    plan = pol.plan(data.test.Y, data.test.lengths, *data.anchors, A=data.test.A)
    insulin = data.test.meta["action_names"].index("insulin")
    np.testing.assert_array_equal(plan[:, 0] == insulin, labs > 180)
    theta = site.model.get_params(THETA_C)
    q = WhatIfRequest(policies=[_threshold("low", -1e9), _threshold("silent", 10_000.0)], reference="low")
    out = site.evaluate(theta, {"whatif": q.to_json(), "n-samples": 1})
    assert out["whatif.fires.silent"] == 0.0 and out["whatif.fires.low"] == 1.0
    # the site keeps how it read each threshold (asked value, grid rank, its cut point) beside its per-entity file
    import json

    kept = json.loads((site.state.dir / "whatif" / f"{q.query_id}.json").read_text())["thresholds"]
    assert kept["silent"] == {"value": 10_000.0, "rank": 1.0, "snapped": "inf"}
    merged = merge_site_metrics([out], q)
    assert merged["policies"]["silent"]["never_fires"] and not merged["policies"]["low"]["never_fires"]
    from fcd_secure.cli.whatif import whatif_table

    caption = str(whatif_table(merged).caption)
    assert "never fires on any site's data" in caption and "silent" in caption and "low" not in caption.split(":")[-1]


def _policy_file(tmp, name: str, value: float):
    """A policy file "insulin when lab > value" (``[evaluation] policies`` takes paths)."""
    path = tmp / f"{name}.toml"
    path.write_text(f'name = "{name}"\n\n[rule]\nkind = "threshold"\nsignal = "context:lab"\nwhen = "above"\n'
                    f'value = {value!r}\nlookback = 1\nthen = "insulin"\notherwise = "none"\n')
    return str(path)


def test_P70_a_scored_rounds_values_cannot_single_out_a_validation_patient(mgdl_site, tmp_path):
    """P70. The attack: the coordinator sets the run's ``[evaluation] policies`` to two thresholds between
    neighbouring validation patients' labs. Every scored round each site sends, per policy, the sum of its simulated
    values over its validation rows (``queries.round_values``), so the two sums differ by one patient's simulated
    course: a function of that patient's history and of the site's private Θs. Unprotected (no question policy: the
    thresholds taken as given, the pair not admitted), the difference is that one patient's. The site reads the
    thresholds on its own grid and admits the pair as one question (P41, P42): the two then act alike on every
    patient (a difference of 0) or on at least ``min_difference``, or nothing is sent."""
    from dataclasses import replace

    from fcd_secure.data.policy import context_scales
    from fcd_secure.queries.evaluation import site_metrics
    from fcd_secure.queries.request import EvaluationRequest
    from fcd_secure.queries.round_values import RoundValues

    site = mgdl_site()
    data, model = site.data, site.model
    model.keep_context_range(data.train)  # as the site does before it rolls its simulator out
    val = data.validation
    assert val is not None and val.n >= 20
    col = list(val.meta["a_names"]).index("lab")
    mean, sd = context_scales(val)[col]
    labs = np.sort(val.A[:, 0, col] * sd + mean)
    i = len(labs) // 2
    lo, hi = (labs[i - 1] + labs[i]) / 2, (labs[i] + labs[i + 1]) / 2  # exactly patient i between them
    cfg = site.cfg.model_copy(update={"evaluation": site.cfg.evaluation.model_copy(update={
        "policies": [_policy_file(tmp_path, "below_i", float(lo)), _policy_file(tmp_path, "above_i", float(hi))]})})
    scored = EvaluationRequest(quick=True, keep_round=1, n_samples=1)
    data = replace(data, validation=val)

    def sums(questions):
        return site_metrics(model, data, cfg, scored, questions=questions, queries=[RoundValues()])

    open_ = sums(None)  # the unprotected computation
    assert open_["rvalue.below_i.n"] == open_["rvalue.above_i.n"] == val.n
    leak = abs(open_["rvalue.below_i.s"] - open_["rvalue.above_i.s"])
    assert leak > 0  # one patient's simulated value under "insulin" against "none"
    guarded = sums(site.policy.questions)
    assert guarded == {} or guarded["rvalue.below_i.s"] == guarded["rvalue.above_i.s"]

    # across runs: the coordinator asks one threshold in one run and another a few grid steps on in the next, so the
    # two runs' sums differ by the few validation patients between them. The site keeps a record of the validation
    # rows' answered cohorts: the second run's policy is refused (nothing sent); without the record it is answered
    tcol = list(data.train.meta["a_names"]).index("lab")
    tmean, tsd = context_scales(data.train)[tcol]
    grid = np.quantile(data.train.A[:, 0, tcol] * tsd + tmean, [0.3, 0.7])
    site_dir = tmp_path / "site"
    (site_dir / "slots").mkdir(parents=True)

    def run_of(name, value, record_dir):
        one = site.cfg.model_copy(update={"evaluation": site.cfg.evaluation.model_copy(update={
            "policies": [_policy_file(tmp_path, name, float(value))]})})
        return site_metrics(model, data, one, scored, site_dir=record_dir, questions=site.policy.questions,
                            queries=[RoundValues()])

    first = run_of("lab_above_q30", grid[0], site_dir)
    assert first["rvalue.lab_above_q30.n"] == val.n
    assert run_of("lab_above_q30", grid[0], site_dir) == first  # the same cohort again: free
    unrecorded = run_of("lab_above_q70", grid[1], None)
    assert 0 < abs(unrecorded["rvalue.lab_above_q70.s"] - first["rvalue.lab_above_q30.s"])
    assert run_of("lab_above_q70", grid[1], site_dir) == {}


def test_P70_a_refused_round_value_is_written_to_the_sites_ledger(mgdl_site, tmp_path):
    """P70, the audit half. A coordinator probing the validation rows with policies a few patients apart is refused
    (the test above), but the scored round's reply still leaves with its other sums: before, nothing in the site's
    ledger showed that the probe happened. Now the egress gate running the round's handler writes the refusal into
    that reply's line (``declined``, rule ``eval_cohort``), and ``fcd audit verify`` lists it for the privacy officer
    beside the refused replies; a round with nothing declined has no such field."""
    from fcd_secure.audit.report import markdown
    from fcd_secure.audit.verify import verify_path
    from fcd_secure.data.policy import context_scales
    from fcd_secure.queries.evaluation import site_metrics
    from fcd_secure.queries.request import EvaluationRequest
    from fcd_secure.queries.round_values import RoundValues
    from test_audit_support import Site, instruction

    site = mgdl_site()
    data, model = site.data, site.model
    model.keep_context_range(data.train)
    scored = EvaluationRequest(quick=True, keep_round=1, n_samples=1)
    tcol = list(data.train.meta["a_names"]).index("lab")
    tmean, tsd = context_scales(data.train)[tcol]
    grid = np.quantile(data.train.A[:, 0, tcol] * tsd + tmean, [0.3, 0.7])
    record_dir = tmp_path / "site"
    (record_dir / "slots").mkdir(parents=True)
    audited = Site(tmp_path / "audit")

    def round_with(name, value):
        one = site.cfg.model_copy(update={"evaluation": site.cfg.evaluation.model_copy(update={
            "policies": [_policy_file(tmp_path, name, float(value))]})})
        inner = audited.train_handler()
        sent = {}

        def handler(msg, ctx):  # the scored round's sums are computed inside the handler the gate wraps
            sent.update(site_metrics(model, data, one, scored, site_dir=record_dir, questions=site.policy.questions,
                                     queries=[RoundValues()]))
            return inner(msg, ctx)

        reply = audited.send(instruction("train", 1 + len(sent_rounds)), handler)
        sent_rounds.append(sent)
        assert reply.has_content() and not reply.has_error()  # the round's reply itself leaves
        return [l for l in audited.ledger.lines() if l["kind"] == "upload"][-1]

    sent_rounds: list[dict] = []
    first = round_with("lab_above_q30", grid[0])
    assert sent_rounds[0]["rvalue.lab_above_q30.n"] > 0 and "declined" not in first
    probe = round_with("lab_above_q70", grid[1])  # a few validation patients on: refused, nothing of it sent
    assert sent_rounds[1] == {}
    assert probe["status"] == "sent"
    assert probe["declined"] == [{"rule": "eval_cohort", "record": "config", "key": "answered_cohort"}]
    res = verify_path(tmp_path / "audit")
    # a site ledger alone (no server receipts, its key unpinned): partial evidence, but neither tampered nor a
    # violation (a declined part is the site doing its job)
    assert res.status == "partial" and not [f for f in res.findings if f.severity in ("tampered", "violation")]
    (listed,) = [r for r in res.refusals if r.part]
    assert (listed.rule, listed.key, listed.round) == ("eval_cohort", "answered_cohort", 2)
    assert "part of the request declined, the rest answered" in markdown(res)
