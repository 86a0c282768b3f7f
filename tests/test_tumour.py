"""The tumour world (Geng et al. 2017 PK-PD oracle): the generator's contract, CRN replay, confounding, sites that
differ, and the ground-truth API."""

from __future__ import annotations

import json

import numpy as np
import pytest
from pydantic import ValidationError

from fcd_secure.data.partition import dirichlet_assignment, site_splits
from fcd_secure.data.policy import Policy, anchor_actions, default_policies
from fcd_secure.data.registry import load_federated
from fcd_secure.data.spec import DataError, context_dynamics
from fcd_secure.data.tumour import ACTION_LABELS, V_DEATH, TumourConfig, generate
from fcd_secure.data.tumour.pkpd import PatientParams, day, diameter_of, volume_of


class Recorder:
    """Replays a plan (or one action) on every rollout row and records what the rollout shows the policy."""

    needs_context = True

    def __init__(self, plan: np.ndarray | int, name: str = "recorder") -> None:
        self.plan, self.name = plan, name
        self.y: np.ndarray | None = None
        self.ctx: np.ndarray | None = None

    def actions(self, t, y_hist, lengths, a_off, a_on, context=None):
        self.y, self.ctx = y_hist.copy(), context.copy()
        if isinstance(self.plan, int):
            return np.full(len(lengths), self.plan, dtype=np.int64)
        return np.tile(self.plan[:, t], len(lengths) // len(self.plan))


def _policy(name: str, rule: dict) -> Policy:
    return Policy.model_validate({"name": name, "rule": rule})


@pytest.fixture(scope="module")
def tiny():
    return generate(TumourConfig.from_preset("tiny"))


# -- generator contract --------------------------------------------------------------------------------------
def test_world_layout_and_contract(tiny):
    cfg = tiny.cfg
    assert tiny.n_actions == 4 and len(tiny.train) == len(tiny.test) == cfg.n_sites == 10
    ids = np.concatenate([d.meta["entity"] for d in tiny.train + tiny.test])
    assert np.array_equal(np.sort(ids), np.arange(cfg.n_patients))  # splits are disjoint and cover everyone
    for s, (tr, te) in enumerate(zip(tiny.train, tiny.test)):
        for ds in (tr, te):
            assert ds.dx == 4 and ds.da == 2 and ds.L == cfg.max_len and ds.P is not None
            assert ds.meta["action_names"] == ["none", "chemo", "radio", "both"]
            assert context_dynamics(ds.meta, ds.da) == ["endogenous", "endogenous"]
            assert (tiny.site_of[ds.meta["entity"]] == s).all()
            valid = ds.M > 0
            assert ds.lengths.min() >= cfg.max_len // 2 and ds.lengths.max() <= cfg.max_len
            assert (ds.P[valid] >= cfg.epsilon).all() and (ds.P[valid] <= 1).all()
            # A is the logged tumour on each morning: volume over V(13 cm), diameter over 13 cm
            V = tiny.V_all[ds.meta["entity"], : cfg.max_len]
            assert np.allclose(ds.A[..., 0][valid], (V / V_DEATH)[valid], rtol=1e-6)
            assert np.allclose(ds.A[..., 1][valid], (diameter_of(V) / 13.0)[valid], rtol=1e-6)
            assert (ds.A[~valid] == 0).all() and (ds.Y[~valid] == 0).all()
            # Y_t = 1[the next diameter is at most 3 cm]
            Vn = tiny.V_all[ds.meta["entity"], 1:]
            assert np.array_equal(ds.Y[valid] > 0, (Vn <= volume_of(3.0))[valid])
            # X: patient type one-hot and the stage at diagnosis
            assert np.array_equal(ds.X[:, :3].sum(1), np.ones(ds.n)) and set(np.unique(ds.X[:, 3])) <= {0, .25, .5, .75, 1}
    # anchors: the project's rule picks "none" (most logged) and "chemo" (second)
    assert tiny.anchors == anchor_actions(tiny.train) == (0, 1)
    sizes = np.array([tr.n + te.n for tr, te in zip(tiny.train, tiny.test)])
    assert sizes.min() >= 2 and sizes.max() > sizes.min()


def test_sites_and_splits_follow_the_projects_rules(tiny):
    cfg = tiny.cfg
    site_of = dirichlet_assignment(np.zeros(cfg.n_patients, dtype=np.int64), cfg.n_sites, cfg.dirichlet_alpha, cfg.seed)
    assert np.array_equal(tiny.site_of, site_of)
    for s, (tr, te) in enumerate(site_splits(site_of, cfg.n_sites, cfg.test_fraction, cfg.seed)):
        assert np.array_equal(tiny.train[s].meta["entity"], tr)
        assert np.array_equal(tiny.test[s].meta["entity"], te)


def test_sites_differ_in_case_mix_and_practice():
    world = generate(TumourConfig.from_preset("default", n_rollouts=2))
    sp = world.site_params
    stage_mean = np.array([world.stage[world.site_of == s].mean() for s in range(world.n_sites)])
    # a site tilted towards later stages sees later stages (and larger tumours)
    assert np.corrcoef(sp["casemix_tilt"], stage_mean)[0, 1] > 0.8
    assert np.ptp(stage_mean) > 0.3
    d = world.describe(n_rollouts=2, policy_values=False)
    chemo = np.array([s["action_share"]["chemo"] + s["action_share"]["both"] for s in d["sites"]])
    radio = np.array([s["action_share"]["radio"] + s["action_share"]["both"] for s in d["sites"]])
    # each site's own practice shift moves its treatment shares
    assert np.corrcoef(sp["chemo_shift"], chemo)[0, 1] > 0.5 and np.corrcoef(sp["radio_shift"], radio)[0, 1] > 0.5


# -- common random numbers -----------------------------------------------------------------------------------
def test_replay_of_logged_actions_reproduces_logged_outcomes_exactly(tiny):
    for s in range(tiny.n_sites):
        for split, sets in (("train", tiny.train), ("test", tiny.test)):
            assert np.array_equal(tiny.replay_logged(s, split), sets[s].Y)


def test_counterfactual_arm_with_the_logged_actions_is_the_factual_arm(tiny):
    ids = tiny.patient_ids(None, "test")
    t0, H = tiny.anchor_step, tiny.L - tiny.anchor_step
    V = tiny.counterfactual_volumes(ids, t0, tiny.T_all[ids, t0:])
    # bit-for-bit on every logged day (same noise, same actions); V_{t+1} is logged while day t is valid, and the
    # logged T is 0 on padding, so the days after a patient's end follow another plan there
    logged = (t0 + np.arange(H + 1))[None, :] <= tiny.lengths[ids][:, None]
    assert np.array_equal(V[logged], tiny.V_all[ids, t0:][logged])
    # another arm differs only where its actions differ: no treatment before day t0 + 2 keeps the first two days
    alt = tiny.T_all[ids, t0:].copy()
    alt[:, 2:] = 3
    V2 = tiny.counterfactual_volumes(ids, t0, alt)
    assert np.array_equal(V2[:, :3], V[:, :3]) and not np.array_equal(V2, V)
    assert H == alt.shape[1]


def test_same_seed_same_data_and_truth_different_seed_different_data(tiny):
    again = generate(TumourConfig.from_preset("tiny"))
    other = generate(TumourConfig.from_preset("tiny", seed=1))
    for a, b in zip(tiny.train + tiny.test, again.train + again.test):
        for key in ("X", "A", "T", "Y", "M", "P"):
            assert np.array_equal(getattr(a, key), getattr(b, key)), key
    assert np.array_equal(tiny.true_effects(None, "test"), again.true_effects(None, "test"))
    never = default_policies()[0]
    assert np.array_equal(tiny.policy_value_per_rollout(never), again.policy_value_per_rollout(never))
    assert not np.array_equal(tiny.V_all, other.V_all) and not np.array_equal(tiny.T_all, other.T_all)


def test_rollout_zero_replays_the_log_and_contexts_follow_the_policy(tiny):
    ids = tiny.patient_ids(None, "test")
    logged = Recorder(tiny.T_all[ids])
    tiny.policy_values_of(logged, ids, n_rollouts=1)
    # with the logged actions, rollout 0 regenerates the logged outcomes and the logged (endogenous) contexts
    M = tiny._valid(ids)
    L = tiny.L
    assert np.array_equal(logged.y[:, : L - 1][M[:, :-1]], tiny.Y_all[ids][:, :-1][M[:, :-1]])
    A = np.concatenate([d.A for d in tiny.test])
    assert np.array_equal(logged.ctx[M], A[M])
    # under another policy the contexts are that policy's: "both" every day shrinks every tumour at least as much as
    # "none", rollout by rollout (same noise), and strictly for someone
    both, none = Recorder(3), Recorder(0)
    tiny.policy_values_of(both, ids, n_rollouts=4)
    tiny.policy_values_of(none, ids, n_rollouts=4)
    assert (both.ctx[..., 0] <= none.ctx[..., 0]).all() and (both.ctx[..., 0] < none.ctx[..., 0]).any()
    assert (both.y >= none.y).all()
    assert not np.array_equal(none.ctx[: len(ids)][M], A[M])  # not the logged contexts


def test_logged_propensities_are_the_policy_probabilities(tiny):
    pi = tiny.logging_propensities(None, "train", actions=[0, 1, 2, 3])
    ids = tiny.patient_ids(None, "train")
    valid = tiny._valid(ids)
    assert np.allclose(pi.sum(-1)[valid], 1.0)
    T, P = tiny.T_all[ids], tiny.P_all[ids]
    taken = np.take_along_axis(pi, T[:, :, None], axis=2)[..., 0]
    assert np.allclose(taken[valid], P[valid], rtol=0, atol=1e-12)
    assert np.nanmin(pi) >= tiny.cfg.epsilon


# -- ground truth ---------------------------------------------------------------------------------------------
def test_exact_response_probability_matches_the_realised_dynamics():
    """P(Y_t = 1 | state, a) in closed form against 200,000 simulated days of three patients."""
    params = PatientParams(rho=np.array([0.002, 0.01, 0.02]), alpha=np.array([0.05, 0.2, 0.01]),
                           beta_c=np.array([0.028, 0.03, 0.029]))
    V = volume_of(np.array([3.05, 3.3, 2.95]))
    C = np.array([0.0, 5.0, 2.0])
    rng = np.random.default_rng(0)
    n = 200_000
    for a in range(4):
        p = day(params, V, C, np.full(3, a), np.zeros(3), 0.01, float(volume_of(3.0)))[2]
        big = PatientParams(*(np.repeat(x, n) for x in (params.rho, params.alpha, params.beta_c)))
        y = day(big, np.repeat(V, n), np.repeat(C, n), np.full(3 * n, a), rng.standard_normal(3 * n), 0.01,
                float(volume_of(3.0)))[3]
        assert np.allclose(y.reshape(3, n).mean(1), p, atol=0.005), a


def test_outcome_probs_do_and_true_effects(tiny, monkeypatch):
    a_off, a_on = tiny.anchors
    t0 = tiny.anchor_step
    one = tiny.true_effects(2, "test", anchor=t0, horizon=1)
    exact = tiny.outcome_probs_do(2, "test", None, t0, a_on) - tiny.outcome_probs_do(2, "test", None, t0, a_off)
    assert np.allclose(one, exact, atol=1e-12)  # one day needs no Monte Carlo
    tau = tiny.true_effects(None, "test")
    assert tau.shape == (sum(d.n for d in tiny.test),) and np.isfinite(tau).all()
    assert tau.std() > 0.05  # heterogeneous: a small tumour is within T1 anyway, a mid-sized one is brought under
    assert not np.allclose(tiny.true_effects(None, "test", horizon=1), tau, atol=1e-3)  # multi-day ≠ one-day
    # counter-based noise: a row's truth does not depend on which other rows are in the batch
    site3 = tiny.true_effects(3, "test")
    start = sum(d.n for d in tiny.test[:3])
    assert np.allclose(site3, tau[start : start + len(site3)], atol=1e-12)
    assert np.allclose(tiny.true_effects(3, "test", rows=[1]), site3[1:2], atol=1e-12)
    import fcd_secure.data.tumour.truth as truth_mod

    early = default_policies()[2]
    whole = tiny.policy_value_per_rollout(early)
    monkeypatch.setattr(truth_mod, "MAX_BATCH_ROWS", 40)
    assert np.allclose(tiny.true_effects(None, "test"), tau, atol=1e-12)
    assert np.allclose(tiny.policy_value_per_rollout(early), whole, atol=1e-12)


def test_policy_values_policies_by_label_and_site_consistency(tiny):
    policies = {p.name: p for p in default_policies()}
    values = {n: tiny.true_policy_value(p) for n, p in policies.items()}
    for v, se in values.values():
        assert 0 < v < 1 and 0 <= se < 0.01
    assert values["always"][0] - values["never"][0] > 0.05  # chemotherapy every day keeps more tumours within T1
    # a policy names an action by its label; "both" every day is at least as good as "chemo" (same noise)
    both = tiny.true_policy_value(_policy("both_daily", {"kind": "static", "action": "both"}))[0]
    chemo = tiny.true_policy_value(_policy("chemo_daily", {"kind": "static", "action": "chemo"}))[0]
    assert both >= chemo == pytest.approx(values["always"][0], abs=1e-12)
    # a rule on the simulated diameter: treat while the tumour is larger than 3 cm
    rule = _policy("treat_large", {"kind": "threshold", "signal": "context:tumour_diameter", "when": "above",
                                   "value": 3.0 / 13.0, "then": "both", "otherwise": "none"})
    assert values["never"][0] < tiny.true_policy_value(rule)[0] <= both + 1e-12
    with pytest.raises(DataError, match="not a label"):
        tiny.true_policy_value(_policy("bad", {"kind": "static", "action": "surgery"}))
    # per-site values, weighted by site size, add up to the pooled value (noise is keyed per patient)
    sizes = np.array([d.n for d in tiny.test])
    by_site = np.array([tiny.true_policy_value(policies["early_on"], site=s)[0] for s in range(tiny.n_sites)])
    assert (by_site * sizes).sum() / sizes.sum() == pytest.approx(values["early_on"][0], abs=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_confounding_bias_follows_the_behaviour_policy_and_grows_with_gamma(seed):
    """~18,000 logged training days per world. The clinic treats large tumours (the policy follows the recent mean
    diameter), and large tumours rarely come within 3 cm, so the naive treated-minus-untreated contrast is biased
    *downwards*, more so the larger γ (seeds 0-2, naive − true: γ = 0: −0.01..+0.01, γ = 1: −0.07..−0.08, γ = 2: −0.15,
    γ = 4: −0.23..−0.30, the truth +0.02); re-weighting by the logged true propensities removes the bias (IPW error
    ≤ 0.015 at every γ)."""
    cfg = TumourConfig(preset="test", n_patients=3000, max_len=10, anchor_step=3, horizon=3, n_rollouts=2, seed=seed)
    bias = []
    for gamma in (0.0, 1.0, 2.0, 4.0):
        c = generate(cfg.model_copy(update={"gamma": gamma})).anchor_contrasts("train")
        assert c["n_on"] > 2000 and c["n_off"] > 5000
        assert abs(c["ipw"] - c["true"]) < 0.03, gamma  # the true propensities remove the confounding
        bias.append(c["naive"] - c["true"])
    assert abs(bias[0]) < 0.03  # γ = 0 assigns without looking at the tumour: the naive contrast is the truth
    assert bias[1] < -0.03 and bias[3] < -0.15  # biased in the direction the policy implies (treated = larger)
    assert np.all(np.diff(bias) < -0.02)  # and the bias grows with γ


def test_config_errors_name_the_field():
    with pytest.raises(ValidationError, match="epsilon"):
        TumourConfig.from_preset("tiny", epsilon=0.3)
    with pytest.raises(ValidationError, match="anchor_step"):
        TumourConfig.from_preset("tiny", anchor_step=6)
    with pytest.raises(ValidationError, match="n_patients"):
        TumourConfig.from_preset("tiny", n_patients=10)
    with pytest.raises(ValueError, match="unknown tumour preset"):
        TumourConfig.from_preset("huge")
    with pytest.raises(ValidationError):
        TumourConfig.from_preset("tiny", no_such_field=1)


def test_describe_reports_truth_case_mix_and_confounding(tiny):
    d = tiny.describe()
    json.dumps(d)  # plain JSON-able numbers for `--json` output
    assert d["anchors"] == {"a_off": 0, "a_on": 1, "a_off_label": "none", "a_on_label": "chemo"}
    assert sum(d["n_train"]) + sum(d["n_test"]) == tiny.cfg.n_patients
    assert d["true_ate_test"] == pytest.approx(float(np.mean(tiny.true_effects(None, "test"))), abs=1e-12)
    assert set(d["true_policy_values_test"]) == {"never", "always", "early_on", "late_on"}
    assert d["min_logged_propensity"] >= tiny.cfg.epsilon
    assert len(d["sites"]) == 10 and set(d["sites"][0]["action_share"]) == set(ACTION_LABELS)
    c = d["one_step_contrast_train"]
    assert c["naive"] < c["true"] - 0.05  # even the tiny preset at the default γ = 2 is visibly confounded


def test_registered_dataset_carries_the_oracle_and_endogenous_contexts():
    fd = load_federated("tumour", n_sites=4, seed=3, preset="tiny")
    assert fd.name == "tumour" and fd.n_sites == 4 and fd.anchors == (0, 1)
    assert fd.oracle.cfg.seed == 3 and fd.oracle.cfg.n_sites == 4
    assert fd.description["contexts"] == {"endogenous": ["tumour_volume", "tumour_diameter"], "exogenous": []}
    assert fd.description["oracle"]["true_ate_test"] == pytest.approx(float(fd.oracle.true_effects(None).mean()))
    with pytest.raises(DataError, match="unknown preset"):
        load_federated("tumour", preset="huge")
    with pytest.raises(DataError, match="n_patients"):
        load_federated("tumour", n_sites=200, preset="tiny")


def test_a_tumour_run_names_its_actions_and_generates_its_contexts():
    """What the server shows for ``fcd run --dataset tumour`` before any site answers, and the label check that
    turns a policy naming an action the tumour world does not have into exit 2 before the engine starts."""
    from fcd_secure.config import build_config
    from fcd_secure.queries.vocabulary import action_labels, bind_policies, context_columns

    cfg = build_config("tiny", {"data": {"dataset": "tumour"}})
    assert action_labels(cfg) == ["none", "chemo", "radio", "both"]
    assert context_columns(cfg) == {"generated_columns": ["tumour_volume", "tumour_diameter"], "replayed_columns": []}
    off = build_config("tiny", {"data": {"dataset": "tumour"}, "model": {"use_context": False}})
    assert context_columns(off) == {"generated_columns": [], "replayed_columns": ["tumour_volume", "tumour_diameter"]}
    bind_policies(cfg, [_policy("both_daily", {"kind": "static", "action": "both"}),
                         _policy("treat_large", {"kind": "threshold", "signal": "context:tumour_diameter",
                                                 "when": "above", "value": 0.23, "then": "both", "otherwise": "none"})])
    with pytest.raises(DataError, match="surgery"):
        bind_policies(cfg, [_policy("bad", {"kind": "static", "action": "surgery"})])


def test_centralised_simulators_generate_the_tumours_endogenous_contexts(one_torch_thread):
    """The pooled (centralised) reference builds its network from the data's dims, endogenous contexts included:
    under "both" every day its simulated volumes are its own, not the logged ones."""
    from fcd_secure.config import build_config
    from fcd_secure.experiments.centralised import train_centralised
    from fcd_secure.federation import learner
    from fcd_secure.model.baselines import SIMULATORS

    cfg = build_config("tiny", {"data": {"dataset": "tumour"}})
    test = learner.load_site_data(cfg, 0).test
    for name in ("fed_causaldiff", "gformula"):
        sim, _ = train_centralised(SIMULATORS[name], cfg, epochs=1)
        res = sim.simulate(test, 3, 2, 0, start_t=2, horizon=4, keep_contexts=True)
        assert res.contexts == {"generated": ["tumour_volume", "tumour_diameter"], "replayed": []}, name
        assert not np.allclose(res.context_values[:, 0, 1:], test.A[:, 3:6]), name
    naive, _ = train_centralised(SIMULATORS["naive"], cfg, epochs=1)
    assert naive.simulate(test, 3, 1, 0, start_t=2, horizon=2).contexts["generated"] == []


def test_gamma_of_the_run_config_reaches_the_generator():
    """``data.gamma`` (``fcd run --gamma``) is the confounding strength the tumour world is generated with: a federated
    γ sweep runs through ``fcd run``; the default stays the generator's 2."""
    from fcd_secure.cli.resolve import RunOptions, resolve_config
    from fcd_secure.config import build_config
    from fcd_secure.federation import learner

    weak = build_config("tiny", {"data": {"dataset": "tumour", "gamma": 0.0}})
    default = build_config("tiny", {"data": {"dataset": "tumour"}})
    fd0, fd2 = learner.load_federated(weak), learner.load_federated(default)
    assert fd0.oracle.cfg.gamma == 0.0 and fd0.description["oracle"]["gamma"] == 0.0
    assert fd2.oracle.cfg.gamma == 2.0 and default.data.gamma is None
    assert not np.array_equal(fd0.train[0].P, fd2.train[0].P)  # the logging policy changed, not just a label
    assert learner.data_key(weak) != learner.data_key(default)  # no cached γ = 2 world answers a γ = 0 run
    assert weak.training_hash() != default.training_hash()  # a γ = 2 checkpoint never resumes a γ = 0 run
    opts = RunOptions(preset="tiny", dataset="tumour", gamma=3.5)
    assert resolve_config(opts).data.gamma == 3.5
    c0 = fd0.description["oracle"]["one_step_contrast_train"]
    assert abs(c0["naive"] - c0["true"]) < abs(fd2.description["oracle"]["one_step_contrast_train"]["naive"]
                                                - fd2.description["oracle"]["one_step_contrast_train"]["true"])


@pytest.mark.parametrize("args, field", [
    (["--dataset", "tumour", "--gamma", "-1"], "gamma"),  # γ ≥ 0
    (["--dataset", "statics2011", "--gamma", "2"], "gamma"),  # only a generated world has a γ
])
def test_a_bad_gamma_is_exit_2_and_writes_nothing(tmp_path, args, field):
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app

    out = tmp_path / "run"
    res = CliRunner().invoke(app, ["run", "--preset", "tiny", "--sites", "2", "--rounds", "1", "--out", str(out),
                                   "--json", *args])
    assert res.exit_code == 2, res.output
    assert field in res.output and not out.exists()


def test_a_dataset_read_from_files_or_an_unknown_option_refuses_generator_options():
    with pytest.raises(DataError, match="gamma"):
        load_federated("statics2011", preset="tiny", world={"gamma": 1.0})
    with pytest.raises(DataError, match="no generator option 'beta'"):
        load_federated("tumour", preset="tiny", world={"beta": 1.0})
