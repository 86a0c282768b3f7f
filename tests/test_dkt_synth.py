"""DKT-Synth: oracle integrity, the generator's contract, CRN replay, confounding and the ground-truth API."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from fcd_secure.data.dkt_synth import (
    N_ITEMS,
    DKTSynthConfig,
    OracleChecksumError,
    generate,
    load_oracle,
)
from fcd_secure._io import file_sha256
from fcd_secure.data.dkt_synth.oracle import ORACLE_CARD, ORACLE_WEIGHTS, roc_auc
from fcd_secure.data.dkt_synth.noise import fresh_uniforms
from fcd_secure.data.partition import dirichlet_assignment, site_splits
from fcd_secure.data.policy import anchor_actions, default_policies
from fcd_secure.data.spec import DataError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


class LoggedReplay:
    """Replays each test student's logged actions (rollout-major rows) and records the y history it is shown."""

    def __init__(self, T: np.ndarray) -> None:
        self.T = T
        self.seen: np.ndarray | None = None

    def actions(self, t, y_hist, lengths, a_off, a_on):
        R = len(lengths) // len(self.T)
        self.seen = y_hist.copy()
        return np.tile(self.T[:, t], R)


@pytest.fixture(scope="module")
def tiny():
    return generate(DKTSynthConfig.from_preset("tiny"))


# -- oracle -------------------------------------------------------------------------------------------------
def test_shipped_oracle_is_small_verified_and_carded():
    model, card = load_oracle()
    assert ORACLE_WEIGHTS.stat().st_size < 300_000
    assert card["weights_sha256"] == file_sha256(ORACLE_WEIGHTS)
    assert card["n_items"] == N_ITEMS == model.n_items and len(card["skill_ids"]) == N_ITEMS
    assert card["test_auc"] > 0.75  # a real knowledge tracer, not noise
    assert len(card["data_sha256"]) == 64 and isinstance(card["seed"], int) and card["epochs"] >= 1
    assert json.loads(ORACLE_CARD.read_text()) == card


def test_tampered_oracle_is_refused_with_both_hashes(tmp_path):
    bad = tmp_path / "dkt_oracle.pt"
    shutil.copy(ORACLE_WEIGHTS, bad)
    shutil.copy(ORACLE_WEIGHTS.with_name(ORACLE_WEIGHTS.name + ".sha256"), tmp_path / "dkt_oracle.pt.sha256")
    load_oracle(bad)  # an intact copy loads
    raw = bytearray(bad.read_bytes())
    raw[len(raw) // 2] ^= 0x01
    bad.write_bytes(bytes(raw))
    want = (tmp_path / "dkt_oracle.pt.sha256").read_text().split()[0]
    with pytest.raises(OracleChecksumError) as exc:
        load_oracle(bad)
    msg = str(exc.value)
    assert str(bad) in msg and want in msg and file_sha256(bad) in msg
    with pytest.raises(OracleChecksumError):
        generate(DKTSynthConfig.from_preset("tiny", oracle_path=str(bad)))
    (tmp_path / "dkt_oracle.pt.sha256").unlink()
    with pytest.raises(OracleChecksumError, match="missing"):
        load_oracle(bad)


def test_roc_auc_matches_pairwise_definition():
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, 200)
    s = np.round(rng.normal(size=200) + y, 1)  # rounding creates ties
    pos, neg = s[y == 1], s[y == 0]
    pairwise = ((pos[:, None] > neg[None, :]) + 0.5 * (pos[:, None] == neg[None, :])).mean()
    assert roc_auc(y, s) == pytest.approx(pairwise, abs=1e-12)


