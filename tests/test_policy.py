"""Declarative policies (paper §IV-A "Reference policy family"): the four files, their action patterns, anchors,
and clear errors for bad files."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.data.policy import (
    POLICY_DIR,
    PolicyLike,
    anchor_actions,
    default_policies,
    load_policies,
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
    names = {p.name for p in load_policies(POLICY_DIR)}
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
