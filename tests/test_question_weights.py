"""A what-if question on an action only one patient received (issue 44 finding 2; docs/threats.md P44).

The site's differencing budget (``queries.budget``) compared a stochastic policy's rows on a grid of log-odds: odds on
the rare action moved by 2-6 % moved only that patient's weight, the grid read it as unchanged, and the site answered
each question as an already-answered cohort, for free. Each answer then differed by exactly that patient's weighted
term. The test runs the real budget (its record file in a site folder) and the real weights of the estimators.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from fcd_secure.audit import Refusal  # noqa: E402
from fcd_secure.queries.budget import QUESTION_SLOT, admit_question, cohort_difference, cohort_signature  # noqa: E402
from fcd_secure.queries.incremental import attach_behaviour, incremental_target_probs  # noqa: E402
from test_incremental_policy import K_ON, incremental, two_step_world  # noqa: E402

MIN_DIFFERENCE = 20


def rare_action_site():
    """Training and test rows of a three-action world in which only test patient 0 ever received action 2."""
    train, test = two_step_world(2000, 11), two_step_world(300, 12)
    for ds in (train, test):
        moved = ds.T == 2
        ds.T[moved], ds.P[moved] = 0, 0.5
    test.T[0, 0], test.P[0, 0] = 2, 0.2
    return train, test


def test_P44_odds_on_an_action_one_patient_received_are_not_a_free_repeat_of_an_answered_cohort(tmp_path):
    """P44. The attack: "as logged" (δ = 1 on action 2) is answered; then δ = 1.02, 1.04, 1.06. Each moves patient 0's
    weight by ~1.6 % and every other weight by 2e-8, so the differences of the answers are patient 0's term alone.
    On the grid the site read every later question as the answered cohort and answered it for free; now the moves are
    compared by size: one entity moves, so the question is refused, and nothing new is recorded."""
    train, test = rare_action_site()
    record = tmp_path / "slots" / QUESTION_SLOT
    record.parent.mkdir()
    weights = {}
    for delta in (1.0, 1.02, 1.04, 1.06):
        (pol,) = attach_behaviour([incremental(delta, action=2, name="odds")], train, seed=0)
        weights[delta] = incremental_target_probs(pol, test, (0, K_ON))[0] / test.P
    # what the answers' difference reads: patient 0's weight moves, every other weight by a hundred-millionth
    moves = np.abs(weights[1.04] - weights[1.0]).max(axis=1)
    assert moves[0] > 0.01 and moves[1:].max() < 1e-7

    (logged,) = attach_behaviour([incremental(1.0, action=2, name="odds")], train, seed=0)
    admit_question([logged], test, (0, K_ON), 2, MIN_DIFFERENCE, record)
    before = record.read_bytes()
    for delta in (1.02, 1.04, 1.06):
        (pol,) = attach_behaviour([incremental(delta, action=2, name="odds")], train, seed=0)
        assert cohort_difference(cohort_signature(pol, test, (0, K_ON), 2),
                                 cohort_signature(logged, test, (0, K_ON), 2)) == 1
        with pytest.raises(Refusal) as exc:
            admit_question([pol], test, (0, K_ON), 2, MIN_DIFFERENCE, record)
        assert (exc.value.rule, exc.value.key) == ("eval_cohort", "answered_cohort")
    assert record.read_bytes() == before

    # the same question again is the same cohort: free, nothing recorded
    admit_question([logged], test, (0, K_ON), 2, MIN_DIFFERENCE, record)
    assert record.read_bytes() == before
    # a question about a common action moves every patient's weight: a new cohort, admitted and recorded
    (common,) = attach_behaviour([incremental(2.0, name="twice")], train, seed=0)
    admit_question([common], test, (0, K_ON), 2, MIN_DIFFERENCE, record)
    assert len(json.loads(record.read_text())["cohorts"]) == 2


def test_P44_within_one_question_the_moves_count_by_size_not_on_a_grid():
    """P44: two policies of one question whose weights differ on patient 0 only (by 2 %) are refused; any odds on the
    rare action count as one entity whatever the size of the move."""
    train, test = rare_action_site()
    for delta in (1.02, 1.3, 10.0):
        pair = attach_behaviour([incremental(1.0, action=2, name="as_logged"),
                                 incremental(delta, action=2, name="rare")], train, seed=0)
        with pytest.raises(Refusal) as exc:
            admit_question(pair, test, (0, K_ON), 2, MIN_DIFFERENCE, record=None)
        assert exc.value.key == "policy_difference"


def test_an_unreadable_or_older_record_is_refused_not_restarted(tmp_path):
    """The record of answered cohorts is never silently replaced: a damaged one, or one of the grid format (no
    version), refuses every question until an operator looks."""
    train, test = rare_action_site()
    (pol,) = attach_behaviour([incremental(2.0, name="twice")], train, seed=0)
    record = tmp_path / QUESTION_SLOT
    for text in ("{not json", json.dumps({"cohorts": [{"ab": "cd"}]})):
        record.write_text(text)
        with pytest.raises(Refusal) as exc:
            admit_question([pol], test, (0, K_ON), 2, MIN_DIFFERENCE, record)
        assert exc.value.key == "unreadable"
        assert record.read_text() == text
