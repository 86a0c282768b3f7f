"""Declared unrecorded confounding (issue 42 item 4, ``queries.declared``): where the user declares a confounder the
logs do not record, every weighted and g-computation answer is "not identified (declared unrecorded confounding:
…)", nothing is ranked, and what every renderer shows is the Γ-bounds."""

from __future__ import annotations

import io

from conftest import GOOD_SPEC
from rich.console import Console

from fcd_secure.cli.whatif import print_answers
from fcd_secure.config import build_config
from fcd_secure.queries.answers import EvaluationAnswer
from fcd_secure.queries.base import MergeContext, Totals
from fcd_secure.queries.declared import DeclaredConfounding, declared_confounding
from fcd_secure.queries.kinds import CHECKED, AnswerKinds

WORDS = "readiness affects both the tutor's choice and the outcome"


def test_the_declaration_is_the_runs_else_the_specs_else_the_worlds(long_case):
    world = declared_confounding(build_config("tiny", {"data": {"dataset": "dkt-synth"}}))
    assert world is not None and "readiness" in world["declared"] and world["by"] == "the dkt-synth world"
    # γ = 0: DKT-Synth's tutor ignores readiness, nothing is hidden that confounds
    assert declared_confounding(build_config("tiny", {"data": {"dataset": "dkt-synth", "gamma": 0.0}})) is None
    own = build_config("tiny", {"data": {"dataset": "dkt-synth"}, "evaluation": {"unrecorded_confounding": WORDS}})
    assert declared_confounding(own) == {"declared": WORDS, "by": "the run's [evaluation] unrecorded_confounding"}
    none = build_config("tiny", {"data": {"dataset": "dkt-synth"}, "evaluation": {"unrecorded_confounding": ""}})
    assert declared_confounding(none) is None  # "" declares none, over the world's
    assert declared_confounding(build_config("tiny", {"data": {"dataset": "tumour"}})) is None
    spec, table = long_case(spec=f'unrecorded_confounding = "the nurse\'s judgement"\n{GOOD_SPEC}')
    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(spec), "table": str(table)}})
    assert declared_confounding(cfg) == {"declared": "the nurse's judgement", "by": "the table spec"}
    plain, table = long_case()
    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(plain), "table": str(table)}})
    assert declared_confounding(cfg) is None


def _answer() -> dict:
    """A merged answer with a one-step effect, its bounds, one identified policy at the horizon asked and a sequential
    DR value: everything the declaration marks."""
    horizon = {"horizon": 2, "estimate": 0.6, "low": 0.55, "high": 0.65, "ess": 80.0, "reached": True,
               "supported": True, "n": 300}
    pol = {"value_sim": 0.58, "identified": {"answer": horizon, "horizons": [horizon]},
           "sequential_dr": {"estimate": 0.61, "low": 0.57, "high": 0.65, "n": 300, "ess": 45.0, "supported": True}}
    return {"one_step_effect": {"estimate": -0.08, "low": -0.11, "high": -0.05, "level": 0.9, "steps": 900,
                                "entities": 300, "model": -0.01},
            "sensitivity": {"model": "msm", "bounds": [{"gamma": 1.0, "low": -0.08, "high": -0.08, "low_ci": -0.11,
                                                       "high_ci": -0.05}], "sign_at_1": -1, "gamma_sign_change": 1.5},
            "propensities": {"source": "logged", "sites": {"logged": 2}},
            "policies": {"never": pol}, "whatif": {"reference": "never", "horizon": 2, "level": 0.9}}


def test_declared_confounding_marks_every_weighted_answer_not_identified_and_ranks_nothing():
    decl = {"declared": WORDS, "by": "the run's [evaluation] unrecorded_confounding"}
    plain = _answer()
    AnswerKinds().merge(Totals({}, 1), MergeContext(), plain)
    assert EvaluationAnswer.from_json(plain).ranked_at_asked  # undeclared: the identified value may be ranked
    answer = _answer()
    for q in (DeclaredConfounding(), AnswerKinds()):
        q.merge(Totals({}, 1), MergeContext(unrecorded_confounding=decl), answer)
    mark = f"not identified (declared unrecorded confounding: {WORDS})"
    assert answer["one_step_effect"]["not_identified"] == mark
    assert answer["policies"]["never"]["identified"]["not_identified"] == mark
    assert answer["policies"]["never"]["sequential_dr"]["not_identified"] == mark
    assert answer["kinds"][CHECKED]["identified"] == mark and answer["kinds"][CHECKED]["ranked"] is False
    ans = EvaluationAnswer.from_json(answer)
    assert not ans.ranked_at_asked and ans.unrecorded_confounding.declared == WORDS
    assert ans.policies["never"].sequential_dr.withheld
    con = Console(width=100, file=io.StringIO(), highlight=False)
    print_answers(con, answer, "world")
    out = con.file.getvalue()
    assert mark in " ".join(out.split()) and "What the logs identify" not in out
    assert "-0.080 (90% CI" not in out and "0.610" not in out  # the numbers are not printed as answers
    assert "Γ = 1: -0.080 to -0.080" in out  # the bounds are
    # the JSON keeps the numbers beside the mark (they are the bounds' Γ = 1 ends)
    assert answer["one_step_effect"]["estimate"] == -0.08
