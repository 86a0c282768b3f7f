"""Fig. 2's step-wise DR (experiments.reproduction.policy_values) on identities that hold whatever the model is, and
the site-fitted behaviour model on a known logging rule."""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from fcd_secure.data.policy import default_policies
from fcd_secure.experiments.reproduction.policy_values import anchor_propensities, one_step_values, stepwise_dr_sums
from fcd_secure.model.baselines import SIMULATORS
from tests.test_model_core import TINY, make_ds

ANCHORS = (0, 1)


def _sim(ds):
    sim = SIMULATORS["naive"].from_dims(TINY, ds.dx, ds.da, ds.n_actions, 1)
    sim.train_site(ds, 0, 1, epochs=2, seed=0)
    return sim


def _value(sums, name):
    return sums[name]["sum"] / sums["steps"]


def test_every_logged_action_the_policys_and_known_propensity_gives_the_logged_mean(one_torch_thread):
    ds = make_ds(n=30)
    ds = replace(ds, T=np.where(ds.M > 0, 1, 0).astype(np.int64), P=np.ones(ds.M.shape, np.float32))  # "always"
    sim = _sim(ds)
    sums = stepwise_dr_sums(sim.simulate, sim.factual_probs(ds), ds, ds, default_policies(), ANCHORS, 2, 0)
    m = ds.M > 0
    assert sums["always"]["matched"] == m.sum()
    assert abs(_value(sums, "always") - ds.Y[m].mean()) < 1e-6  # DR = r on every step: the model cancels
    assert sums["never"]["matched"] == 0
    q_off = one_step_values(sim.simulate, ds, 0, 2, 0)
    assert abs(_value(sums, "never") - q_off[m].mean()) < 1e-9  # no support: the direct method


def test_behaviour_model_recovers_a_known_logging_rule(one_torch_thread):
    ds = make_ds(n=200, na=3)
    rule = np.where(ds.X[:, :1] > 0, 1, 0) * np.ones_like(ds.T)  # a_on when X0 > 0, else a_off
    ds = replace(ds, T=(rule * (ds.M > 0)).astype(np.int64))
    mu = anchor_propensities(ds, ds, ANCHORS)
    m = ds.M > 0
    assert mu.shape == ds.M.shape and (mu[~m] == 1).all()
    assert np.median(mu[m]) > 0.9  # the taken action is predictable from X
    assert (mu[m] >= 1e-3).all() and (mu[m] <= 1).all()
    np.testing.assert_array_equal(mu, anchor_propensities(ds, ds, ANCHORS))  # deterministic
