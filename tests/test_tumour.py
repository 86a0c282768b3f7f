"""The tumour world (Geng et al. 2017 PK-PD oracle): its logged columns, the counterfactual arms, confounding, sites
that differ, the truth's own numbers, and what a run on it shows. The contract every generated world keeps (layout,
replay, propensities, seeds, batching, config errors, the registered dataset) is in ``test_worlds.py``."""

from __future__ import annotations

import numpy as np
import pytest
from policy_cases import policy
from world_cases import Recorder, tiny_world

from fcd_secure.data.policy import default_policies
from fcd_secure.data.registry import load_federated
from fcd_secure.data.spec import DataError
from fcd_secure.data.tumour import ACTION_LABELS, V_DEATH, TumourConfig, generate
from fcd_secure.data.tumour.pkpd import PatientParams, day, diameter_of, volume_of


@pytest.fixture(scope="module")
def tiny():
    return tiny_world("tumour")


# -- generator contract --------------------------------------------------------------------------------------
def test_the_logs_record_the_tumour_its_response_and_the_patients_type(tiny):
    """The tumour world's own columns (the contract every world keeps: ``test_worlds.py``)."""
    cfg = tiny.cfg
    for ds in tiny.train + tiny.test:
        valid = ds.M > 0
        # A is the logged tumour on each morning: volume over V(13 cm), diameter over 13 cm
        V = tiny.V_all[ds.meta["entity"], : cfg.max_len]
        assert np.allclose(ds.A[..., 0][valid], (V / V_DEATH)[valid], rtol=1e-6)
        assert np.allclose(ds.A[..., 1][valid], (diameter_of(V) / 13.0)[valid], rtol=1e-6)
        # Y_t = 1[the next diameter is at most 3 cm]
        Vn = tiny.V_all[ds.meta["entity"], 1:]
        assert np.array_equal(ds.Y[valid] > 0, (Vn <= volume_of(3.0))[valid])
        # X: patient type one-hot and the stage at diagnosis
        assert np.array_equal(ds.X[:, :3].sum(1), np.ones(ds.n)) and set(np.unique(ds.X[:, 3])) <= {0, .25, .5, .75, 1}
    # anchors: the project's rule picks "none" (most logged) and "chemo" (second)
    assert tiny.anchors == (0, 1)


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


def test_the_contexts_follow_the_policy(tiny):
    """Under another policy than the logged one the contexts are that policy's: "both" every day shrinks every tumour
    at least as much as "none", rollout by rollout (same noise), and strictly for someone (rollout 0 under the logged
    actions replays the logs: ``test_worlds.py``)."""
    ids = tiny.patient_ids(None, "test")
    M = tiny._valid(ids)
    A = np.concatenate([d.A for d in tiny.test])
    both, none = Recorder(3), Recorder(0)
    tiny.policy_values_of(both, ids, n_rollouts=4)
    tiny.policy_values_of(none, ids, n_rollouts=4)
    assert (both.ctx[..., 0] <= none.ctx[..., 0]).all() and (both.ctx[..., 0] < none.ctx[..., 0]).any()
    assert (both.y >= none.y).all()
    assert not np.array_equal(none.ctx[: len(ids)][M], A[M])  # not the logged contexts


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


def test_policy_values_by_label_and_on_the_simulated_diameter(tiny):
    policies = {p.name: p for p in default_policies()}
    values = {n: tiny.true_policy_value(p) for n, p in policies.items()}
    assert values["always"][0] - values["never"][0] > 0.05  # chemotherapy every day keeps more tumours within T1
    # a policy names an action by its label; "both" every day is at least as good as "chemo" (same noise)
    both = tiny.true_policy_value(policy("both_daily", {"kind": "static", "action": "both"}))[0]
    chemo = tiny.true_policy_value(policy("chemo_daily", {"kind": "static", "action": "chemo"}))[0]
    assert both >= chemo == pytest.approx(values["always"][0], abs=1e-12)
    # a rule on the simulated diameter: treat while the tumour is larger than 3 cm
    rule = policy("treat_large", {"kind": "threshold", "signal": "context:tumour_diameter", "when": "above",
                                  "value": 3.0 / 13.0, "then": "both", "otherwise": "none"})
    assert values["never"][0] < tiny.true_policy_value(rule)[0] <= both + 1e-12


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


def test_describe_reports_labels_case_mix_and_confounding(tiny):
    d = tiny.describe()
    assert d["anchors"] == {"a_off": 0, "a_on": 1, "a_off_label": "none", "a_on_label": "chemo"}
    assert len(d["sites"]) == 10 and set(d["sites"][0]["action_share"]) == set(ACTION_LABELS)
    c = d["one_step_contrast_train"]
    assert c["naive"] < c["true"] - 0.05  # even the tiny preset at the default γ = 2 is visibly confounded


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
