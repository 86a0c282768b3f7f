"""DKT-Synth: oracle integrity, its clock context and anchors, the propensity floor and zero support, the oracle's
outcomes, confounding, describe, and what a run on it sets. The contract every generated world keeps (layout, replay,
propensities, seeds, batching, the truth's definition, policy values, config errors) is in ``test_worlds.py``."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
from world_cases import tiny_world

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
from fcd_secure.data.spec import DataError

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def tiny():
    return tiny_world("dkt-synth")


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
def test_the_context_is_the_clock_and_the_anchors_are_the_most_logged_items(tiny):
    """DKT-Synth's own columns and anchors (the contract every world keeps: ``test_worlds.py``)."""
    for ds in tiny.train + tiny.test:
        valid = ds.M > 0
        # A is the exogenous normalised step index: identical for every row wherever the step is valid
        steps = np.broadcast_to(np.arange(ds.L) / (ds.L - 1), ds.M.shape)
        assert np.allclose(ds.A[..., 0][valid], steps[valid])
    # anchors: the two most-logged actions over the training data, a_off the most logged, each well supported
    T = np.concatenate([d.T[d.M > 0] for d in tiny.train])
    counts = np.bincount(T, minlength=N_ITEMS)
    a_off, a_on = tiny.anchors
    assert counts[a_off] == counts.max() and counts[a_on] == np.sort(counts)[-2] and a_off != a_on
    assert counts[a_on] / len(T) > 0.15


def test_logged_propensities_are_the_policy_probabilities(tiny):
    pi = tiny.logging_propensities(None, "train")  # [n, L, 2] for (a_off, a_on)
    ids = tiny.student_ids(None, "train")
    T, P = tiny.T_all[ids], tiny.P_all[ids]
    for k, a in enumerate(tiny.anchors):
        taken = (T == a) & ~np.isnan(pi[..., k])
        assert taken.sum() > 50
        assert np.allclose(pi[..., k][taken], P[taken], rtol=0, atol=1e-12)


def test_epsilon_floor_and_zero_support(tiny):
    pi = tiny.logging_propensities(None, "train")
    assert np.nanmin(pi) >= tiny.cfg.epsilon
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


def test_fresh_noise_is_uniform_and_keyed():
    u = fresh_uniforms(7, np.arange(200), np.arange(1, 9), np.arange(30))
    assert u.shape == (200, 8, 30) and 0 <= u.min() and u.max() < 1
    assert abs(u.mean() - 0.5) < 0.01 and abs(u.var() - 1 / 12) < 0.005
    assert np.array_equal(fresh_uniforms(7, np.array([5]), np.array([3]), np.array([4]))[0, 0, 0], u[5, 2, 4])
    assert not np.array_equal(fresh_uniforms(8, np.arange(200), np.arange(1, 9), np.arange(30)), u)


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


def test_describe_reports_support_confounding_and_truth(tiny):
    d = tiny.describe(policy_values=True)
    assert d["anchors"] == {"a_off": tiny.anchors[0], "a_on": tiny.anchors[1]}
    assert d["anchor_share_train"]["a_off"] >= d["anchor_share_train"]["a_on"] > 0.15
    assert d["anchor_propensity_train"]["a_on"]["p01"] >= tiny.cfg.epsilon
    assert d["anchor_propensity_train"]["a_on"]["zero_cells"] == 0
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
