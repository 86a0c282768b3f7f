"""Declarative policies (paper §IV-A "Reference policy family"): the four files, their action patterns, anchors,
and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.data.policy import (
    PolicyLike,
    anchor_actions,
    default_policies,
    load_policies,
    policy_dir,
    load_policy,
)
from fcd_secure.data.schema import SiteDataset
from fcd_secure.data.spec import DataError

A_OFF, A_ON = 3, 7


def _plan(policy, lengths, L=6, Y=None):
    Y = np.zeros((len(lengths), L)) if Y is None else Y
    return policy.plan(Y, np.asarray(lengths), A_OFF, A_ON)


def test_default_policies_order_and_patterns():
    never, always, early, late = default_policies()
    assert [p.name for p in (never, always, early, late)] == ["never", "always", "early_on", "late_on"]
    lengths = [6, 5, 1]
    assert (_plan(never, lengths) == A_OFF).all()
    assert (_plan(always, lengths) == A_ON).all()
    e = _plan(early, lengths)
    l_ = _plan(late, lengths)
    # Early-on treats for t < length/2, Late-on for t >= length/2 (per trajectory)
    for row, n in enumerate(lengths):
        t = np.arange(6)
        np.testing.assert_array_equal(e[row], np.where(t < n / 2, A_ON, A_OFF))
        np.testing.assert_array_equal(l_[row], np.where(t >= n / 2, A_ON, A_OFF))
    assert e.dtype == np.int64


def test_actions_contract_shapes_and_prob():
    early = default_policies()[2]
    a = early.actions(2, np.zeros((3, 2)), np.array([6, 4, 2]), A_OFF, A_ON)
    assert a.dtype == np.int64 and a.shape == (3,)
    assert a.tolist() == [A_ON, A_OFF, A_OFF]
    assert early.on(2, np.zeros((3, 2)), np.array([6, 4, 2])).tolist() == [True, False, False]
    p = early.prob(2, np.zeros((3, 2)), np.array([6, 4, 2]), A_OFF, A_ON, logged=np.array([A_ON, A_ON, A_OFF]))
    assert p.tolist() == [1.0, 0.0, 1.0]


def test_load_policies_folder_matches_defaults():
    names = {p.name for p in load_policies(policy_dir())}
    assert {"never", "always", "early_on", "late_on"} <= names


def test_switch_and_threshold_rules(tmp_path):
    (tmp_path / "switch.toml").write_text('name = "switch_at_2"\n[rule]\nkind = "window"\nunit = "step"\nstart = 2\n')
    (tmp_path / "thr.toml").write_text(
        'name = "after_failure"\n[rule]\nkind = "threshold"\nvalue = 0.5\nwhen = "below"\nlookback = 1\n'
    )
    switch = load_policy(tmp_path / "switch.toml")
    assert _plan(switch, [6])[0].tolist() == [A_OFF, A_OFF, A_ON, A_ON, A_ON, A_ON]
    thr = load_policy(tmp_path / "thr.toml")
    Y = np.array([[1, 0, 1, 1, 0, 0]], dtype=float)
    # step 0 has no history (initial = false); afterwards treat right after a 0 outcome
    assert _plan(thr, [6], Y=Y)[0].tolist() == [A_OFF, A_OFF, A_ON, A_OFF, A_OFF, A_ON]
    assert [p.name for p in load_policies(tmp_path)] == ["switch_at_2", "after_failure"]


@pytest.mark.parametrize(
    "text, field",
    [
        ('name = "x"\n[rule]\nkind = "window"\nstart = 0.5\nstop = 0.2\n', "rule"),
        ('name = "x"\n[rule]\nkind = "window"\nstrat = 0.5\n', "rule.strat"),
        ('name = "x"\n[rule]\nkind = "sometimes"\n', "rule"),
        ('name = "x"\n[rule]\nkind = "constant"\non = "maybe"\n', "rule.on"),
        ('[rule]\nkind = "constant"\non = true\n', "name"),
    ],
)
def test_bad_policy_file_names_file_and_field(tmp_path, text, field):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(DataError) as exc:
        load_policy(path)
    assert exc.value.file == str(path)
    assert exc.value.field is not None and exc.value.field.startswith(field)
    assert str(path) in str(exc.value) and field in str(exc.value)


def test_unparsable_policy_and_duplicate_names(tmp_path):
    (tmp_path / "a.toml").write_text("name = [\n")
    with pytest.raises(DataError, match="does not parse"):
        load_policy(tmp_path / "a.toml")
    (tmp_path / "a.toml").write_text('name = "same"\n[rule]\nkind = "constant"\non = true\n')
    (tmp_path / "b.toml").write_text('name = "same"\n[rule]\nkind = "constant"\non = false\n')
    with pytest.raises(DataError, match="two policy files"):
        load_policies(tmp_path)


def _ds(T, M=None):
    T = np.asarray(T, dtype=np.int64)
    M = np.ones(T.shape, np.float32) if M is None else np.asarray(M, np.float32)
    n, L = T.shape
    return SiteDataset(X=np.zeros((n, 1), np.float32), A=np.zeros((n, L, 1), np.float32), T=T,
                       Y=np.zeros((n, L), np.float32), M=M, n_actions=6)


def test_anchor_actions_are_two_best_supported_over_valid_steps():
    # action 5 is frequent only on padding steps, so it must not count
    ds = _ds([[2, 2, 4, 5, 5], [4, 2, 1, 5, 5]], M=[[1, 1, 1, 0, 0], [1, 1, 1, 0, 0]])
    assert anchor_actions(ds) == (2, 4)
    other = _ds([[4, 4, 4, 4, 4]])
    assert anchor_actions([ds, other]) == (4, 2)  # pooled over sites
    with pytest.raises(DataError, match="fewer than two actions"):
        anchor_actions(_ds([[1, 1, 1]]))


def test_threshold_reads_the_last_lookback_outcomes_of_a_shorter_history(tmp_path):
    (tmp_path / "thr.toml").write_text(
        'name = "struggling"\n[rule]\nkind = "threshold"\nvalue = 0.75\nwhen = "below"\nlookback = 2\n'
    )
    thr = load_policy(tmp_path / "thr.toml")
    Y = np.array([[1, 1, 1, 0, 1, 1], [1, 1, 1, 1, 0, 0]], dtype=float)
    lengths = np.array([6, 6])
    t = 5
    # full history: mean of steps 3-4 -> row 0: (0 + 1)/2 = 0.5 < 0.75 (on); row 1: (1 + 0)/2 = 0.5 (on)
    full = thr.on(t, Y[:, :t], lengths)
    assert full.tolist() == [True, True]
    # a rollout that started at step 3 carries only Y[:, 3:5]; the decision must be the same, not "off" (NaN mean)
    assert thr.on(t, Y[:, 3:t], lengths).tolist() == full.tolist()
    # one column of history (start_t = 4): the mean of what there is
    assert thr.on(t, Y[:, 4:t], lengths).tolist() == [False, True]
    # only the last `lookback` columns count: older failures do not
    assert thr.on(3, np.array([[0.0, 1.0, 1.0]]), np.array([6])).tolist() == [False]
    assert thr.actions(t, Y[:, 3:t], lengths, A_OFF, A_ON).tolist() == [A_ON, A_ON]


def test_policies_are_the_one_policy_protocol():
    class OnlyActions:
        name = "x"

        def actions(self, t, y_hist, lengths, a_off, a_on):
            return np.full(len(lengths), a_off)

    assert all(isinstance(p, PolicyLike) for p in default_policies())
    assert not isinstance(OnlyActions(), PolicyLike)  # an OPE estimator also needs prob()


# -- policies that name actions ------------------------------------------------------------------------------------
LABELS = ["none", "insulin", "metformin", "both"]


def test_a_policy_names_actions_by_label_id_or_anchor(tmp_path):
    (tmp_path / "insulin.toml").write_text('name = "insulin_always"\n[rule]\nkind = "static"\naction = "insulin"\n')
    (tmp_path / "by_id.toml").write_text('name = "three"\n[rule]\nkind = "static"\naction = 3\n')
    (tmp_path / "switch.toml").write_text(
        'name = "metformin_then_both"\n[rule]\nkind = "switch"\nat = 2\nbefore = "metformin"\nafter = "both"\n')
    lengths = np.array([5, 3])
    pol = load_policy(tmp_path / "insulin.toml").bind(LABELS)
    assert _plan(pol, lengths, L=5).tolist() == [[1] * 5, [1] * 5]  # the label, whatever the anchors
    assert _plan(load_policy(tmp_path / "by_id.toml").bind(LABELS), lengths, L=3).tolist() == [[3] * 3] * 2
    sw = load_policy(tmp_path / "switch.toml").bind(LABELS)
    assert _plan(sw, lengths, L=5)[0].tolist() == [2, 2, 3, 3, 3]
    assert sw.labels == ["metformin", "both"] and not sw.uses_anchors
    assert default_policies()[1].uses_anchors and default_policies()[1].labels == []
    # a label needs the dataset's vocabulary: unbound, the policy refuses rather than guess an id
    with pytest.raises(ValueError, match="bind it"):
        _plan(load_policy(tmp_path / "insulin.toml"), lengths)
    # the same question travels to the sites as JSON and binds there
    again = type(pol).model_validate_json(load_policy(tmp_path / "insulin.toml").model_dump_json()).bind(LABELS)
    assert _plan(again, lengths).tolist() == _plan(pol, lengths).tolist()


def test_a_label_or_context_the_data_does_not_have_names_the_file_and_field(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text('name = "x"\n[rule]\nkind = "switch"\nat = 1\nbefore = "none"\nafter = "surgery"\n')
    with pytest.raises(DataError) as exc:
        load_policy(path).bind(LABELS)
    assert exc.value.file == str(path) and exc.value.field == "rule.after" and "surgery" in str(exc.value)
    path.write_text('name = "x"\n[rule]\nkind = "static"\naction = 9\n')
    with pytest.raises(DataError, match="outside the dataset's 4 actions"):
        load_policy(path).bind(LABELS)
    path.write_text('name = "x"\n[rule]\nkind = "threshold"\nsignal = "context:hba1c"\nvalue = 7\nthen = 1\n')
    with pytest.raises(DataError) as exc:
        load_policy(path).bind(LABELS, ["lab", "ward=a"])
    assert exc.value.field == "rule.signal" and "hba1c" in str(exc.value)
    for text, field in [
        ('name = "x"\n[rule]\nkind = "static"\naction = "anchor:middle"\n', "rule"),
        ('name = "x"\n[rule]\nkind = "static"\naction = -1\n', "rule"),
        ('name = "x"\n[rule]\nkind = "switch"\nat = 2\nbefore = 1\n', "rule.after"),
        ('name = "has space"\n[rule]\nkind = "static"\naction = 1\n', "name"),
        ('name = "x"\n[rule]\nkind = "threshold"\nvalue = 1\nsignal = "lab"\n', "rule"),
    ]:
        path.write_text(text)
        with pytest.raises(DataError) as exc:
            load_policy(path)
        assert exc.value.field is not None and exc.value.field.startswith(field), (text, exc.value)


def test_threshold_on_a_context_column_reads_contexts_up_to_t(tmp_path):
    (tmp_path / "t.toml").write_text(
        'name = "titrate"\n[rule]\nkind = "threshold"\nsignal = "context:lab"\nvalue = 7.0\nwhen = "above"\n'
        'lookback = 2\nthen = "insulin"\notherwise = "none"\n')
    pol = load_policy(tmp_path / "t.toml").bind(LABELS, ["ward=a", "lab"])
    assert pol.needs_context
    A = np.zeros((2, 4, 2))
    A[:, :, 1] = [[6.0, 8.0, 8.0, 5.0], [9.0, 9.0, 5.0, 5.0]]
    # the mean of the last 2 contexts up to and including t (A_t is known at decision time; t = 0 has only A_0):
    # row 0: 6, 7, 8, 6.5; row 1: 9, 9, 7, 5 -> "above 7" is insulin (id 1), else none (id 0)
    assert pol.plan(np.zeros((2, 4)), np.array([4, 4]), A_OFF, A_ON, A=A).tolist() == [[0, 0, 1, 0], [1, 1, 0, 0]]
    with pytest.raises(ValueError, match="context"):
        pol.actions(1, np.zeros((2, 1)), np.array([4, 4]), A_OFF, A_ON)


def test_policy_refs_are_files_or_shipped_names(tmp_path):
    from fcd_secure.data.policy import load_policy_refs

    (tmp_path / "mine.toml").write_text('name = "mine"\n[rule]\nkind = "static"\naction = "anchor:on"\n')
    pols = load_policy_refs(["never", str(tmp_path / "mine.toml")])
    assert [p.name for p in pols] == ["never", "mine"]
    assert [p.name for p in load_policy_refs([])] == ["never", "always", "early_on", "late_on"]
    with pytest.raises(DataError, match="no such policy file"):
        load_policy_refs(["sometimes"])
    with pytest.raises(DataError, match="two policy files"):
        load_policy_refs(["never", "never"])


def test_regime_support_counts_the_logged_trajectories_that_follow_a_regime_over_the_window():
    from fcd_secure.data.policy import regime_support

    T = np.array([[0, 1, 1, 1, 0],   # follows "always 1" over steps 1..3
                  [0, 1, 1, 0, 0],   # leaves it at step 3
                  [1, 1, 1, 9, 9],   # too short: steps 3, 4 are padding
                  [0, 0, 1, 1, 1]])  # not at the first step
    M = np.array([[1, 1, 1, 1, 1], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]])
    assert regime_support(T, M, 1, 1, 3) == {"n": 3, "first_step": 2, "whole": 1}
    assert regime_support(T, M, 1, 1, 1) == {"n": 4, "first_step": 3, "whole": 3}
    assert regime_support(T, M, 0, 0, 2) == {"n": 4, "first_step": 3, "whole": 1}
