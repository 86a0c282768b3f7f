"""The effect-fidelity switches of the model (docs/fidelity.md): the outcome-conditioned transition
(``transition_given_y``) and inverse-propensity weighting of the likelihood terms (``ipw``) — each changes what it
says it changes, keeps P on the site, and leaves the paper's path as it was."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fcd_secure.audit.allowlist import TRAIN_METRICS
from fcd_secure.data.schema import SiteDataset
from fcd_secure.model import Batch, FedCausalDiff, ModelConfig, batch_loss, dataset_tensors, make_loader, train_local
from fcd_secure.model import losses as L
from fcd_secure.model.manifest import get_params
from fcd_secure.model.baselines import FedCausalDiffSimulator
from fcd_secure.model.training import site_objective, training_view

#: the paper's objective (``ipw = 'off'``): each test turns on the switch it is about
TINY = ModelConfig(
    k_causal=3, k_site=2, hidden=12, mlp_hidden=12, action_emb=4, time_emb=8,
    diffusion_steps=10, sampler_steps=3, cf_horizon=2, batch_size=16, lr=5e-3, ipw="off",
)


def make_ds(n: int = 40, L: int = 8, na: int = 3, seed: int = 0, propensities: bool = True) -> SiteDataset:
    """Confounded trajectories: a hidden u raises both Y and the chance of action 1; P is the true propensity."""
    r = np.random.default_rng(seed)
    lengths = r.integers(3, L + 1, n)
    M = (np.arange(L)[None] < lengths[:, None]).astype(np.float32)
    X = r.normal(size=(n, 2)).astype(np.float32)
    A = np.zeros((n, L, 1), np.float32)
    u = r.normal(size=n)
    T = np.zeros((n, L), np.int64)
    P = np.ones((n, L), np.float32)
    Y = np.zeros((n, L), np.float32)
    for t in range(L):
        logits = np.stack([np.zeros(n), 1.5 * u, np.full(n, -0.5)], 1)
        pr = np.exp(logits) / np.exp(logits).sum(1, keepdims=True)
        T[:, t] = [r.choice(na, p=p) for p in pr]
        P[:, t] = pr[np.arange(n), T[:, t]]
        Y[:, t] = (r.random(n) < 1 / (1 + np.exp(-(u + 0.8 * (T[:, t] == 1) + X[:, 0])))).astype(np.float32)
    T = (T * M).astype(np.int64)
    P = np.where(M > 0, P, 1.0).astype(np.float32)
    return SiteDataset(X=X, A=A, T=T, Y=Y * M, M=M, n_actions=na, name="conf", P=P if propensities else None)


def model_for(ds: SiteDataset, cfg: ModelConfig) -> FedCausalDiff:
    return FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, 2)


def every_param(m: FedCausalDiff) -> dict[str, np.ndarray]:
    """Θc and Θs (part 'full' leaves out the site-bound behaviour head)."""
    return {**get_params(m, "theta_c"), **get_params(m, "theta_s")}


# -- the paper's path is untouched -------------------------------------------------------------------------------


def test_switches_off_are_the_papers_network():
    ds = make_ds()
    m = model_for(ds, TINY)
    assert m.propensity_head is None
    # the eps-nets read no outcome, and an outcome handed to the transition is ignored
    K, A, T = torch.zeros(4, TINY.k), torch.zeros(4, 1), torch.zeros(4, dtype=torch.long)
    g = lambda: torch.Generator().manual_seed(0)  # noqa: E731
    a = m.transition(K, A, T, generator=g())
    b = m.transition(K, A, T, generator=g(), y=torch.ones(4))
    assert torch.equal(a, b)
    # with both switches on, the modules shared with the paper's network start from the same values
    on = model_for(ds, TINY.model_copy(update={"ipw": "cumulative"}))
    p_off, p_on = every_param(m), every_param(on)
    assert all(np.array_equal(p_off[k], p_on[k]) for k in p_off)
    assert set(p_on) - set(p_off) == {k for k in p_on if k.startswith("propensity_head.")} != set()


def test_propensities_reach_training_only_under_ipw():
    ds = make_ds()
    assert training_view(ds, TINY).P is None
    assert training_view(ds, TINY.model_copy(update={"ipw": "step"})).P is ds.P
    # the default, 'auto', keeps the P a site logs (a dataset's P covers every step or is absent: SiteDataset.validate)
    auto = TINY.model_copy(update={"ipw": "auto"})
    assert ModelConfig().ipw == "auto"
    assert training_view(ds, auto).P is ds.P and training_view(ds.without_propensities(), auto).P is None
    assert torch.isnan(dataset_tensors(ds.without_propensities(), 0).P).all()
    assert torch.equal(dataset_tensors(ds, 0).P, torch.as_tensor(ds.P))


# -- transition_given_y ------------------------------------------------------------------------------------------


def test_transition_given_y_reads_the_outcome():
    ds = make_ds()
    cfg = TINY.model_copy(update={"transition_given_y": True})
    m = model_for(ds, cfg)
    K, A, T = torch.rand(6, cfg.k) - 0.5, torch.zeros(6, 1), torch.ones(6, dtype=torch.long)
    g = lambda: torch.Generator().manual_seed(3)  # noqa: E731
    y0 = m.transition(K, A, T, generator=g(), y=torch.zeros(6))
    y1 = m.transition(K, A, T, generator=g(), y=torch.ones(6))
    assert not torch.allclose(y0, y1)
    assert torch.equal(y0, m.transition(K, A, T, generator=g(), y=torch.zeros(6)))  # deterministic for a seed
    with pytest.raises(ValueError, match="outcome"):
        m.transition(K, A, T, generator=g())


def test_transition_given_y_trains_and_rolls_out_deterministically(one_torch_thread):
    ds = make_ds(propensities=False)
    cfg = TINY.model_copy(update={"transition_given_y": True})

    def run(seed: int):
        m = model_for(ds, cfg)
        opt = torch.optim.Adam(m.parameters(), lr=cfg.lr)
        out = train_local(m, ds, cfg, site_index=0, n_sites=2, epochs=2, seed=seed, optimizer=opt)
        sim = FedCausalDiffSimulator(m)
        eff = sim.estimate_effects(ds, (0, 1), anchor_step=2, horizon=3, n_samples=2, seed=seed)
        return out, eff, sim.simulate(ds, 1, n_samples=2, seed=seed).value

    (o1, e1, v1), (o2, e2, v2) = run(1), run(1)
    assert np.isfinite(o1["total"]) and o1 == o2 and np.array_equal(e1, e2) and v1 == v2
    # the diffusion target is conditioned on the logged outcome: changing Y changes L_diff for the same noise
    b = Batch.of(next(iter(make_loader(ds, 16, 0, site_index=0))))
    m = model_for(ds, cfg)
    Kc, Ks = m.encode(b.X, b.A, b.T, b.Y)
    K = torch.cat([Kc, Ks], -1).detach()
    torch.manual_seed(0)
    d1 = L.l_diff(m, K, b)
    torch.manual_seed(0)
    d2 = L.l_diff(m, K, b._replace(Y=1.0 - b.Y))
    assert not torch.allclose(d1, d2)


# -- ipw ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode,window", [("step", 0), ("cumulative", 0), ("cumulative", 2)])
def test_ipw_weights_known_answer(mode, window):
    ds = make_ds()
    cfg = TINY.model_copy(update={"ipw": mode, "ipw_window": window, "ipw_clip": 4.0})
    m = model_for(ds, cfg)
    b = dataset_tensors(ds, 0)
    _, _, h = m.encode_states(b.X, b.A, b.T, b.Y)
    W = L.ipw_weights(m, h, b).numpy()
    p_hat = torch.softmax(m.propensity_logits(h), -1).detach().numpy()
    p_hat = np.take_along_axis(p_hat, ds.T[..., None], -1)[..., 0]
    w = np.where(ds.M > 0, np.minimum(p_hat / ds.P, 4.0), 1.0)
    if mode == "step":
        want = w
    else:
        want = np.ones_like(w)
        for t in range(ds.L):
            lo = 0 if window == 0 else max(0, t - window + 1)
            want[:, t] = np.minimum(np.prod(w[:, lo : t + 1], 1), 4.0)
    np.testing.assert_allclose(W, want, rtol=1e-4)
    assert (W <= 4.0 + 1e-6).all() and (W > 0).all()
    if mode == "step":
        assert (W[ds.M == 0] == 1.0).all()  # padding carries no weight of its own


def test_ipw_weights_the_likelihood_and_needs_propensities():
    ds = make_ds()
    cfg = TINY.model_copy(update={"ipw": "cumulative"})
    m = model_for(ds, cfg)
    b = dataset_tensors(ds, 0)
    Kc, Ks, h = m.encode_states(b.X, b.A, b.T, b.Y)
    K = torch.cat([Kc, Ks], -1)
    W = L.ipw_weights(m, h, b)
    plain, weighted = L.l_recon(m, K, b), L.l_recon(m, K, b, W)
    manual = (L.outcome_nll(m, K, b.A, b.T, b.Y) * W * b.M).sum(1) / b.M.sum(1)
    assert torch.allclose(weighted, manual) and not torch.allclose(plain, weighted)
    # without logged propensities the weighted objective refuses to run (it never invents weights)
    with pytest.raises(ValueError, match="propensit"):
        batch_loss(m, dataset_tensors(ds.without_propensities(), 0), cfg, n_sites=2)


def test_auto_weights_a_site_with_propensities_and_leaves_one_without_on_the_papers_objective():
    ds = make_ds()
    auto, step = (TINY.model_copy(update={"ipw": m}) for m in ("auto", "step"))
    m_auto, m_step, m_off = model_for(ds, auto), model_for(ds, step), model_for(ds, TINY)

    def parts(m, view, cfg):
        torch.manual_seed(7)
        return batch_loss(m, dataset_tensors(view, 0), cfg, n_sites=2)[1]

    # a site that logs propensities: exactly 'step' (same network, same weights, same loss)
    with_p = parts(m_auto, training_view(ds, auto), auto)
    assert with_p == parts(m_step, training_view(ds, step), step)
    # a site without them: no error (where 'step' refuses), and the likelihood terms are the paper's, unweighted
    bare = ds.without_propensities()
    without_p = parts(m_auto, training_view(bare, auto), auto)
    paper = parts(m_off, training_view(bare, TINY), TINY)
    assert {k: v for k, v in without_p.items() if k != "total"} == {k: v for k, v in paper.items() if k != "total"}
    assert without_p["total"] > paper["total"]  # plus the behaviour head's own loss (Θs, never reported)
    assert with_p["recon"] != without_p["recon"]  # the weights moved the likelihood
    with pytest.raises(ValueError, match="propensit"):
        parts(m_step, training_view(bare, step), step)
    # what leaves the site has the same keys either way: the server cannot read off whether a site weights
    assert set(with_p) == set(without_p) == set(paper)


def test_auto_on_a_site_without_propensities_trains_exactly_the_papers_objective(one_torch_thread):
    """Resolved once per dataset (training.site_objective): the unused behaviour head takes no part in the global
    gradient clip, so Θc and the rest of Θs come out bit for bit as under ipw = 'off'."""
    bare = make_ds(n=48).without_propensities()
    auto = TINY.model_copy(update={"ipw": "auto"})
    assert site_objective(bare, auto).ipw == "off" and site_objective(make_ds(), auto).ipw == "step"
    assert site_objective(bare, TINY.model_copy(update={"ipw": "cumulative"})).ipw == "cumulative"

    def trained(cfg: ModelConfig) -> dict[str, np.ndarray]:
        m = model_for(bare, cfg)
        obj = site_objective(bare, cfg)
        train_local(m, training_view(bare, obj), obj, site_index=0, n_sites=2, epochs=2, seed=3,
                    optimizer=torch.optim.Adam(m.parameters(), lr=cfg.lr))
        return every_param(m)

    p_auto, p_off = trained(auto), trained(TINY)
    assert set(p_auto) - set(p_off) == {k for k in p_auto if k.startswith("propensity_head.")}
    assert all(np.array_equal(p_auto[k], p_off[k]) for k in p_off)
    fresh = every_param(model_for(bare, auto))
    assert all(np.array_equal(p_auto[k], fresh[k]) for k in p_auto if k.startswith("propensity_head."))


def test_auto_under_dp_sgd_freezes_the_unused_head_and_trains_it_where_it_weights(tmp_path, one_torch_thread):
    """Under DP-SGD a site without propensities leaves the head out of the round (no per-sample gradient, no
    clipping share, no noise); a site with them fits it. DP noise is not seeded, so only which parameters move is
    compared."""
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite, train_round_private
    from fcd_secure.privacy.ledger import dataset_fingerprint

    warnings.filterwarnings("ignore")
    auto = TINY.model_copy(update={"ipw": "auto"})
    for name, ds, head_moves in (("bare", make_ds(n=48).without_propensities(), False), ("logged", make_ds(n=48), True)):
        m = model_for(ds, auto)
        before = every_param(m)
        obj = site_objective(ds, auto)
        site = DPSite(str(tmp_path / name), dataset_fingerprint(ds), DPConfig(enabled=True, epsilon=8.0), ds.n,
                      planned_rounds=1, local_epochs=1, batch_size=16)
        train_round_private(site, m, training_view(ds, obj), obj, 0, 2, epochs=1, seed=3,
                            optimizer=torch.optim.Adam(m.parameters(), lr=auto.lr), round_id=1)
        after = every_param(m)
        moved = {k for k in before if not np.array_equal(before[k], after[k])}
        head = {k for k in before if k.startswith("propensity_head.")}
        assert (head <= moved) if head_moves else not (head & moved), name
        assert any(k.startswith("decoder.") for k in moved), name  # the round did train


def test_ipw_training_reports_nothing_about_p(one_torch_thread):
    ds = make_ds()
    cfg = TINY.model_copy(update={"ipw": "cumulative"})

    def run():
        m = model_for(ds, cfg)
        out = train_local(m, training_view(ds, cfg), cfg, site_index=0, n_sites=2, epochs=2, seed=4,
                          optimizer=torch.optim.Adam(m.parameters(), lr=cfg.lr))
        return m, out

    (m1, o1), (m2, o2) = run(), run()
    assert o1 == o2 and np.isfinite(o1["total"])
    assert set(o1) <= set(TRAIN_METRICS)  # the egress allow-list: no weight statistic leaves the site
    p1, p2 = every_param(m1), every_param(m2)
    assert all(np.array_equal(p1[k], p2[k]) for k in p1)
    # the behaviour head learned the logging policy's dependence on the history (its loss went down)
    fresh = model_for(ds, cfg)
    b = dataset_tensors(ds, 0)
    ce = lambda mm: float(L.l_propensity(mm, mm.encode_states(b.X, b.A, b.T, b.Y)[2], b).mean().detach())  # noqa: E731
    assert ce(m1) < ce(fresh)


def test_ipw_runs_under_opacus_per_sample_hooks():
    from opacus import PrivacyEngine

    warnings.filterwarnings("ignore")
    ds = make_ds(n=48)
    cfg = TINY.model_copy(update={"ipw": "cumulative", "dp_mode": True, "align_under_dp": "reference"})
    m = model_for(ds, cfg)
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    gm, dopt, dl = PrivacyEngine(accountant="prv").make_private(
        module=m, optimizer=opt, data_loader=make_loader(ds, 16, 0, site_index=1), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=True, grad_sample_mode="hooks",
    )
    before = get_params(gm, "theta_s")
    out = train_local(gm, ds, cfg, site_index=1, n_sites=2, epochs=1, seed=0, optimizer=dopt, loader=dl)
    assert np.isfinite(out["total"])
    after = get_params(gm, "theta_s")
    assert any(not np.array_equal(before[k], after[k]) for k in before if k.startswith("propensity_head."))
