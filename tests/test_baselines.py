"""The paper's four baselines (CRN, RCGAN, TimeGAN, FedCM): each trains on a tiny federated split through the secure
aggregation path, names its parts in the manifest (only FedCM keeps a site-local Θs), and its rollout responds to
the action sequence — causally (an action changes its own step and later ones, never earlier ones)."""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.config import build_config
from fcd_secure.federation import learner
from fcd_secure.engines.inprocess import run_inprocess
from fcd_secure.apps.site import default_site_id
from fcd_secure.federation.state import SiteState
from fcd_secure.manifest import THETA_C, THETA_S
from fcd_secure.model.baselines import SIMULATORS, get_simulator, parameter_counts
from tests.test_model_core import TINY, make_ds

BASELINES = ("crn", "rcgan", "timegan", "fedcm")
N_SITES = 3
#: Secure aggregation needs at least four sites (its default policy, docs/threats.md P10).
SECURE_SITES = 4


def _trained(key: str, ds, epochs: int = 3):
    sim = SIMULATORS[key].from_dims(TINY, ds.dx, ds.da, ds.n_actions, N_SITES)
    for e in range(epochs):
        sim.train_site(ds, 0, N_SITES, epochs=1, seed=e)
    return sim


@pytest.mark.parametrize("key", BASELINES)
def test_rollout_responds_to_the_action_sequence_causally(key, one_torch_thread):
    ds = make_ds(n=32)
    sim = _trained(key, ds)
    H = 4
    base = np.zeros((ds.n, H), np.int64)
    changed = base.copy()
    changed[:, 2] = 1  # only the action of step 2 differs
    a = sim.simulate(ds, base, n_samples=3, seed=5, start_t=1, horizon=H)
    b = sim.simulate(ds, changed, n_samples=3, seed=5, start_t=1, horizon=H)
    np.testing.assert_array_equal(a.probs[:, :, :2], b.probs[:, :, :2])  # earlier steps never see a later action
    assert np.abs(a.probs[:, :, 2] - b.probs[:, :, 2]).max() > 1e-4  # the step's own outcome responds
    assert (b.actions[:, :, 2] == 1).all() and (b.actions[:, :, [0, 1, 3]] == 0).all()
    on = sim.simulate(ds, 1, 3, 5, start_t=1, horizon=H)
    off = sim.simulate(ds, 0, 3, 5, start_t=1, horizon=H)
    assert on.value != off.value
    again = sim.simulate(ds, 1, 3, 5, start_t=1, horizon=H)
    np.testing.assert_array_equal(on.probs, again.probs)  # same seed, same numbers


@pytest.mark.parametrize("key", BASELINES)
def test_parts_in_the_manifest(key):
    ds = make_ds(n=8)
    man = SIMULATORS[key].from_dims(TINY, ds.dx, ds.da, ds.n_actions, N_SITES).manifest()
    tops_s = {n.split(".")[0] for n in man.names(THETA_S)}
    if key == "fedcm":
        # the treatment mechanism (the site's logging practice) stays local; the outcome mechanism is shared
        assert tops_s == {"treat_action_emb", "treat_gen", "treat_critic"}
        assert {n.split(".")[0] for n in man.names(THETA_C)} >= {"outcome_gen", "outcome_critic"}
    else:
        assert tops_s == set()  # no site-local part: synchronised whole
    assert man.size("full") == man.size(THETA_C) + man.size(THETA_S)


def test_parameter_counts_are_comparable_to_fed_causaldiff():
    counts = parameter_counts(build_config("default").model, 4, 1, 50, 10, ("fed_causaldiff",) + BASELINES)
    ours = counts["fed_causaldiff"]["total"]
    for key in BASELINES:
        assert 0.5 * ours <= counts[key]["total"] <= 1.5 * ours, (key, counts)


def test_unknown_simulator_and_non_binary_outcome_are_refused():
    with pytest.raises(ValueError, match="model.simulator"):
        get_simulator("nope")
    ds = make_ds(n=8)
    for key in BASELINES:
        with pytest.raises(ValueError, match="model.outcome"):
            SIMULATORS[key].from_dims(TINY.model_copy(update={"outcome": "gaussian"}), ds.dx, ds.da, ds.n_actions, 3)


@pytest.mark.parametrize("key", BASELINES)
def test_trains_federated_through_secure_aggregation(key, tmp_path, one_torch_thread):
    n = SECURE_SITES
    cfg = build_config("tiny", {
        "data": {"n_sites": n, "test_fraction": 0.5},  # test splits above the sites' evaluation cohort floor (20)
        "federation": {"clients_per_round": n, "rounds": 1, "eval_every": 0, "secure_aggregation": True},
        "model": {"simulator": key},
        "evaluation": {"n_samples": 1, "max_rows": 4},
        "state_dir": str(tmp_path / "state"),
    })
    d = learner.load_site_data(cfg, 0).train
    init = get_simulator(key).from_dims(learner.model_config(cfg), d.dx, d.da, int(d.n_actions), n)
    res = run_inprocess(cfg)
    man = init.manifest()
    assert res.part == THETA_C and sorted(res.theta) == sorted(man.names(THETA_C))
    assert not set(res.theta) & set(man.names(THETA_S))
    start = init.get_params(THETA_C)
    assert any(not np.array_equal(start[n], res.theta[n]) for n in start)  # the sites trained and it was aggregated
    assert all(np.isfinite(v).all() for v in res.theta.values())
    train_actions = {r["action"] for r in res.traffic_rows if r["round"] == 1 and r["action"].startswith("train")}
    assert train_actions and all(a.startswith("train.secagg_") for a in train_actions)  # no plain update left a site
    assert res.history[0]["participants"] == n and not res.history[0]["aborted"]
    assert np.isfinite(res.final_eval["pehe"])
    if key == "fedcm":  # Θs stayed on each site, trained on its own data
        s0, s1 = (SiteState(cfg.state_dir, default_site_id(i)).load().theta_s for i in (0, 1))
        assert sorted(s0) == sorted(man.names(THETA_S))
        assert any(not np.array_equal(s0[n], s1[n]) for n in s0)


def test_a_run_config_refuses_an_unknown_simulator_and_dp_without_fed_causaldiff():
    from fcd_secure.config import ConfigError  # noqa: PLC0415

    with pytest.raises(ConfigError, match="model.simulator"):
        build_config("tiny", {"model": {"simulator": "nope"}})
    with pytest.raises(ConfigError, match="dp.enabled"):
        build_config("tiny", {"model": {"simulator": "crn"}, "dp": {"enabled": True}})
    assert build_config("tiny", {"model": {"simulator": "gformula"}, "dp": {"enabled": True}}).dp.enabled
