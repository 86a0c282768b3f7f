"""docs/threats.md P13: DP noise and modular arithmetic.

A DP site's update carries Gaussian noise (DP-SGD adds it to the clipped gradients while the site trains,
``fcd_secure/privacy/engine.py``), and only then is the update clipped, encoded as fixed-point words and masked
(``fcd_secure/apps/secure_site.py::_train_update`` → ``aggregation/secagg/encoding.py::encode`` →
``SecAggClient.set_input``). These tests show, with the real protocol (every site in this process, no Flower, no
mocks), the real Opacus DP-SGD step and the real DP runs, that

* the secure aggregate of noised updates is exactly the decoding of the modular sum of the noised, encoded vectors
  (the masks cancel to the bit), and within the fixed-point quantisation bound of their plain weighted sum;
* the noise survives the modular arithmetic: over many seeded rounds the aggregate's deviation from the clean
  weighted mean has the variance Σ (n_i/N)² σ² the noise predicts (the masks add none), for Gaussian noise and for
  the noise Opacus' DP-SGD step itself draws;
* a noised value beyond the encoding range is never wrapped around the modulus: ``encode`` clips and counts it
  (``clipped_fraction``, P14), a vector holding an out-of-range word is refused before masking, a non-finite value is
  refused, and a policy or a round whose sum could wrap is refused when it is configured (P6);
* secure aggregation changes no ε: the accountant's ε depends on (σ, q, steps) only, and two real DP runs that differ
  only in secure aggregation leave the same privacy ledgers.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import CHEAP_EVALUATION
from secagg_harness import make_clients, make_identities, run_round, toy_manifest

from fcd_secure.aggregation.secagg.client import SecAggClient
from fcd_secure.aggregation.secagg.config import SecAggPolicy
from fcd_secure.aggregation.secagg.encoding import HEADER_WORDS, VectorLayout, decode, encode, plaintext_weighted_mean
from fcd_secure.aggregation.secagg.errors import EncodingError, PolicyError
from fcd_secure.aggregation.secagg.server import SecAggServer
from fcd_secure.manifest import THETA_C

SIGMA = 0.05  # noise s.d. per coordinate of one site's update (σ·C·lr/batch of DP-SGD)


def _layout(d: int) -> VectorLayout:
    return VectorLayout.from_manifest(toy_manifest([("w", (d,), THETA_C)]))


def _round(updates: dict, policy: SecAggPolicy, layout: VectorLayout, d: int, round_id: int = 1):
    sites = list(updates)
    identities, roster = make_identities(sites)
    server = SecAggServer(policy, layout, sites, round_id=round_id, roster=roster)
    clients = make_clients(policy, layout, updates, identities, roster, {"w": np.zeros(d, np.float32)})
    return run_round(server, clients)


def _noised_world(seed: int, d: int, n_sites: int = 5):
    """Clean updates, sample counts and per-site Gaussian noise; a site hands clean + noise to the encoding."""
    rng = np.random.default_rng(seed)
    clean = {f"site{i:02d}": rng.uniform(-0.3, 0.3, size=d).astype(np.float32) for i in range(n_sites)}
    counts = {s: int(rng.integers(50, 400)) for s in clean}
    noise = {s: rng.normal(0.0, SIGMA, size=d).astype(np.float32) for s in clean}
    updates = {s: ({"w": clean[s] + noise[s]}, counts[s]) for s in clean}
    return clean, counts, noise, updates


def test_noised_updates_sum_exactly_through_secure_aggregation():
    d = 300
    policy = SecAggPolicy(max_weight=1000)
    layout = _layout(d)
    _, _, _, updates = _noised_world(0, d)
    agg = _round(updates, policy, layout, d)
    # bit for bit: the masks cancel, and what was masked is the noised, encoded vector of each site
    total = np.zeros(layout.length, np.uint32)
    for arrays, n in updates.values():
        total += encode(layout, policy, arrays, n)  # uint32 addition is mod 2**32, as the protocol's
    exact = decode(layout, policy, total, len(updates))
    assert np.array_equal(agg.theta_c["w"], exact.theta_c["w"])
    # and within the fixed-point quantisation bound of the plain weighted sum of the noised updates
    ref = plaintext_weighted_mean(policy, list(updates.values()))
    assert np.max(np.abs(agg.theta_c["w"] - ref["w"])) <= agg.quantisation_bound
    assert agg.n_total == sum(n for _, n in updates.values())
    assert agg.clipped_fraction == 0.0


def test_the_noise_survives_the_modular_arithmetic_with_its_variance():
    """12 seeded rounds of 5 sites × 1,000 coordinates: every coordinate of every round is an independent draw of the
    aggregate's noise, so the pooled variance of 12,000 draws is within ±5 % of the prediction with probability
    > 0.999 (its relative s.d. is √(2/12000) ≈ 1.3 %), and each round's within ±15 % (relative s.d. 4.5 %)."""
    d, trials = 1000, 12
    policy = SecAggPolicy(max_weight=1000)
    layout = _layout(d)
    devs, predicted, ratios = [], [], []
    for t in range(trials):
        clean, counts, noise, updates = _noised_world(100 + t, d)
        agg = _round(updates, policy, layout, d, round_id=t + 1)
        n_total = sum(counts.values())
        clean_mean = sum(clean[s].astype(np.float64) * counts[s] for s in clean) / n_total
        noise_mean = sum(noise[s].astype(np.float64) * counts[s] for s in clean) / n_total
        dev = agg.theta_c["w"] - clean_mean
        # the deviation is the weighted noise itself (up to float32 addition and fixed-point rounding)
        assert np.max(np.abs(dev - noise_mean)) <= agg.quantisation_bound + 1e-7
        p = SIGMA**2 * sum((n / n_total) ** 2 for n in counts.values())
        devs.append(dev / np.sqrt(p))  # standardised: variance 1 if the noise survived intact
        predicted.append(p)
        ratios.append(float(np.var(dev)) / p)
    z = np.concatenate(devs)
    pooled = float(np.mean(z**2))
    assert 0.95 < pooled < 1.05, (pooled, ratios)
    assert all(0.85 < r < 1.15 for r in ratios), ratios
    assert abs(float(np.mean(z))) < 4 / np.sqrt(z.size)  # no bias from masking or rounding


