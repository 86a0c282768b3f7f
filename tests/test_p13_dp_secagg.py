"""docs/threats.md P13: DP noise and modular arithmetic.

A DP site's update carries Gaussian noise (DP-SGD adds it to the clipped gradients while the site trains), and only
then is the update clipped, encoded as fixed-point words and masked. These tests show, with the real protocol (every
site in this process, no Flower) and the real DP runs, that

* the secure aggregate of noised updates is their plain weighted sum, within the fixed-point quantisation bound;
* the noise survives the modular arithmetic: the aggregate's deviation from the clean weighted mean has the variance
  Σ (n_i/N)² σ² that the noise predicts (the masks cancel exactly, so they add none);
* a noised value beyond the encoding range is clipped and counted (``clipped_fraction``), never wrapped around the
  modulus into a value of the other sign;
* secure aggregation changes no ε: two DP runs that differ only in secure aggregation leave the same privacy ledgers.
"""

from __future__ import annotations

import numpy as np
import pytest
from secagg_harness import make_clients, make_identities, run_round, toy_manifest

from fcd_secure.aggregation.secagg.config import SecAggPolicy
from fcd_secure.aggregation.secagg.encoding import VectorLayout, plaintext_weighted_mean
from fcd_secure.aggregation.secagg.server import SecAggServer
from fcd_secure.manifest import THETA_C

SIGMA = 0.05  # noise s.d. per coordinate of one site's update (σ·C / batch of DP-SGD)


def _round(updates: dict, policy: SecAggPolicy, layout: VectorLayout, d: int):
    sites = list(updates)
    identities, roster = make_identities(sites)
    server = SecAggServer(policy, layout, sites, round_id=1, roster=roster)
    clients = make_clients(policy, layout, updates, identities, roster, {"w": np.zeros(d, np.float32)})
    return run_round(server, clients)


def _noised_world(seed: int, d: int, n_sites: int = 5):
    rng = np.random.default_rng(seed)
    clean = {f"site{i:02d}": rng.uniform(-0.3, 0.3, size=d) for i in range(n_sites)}
    counts = {s: int(rng.integers(50, 400)) for s in clean}
    noise = {s: rng.normal(0.0, SIGMA, size=d) for s in clean}
    updates = {s: ({"w": (clean[s] + noise[s]).astype(np.float32)}, counts[s]) for s in clean}
    return clean, counts, noise, updates


def test_noised_updates_sum_exactly_through_secure_aggregation():
    d = 300
    policy = SecAggPolicy(max_weight=1000)
    layout = VectorLayout.from_manifest(toy_manifest([("w", (d,), THETA_C)]))
    _, _, _, updates = _noised_world(0, d)
    agg = _round(updates, policy, layout, d)
    ref = plaintext_weighted_mean(policy, list(updates.values()))
    assert np.max(np.abs(agg.theta_c["w"] - ref["w"])) <= agg.quantisation_bound
    assert agg.n_total == sum(n for _, n in updates.values())
    assert agg.clipped_fraction == 0.0


def test_the_noise_survives_the_modular_arithmetic_with_its_variance():
    d = 4000  # coordinates are independent draws of the aggregate's noise
    policy = SecAggPolicy(max_weight=1000)
    layout = VectorLayout.from_manifest(toy_manifest([("w", (d,), THETA_C)]))
    clean, counts, _, updates = _noised_world(1, d)
    agg = _round(updates, policy, layout, d)
    n_total = sum(counts.values())
    clean_mean = sum(clean[s].astype(np.float32).astype(np.float64) * counts[s] for s in clean) / n_total
    dev = agg.theta_c["w"] - clean_mean
    predicted = SIGMA**2 * sum((n / n_total) ** 2 for n in counts.values())
    ratio = float(np.var(dev)) / predicted
    # the sample variance of 4000 Gaussian draws is within ±10 % of the truth with probability > 0.999
    assert 0.9 < ratio < 1.1, ratio
    assert abs(float(np.mean(dev))) < 4 * np.sqrt(predicted / d)  # no bias from masking or rounding


def test_a_noised_value_beyond_the_encoding_bound_is_clipped_and_counted_not_wrapped():
    d = 200
    policy = SecAggPolicy(max_weight=1000)
    layout = VectorLayout.from_manifest(toy_manifest([("w", (d,), THETA_C)]))
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


@pytest.mark.slow
def test_accounting_is_the_same_with_and_without_secure_aggregation(tmp_path):
    """Two real DP-SGD runs (in-process engine, 4 sites, 1 round) that differ only in secure aggregation: every site's
    privacy ledger records the same segments and the same ε."""
    import torch

    from fcd_secure.config import build_config
    from fcd_secure.engines.inprocess import run_inprocess
    from fcd_secure.privacy.ledger import Ledger
    from fcd_secure.privacy.planner import epsilon
    from fcd_secure.privacy.report import find_ledgers

    torch.set_num_threads(1)
    spent = {}
    for secure in (True, False):
        root = tmp_path / ("secure" if secure else "plain")
        cfg = build_config("tiny", {
            "data": {"n_sites": 4, "test_fraction": 0.5},
            "federation": {"clients_per_round": 4, "rounds": 1, "eval_every": 0, "secure_aggregation": secure},
            "dp": {"enabled": True, "epsilon": 8.0},
            "evaluation": {"n_samples": 1},
            "out": str(root / "run"), "state_dir": str(root / "state"),
        })
        run_inprocess(cfg)
        ledgers = find_ledgers(root / "state")
        assert len(ledgers) == 4
        spent[secure] = {}
        for f in ledgers:
            st = Ledger(f).load()
            spent[secure][f.name] = ([(s.sigma, s.q, s.steps) for s in st.segments],
                                     epsilon(st.history(), st.delta, st.accountant))
    assert spent[True] == spent[False]
    assert all(0 < eps <= 8.0 for _, eps in spent[True].values())
