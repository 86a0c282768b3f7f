"""`fcd whatif` end to end (real ClientApp/ServerApp, real model and data): a finished tiny run is asked about
policies that name actions by label; values and effects come with intervals and the DKT-Synth truth; per-entity
effects stay in each site's own folder and never reach the server's ledger; the evaluation-only round keeps the audit
evidence verifiable.

The finished run is trained on the in-process engine (``engines.inprocess``: the same ServerApp, ClientApp and
messages as Flower's simulation engine, pinned to it bit for bit in ``test_federation_inprocess.py``), and the
question runs on the engine the run recorded (``engines.whatif_run.recorded_engine``), so in process too: the claims
here are the question's, not the engine's. The tests that read them form one xdist group, so both runs happen once,
on one worker."""

from __future__ import annotations

import json
import re

import numpy as np
import pandas as pd
import pytest


from typer.testing import CliRunner  # noqa: E402

from fcd_secure.cli.main import app as fcd_app  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.data.policy import load_policy, load_policy_refs  # noqa: E402
from fcd_secure.queries.request import WhatIfRequest  # noqa: E402
from fcd_secure.engines.whatif_run import run_whatif  # noqa: E402

SITES = 2
#: the tests that read the asked question (a module-scoped fixture) run on one xdist worker
shared_run = pytest.mark.xdist_group("whatif-run")
ITEM_POLICY = """\
name = "item30_then_off"
description = "item 30 (by its label; logged at step 0 on both sites) for the first 4 steps, then the anchor a_off"
[rule]
kind = "switch"
at = 4
before = "item 30"
after = "anchor:off"
"""


@pytest.fixture(scope="module")
def asked(tmp_path_factory):
    """One tiny 1-round run (its end-of-run table included), then one what-if question of it."""
    import torch

    from fcd_secure.engines.inprocess import run_inprocess

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("whatif")
    cfg = build_config("tiny", {
        "data": {"n_sites": SITES, "test_fraction": 0.2},
        "federation": {"clients_per_round": SITES, "rounds": 1, "eval_every": 0, "secure_aggregation": False},
        "evaluation": {"n_samples": 2, "max_rows": None},
        "out": str(root / "run"),
    })
    run_inprocess(cfg)
    pol_file = root / "item30.toml"
    pol_file.write_text(ITEM_POLICY)
    request = WhatIfRequest(policies=load_policy_refs(["never", "always", str(pol_file)]), reference="never")
    result = run_whatif(root / "run", request)
    return root / "run", request, result


@shared_run
def test_run_summary_has_anchors_contexts_and_intervals(asked):
    run, _request, _ = asked
    s = json.loads((run / "summary.json").read_text())
    a_off, a_on = s["anchors"]["a_off"], s["anchors"]["a_on"]
    assert a_off["label"] == f"item {a_off['id']}" and a_on["label"] == f"item {a_on['id']}" and a_off != a_on
    # DKT-Synth's only context is the clock: exogenous, replayed
    assert s["contexts"] == {"generated": 0, "replayed": 1, "generated_columns": [],
                             "replayed_columns": ["step_index_normalised"]}
    assert s["whatif"]["reference"] == "never" and s["whatif"]["level"] == 0.9
    assert list(s["policies"]) == ["never", "always", "early_on", "late_on"]
    for name, d in s["policies"].items():
        iv = d["interval"]
        assert iv["low"] <= d["value_sim"] <= iv["high"] and iv["level"] == 0.9 and iv["n"] > 0
        assert d["value_true"] is not None
        assert ("effect" in d) == (name != "never")


