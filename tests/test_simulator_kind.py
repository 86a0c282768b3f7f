"""The simulator's whole-trajectory numbers are printed as the kind they are (issue 42 item 4; ``queries.kinds``):
g-computation where the natural course matches the logs, the sites have propensities and no unrecorded confounder is
declared — then ranked at the horizon asked — and extrapolation, never ranked, everywhere else. Before, the table
was titled "Extrapolation … not ranked" even where the kind lines called the same numbers g-computation."""

from __future__ import annotations

import io

from rich.console import Console

from fcd_secure.cli.whatif import print_answers
from fcd_secure.queries.answers import EvaluationAnswer
from fcd_secure.queries.kinds import EXTRAPOLATION, G_COMPUTATION, AnswerKinds


def _answer(passes: bool = True, source: str | None = "logged", declared: bool = False, unseen: bool = False) -> dict:
    def pol(v, half, supported=True, effect=None):
        out = {"value_sim": v, "interval": {"estimate": v, "low": v - half, "high": v + half, "level": 0.9},
               "supported": supported}
        if effect is not None:  # the paired contrast to the reference, never
            out["effect"] = {"estimate": effect[0], "low": effect[1], "high": effect[2], "reference": "never"}
        return out
    answer = {
        "policies": {"never": pol(0.583, 0.033), "always": pol(0.847, 0.016, not unseen, (0.263, 0.240, 0.286)),
                     "early_on": pol(0.811, 0.021, effect=(0.227, 0.204, 0.250)),
                     "late_on": pol(0.644, 0.029, effect=(0.061, 0.053, 0.068))},
        "natural_course": {"passes": passes, "mean_abs_gap": 0.011},
        "propensities": {"source": source} if source else {},
        "whatif": {"level": 0.9, "reference": "never"},
    }
    if declared:
        answer["unrecorded_confounding"] = {"not_identified": "not identified (declared unrecorded confounding: U)",
                                            "declared": "U"}
    AnswerKinds().merge({}, None, answer)
    return answer


def _printed(answer: dict) -> str:
    buf = io.StringIO()
    print_answers(Console(file=buf, width=200), answer, "tumour")
    return " ".join(buf.getvalue().split())


def test_checked_simulator_numbers_are_g_computation_and_ranked_at_the_horizon_asked():
    answer = _answer()
    assert G_COMPUTATION in answer["kinds"] and EXTRAPOLATION not in answer["kinds"]
    assert answer["kinds"][G_COMPUTATION]["ranked"] is True
    ans = EvaluationAnswer.of(answer)
    assert ans.simulator_kind == G_COMPUTATION
    # always and early_on's value intervals overlap (0.831-0.863 against 0.790-0.832): a tie, not an order; late_on's
    # overlap never's too (0.615-0.673 against 0.550-0.616), but their paired contrast (0.053-0.068) excludes 0
    assert ans.simulated_ranking() == "always 0.847 ≈ early_on 0.811 > late_on 0.644 > never 0.583"
    said = _printed(answer)
    assert "G-computation by the simulator (tumour): whole trajectories" in said
    assert "Extrapolation" not in said and "never ranked" not in said
    assert "ranking over whole trajectories (g-computation" in said and "always 0.847 ≈ early_on 0.811" in said


def test_the_title_and_the_ranking_carry_the_horizon_asked():
    answer = _answer()
    answer["whatif"]["horizon"] = 10
    ans = EvaluationAnswer.of(answer)
    assert ans.simulator_title.startswith("G-computation by the simulator: the first 10 steps")
    assert ans.simulated_ranking_line().startswith("ranking over the first 10 steps (g-computation")
    said = _printed(answer)
    assert "the first 10 steps" in said and "whole trajectories" not in said.split("natural course")[0]


def test_unchecked_or_declared_simulator_numbers_stay_extrapolation_and_unranked():
    for answer in (_answer(passes=False), _answer(source=None), _answer(declared=True)):
        ans = EvaluationAnswer.of(answer)
        assert EXTRAPOLATION in answer["kinds"] and answer["kinds"][EXTRAPOLATION]["ranked"] is False
        assert ans.simulator_kind == EXTRAPOLATION and ans.simulated_ranking() is None
        said = _printed(answer)
        assert "Extrapolation (tumour): the simulator over whole trajectories" in said and "ranking over" not in said


def test_a_natural_course_without_a_single_standard_error_is_unchecked_not_a_misfit():
    # every step compared on one entity: no standard error, no verdict (passes None) and, with no step at all, no gap;
    # the kind line used to format the missing gap and crash, and to call an unchecked simulator a misfit
    for gap in (None, 0.02):
        answer = _answer()
        answer.pop("kinds")
        answer["natural_course"] = {"passes": None, "mean_abs_gap": gap}
        AnswerKinds().merge({}, None, answer)
        line = answer["kinds"][EXTRAPOLATION]["checked_by"]
        assert "not checkable" in line and "MISFIT" not in line
        assert ("n/a" in line) == (gap is None)
        assert EvaluationAnswer.of(answer).simulated_ranking() is None