# -- generator contract --------------------------------------------------------------------------------------
def test_world_layout_and_contract(tiny):
    cfg = tiny.cfg
    assert tiny.n_actions == N_ITEMS and len(tiny.train) == len(tiny.test) == cfg.n_sites == 10
    ids = np.concatenate([d.meta["entity"] for d in tiny.train + tiny.test])
    assert np.array_equal(np.sort(ids), np.arange(cfg.n_students))  # splits are disjoint and cover everyone
    for s, (tr, te) in enumerate(zip(tiny.train, tiny.test)):
        for ds in (tr, te):
            assert ds.n >= 1 and ds.dx == 4 and ds.da == 1 and ds.L == cfg.max_len and ds.P is not None
            assert (tiny.site_of[ds.meta["entity"]] == s).all()
            lengths = ds.lengths
            assert lengths.min() >= cfg.max_len // 2 and lengths.max() <= cfg.max_len
            valid = ds.M > 0
            assert (ds.P[valid] >= cfg.epsilon).all() and (ds.P[valid] <= 1).all()
            # A is the exogenous normalised step index: identical for every row wherever the step is valid
            steps = np.broadcast_to(np.arange(ds.L) / (ds.L - 1), ds.M.shape)
            assert np.allclose(ds.A[..., 0][valid], steps[valid])
    # anchors: the two most-logged actions over the training data, a_off the most logged, each well supported
    T = np.concatenate([d.T[d.M > 0] for d in tiny.train])
    counts = np.bincount(T, minlength=N_ITEMS)
    a_off, a_on = tiny.anchors
    assert counts[a_off] == counts.max() and counts[a_on] == np.sort(counts)[-2] and a_off != a_on
    assert counts[a_on] / len(T) > 0.15
    assert anchor_actions(tiny.train) == tiny.anchors  # the data layer's rule agrees
    # site sizes vary (Dirichlet) but none is empty
    sizes = np.array([tr.n + te.n for tr, te in zip(tiny.train, tiny.test)])
    assert sizes.min() >= 2 and sizes.max() > sizes.min()


def test_sites_splits_and_anchors_follow_the_projects_rules(tiny):
    """One Dirichlet rule, one per-site train/test rule, one anchor rule for every dataset (no private copies)."""
    cfg = tiny.cfg
    site_of = dirichlet_assignment(np.zeros(cfg.n_students, dtype=np.int64), cfg.n_sites, cfg.dirichlet_alpha, cfg.seed)
    assert np.array_equal(tiny.site_of, site_of)
    assert np.bincount(site_of).min() >= max(2, int(0.1 * cfg.n_students / cfg.n_sites))  # the project's minimum
    for s, (tr, te) in enumerate(site_splits(site_of, cfg.n_sites, cfg.test_fraction, cfg.seed)):
        assert np.array_equal(tiny.train[s].meta["entity"], tr)
        assert np.array_equal(tiny.test[s].meta["entity"], te)
    assert tiny.anchors == anchor_actions(tiny.train)


def test_replay_of_logged_actions_reproduces_logged_outcomes_exactly(tiny):
    for s in range(tiny.n_sites):
        for split, sets in (("train", tiny.train), ("test", tiny.test)):
            assert np.array_equal(tiny.replay_logged(s, split), sets[s].Y)


def test_logged_propensities_are_the_policy_probabilities(tiny):
    pi = tiny.logging_propensities(None, "train")  # [n, L, 2] for (a_off, a_on)
    ids = tiny.student_ids(None, "train")
    T, P = tiny.T_all[ids], tiny.P_all[ids]
    for k, a in enumerate(tiny.anchors):
        taken = (T == a) & ~np.isnan(pi[..., k])
        assert taken.sum() > 50
        assert np.allclose(pi[..., k][taken], P[taken], rtol=0, atol=1e-12)