@shared_run
def test_whatif_answers_label_policies_with_intervals_and_truth(asked):
    run, request, res = asked
    pols = res["policies"]
    assert list(pols) == ["never", "always", "item30_then_off"]
    for name, d in pols.items():
        assert d["supported"] and d["support"] > 0 and d["n"] == res["n_test"] and d["n_sites"] == SITES
        assert d["interval"]["low"] <= d["value_sim"] <= d["interval"]["high"]
        assert 0.0 <= d["value_true"] <= 1.0
        # the rectified value: the simulated one minus the factual residual (the model's error on logged actions)
        assert d["rectified"]["estimate"] == pytest.approx(d["value_sim"] - res["factual_residual"]["estimate"])
        assert d["rectified"]["low"] <= d["rectified"]["estimate"] <= d["rectified"]["high"]
        # the doubly robust value (DKT-Synth logs propensities): an interval, and the share of supported steps
        dr = d["doubly_robust"]
        assert dr["low"] <= dr["estimate"] <= dr["high"] and 0.0 <= dr["support"] < 1.0
        # widened by what the logged sample did not reach of π (binary outcome: the bounds are sent), with the
        # Imbens-Manski critical value between the one- and the two-sided normal quantile
        b = dr["bounded"]
        se = (dr["high"] - dr["low"]) / (2 * 1.6448536269514722)
        assert 1.2815515655446004 <= b["critical"] <= 1.6448536269514722
        # each end with the spread of its own per-entity terms (B_t's sampling error), never below the estimate's
        assert b["se_low"] >= se * (1 - 1e-9) and b["se_high"] >= se * (1 - 1e-9)
        assert b["low"] == pytest.approx(max(0.0, dr["estimate"] - b["unseen_low"] - b["critical"] * b["se_low"]))
        assert b["high"] == pytest.approx(min(1.0, dr["estimate"] + b["unseen_high"] + b["critical"] * b["se_high"]))
        assert 0.0 <= b["low"] <= b["high"] <= 1.0  # a value of a binary outcome: the interval stays in [0, 1]
        assert b["unseen_low"] >= 0 and b["unseen_high"] >= 0 and b["unseen_low"] + b["unseen_high"] > 0
        assert "value" in d["dr"]  # the per-decision DR point estimate of the OPE sums stays beside it
    eff = pols["item30_then_off"]["effect"]
    b = eff["doubly_robust"]["bounded"]  # a contrast: the policy's room below plus the reference's above
    assert b["unseen_low"] == pytest.approx(pols["item30_then_off"]["doubly_robust"]["bounded"]["unseen_low"]
                                            + pols["never"]["doubly_robust"]["bounded"]["unseen_high"])
    assert eff["doubly_robust"]["estimate"] == pytest.approx(
        pols["item30_then_off"]["doubly_robust"]["estimate"] - pols["never"]["doubly_robust"]["estimate"])
    assert eff["reference"] == "never" and eff["low"] <= eff["estimate"] <= eff["high"]
    assert eff["estimate"] == pytest.approx(pols["item30_then_off"]["value_sim"] - pols["never"]["value_sim"], abs=1e-9)
    assert eff["true"] == pytest.approx(pols["item30_then_off"]["value_true"] - pols["never"]["value_true"])
    # the label policy really ran its labelled item: its value differs from both anchor policies
    assert pols["item30_then_off"]["value_sim"] not in (pols["never"]["value_sim"], pols["always"]["value_sim"])
    saved = json.loads((run / "whatif" / f"{request.query_id}.json").read_text())
    assert saved["policies"]["always"]["value_sim"] == pytest.approx(pols["always"]["value_sim"])


@shared_run
def test_the_doubly_robust_table_shows_the_interval_widened_by_the_unseen_mass(asked):
    from rich.console import Console

    from fcd_secure.cli.whatif import dr_table

    res = asked[2]
    con = Console(record=True, width=80)  # a terminal of 80 columns: every interval on one line
    con.print(dr_table(res))
    text = con.export_text()
    assert max(len(line) for line in text.splitlines()) <= 80
    for name in ("never", "always", "item30_then_off"):
        dr = res["policies"][name]["doubly_robust"]
        assert f"{dr['low']:.3f}–{dr['high']:.3f}" in text
        assert f"{dr['bounded']['low']:.3f}–{dr['bounded']['high']:.3f}" in text
    eff = res["policies"]["always"]["effect"]["doubly_robust"]["bounded"]
    assert f"{eff['low']:.3f}–{eff['high']:.3f}" in text
    assert dr_table({"policies": {"never": {"value_sim": 0.5}}}) is None  # no propensities: no table


