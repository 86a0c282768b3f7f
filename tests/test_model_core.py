"""Fed-CausalDiff model: manifest, losses, samplers, Opacus compatibility, determinism (tiny sizes, real parts)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

from fcd_secure.data.schema import SiteDataset
from fcd_secure.manifest import Manifest, ManifestEntry, ManifestError
from fcd_secure.model import (
    Batch,
    FedCausalDiff,
    ModelConfig,
    batch_loss,
    build_manifest,
    get_params,
    make_loader,
    set_params,
    train_local,
)
from fcd_secure.model.baselines import FedCausalDiffSimulator, GFormulaSimulator, NaiveSimulator
from fcd_secure.model.networks import THETA_S_MODULES
from fcd_secure.model.samplers import ddim_sample, ddpm_sample
from fcd_secure.model.schedule import NoiseSchedule

pytestmark = pytest.mark.usefixtures("one_torch_thread")

TINY = ModelConfig(
    k_causal=3, k_site=2, hidden=12, mlp_hidden=12, action_emb=4, time_emb=8,
    diffusion_steps=10, sampler_steps=3, cf_horizon=2, batch_size=16, lr=5e-3,
)


def make_ds(n: int = 48, L: int = 8, dx: int = 3, da: int = 2, na: int = 3, seed: int = 0, site: int = 0) -> SiteDataset:
    """Random trajectories with a real signal: Y depends on X, the action and the previous Y."""
    r = np.random.default_rng(seed)
    lengths = r.integers(3, L + 1, n)
    M = (np.arange(L)[None] < lengths[:, None]).astype(np.float32)
    X = r.normal(size=(n, dx)).astype(np.float32)
    A = r.normal(size=(n, L, da)).astype(np.float32)
    T = r.integers(0, na, (n, L))
    Y = np.zeros((n, L), np.float32)
    for t in range(L):
        prev = Y[:, t - 1] if t else 0.0
        logit = 1.5 * X[:, 0] + 1.2 * (T[:, t] == 1) - 0.8 * (T[:, t] == 2) + 1.0 * prev + 0.5 * A[:, t, 0]
        Y[:, t] = (r.random(n) < 1 / (1 + np.exp(-logit))).astype(np.float32)
    T = (T * M).astype(np.int64)
    return SiteDataset(X=X, A=A * M[..., None], T=T, Y=Y * M, M=M, n_actions=na, name=f"site{site}")


def model_for(ds: SiteDataset, cfg: ModelConfig = TINY, n_sites: int = 3) -> FedCausalDiff:
    return FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, n_sites)


# -- manifest ---------------------------------------------------------------------------------------------------


def test_manifest_partition_as_documented():
    m = model_for(make_ds())
    man = build_manifest(m)
    tops = {e.name.split(".")[0]: e.part for e in man.entries}
    assert set(THETA_S_MODULES) == {"head_s", "eps_s", "parallel_head", "propensity_head"}
    # the default model.ipw = 'auto' builds the behaviour head of IPW weighting on every site (one layout for all)
    assert {k for k, v in tops.items() if v == "theta_s"} == set(THETA_S_MODULES)
    assert {k for k, v in tops.items() if v == "theta_c"} == {
        "action_emb", "trunk", "head_c", "eps_c", "decoder", "site_disc"
    }
    paper = build_manifest(model_for(make_ds(), TINY.model_copy(update={"ipw": "off"})))
    assert {e.name.split(".")[0] for e in paper.entries if e.part == "theta_s"} == {"head_s", "eps_s", "parallel_head"}
    # the behaviour head is site-bound: Θs that full synchronisation leaves on the site too
    bound = {e.name for e in man.entries if e.site_bound}
    assert bound and {n.split(".")[0] for n in bound} == {"propensity_head"}
    assert set(man.names("full")) == {n for n, _ in m.named_parameters()} - bound
    assert man.size("full") == man.size("theta_c") + man.size("theta_s") - sum(e.size for e in man.entries if e.site_bound)
    assert set(paper.names("full")) == set(paper.names("theta_c")) | set(paper.names("theta_s"))
    # the flag is part of the layout: a manifest that sends the head under full sync is a different layout
    unbound = Manifest.from_entries(e.model_copy(update={"site_bound": False}) for e in man.entries)
    assert unbound.layout_hash != man.layout_hash and set(unbound.names("full")) >= bound
    with pytest.raises(ValueError, match="site-bound"):
        ManifestEntry(name="x", shape=(1,), dtype="float32", part="theta_c", site_bound=True)


def test_manifest_hash_stable_and_layout_sensitive():
    ds = make_ds()
    h1 = build_manifest(model_for(ds)).layout_hash
    h2 = build_manifest(FedCausalDiff.from_dims(TINY.model_copy(update={"seed": 7}), ds.dx, ds.da, ds.n_actions, 3)).layout_hash
    assert h1 == h2  # values differ, layout does not
    assert build_manifest(model_for(ds, TINY.model_copy(update={"k_site": 3}))).layout_hash != h1
    assert build_manifest(model_for(ds, n_sites=4)).layout_hash != h1
    man = build_manifest(model_for(ds))
    assert type(man).from_json(man.to_json()) == man


def test_get_set_round_trip_and_strictness():
    ds = make_ds()
    a, b = model_for(ds), FedCausalDiff.from_dims(TINY.model_copy(update={"seed": 3}), ds.dx, ds.da, ds.n_actions, 3)
    c_params, s_params = get_params(a, "theta_c"), get_params(a, "theta_s")
    assert not set(c_params) & set(s_params)
    assert not any(n.split(".")[0] in THETA_S_MODULES for n in c_params)
    before_s = get_params(b, "theta_s")
    set_params(b, "theta_c", c_params)
    for n, v in get_params(b, "theta_c").items():
        np.testing.assert_array_equal(v, c_params[n])
    for n, v in get_params(b, "theta_s").items():  # Θs untouched by a Θc load
        np.testing.assert_array_equal(v, before_s[n])
    with pytest.raises(ManifestError, match="missing"):
        set_params(b, "theta_c", {k: v for k, v in list(c_params.items())[1:]})
    with pytest.raises(ManifestError, match="another part"):
        set_params(b, "theta_c", {**c_params, **s_params})
    bad = dict(c_params)
    name = next(iter(bad))
    bad[name] = np.zeros((1, 1), np.float32)
    snapshot = get_params(b, "theta_c")
    with pytest.raises(ManifestError, match=name):
        set_params(b, "theta_c", bad)
    for n, v in get_params(b, "theta_c").items():  # nothing half-written
        np.testing.assert_array_equal(v, snapshot[n])
    with pytest.raises(ManifestError, match="unknown part"):
        get_params(b, "theta_x")  # type: ignore[arg-type]
    full = get_params(a, "full")
    set_params(b, "full", full)
    assert all(np.array_equal(v, full[n]) for n, v in get_params(b, "full").items())


# -- losses -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("off", [None, "use_recon", "use_diff", "use_align", "use_dis", "use_cf"])
def test_each_loss_finite_and_switchable(off):
    ds = make_ds()
    cfg = TINY if off is None else TINY.model_copy(update={off: False})
    m = model_for(ds, cfg)
    batch = next(iter(make_loader(ds, 16, 0, site_index=1)))
    torch.manual_seed(0)
    loss, parts = batch_loss(m, batch, cfg, n_sites=3)
    assert torch.isfinite(loss)
    names = {"recon", "diff", "align", "dis", "cf"}
    expect = names if off is None else names - {off.removeprefix("use_")}
    assert set(parts) - {"total"} == expect
    assert all(np.isfinite(v) for v in parts.values())
    loss.backward()
    grads = [p.grad for p in m.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_loss_decreases_on_tiny_dataset():
    ds = make_ds(n=64)
    m = model_for(ds)
    first = train_local(m, ds, TINY, site_index=0, n_sites=3, epochs=1, seed=0)
    opt = torch.optim.Adam(m.parameters(), lr=TINY.lr)
    for ep in range(1, 12):
        last = train_local(m, ds, TINY, site_index=0, n_sites=3, epochs=1, seed=ep, optimizer=opt)
    assert last["recon"] < first["recon"] - 0.02
    assert last["diff"] < first["diff"]
    assert last["total"] < first["total"]


def test_dp_mode_drops_batch_coupled_terms():
    assert TINY.align_form == "batch_mmd" and TINY.batch_coupled_terms == ["align"]
    dp = TINY.model_copy(update={"dp_mode": True})
    assert dp.align_form == "off" and dp.per_sample_safe
    ref = TINY.model_copy(update={"dp_mode": True, "align_under_dp": "reference"})
    assert ref.align_form == "reference" and ref.per_sample_safe
    # per-sample safety of the reference form: one row's loss does not depend on the others
    ds = make_ds()
    m = model_for(ds, ref)
    batch = Batch.of(next(iter(make_loader(ds, 16, 0, site_index=0))))
    from fcd_secure.model.losses import l_align_reference

    Kc, _ = m.encode(*batch[:4])
    full = l_align_reference(m, Kc, batch)
    one = l_align_reference(m, Kc[:1], Batch.of([b[:1] for b in batch]))
    torch.testing.assert_close(full[:1], one)


def test_runs_under_opacus_poisson_hooks():
    from opacus import PrivacyEngine

    warnings.filterwarnings("ignore")
    ds = make_ds(n=48)
    cfg = TINY.model_copy(update={"dp_mode": True, "align_under_dp": "reference"})
    m = model_for(ds, cfg)
    h_before = build_manifest(m).layout_hash
    opt = torch.optim.SGD(m.parameters(), lr=0.1)
    pe = PrivacyEngine(accountant="prv")
    gm, dopt, dl = pe.make_private(
        module=m, optimizer=opt, data_loader=make_loader(ds, 16, 0, site_index=2), noise_multiplier=1.0,
        max_grad_norm=1.0, poisson_sampling=True, grad_sample_mode="hooks",
    )
    before = get_params(gm, "full")
    out = train_local(gm, ds, cfg, site_index=2, n_sites=3, epochs=1, seed=0, optimizer=dopt, loader=dl)
    assert np.isfinite(out["total"]) and out["steps"] >= 1
    assert pe.get_epsilon(1e-5) > 0
    assert build_manifest(gm).layout_hash == h_before  # wrapper prefix stripped
    after = get_params(gm, "full")
    assert any(not np.array_equal(before[n], after[n]) for n in before)


# -- samplers ---------------------------------------------------------------------------------------------------


def test_samplers_shapes_finite_and_ddim_deterministic():
    sch = NoiseSchedule(20, "cosine")
    target = torch.tensor([0.5, -0.3, 0.1])

    def eps_fn(x, n):  # the exact ε for a point mass at `target`
        ab = sch.alpha_bar[n].unsqueeze(-1)
        return (x - ab.sqrt() * target) / (1 - ab).sqrt()

    g = torch.Generator().manual_seed(0)
    x = ddpm_sample(eps_fn, sch, (7, 3), g)
    assert x.shape == (7, 3) and torch.isfinite(x).all()
    torch.testing.assert_close(x, target.expand(7, 3), atol=1e-3, rtol=0)
    d1 = ddim_sample(eps_fn, sch, (7, 3), 4, torch.Generator().manual_seed(1))
    d2 = ddim_sample(eps_fn, sch, (7, 3), 4, torch.Generator().manual_seed(1))
    assert d1.shape == (7, 3) and torch.isfinite(d1).all()
    assert torch.equal(d1, d2)
    torch.testing.assert_close(d1, target.expand(7, 3), atol=1e-3, rtol=0)
    # with a learned (untrained) model: both samplers give finite [B, k] transitions
    ds = make_ds()
    m = model_for(ds)
    K = torch.zeros(5, TINY.k)
    for s in ("ddpm", "ddim"):
        out = m.transition(K, torch.zeros(5, ds.da), torch.ones(5, dtype=torch.long), sampler=s,
                           generator=torch.Generator().manual_seed(2))
        assert out.shape == (5, TINY.k) and torch.isfinite(out).all()


# -- determinism and simulation ---------------------------------------------------------------------------------


def _train_and_simulate(seed: int):
    ds = make_ds(n=32)
    m = model_for(ds)
    opt = torch.optim.Adam(m.parameters(), lr=TINY.lr)
    for ep in range(2):
        train_local(m, ds, TINY, site_index=1, n_sites=3, epochs=1, seed=seed + ep, optimizer=opt)
    sim = FedCausalDiffSimulator(m)
    res = sim.simulate(ds, 1, n_samples=3, seed=seed)
    eff = sim.estimate_effects(ds, (0, 1), anchor_step=2, horizon=3, n_samples=3, seed=seed)
    return get_params(m, "full"), res, eff


def test_same_seed_same_numbers():
    p1, r1, e1 = _train_and_simulate(5)
    p2, r2, e2 = _train_and_simulate(5)
    assert all(np.array_equal(p1[n], p2[n]) for n in p1)
    assert np.array_equal(r1.probs, r2.probs) and r1.value == r2.value
    assert np.array_equal(e1, e2)
    _, r3, _ = _train_and_simulate(6)
    assert r3.value != r1.value


def test_simulation_outputs_and_plans():
    ds = make_ds(n=20)
    sim = FedCausalDiffSimulator(model_for(ds))
    res = sim.simulate(ds, np.array([1, 2, 0, 1]), n_samples=2, seed=0, start_t=1, horizon=4)
    assert res.probs.shape == (20, 2, 4) and ((res.probs > 0) & (res.probs < 1)).all()
    assert set(np.unique(res.y)) <= {0.0, 1.0}
    assert (res.actions[:, :, 0] == 1).all() and (res.actions[:, :, 1] == 2).all()
    assert res.ci95[0] <= res.value <= res.ci95[1]

    class Flip:
        name = "flip"

        def actions(self, t, y_hist, lengths, a_off, a_on):
            assert y_hist.shape == (len(lengths), t)
            return np.where(y_hist[:, -1] > 0, a_on, a_off) if t else np.full(len(lengths), a_off)

    pol = sim.simulate(ds, Flip(), n_samples=2, seed=0, anchors=(0, 2))
    y_prev = pol.y[:, :, :-1]
    np.testing.assert_array_equal(pol.actions[:, :, 1:], np.where(y_prev > 0, 2, 0))
    with pytest.raises(ValueError, match="horizon"):
        sim.simulate(ds, 1, 1, 0, start_t=5, horizon=10)
    with pytest.raises(ValueError, match="outside"):
        sim.simulate(ds, 7, 1, 0)
    # common random numbers: identical plans under one seed give identical draws; effect of a = a is zero
    same = sim.estimate_effects(ds, (1, 1), anchor_step=0, horizon=3, n_samples=2, seed=0)
    assert np.array_equal(same, np.zeros(ds.n))


def test_baselines_train_and_estimate():
    ds = make_ds(n=48)
    gf = GFormulaSimulator.from_dims(TINY, ds.dx, ds.da, ds.n_actions, 3)
    assert gf.config.transition == "deterministic"
    out = gf.train_site(ds, 0, 3, epochs=1, seed=0)
    assert np.isfinite(out["diff"])
    eff_g = gf.estimate_effects(ds, (0, 1), anchor_step=1, horizon=3, n_samples=2, seed=0)
    assert eff_g.shape == (ds.n,) and np.isfinite(eff_g).all()
    naive = NaiveSimulator.from_dims(ModelConfig(mlp_hidden=16), ds.dx, ds.da, ds.n_actions, 3)
    first = naive.train_site(ds, 0, 3, epochs=1, seed=0)
    last = naive.train_site(ds, 0, 3, epochs=15, seed=1)
    assert last["nll"] < first["nll"]
    eff = naive.estimate_effects(ds, (0, 1), anchor_step=1, horizon=3, n_samples=4, seed=0)
    # the data's true immediate effect of action 1 vs 0 is positive (+1.2 logits); a fitted model must see it
    assert eff.shape == (ds.n,) and eff.mean() > 0


def test_encoder_rollout_replays_the_encoder_and_runs():
    ds = make_ds(n=10)
    m = model_for(ds)
    X, A, T, Y = (torch.as_tensor(v) for v in (ds.X, ds.A, ds.T, ds.Y))
    with torch.no_grad():
        Kc, Ks = m.encode(X, A, T, Y)
        K, state = m.encode_prefix(X, A, T, Y, 0)
        for t in range(1, 4):  # feeding the logged (T, Y) step by step reproduces the full-sequence encoder
            K, state = m.encode_step(state, X, A[:, t], T[:, t - 1], Y[:, t - 1])
            torch.testing.assert_close(K, torch.cat([Kc, Ks], -1)[:, t])
    r = FedCausalDiffSimulator(m).simulate(ds, 1, n_samples=2, seed=0, start_t=1, horizon=4, rollout="encoder")
    assert r.probs.shape == (10, 2, 4) and np.isfinite(r.probs).all() and r.meta["rollout"] == "encoder"


@pytest.mark.parametrize("to_encoder", [False, True])
def test_cf_gradient_reaches_encoder_only_when_asked(to_encoder):
    from fcd_secure.model.losses import l_cf

    ds = make_ds()
    cfg = TINY.model_copy(update={"cf_grad_to_encoder": to_encoder})
    m = model_for(ds, cfg)
    batch = Batch.of(next(iter(make_loader(ds, 16, 0, site_index=0))))
    Kc, Ks = m.encode(*batch[:4])
    l_cf(m, torch.cat([Kc, Ks], -1), batch).mean().backward()
    trunk_grad = m.trunk.weight_ih_l0.grad
    assert m.eps_c[0].weight.grad is not None and m.eps_c[0].weight.grad.abs().sum() > 0
    assert m.decoder[0].weight.grad.abs().sum() > 0
    assert (trunk_grad is not None and trunk_grad.abs().sum() > 0) == to_encoder