def test_same_seed_same_data_and_truth_different_seed_different_data(tiny):
    again = generate(DKTSynthConfig.from_preset("tiny"))
    other = generate(DKTSynthConfig.from_preset("tiny", seed=1))
    for a, b, c in zip(tiny.train + tiny.test, again.train + again.test, other.train + other.test):
        for key in ("X", "A", "T", "Y", "M", "P"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert np.array_equal(tiny.true_effects(None, "test"), again.true_effects(None, "test"))
    assert not np.array_equal(tiny.train[0].X, other.train[0].X)
    assert not np.array_equal(tiny.T_all, other.T_all) and not np.array_equal(tiny.Y_all, other.Y_all)


def test_epsilon_floor_and_zero_support():
    floored = generate(DKTSynthConfig.from_preset("tiny"))
    pi = floored.logging_propensities(None, "train")
    assert np.nanmin(pi) >= floored.cfg.epsilon
    # with ε = 0 the tutor's "skip mastered items" rule leaves anchors with exactly zero propensity somewhere
    bare = generate(DKTSynthConfig.from_preset("tiny", epsilon=0.0))
    pi0 = bare.logging_propensities(None, "train")
    assert (pi0 == 0).sum() > 0
    for ds in bare.train:
        assert (ds.P[ds.M > 0] > 0).all()  # a logged (taken) action always had support


# -- ground truth ---------------------------------------------------------------------------------------------
def test_outcome_probs_do_drive_the_logged_outcomes(tiny):
    for t in (0, tiny.anchor_step, tiny.L - 1):
        for s in (0, 3):
            ds = tiny.train[s]
            p = tiny.outcome_probs_do(s, "train", None, t, ds.T[:, t])
            valid = ds.M[:, t] > 0
            assert np.isnan(p[~valid]).all() and ((p[valid] > 0) & (p[valid] < 1)).all()
            u = tiny.U[ds.meta["entity"], t]
            assert np.array_equal((u < p)[valid], ds.Y[valid, t] > 0)  # Y_t = 1[U_it < p_t(T_t)]
    a_off, a_on = tiny.anchors
    diff = tiny.outcome_probs_do(0, "test", None, 4, a_on) - tiny.outcome_probs_do(0, "test", None, 4, a_off)
    assert np.nanstd(diff) > 0.01  # the item effect depends on the student's state


def test_true_effects_definition_and_batch_invariance(tiny):
    a_off, a_on = tiny.anchors
    t0 = tiny.anchor_step
    one = tiny.true_effects(2, "test", anchor=t0, horizon=1)
    exact = tiny.outcome_probs_do(2, "test", None, t0, a_on) - tiny.outcome_probs_do(2, "test", None, t0, a_off)
    assert np.allclose(one, exact, atol=1e-12)  # one step needs no Monte Carlo
    tau = tiny.true_effects(None, "test")
    assert tau.shape == (sum(d.n for d in tiny.test),) and np.isfinite(tau).all()
    assert tau.std() > 0.02  # heterogeneous
    # counter-based noise: a row's truth does not depend on which other rows are in the batch
    site3 = tiny.true_effects(3, "test")
    start = sum(d.n for d in tiny.test[:3])
    assert np.allclose(site3, tau[start : start + len(site3)], atol=1e-12)
    assert np.allclose(tiny.true_effects(3, "test", rows=[1]), site3[1:2], atol=1e-12)
    # the multi-step effect is not the one-step effect: practice changes future mastery
    assert not np.allclose(tiny.true_effects(None, "test", horizon=1), tau, atol=1e-3)


def test_fresh_noise_is_uniform_and_keyed():
    u = fresh_uniforms(7, np.arange(200), np.arange(1, 9), np.arange(30))
    assert u.shape == (200, 8, 30) and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert np.array_equal(fresh_uniforms(7, np.array([5]), np.array([3]), np.array([4]))[0, 0, 0], u[5, 2, 4])
    assert not np.array_equal(fresh_uniforms(8, np.arange(200), np.arange(1, 9), np.arange(30)), u)


def test_policy_values_crn_replay_and_site_consistency(tiny):
    ids = tiny.student_ids(None, "test")
    replay = LoggedReplay(tiny.T_all[ids])
    per = tiny.policy_value_per_rollout(replay, None, "test", n_rollouts=1)
    # rollout 0 uses the logged noise, so following the logged actions regenerates the logged outcomes
    Y = tiny.Y_all[ids]
    M = np.arange(tiny.L)[None, :] < tiny.lengths[ids][:, None]
    assert np.array_equal(replay.seen[:, : tiny.L - 1][M[:, :-1]], Y[:, :-1][M[:, :-1]])
    assert 0 < per[0] < 1
    policies = {p.name: p for p in default_policies()}
    assert set(policies) == {"never", "always", "early_on", "late_on"}
    values = {n: tiny.true_policy_value(p) for n, p in policies.items()}
    for v, se in values.values():
        assert 0 < v < 1 and 0 < se < 0.02
    assert abs(values["always"][0] - values["never"][0]) > 3 * (values["always"][1] + values["never"][1])
    # per-site values, weighted by site size, add up to the pooled value (noise is keyed per student)
    pooled = values["early_on"][0]
    sizes = np.array([d.n for d in tiny.test])
    by_site = np.array([tiny.true_policy_value(policies["early_on"], site=s)[0] for s in range(tiny.n_sites)])
    assert (by_site * sizes).sum() / sizes.sum() == pytest.approx(pooled, abs=1e-12)


def test_confounding_is_real_and_ipw_with_true_propensities_recovers_the_truth():
    """Seeded, test-sized world with ~18,000 logged training steps (seed-to-seed sd of the IPW error ~0.03).

    The contrast is the one-step a_on - a_off effect over every valid logged step (its truth from
    outcome_probs_do); at the anchor step alone the same holds for the naive gap.
    """
    cfg = DKTSynthConfig(preset="test", n_students=3000, max_len=10, anchor_step=3, horizon=3, n_rollouts=2)
    world = generate(cfg)
    c = world.anchor_contrasts("train")
    assert c["n_on"] > 3000 and c["n_off"] > 3000
    assert abs(c["naive"] - c["true"]) > 0.2  # naive treated-minus-untreated is badly confounded
    assert abs(c["ipw"] - c["true"]) < 0.08  # re-weighting by the true propensities removes it
    at = world.anchor_contrasts("train", t=cfg.anchor_step)
    assert abs(at["naive"] - at["true"]) > 0.15
    # without the history/confounder-driven policy (γ = 0) the naive contrast is close to the truth
    flat = generate(cfg.model_copy(update={"gamma": 0.0})).anchor_contrasts("train")
    assert abs(flat["naive"] - flat["true"]) < 0.06


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="epsilon"):
        DKTSynthConfig.from_preset("tiny", epsilon=0.05)
    with pytest.raises(ValidationError, match="anchor_step"):
        DKTSynthConfig.from_preset("tiny", anchor_step=6)
    with pytest.raises(ValidationError, match="n_students"):
        DKTSynthConfig.from_preset("tiny", n_students=10)
    with pytest.raises(ValueError, match="unknown DKT-Synth preset"):
        DKTSynthConfig.from_preset("huge")
    with pytest.raises(ValidationError):
        DKTSynthConfig.from_preset("tiny", no_such_field=1)