@shared_run
def test_per_entity_effects_stay_on_their_site_and_never_reach_the_server_ledger(asked):
    run, request, res = asked
    state = run / "state"
    files = sorted(state.glob(f"site-*/whatif/{request.query_id}.csv"))
    assert len(files) == SITES  # one per site, each in the site's own folder
    server_text = "\n".join(p.read_text() for p in (state / "_server").rglob("*.jsonl"))
    server_text += (run / "whatif" / f"{request.query_id}.json").read_text() + (run / "traffic.csv").read_text()
    received = [json.loads(line) for line in (state / "_server" / "audit" / "server_ledger.jsonl").read_text().splitlines()]
    received = [e for e in received if e["kind"] == "received"]
    assert received, "the server ledger records what it received"
    keys = {m for e in received for m in e["metrics"]}
    n_rows = 0
    for f in files:
        df = pd.read_csv(f)
        n_rows += len(df)
        steps = [c for c in df.columns if c.startswith("dr_")]  # the unseen-mass bounds' per-step pieces
        assert [c for c in df.columns if c not in steps] == [
            "entity", "value[never]", "value[always]", "value[item30_then_off]", "effect[always - never]",
            "effect[item30_then_off - never]", "factual_residual", "dr[never]", "dr[always]", "dr[item30_then_off]"]
        H = sum(c.startswith("dr_scale[") for c in steps)
        assert H >= 1 and len(steps) == H * (1 + 2 * 3) and f"dr_w[always][{H - 1}]" in steps
        # no per-entity value, under any rounding the server side could have printed, and no per-entity key (the
        # per-step pieces are weights 0 or 1/μ, step shares 1/length and model probabilities: common numbers)
        for v in df.drop(columns=["entity", *steps]).to_numpy().ravel():
            for text in {f"{v:.6f}", repr(float(v))}:
                # a whole number token: '0.49' (a value of exactly 0.490000) is no leak inside '0.4905060596'
                if abs(v) > 1e-3:
                    assert not re.search(rf"(?<![\d.]){re.escape(text)}(?![\d])", server_text), text
        for col in df.columns:
            assert not any(col in k for k in keys)
        assert not any(re.search(rf"\b{re.escape(str(e))}\b", k) for e in df["entity"] for k in keys)
    assert res["n_test"] == n_rows
    # what the sites sent for the question: sums whose count does not grow with the entities
    whatif_keys = {k for k in keys if ".whatif." in k or "/whatif." in k}
    assert whatif_keys and all(
        re.fullmatch(r"eval/whatif\.((value|diff|rectified|dr|drdiff)\.[A-Za-z0-9_-]+|residual)\.(n|sum|sumsq|mc_var)", k)
        or re.fullmatch(r"eval/whatif\.dr\.[A-Za-z0-9_-]+\.support", k)  # Σ_i of a share of steps: one more sum
        # the unseen-mass bounds: two more, and n, Σ, Σ² of each end's per-entity terms
        or re.fullmatch(r"eval/whatif\.dr\.[A-Za-z0-9_-]+\.unseen_(lo|hi)(_n|_sum|_sumsq)?", k)
        # the identified answers (queries.targeted): per horizon the same sums, the weight sums of the ESS, the truth
        or re.fullmatch(r"eval/whatif\.id\.h\d+\.(diff\.)?[A-Za-z0-9_-]+\.(n|sum|sumsq|sw|sww|true_sum)", k)
        # the logged support: Σ_i a share of steps, and whether the site's logs never follow π (a count)
        or re.fullmatch(r"eval/whatif\.support\.[A-Za-z0-9_-]+\.(sum|none)", k)
        # the sequential doubly robust value (queries.sequential_dr): n, Σ, Σ² of the per-entity terms, and the
        # sums of the weight products through the horizon (its support rule: Kish ESS and mean), and whether the
        # site's Q̂ was the rollout from t = 0 (none of its entities follows π through the horizon: a count)
        or re.fullmatch(r"eval/whatif\.sdr\.[A-Za-z0-9_-]+\.(n|sum|sumsq|sw|sww|q0)", k)
        for k in whatif_keys), sorted(whatif_keys)
    assert any(k.endswith(".unseen_lo") for k in whatif_keys)
    assert any(".drdiff." in k for k in whatif_keys)  # the doubly robust contrasts went as sums too