def test_a_policy_no_logged_step_follows_blocks_the_ranking_and_says_so():
    ans = EvaluationAnswer.of(_answer(unseen=True))
    assert ans.simulator_kind == G_COMPUTATION and ans.simulated_ranking() is None
    assert ans.simulated_ranking_line() == ("no ranking over whole trajectories: no logged step follows always, so "
                                            "its value is not identified")


def test_a_contrast_to_the_reference_whose_interval_holds_zero_is_a_tie():
    answer = _answer()
    answer["policies"]["late_on"]["effect"].update(low=-0.01, high=0.13)
    assert EvaluationAnswer.of(answer).simulated_ranking().endswith("late_on 0.644 ≈ never 0.583")


def test_a_pair_within_twice_the_natural_course_gap_is_a_tie_whatever_its_interval():
    """The intervals count only sampling; the simulator's own error is what the natural course measures. A pair whose
    paired contrast excludes 0 (late_on − never: 0.053 to 0.068) but whose difference, 0.061, is within twice the
    run's mean |gap| (2 × 0.031) is not ordered: over issue 42's runs 9 of 111 '>' claims were wrong, all on
    carry-over (e.g. never 0.468 > late_on 0.438 with a gap of 0.018, where the truth is 0.444 against 0.477)."""
    answer = _answer()
    answer["natural_course"]["mean_abs_gap"] = 0.031
    ans = EvaluationAnswer.of(answer)
    assert ans.rank_margin == 2 * 0.031
    assert ans.simulated_ranking() == "always 0.847 ≈ early_on 0.811 > late_on 0.644 ≈ never 0.583"
    assert "more than 2× the natural course's mean |gap| 0.031" in ans.simulated_ranking_line()
    answer["natural_course"]["mean_abs_gap"] = 0.030  # 0.061 > 0.060: apart again
    assert EvaluationAnswer.of(answer).simulated_ranking().endswith("late_on 0.644 > never 0.583")
    answer["natural_course"]["mean_abs_gap"] = float("nan")  # no measured error: no pair is apart
    assert " > " not in EvaluationAnswer.of(answer).simulated_ranking()


def test_a_pair_the_late_rounds_order_the_other_way_is_a_tie():
    """A run's late rounds are models of about equal standing; where one of them orders a pair the other way on the
    validation rows, the picked round's order of it is the pick's, not the data's (queries.round_values). Fresh
    carry-over seed 13 printed `always 0.391 > late_on 0.303` with truths 0.349 and 0.463: its rounds 10-20
    disagreed."""
    answer = _answer()
    late = {"10": {"always": 0.84, "early_on": 0.80, "late_on": 0.66, "never": 0.58},
            "20": {"always": 0.85, "early_on": 0.82, "late_on": 0.57, "never": 0.59}}  # round 20: never above late_on
    answer["round_values"] = {"horizon": None, "rows": "validation", "rounds": late}
    ans = EvaluationAnswer.of(answer)
    assert ans.simulated_ranking() == "always 0.847 ≈ early_on 0.811 > late_on 0.644 ≈ never 0.583"
    assert "rounds 10, 20 order it alike on the validation rows" in ans.simulated_ranking_line()
    late["20"]["late_on"] = 0.62  # now every late round agrees: apart again
    assert EvaluationAnswer.of(answer).simulated_ranking().endswith("late_on 0.644 > never 0.583")
    # a policy the run's rounds did not value (a later question's own) is not checked, and the line says so
    del late["10"]["early_on"], late["20"]["early_on"]
    assert "(early_on: not valued there, not checked)" in EvaluationAnswer.of(answer).simulated_ranking_line()
    # the rounds were simulated over whole trajectories: a question at another horizon is not checked against them
    answer["whatif"]["horizon"] = 10
    late["20"]["late_on"] = 0.57
    ans = EvaluationAnswer.of(answer)
    assert ans.checked_rounds is None and ans.simulated_ranking().endswith("late_on 0.644 > never 0.583")
    assert "order it alike" not in ans.simulated_ranking_line()


def test_the_html_report_titles_and_ranks_as_the_terminal_does():
    from fcd_secure.experiments.report_html import _answers_html

    page = "".join(_answers_html(EvaluationAnswer.of(_answer())))
    assert "<h3>G-computation by the simulator: whole trajectories" in page
    assert 'class="ranking"' in page and "always 0.847 ≈ early_on 0.811 &gt; late_on 0.644 &gt; never 0.583" in page
    page = "".join(_answers_html(EvaluationAnswer.of(_answer(passes=False))))
    assert "<h3>Extrapolation: the simulator over whole trajectories" in page and 'class="ranking"' not in page