def test_chunked_batches_give_the_same_truth(tiny, monkeypatch):
    import fcd_secure.data.dkt_synth.truth as truth_mod

    early = [p for p in default_policies() if p.name == "early_on"][0]
    whole_tau, whole_v = tiny.true_effects(None, "test"), tiny.policy_value_per_rollout(early)
    monkeypatch.setattr(truth_mod, "MAX_BATCH_ROWS", 40)  # many small LSTM batches
    assert np.allclose(tiny.true_effects(None, "test"), whole_tau, atol=1e-12)
    assert np.allclose(tiny.policy_value_per_rollout(early), whole_v, atol=1e-12)


def test_describe_reports_support_confounding_and_truth(tiny):
    d = tiny.describe(policy_values=True)
    json.dumps(d)  # plain JSON-able numbers for `--json` output
    assert d["anchors"] == {"a_off": tiny.anchors[0], "a_on": tiny.anchors[1]}
    assert sum(d["n_train"]) + sum(d["n_test"]) == tiny.cfg.n_students and len(d["n_train"]) == tiny.n_sites
    assert d["anchor_share_train"]["a_off"] >= d["anchor_share_train"]["a_on"] > 0.15
    assert d["anchor_propensity_train"]["a_on"]["p01"] >= tiny.cfg.epsilon
    assert d["anchor_propensity_train"]["a_on"]["zero_cells"] == 0
    assert d["true_ate_test"] == pytest.approx(float(np.mean(tiny.true_effects(None, "test"))), abs=1e-12)
    assert set(d["true_policy_values_test"]) == {"never", "always", "early_on", "late_on"}
    c = d["one_step_contrast_train"]
    assert abs(c["naive"] - c["true"]) > 0.2  # even the tiny preset is visibly confounded
    # how much of each anchor regime the logs show over the effect window: shorter runs than the window's are common,
    # whole-window runs rare (the "always" regimes are extrapolated from them)
    for s in d["regime_support_train"].values():
        assert s["n"] == sum(d["n_train"]) and 0 <= s["whole"] < s["first_step"] < s["n"]


