"""The Simulator protocol: every simulator (Fed-CausalDiff, GRU g-formula, naive and the paper's baselines) builds, trains, names its Θc/Θs
parts, rolls out plans and answers the same effect and factual questions through one definition; the training
batch is one NamedTuple at the loader boundary."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fcd_secure.manifest import ManifestError
from fcd_secure.model import Batch, FedCausalDiff, dataset_tensors, make_loader
from fcd_secure.model.baselines import SIMULATORS, FedCausalDiffSimulator, NaiveSimulator
from fcd_secure.model.networks import THETA_S_MODULES
from fcd_secure.model.simulator import Simulator, contrast_effects
from tests.test_model_core import TINY, make_ds

N_SITES = 3


def build(key: str, ds, seed: int = 0) -> Simulator:
    return SIMULATORS[key].from_dims(TINY.model_copy(update={"seed": seed}), ds.dx, ds.da, ds.n_actions, N_SITES)


def test_registry_names_match_classes():
    assert list(SIMULATORS) == ["fed_causaldiff", "gformula", "naive", "crn", "rcgan", "timegan", "fedcm"]
    assert all(cls.name == key and issubclass(cls, Simulator) for key, cls in SIMULATORS.items())


@pytest.mark.parametrize("key", list(SIMULATORS))
def test_every_simulator_honours_the_protocol(key, one_torch_thread):
    ds = make_ds(n=24, site=1)
    sim = build(key, ds)
    man = sim.manifest()
    theta_s_tops = {n.split(".")[0] for n in man.names("theta_s")}
    assert theta_s_tops == set(SIMULATORS[key].theta_s_modules)
    if key in ("fed_causaldiff", "gformula"):
        # the behaviour head of IPW weighting (the default model.ipw = 'auto') is Θs and site-bound
        assert theta_s_tops == set(THETA_S_MODULES)
    bound = sum(e.size for e in man.entries if e.site_bound)
    assert (bound > 0) == (key in ("fed_causaldiff", "gformula"))
    assert man.size("full") + bound == sum(p.numel() for p in sim.module.parameters())
    before = sim.get_params("full")
    fit = sim.train_site(ds, 1, N_SITES, epochs=1, seed=0)
    assert np.isfinite(fit["total"]) and fit["n"] == ds.n
    assert any(not np.array_equal(before[n], v) for n, v in sim.get_params("full").items())
    # parameters move by part: a fresh copy takes Θc, strictly
    other = build(key, ds, seed=4)
    other.set_params("theta_c", sim.get_params("theta_c"))
    for n, v in other.get_params("theta_c").items():
        np.testing.assert_array_equal(v, sim.get_params("theta_c")[n])
    with pytest.raises(ManifestError):
        other.set_params("theta_c", {})
    res = sim.simulate(ds, 1, n_samples=2, seed=0, start_t=1, horizon=3)
    assert res.probs.shape == (ds.n, 2, 3) and np.isfinite(res.value)
    assert (res.actions == 1).all()
    p = sim.factual_probs(ds)
    assert p.shape == (ds.n, ds.L) and p.dtype == np.float64 and ((p > 0) & (p < 1)).all()
    eff = sim.estimate_effects(ds, (0, 2), anchor_step=1, horizon=3, n_samples=2, seed=0)
    np.testing.assert_array_equal(eff, contrast_effects(sim.simulate, ds, (0, 2), 1, 3, 2, 0))
    assert sim.simulate_policy(ds, 2, (0, 2), 2, 0).value == sim.simulate(ds, 2, 2, 0).value
    # common random numbers: the effect of a on itself is exactly zero
    assert np.array_equal(sim.estimate_effects(ds, (1, 1), 0, 3, 2, 0), np.zeros(ds.n))


@pytest.mark.parametrize("key", list(SIMULATORS))
def test_same_seed_same_numbers_for_every_simulator(key, one_torch_thread):
    ds = make_ds(n=20)

    def run(seed: int):
        sim = build(key, ds, seed)
        for e in range(2):  # the optimiser state persists across calls
            sim.train_site(ds, 0, N_SITES, epochs=1, seed=seed + e)
        return sim.get_params("full"), sim.estimate_effects(ds, (0, 1), 1, 3, 2, seed), sim.factual_probs(ds)

    p1, e1, f1 = run(3)
    p2, e2, f2 = run(3)
    assert all(np.array_equal(p1[n], p2[n]) for n in p1)
    assert np.array_equal(e1, e2) and np.array_equal(f1, f2)
    _, e3, _ = run(4)
    assert not np.array_equal(e1, e3)


def test_fed_causaldiff_simulator_wraps_a_network_and_nothing_else():
    ds = make_ds(n=10)
    net = FedCausalDiff.from_dims(TINY, ds.dx, ds.da, ds.n_actions, N_SITES)
    sim = FedCausalDiffSimulator(net)
    assert sim.module is net and sim.config == net.cfg
    net.train()
    sim.factual_probs(ds)
    assert net.training  # the training flag survives scoring
    with pytest.raises(TypeError, match="FedCausalDiff"):
        FedCausalDiffSimulator(torch.nn.Linear(2, 2))


def test_naive_simulator_refuses_fed_causaldiff_options():
    ds = make_ds(n=8)
    with pytest.raises(TypeError, match="sampler"):
        build("naive", ds).simulate(ds, 1, 1, 0, sampler="ddpm")


def test_naive_factual_probs_are_means_for_gaussian_outcomes():
    ds = make_ds(n=8)
    cfg = TINY.model_copy(update={"outcome": "gaussian"})
    sim = NaiveSimulator.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES)
    b = dataset_tensors(ds, 0)
    Xe, y_prev, first = sim.model.step_inputs(b.X, b.Y)
    with torch.no_grad():
        raw = sim.model(Xe, b.A, b.T, y_prev, first).numpy()
    np.testing.assert_allclose(sim.factual_probs(ds), raw, rtol=1e-6)  # not squashed through a sigmoid


def test_batch_is_one_named_tuple_at_the_loader_boundary():
    ds = make_ds(n=10)
    whole = dataset_tensors(ds, 2)
    assert isinstance(whole, Batch) and whole._fields == ("X", "A", "T", "Y", "M", "site", "P")
    assert whole.size == 10 and (whole.site == 2).all() and whole.T.dtype == torch.long
    raw = next(iter(make_loader(ds, 4, 0, site_index=1)))
    assert not isinstance(raw, Batch)  # loaders keep the default collation (Opacus rebuilds it on empty batches)
    b = Batch.of(raw)
    assert b.size == 4 and (b.site == 1).all() and Batch.of(b) is b
    with pytest.raises(ValueError, match="seven|7"):
        Batch.of(list(raw)[:5])
