"""`fcd whatif` on a run of `fcd server run` (issue 45, last item): the question travels as a new run the coordinator
signs, through the SuperLink; each site answers with what it recorded when it answered that run, under its own
question budget, through secure aggregation (``federation.asked_runs``).

The first part attacks the site's side of this channel without Flower (docs/threats.md P61-P66): a question other
than the signed one, another Θc than the run's, a run the site never answered, a run whose Θs it deleted, a question
run that trains or asks for the round-0 sums, a signed question start replayed under another run id. The last test
runs the real deployment (SuperLink, SuperNodes, site executors on 127.0.0.1): the session's coordinator and four
hospitals (``tests/_hospital.py``, shared with ``test_hospital_deployment.py``), a DP run, one question answered,
the same question declined by the site whose budget refuses it (named, with its rule; the other three are then
below secure aggregation's minimum, so nothing is revealed), a question about a run no site answered (declined by
every site, named), a replayed question start (refused) and the refusal, before any work, when the coordinator is
not running.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from fcd_secure.audit import Refusal
from fcd_secure.config import build_config
from fcd_secure.data.policy import load_policy_refs
from fcd_secure.federation.asked_runs import (
    ANSWERED_SLOT,
    QUESTION_KEY,
    AnsweredRuns,
    QuestionStart,
    config_text,
    question_start_of,
    split_config_text,
    theta_digest,
)
from fcd_secure.federation.records import RUN_CONFIG_KEY
from fcd_secure.manifest import THETA_C, THETA_S
from fcd_secure.queries.request import WHATIF_FIELD, WhatIfRequest

runner = CliRunner()
SESSION = "ab" * 16
OTHER = "cd" * 16


def _question(*names: str) -> WhatIfRequest:
    pols = load_policy_refs(list(names))
    return WhatIfRequest(policies=pols, reference=pols[0].name)


@pytest.fixture
def answered_site(tmp_path, one_torch_thread):
    """A site that trained one round and answered a deployed run's final evaluation (session :data:`SESSION`);
    returns ``(site, Θc it was sent, its Θs then, the evaluation config)``."""
    from fcd_secure.apps.site import SiteRuntime

    cfg = build_config("tiny", {"state_dir": str(tmp_path), "data": {"n_sites": 2},
                                "federation": {"secure_aggregation": False, "clients_per_round": 2}})
    rt = SiteRuntime(cfg, "site-00", 0, str(tmp_path))
    theta = rt.model.get_params(THETA_C)
    theta, _, _ = rt.train_round(theta, {"server-round": 1, "part": THETA_C, "local-epochs": 1})
    rt.run_session = SESSION  # as from_context sets it from the run's verified ticket
    ev = {"quick": False, "part": THETA_C, "n-samples": 1, "max-rows": -1,
          WHATIF_FIELD: _question("never", "always").to_json()}
    try:
        rt.evaluate(theta, ev)
    except Refusal as exc:  # the tiny world may decline under its cohort rules: the run is recorded before that
        assert exc.rule == "eval_cohort"
    kept = {k: v.copy() for k, v in rt.state.load().theta_s.items()}
    return rt, theta, kept, ev


def _asking(rt, session: str, question: WhatIfRequest):
    """The same site serving a question run about ``session`` (what from_context reads from the signed start)."""
    from fcd_secure.apps.site import SiteRuntime

    asked = SiteRuntime(rt.request, rt.site_id, rt.site_index, str(rt.state.dir.parent), policy=rt.policy)
    asked.run_session = OTHER
    asked.question = QuestionStart(session, question.to_json())
    return asked


def _declined(fn) -> tuple[str, str]:
    with pytest.raises(Refusal) as info:
        fn()
    return info.value.rule, info.value.key


def test_a_question_start_carries_the_question_in_the_signed_config_text():
    cfg = build_config("tiny")
    start = QuestionStart(SESSION, _question("never", "always").to_json())
    text = config_text(cfg.to_json(), start)
    fields, back = split_config_text(text)
    assert back == start and QUESTION_KEY not in fields
    assert question_start_of({RUN_CONFIG_KEY: text}, RUN_CONFIG_KEY) == start
    assert question_start_of({RUN_CONFIG_KEY: cfg.to_json()}, RUN_CONFIG_KEY) is None  # a training run
    with pytest.raises(ValueError, match="32-hex-digit"):
        QuestionStart("run-7", start.question)
    from fcd_secure.federation.run_ticket import config_digest

    # the ticket signs the whole text: another question is another digest
    other = config_text(cfg.to_json(), QuestionStart(SESSION, _question("never", "early_on").to_json()))
    assert config_digest(text) != config_digest(other)


def test_a_site_answers_a_question_with_the_theta_s_it_recorded_for_the_run(answered_site):
    rt, theta, kept, ev = answered_site
    rt.train_round(theta, {"server-round": 2, "part": THETA_C, "local-epochs": 1})  # its Θs moves on after the run
    later = rt.state.load().theta_s
    assert any(not np.array_equal(kept[k], later[k]) for k in kept)
    asked = _asking(rt, SESSION, _question("never", "always"))
    run = asked.answered_run(theta, asked_request(ev))
    assert run.theta_c_sha256 == theta_digest(theta)
    for k in kept:
        np.testing.assert_array_equal(run.theta_s[k], kept[k])
    model = asked._model_with(run.theta_s, theta, THETA_C)
    for k, v in model.get_params(THETA_S).items():
        np.testing.assert_array_equal(v, kept[k])


def asked_request(ev: dict):
    from fcd_secure.queries.request import EvaluationRequest

    return EvaluationRequest.from_config(ev)


def test_P61_a_question_other_than_the_signed_one_is_declined(answered_site):
    """The ServerApp of a question run sends its own question in the evaluation message: the site answers only the
    one the coordinator signed in the run start."""
    rt, theta, _, ev = answered_site
    asked = _asking(rt, SESSION, _question("never", "always"))
    other = {**ev, WHATIF_FIELD: _question("never", "early_on").to_json()}
    assert _declined(lambda: asked.evaluate(theta, other)) == ("whatif_run", "question_not_signed")


def test_P61_a_question_with_another_theta_c_than_the_runs_is_declined(answered_site):
    """A crafted Θc (one weight moved) with the signed question: the site compares it with the Θc it answered the
    run with, from its own record."""
    rt, theta, _, ev = answered_site
    asked = _asking(rt, SESSION, _question("never", "always"))
    probe = {k: v.copy() for k, v in theta.items()}
    name = sorted(probe)[0]
    probe[name].flat[0] += 1e-3
    assert _declined(lambda: asked.evaluate(probe, ev)) == ("whatif_run", "theta_c_not_the_runs")


def test_P62_a_question_about_a_run_the_site_never_answered_is_declined(answered_site):
    rt, theta, _, ev = answered_site
    asked = _asking(rt, OTHER, _question("never", "always"))
    assert _declined(lambda: asked.evaluate(theta, ev)) == ("whatif_run", "unknown_run")


def test_P63_a_question_about_a_run_whose_theta_s_the_site_deleted_is_declined(answered_site):
    """Unprotected, the site fell back to its latest Θs (or a fresh one) and answered about a model the run never
    had."""
    rt, theta, _, ev = answered_site
    AnsweredRuns(rt.state.slot(ANSWERED_SLOT)).path(SESSION).unlink()
    asked = _asking(rt, SESSION, _question("never", "always"))
    assert _declined(lambda: asked.evaluate(theta, ev)) == ("whatif_run", "theta_deleted")


def test_P64_a_question_run_neither_trains_nor_gives_round_0_sums(answered_site):
    rt, theta, _, _ = answered_site
    asked = _asking(rt, SESSION, _question("never", "always"))
    assert _declined(lambda: asked.train_round(theta, {"server-round": 9, "part": THETA_C})) == ("whatif_run",
                                                                                                   "training")
    assert _declined(asked.preprocessing_sums) == ("whatif_run", "moment_sums")


def test_P65_a_signed_question_start_is_used_once(tmp_path):
    """A question run start replayed under another Flower run id is refused by the site's executor before its app
    runs (P52's record, which a question run start passes through like a training one)."""
    from fcd_secure.audit.signing import public_key_bytes
    from fcd_secure.engines.deployment import signed_run_config
    from fcd_secure.engines.site_exec import task_refusal
    from fcd_secure.federation.run_ticket import AcceptedRuns
    from fcd_secure.federation.site_policy import SitePolicy

    key = bytes(range(32))
    text = config_text(build_config("tiny").to_json(), QuestionStart(SESSION, _question("never", "always").to_json()))
    doc = signed_run_config(key, "c1", "f" * 64, text)
    policy = SitePolicy.model_validate({"app": {"fab_sha256": ["f" * 64], "coordinator_key": public_key_bytes(key).hex(),
                                                "consortium_id": "c1"}})
    accepted = AcceptedRuns(tmp_path)
    assert task_refusal(policy, "f" * 64, doc, accepted=accepted, run_id=11) == (None, "")
    assert task_refusal(policy, "f" * 64, doc, accepted=accepted, run_id=11) == (None, "")  # its own later tasks
    refusal, why = task_refusal(policy, "f" * 64, doc, accepted=accepted, run_id=12)
    assert refusal is not None and refusal.rule == "run_replayed" and "already used by run 11" in why
    # the question inside the signed text cannot be swapped either
    swapped = {**doc, RUN_CONFIG_KEY: config_text(build_config("tiny").to_json(),
                                                  QuestionStart(SESSION, _question("never", "late_on").to_json()))}
    refusal, _ = task_refusal(policy, "f" * 64, swapped, accepted=accepted, run_id=13)
    assert refusal is not None and refusal.rule == "run_not_signed"


def test_a_declined_question_names_each_site_and_its_rule():
    from fcd_secure.cli.whatif import unanswered_error

    q = _question("never", "always")
    err = unanswered_error({"declined_sites": ["h0", "h1"], "failed_sites": [],
                            "declined_rules": {"h0": "whatif_run", "h1": "eval_cohort"}}, q)
    assert "h0 declined it under rule 'whatif_run'" in err.message
    assert "h1 declined it under rule 'eval_cohort'" in err.message
    err = unanswered_error({"declined_sites": ["h3"], "failed_sites": [], "declined_rules": {"h3": "eval_cohort"},
                            "coverage": {"sites_asked": ["h0", "h1", "h2", "h3"]}}, q)
    assert err.message.endswith("; the 3 other site(s) were too few for secure aggregation to reveal a sum")
    from fcd_secure.queries.evaluation import coverage

    cov = coverage(["h0", "h1", "h2"], [], ["h0"], 30.0, rules={"h0": "whatif_run"})
    assert "h0 (declined under rule 'whatif_run'" in cov["warning"]


# -- the real deployment ---------------------------------------------------------------------------------------------

def _set_policy(home: Path, **sections) -> None:
    """Change the site's own policy file (the site is the authority: it is read for every message)."""
    from fcd_secure.federation.site_policy import SitePolicy

    path = home / "site_policy.toml"
    pol = SitePolicy.load(path)
    doc = pol.model_dump()
    for section, fields in sections.items():
        doc[section] = {**doc[section], **fields}
    SitePolicy.model_validate(doc).write(path)


@pytest.mark.deployment
def test_whatif_on_a_deployed_run_through_the_superlink(hospitals, one_torch_thread):
    """On the session's consortium (``tests/_hospital.py``; after ``test_hospital_deployment.py``'s runs when the
    session has them, then this run resumes their checkpoint): its sites' policies change here, so it is closed at
    the end and a later test gets a fresh one."""
    from _hospital import N_SITES, invoke

    from fcd_secure.cli import server as server_cli
    from fcd_secure.cli.main import app as main_app
    from fcd_secure.provisioning.consortium import Coordinator
    from fcd_secure.provisioning.server import RUN_START_FILE, _server_root, _submit_and_wait

    c = hospitals.consortium()
    co, homes = c.co, c.homes
    run = c.root / "asked-run"
    try:
        for home in homes:
            # each hospital tests on half of its patients: the tiny world's test splits then reach the cohort floor
            _set_policy(home, split={"test_fraction": 0.5})
        # the rounds the checkpoint holds (the same training settings as the other module's runs): the run resumes
        # after its last round and goes straight to its closing evaluation, which the sites answer here (the
        # questions are about that answer, not about training; a fresh consortium trains one round); the closing
        # evaluation and the questions below (they take the run's evaluation settings) with one rollout each and the
        # two policies asked: no figure of either is asserted on
        rounds = max(c.trained_rounds(), 1)
        code, env = invoke(server_cli.app, ["run", "--home", str(co), "--out", str(run), "--rounds", str(rounds),
                                            "--dp", "--dp-epsilon", "1", "--timeout", "900",
                                            "--set", "evaluation.n_samples=1",
                                            "--set", 'evaluation.policies=["never", "always"]'])
        assert code in (0, 8), (env["message"], env.get("hint"))  # 8: the answer is the simulator's alone
        assert json.loads((run / "summary.json").read_text())["rounds"] == rounds
        start = json.loads((run / RUN_START_FILE).read_text())
        assert len(start["session_id"]) == 32
        for i, home in enumerate(homes):  # each site recorded what it answered the run with, under its session
            assert (home / "state" / f"site{i}" / "slots" / ANSWERED_SLOT / f"{start['session_id']}.npz").is_file()

        # 1. one question, answered by every site through the SuperLink
        ask = ["whatif", str(run), "-p", "never", "-p", "always", "--timeout", "600", "--json"]
        res = runner.invoke(main_app, ask)
        env = json.loads(res.stdout)
        assert res.exit_code in (0, 8), (env["message"], env.get("hint"))
        answer = env["data"]
        assert set(answer["policies"]) == {"never", "always"}
        assert answer["coverage"]["complete"] and answer["coverage"]["n_sites_covered"] == N_SITES
        qid = answer["query_id"]
        assert (run / "whatif" / f"{qid}.json").is_file()

        # 2. the same question after one hospital tightened its question budget: it declines, named with its rule
        _set_policy(homes[3], questions={"min_difference": 100_000})
        res = runner.invoke(main_app, ask)
        env = json.loads(res.stdout)
        # four sites are secure aggregation's minimum here: the other three are too few to reveal a sum
        assert res.exit_code == 1, (env["message"], env.get("hint"))
        assert env["data"]["declined_rules"] == {"site3": "eval_cohort"}
        assert env["message"].startswith("no site answered the question: site3 declined it under rule 'eval_cohort'")
        assert "3 other site(s) were too few for secure aggregation" in env["message"], env["message"]

        # 3. a question naming a run no site answered: every site declines, each named with the rule
        (run / RUN_START_FILE).write_text(json.dumps({**start, "session_id": OTHER}))
        res = runner.invoke(main_app, ask)
        env = json.loads(res.stdout)
        assert res.exit_code == 1, env
        assert "declined it under rule 'whatif_run'" in env["message"] and "site0" in env["message"], env["message"]
        (run / RUN_START_FILE).write_text(json.dumps(start))

        # 4. the last signed question start, replayed under a new Flower run id: refused, nothing answered
        doc_path = _server_root(Coordinator(co)) / "run-config.toml"
        import tomllib

        replay = tomllib.loads(doc_path.read_text())
        with pytest.raises(RuntimeError, match="ended finished:failed"):
            _submit_and_wait(Coordinator(co), replay, run / "whatif" / "replayed.json", 300)
    finally:
        hospitals.close()  # every process stopped by its own stop command; none survived it
    # 5. refused before any work when the coordinator is not running
    res = runner.invoke(main_app, ["whatif", str(run), "-p", "never", "-p", "always", "--json"])
    env = json.loads(res.stdout)
    assert res.exit_code == 2 and "server is not running" in env["message"], env