def test_gamma_and_effect_horizon_of_the_run_config_reach_the_dkt_synth_generator():
    """``data.gamma`` and ``data.effect_horizon`` build the DKT-Synth world a run scores against: γ = 0 changes the
    logged actions (not just a label), the effect horizon changes which true effects PEHE is measured on, and
    neither world is answered from the other's cache."""
    from fcd_secure.config import ConfigError, build_config
    from fcd_secure.federation import learner

    default = build_config("tiny", {})
    flat = build_config("tiny", {"data": {"gamma": 0.0}})
    one = build_config("tiny", {"data": {"effect_horizon": 1}})
    fd, fd0, fd1 = (learner.load_federated(c) for c in (default, flat, one))
    assert fd.oracle.cfg.gamma == 1.5 and fd0.oracle.cfg.gamma == 0.0 and default.data.world_options() == {}
    assert not np.array_equal(fd0.train[0].T, fd.train[0].T)
    assert fd1.oracle.horizon == 1 and fd.oracle.horizon == 4
    np.testing.assert_array_equal(fd1.train[0].T, fd.train[0].T)  # the same world, another question of it
    np.testing.assert_allclose(fd1.oracle.true_effects(0, "test"), fd.oracle.true_effects(0, "test", horizon=1))
    assert not np.allclose(fd1.oracle.true_effects(0, "test"), fd.oracle.true_effects(0, "test"))
    assert len({learner.data_key(c) for c in (default, flat, one)}) == 3
    # the window only changes what the run is scored on: a checkpoint resumes across it, not across another γ
    assert one.training_hash() == default.training_hash() != flat.training_hash()
    with pytest.raises(DataError, match="horizon") as err:
        learner.load_federated(build_config("tiny", {"data": {"effect_horizon": 11}}))  # anchor 2 + 11 > L = 12
    assert err.value.field == "effect_horizon"
    with pytest.raises(ConfigError, match="effect_horizon"):
        build_config("tiny", {"data": {"dataset": "statics2011", "effect_horizon": 1}})


def test_an_effect_horizon_past_the_trajectories_is_exit_2_before_any_site_starts(tmp_path):
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app

    cfg = tmp_path / "run.toml"
    cfg.write_text("[data]\neffect_horizon = 11\n")  # tiny: anchor step 2 + 11 > 12 steps
    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--preset", "tiny", "--config", str(cfg), "--sites", "2", "--rounds", "1",
                                   "--no-secure-aggregation", "--out", str(out), "--json"])
    assert res.exit_code == 2, res.output
    assert "horizon" in res.output and not out.exists()