@shared_run
def test_audit_evidence_still_verifies_after_the_question(asked):
    from fcd_secure.audit.ledger import fingerprint, public_key_bytes
    from fcd_secure.audit.verify import verify_path

    state = asked[0] / "state"
    site_pins, server_pins = [], []
    for key_file in sorted(state.rglob("identity_ed25519.key")):
        (server_pins if key_file.parent.name == "_server" else site_pins).append(
            fingerprint(public_key_bytes(key_file.read_bytes())))
    res = verify_path(state, site_keys=site_pins, server_keys=server_pins)
    assert res.exit_code == 0, [f.message for f in res.findings if f.severity != "note"]


@shared_run
def test_bad_questions_exit_2_before_any_engine(asked, tmp_path):
    run = asked[0]
    def said(r):
        return " ".join(r.output.split())

    r = CliRunner().invoke(fcd_app, ["whatif", str(tmp_path / "nope")])
    assert r.exit_code == 2 and "not a finished run folder" in said(r)
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\n[rule]\nkind = "static"\naction = "item 99"\n')
    r = CliRunner().invoke(fcd_app, ["whatif", str(run), "--policy", str(bad)])
    assert r.exit_code == 2 and "not a label" in said(r) and str(bad) in r.output.replace("\n", "")
    r = CliRunner().invoke(fcd_app, ["whatif", str(run), "--policy", "never", "--reference", "sometimes"])
    assert r.exit_code == 2 and "sometimes: no such policy file" in said(r)
    assert load_policy(run.parent / "item30.toml").labels == ["item 30"]
    assert not np.isnan(asked[2]["policies"]["never"]["value_sim"])


@shared_run
def test_the_question_runs_on_the_runs_recorded_engine_and_an_unknown_one_exits_2(asked, tmp_path):
    """``fcd whatif`` asks a run on the engine its summary.json records (this run's: in process); a run folder that
    names an engine no local engine records is refused before any engine starts, naming the engine."""
    import shutil

    from fcd_secure.engines.choice import Engine
    from fcd_secure.engines.whatif_run import recorded_engine

    run = asked[0]
    assert recorded_engine(run) is Engine.INPROCESS
    assert Engine.of_summary(Engine.SIMULATION.summary_name) is Engine.SIMULATION
    other = tmp_path / "run"
    shutil.copytree(run, other, ignore=shutil.ignore_patterns("state", "whatif"))  # without the answers given
    (other / "state").symlink_to(run / "state", target_is_directory=True)
    summary = json.loads((other / "summary.json").read_text())
    (other / "summary.json").write_text(json.dumps({**summary, "engine": "ray-cluster"}))
    r = CliRunner().invoke(fcd_app, ["whatif", str(other), "--policy", "never", "--json"])
    env = json.loads(r.stdout)
    assert r.exit_code == 2 and env["error_code"] == "BAD_INPUT" and "'ray-cluster'" in env["message"], r.output
    assert not (other / "whatif").exists()


def test_the_egress_gate_allows_exactly_the_keys_of_the_question():
    from fcd_secure.apps.egress import federation_policy
    from fcd_secure.queries.request import evaluated_policy_names

    cfg = build_config("tiny", {})
    request = WhatIfRequest(policies=load_policy_refs(["never", "late_on"]), reference="never")
    names = evaluated_policy_names({"whatif": request.to_json()}, cfg)
    assert names == ["never", "late_on"]
    assert evaluated_policy_names({}, cfg) == ["never", "always", "early_on", "late_on"]  # the run's own question
    assert evaluated_policy_names({"whatif": "{not json"}, cfg) == []  # nothing of a malformed question may leave
    pol = federation_policy(2, names)
    for key in ("eval/whatif.value.late_on.sum", "eval/whatif.diff.late_on.sumsq", "eval/whatif.rectified.never.n",
                "eval/whatif.dr.late_on.unseen_lo", "eval/whatif.dr.never.unseen_hi",
                "eval/whatif.residual.sum", "eval/anchors.a_on", "eval/policy.late_on.sim_sum"):
        assert key in pol.allowed_metrics, key
    assert "eval/whatif.value.always.sum" not in pol.allowed_metrics  # not asked, so not allowed
    assert "eval/whatif.value.late_on.entity" not in pol.allowed_metrics
    assert "hello/dim-n_endogenous" in pol.allowed_config_keys and "metrics/context" in pol.allowed_metrics