@pytest.mark.usefixtures("one_torch_thread")
def test_the_noise_of_a_real_dp_sgd_step_survives_secure_aggregation(tmp_path):
    """Five sites train a linear model (4,040 parameters) with the real ``DPSite`` / Opacus DP-SGD path on a loss whose
    gradient is zero, so their update is the DP noise alone: −lr Σ_steps σ C z / B. Its secure aggregate has the
    predicted variance Σ (n_i/N)² steps_i (lr σ_i C / B)², and each site's ε is the accountant's ε of its
    (σ, q, steps), the same before and after secure aggregation."""
    import torch
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite
    from fcd_secure.privacy.planner import epsilon

    lr, batch = 0.5, 12
    dp = DPConfig(enabled=True, epsilon=3.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    # two site sizes (q = 1/5 and 1/10, 5 and 10 steps): unequal weights, and only two σ plans to compute
    sizes = {f"site{i:02d}": n for i, n in enumerate((60, 120, 60, 120, 60))}
    updates, per_site_var, eps_before, history, ledgers = {}, {}, {}, {}, {}
    for i, (site, n) in enumerate(sizes.items()):
        torch.manual_seed(i)
        model = nn.Linear(100, 40)
        before = [p.detach().clone() for p in model.parameters()]
        opt = torch.optim.SGD(model.parameters(), lr=lr)
        dps = DPSite(tmp_path / site, f"{i:064x}", dp, n, planned_rounds=1, local_epochs=1, batch_size=batch)
        res = dps.reserve_round(round_id=1)
        data = TensorDataset(torch.randn(n, 100, generator=torch.Generator().manual_seed(i)))
        m, o, dl = dps.make_private(model, opt, DataLoader(data, batch_size=batch), seed=7)
        steps = 0
        for (xb,) in dl:
            o.zero_grad()
            (m(xb) * 0.0).mean().backward()  # zero per-sample gradients: the step moves by the noise only
            o.step()
            steps += 1
        dps.commit(res)
        delta = torch.cat([(p.detach() - b).reshape(-1) for p, b in zip(model.parameters(), before, strict=True)])
        updates[site] = ({"w": delta.numpy().astype(np.float32)}, n)
        per_site_var[site] = steps * (lr * res.sigma * dp.clip / batch) ** 2
        history[site] = (res.sigma, res.q, steps)
        eps_before[site] = dps.spent()
        ledgers[site] = dps
        assert eps_before[site][0] == pytest.approx(epsilon([history[site]], dps.delta, "rdp"))
    d = 100 * 40 + 40
    policy = SecAggPolicy(max_weight=1000)
    layout = _layout(d)
    agg = _round(updates, policy, layout, d)
    n_total = sum(sizes.values())
    assert agg.clipped_fraction == 0.0
    ref = plaintext_weighted_mean(policy, list(updates.values()))
    assert np.max(np.abs(agg.theta_c["w"] - ref["w"])) <= agg.quantisation_bound + 1e-7
    predicted = sum((sizes[s] / n_total) ** 2 * per_site_var[s] for s in sizes)
    ratio = float(np.var(agg.theta_c["w"])) / predicted
    # 4,040 independent draws: relative s.d. of the sample variance √(2/4040) ≈ 2.2 %; ±10 % is > 4 s.d.
    assert 0.9 < ratio < 1.1, ratio
    assert abs(float(np.mean(agg.theta_c["w"]))) < 4 * np.sqrt(predicted / d)
    for site, dps in ledgers.items():  # secure aggregation spends nothing: the ledgers (read again) are unchanged
        assert dps.spent() == eps_before[site]
        assert [(g.sigma, g.q, g.steps) for g in dps.ledger.load().segments] == [history[site]]


def test_a_noised_value_beyond_the_encoding_bound_is_clipped_and_counted_not_wrapped():
    d = 200
    policy = SecAggPolicy(max_weight=1000)
    layout = _layout(d)
    rng = np.random.default_rng(2)
    updates = {f"site{i:02d}": ({"w": np.full(d, 0.1, np.float32)}, 100) for i in range(4)}
    big = rng.choice(d, size=10, replace=False)
    w = updates["site00"][0]["w"].copy()
    w[big] = policy.clip * 50  # noise far beyond the clip: would wrap to a negative word if not clipped
    updates["site00"] = ({"w": w}, 100)
    agg = _round(updates, policy, layout, d)
    expected = (policy.clip + 3 * 0.1) / 4  # site00's value is clipped to +clip, the others are 0.1
    assert np.allclose(agg.theta_c["w"][big], expected, atol=agg.quantisation_bound)
    assert (agg.theta_c["w"][big] > 0).all()  # never wrapped into a value of the other sign
    assert agg.clipped_fraction == pytest.approx(10 / (4 * d))


def test_a_noised_value_the_encoding_cannot_hold_is_refused_before_masking():
    """What ``encode`` does not clip is refused: a vector whose word was written past the clip range (a carrier that
    skipped clipping; the word has wrapped to a negative int32) is refused by the site before it masks anything; a
    non-finite noised value is refused by ``encode``; and a policy or a round whose sum could wrap is refused when it
    is configured, not discovered in a wrapped aggregate (P6)."""
    d = 50
    policy = SecAggPolicy(max_weight=1000)
    layout = _layout(d)
    n = 1000  # weight 1: the word is value × 2**scale_bits
    vector = encode(layout, policy, {"w": np.full(d, 0.2, np.float32)}, n)
    wrapped = vector.copy()
    # 50 × clip × 2**26 = 3.36e9 > 2**31: mod 2**32 it reads as about −0.94e9, a large value of the other sign
    wrapped[HEADER_WORDS + 3] = np.uint32(int(round(policy.clip * 50 * policy.scale)) % 2**32)
    assert wrapped.view(np.int32)[HEADER_WORDS + 3] < 0
    identities, roster = make_identities(["site00", "site01", "site02", "site03"])
    client = SecAggClient("site00", identities["site00"], roster, policy, layout)
    with pytest.raises(EncodingError, match=r"tensor 'w'\[3\].*outside the clip range"):
        client.set_input(wrapped, bytes(32))
    client.set_input(vector, bytes(32))  # the honest, clipped vector is taken
    for bad in (np.inf, -np.inf, np.nan):
        w = np.full(d, 0.2, np.float32)
        w[7] = bad
        with pytest.raises(EncodingError, match="NaN or inf"):
            encode(layout, policy, {"w": w}, n)
    # a clip range whose encoded words cannot be summed over the minimum of four sites without wrapping
    with pytest.raises(ValueError, match="leaves room for only"):
        SecAggPolicy(clip=64.0, scale_bits=26)
    # a round of more sites than the bound allows
    limit = policy.max_overflow_sites()
    assert limit * policy.word_bound < 2**31 <= (limit + 1) * policy.word_bound
    policy.check_overflow(limit)
    with pytest.raises(PolicyError, match="could overflow"):
        policy.check_overflow(limit + 1)


@pytest.mark.slow
@pytest.mark.usefixtures("one_torch_thread")
def test_accounting_is_the_same_with_and_without_secure_aggregation(tmp_path):
    """Two real DP-SGD runs (in-process engine, 4 sites, 1 round) that differ only in secure aggregation: every site's
    privacy ledger records the same segments and the same ε."""
    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.privacy.ledger import Ledger
    from fcd_secure.privacy.planner import epsilon
    from fcd_secure.privacy.report import find_ledgers

    spent = {}
    for secure in (True, False):
        root = tmp_path / ("secure" if secure else "plain")
        cfg = build_config("tiny", {
            "data": {"n_sites": 4, "test_fraction": 0.5},
            "federation": {"clients_per_round": 4, "rounds": 1, "eval_every": 0, "secure_aggregation": secure},
            "dp": {"enabled": True, "epsilon": 8.0},
            "evaluation": CHEAP_EVALUATION,  # the claim is the ledgers', not a policy's value
            "out": str(root / "run"), "state_dir": str(root / "state"),
        })
        run_inprocess(cfg)
        ledgers = find_ledgers(root / "state")
        assert len(ledgers) == 4
        spent[secure] = {}
        for f in ledgers:
            st = Ledger(f).load()
            # keyed by the site: a ledger's file name is its table's fingerprint under the site's record secret,
            # which each run's fresh state folder makes anew (privacy.identity)
            spent[secure][tuple(st.sites)] = ([(s.sigma, s.q, s.steps) for s in st.segments],
                                     epsilon(st.history(), st.delta, st.accountant))
    assert spent[True] == spent[False]
    assert all(0 < eps <= 8.0 for _, eps in spent[True].values())
