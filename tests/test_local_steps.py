"""A site's local round makes at least ``federation.min_local_steps`` optimiser steps (``learner.round_epochs``), and
why it must: with few rows a site, one pass is one or two steps, and a federated simulator trained that way predicts
no effect of a treatment whose effect is large and known (issue 42; docs/benchmarks.md, "The local round's steps").
"""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.config import build_config
from fcd_secure.data.schema import SiteDataset
from fcd_secure.federation import learner
from fcd_secure.manifest import THETA_C
from fcd_secure.model.baselines import SIMULATORS

#: the synthetic world below: steps per trajectory, rows per site, sites
L, N, SITES = 5, 40, 2


def test_round_epochs_raises_the_passes_to_the_fewest_that_reach_the_steps():
    assert learner.round_epochs(1, 0, 190, 64) == 1  # off: Table II's one pass
    assert learner.round_epochs(1, 32, 190, 64) == 11  # 3 batches a pass: 11 passes, 33 steps
    assert learner.round_epochs(1, 32, 5_000, 64) == 1  # a large site already makes 79 steps
    assert learner.round_epochs(4, 3, 190, 64) == 4  # never fewer passes than asked
    assert learner.round_epochs(1, 5, 20, 64) == 5  # the batch is capped at the site's rows: one step a pass
    with pytest.raises(ValueError):
        learner.round_epochs(0, 5, 20, 64)


def test_a_site_with_few_rows_makes_the_round_s_minimum_of_steps(tmp_path):
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.federation.site_policy import SitePolicy

    cfg = build_config("tiny", {"state_dir": str(tmp_path)})
    rt = SiteRuntime(cfg, "site-00", 0, str(tmp_path), SitePolicy.for_run(cfg))
    theta = rt.model.get_params(THETA_C)
    per_pass = -(-rt.data.train.n // min(cfg.model.batch_size, rt.data.train.n))
    conf = {"server-round": 1, "part": THETA_C, "local-epochs": 1}
    _, _, plain = rt.train_round(theta, conf)
    assert plain["steps"] == per_pass
    _, _, floored = rt.train_round(theta, {**conf, "server-round": 2, "min-local-steps": 3 * per_pass + 1})
    assert floored["steps"] == 4 * per_pass and floored["epochs"] == 4


def _site(seed: int, site: int) -> SiteDataset:
    """A randomised trial (no confounding) whose treatment works with carry-over: P(Y_t = 1) = 0.1 + 0.8·min(1,
    c_t / 3), c_t the treated steps up to and including t. Truth over the 6 steps: never 0.1, always 0.767."""
    rng = np.random.default_rng([seed, site])
    T = rng.integers(0, 2, size=(N, L))
    p = 0.1 + 0.8 * np.minimum(1.0, np.cumsum(T, axis=1) / 3.0)
    Y = (rng.random((N, L)) < p).astype(np.float32)
    return SiteDataset(X=np.zeros((N, 1), np.float32), A=np.zeros((N, L, 1), np.float32), T=T.astype(np.int64), Y=Y,
                       M=np.ones((N, L), np.float32), n_actions=2, name=f"trial{site}")


def _federated_effect(min_steps: int, rounds: int = 2) -> float:
    """FedAvg of Θc over the sites (every site every round, weighted by rows, Θs and the optimiser kept per site, as
    the ServerApp and ``SiteRuntime.train_round`` do), each local round ``round_epochs`` passes; then the federated
    deterministic simulator's always − never over the whole trajectory."""
    # one batch holds a site's rows (one step a pass); L_cf off: it is most of a step's cost and not what is tested
    cfg = build_config("tiny", {"model": {"transition": "deterministic", "batch_size": 64, "use_cf": False,
                                                 "lr": 1e-2}})
    sites = [_site(0, i) for i in range(SITES)]
    mc = learner.model_config(cfg)
    sims = [SIMULATORS["fed_causaldiff"].from_dims(mc, 1, 1, 2, SITES) for _ in sites]
    theta = sims[0].get_params(THETA_C)
    for r in range(1, rounds + 1):
        sent = []
        for i, (sim, ds) in enumerate(zip(sims, sites)):
            sim.set_params(THETA_C, theta)
            epochs = learner.round_epochs(1, min_steps, ds.n, mc.batch_size)
            learner.train_local(sim, ds, cfg, i, SITES, epochs, learner.round_seed(0, r, i), sim.optimizer)
            sent.append(sim.get_params(THETA_C))
        theta = {k: sum(s[k] for s in sent) / SITES for k in theta}  # equal rows: the weighted mean is the mean
    value = {}
    for a in (0, 1):
        v = []
        for sim, ds in zip(sims, sites):
            sim.set_params(THETA_C, theta)
            v.append(float(np.asarray(sim.simulate(ds, a, 2, seed=1).probs).mean()))
        value[a] = float(np.mean(v))
    return value[1] - value[0]


def test_the_federated_simulator_learns_a_large_effect_only_when_the_local_rounds_make_enough_steps():
    truth = np.mean(0.1 + 0.8 * np.minimum(1.0, np.arange(1, L + 1) / 3.0)) - 0.1
    few = _federated_effect(0)  # one step a round, as a small site's single pass: 0.16 of 0.64 when written
    enough = _federated_effect(20)  # 20 steps a round: 0.61
    assert abs(few - truth) > 0.3
    assert abs(enough - truth) < 0.15


def test_P69_a_server_cannot_make_a_site_train_more_passes_a_round_than_its_policy_allows(tmp_path):
    """docs/threats.md P69: the round's ``local-epochs`` and ``min-local-steps`` come in the server's message; the
    site's ``[training] max_local_passes`` caps the passes, refused before any training, naming the setting."""
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.audit import Refusal
    from fcd_secure.federation.site_policy import SitePolicy, TrainingPolicy

    cfg = build_config("tiny", {"state_dir": str(tmp_path)})
    policy = SitePolicy.for_run(cfg).model_copy(update={"training": TrainingPolicy(max_local_passes=2)})
    rt = SiteRuntime(cfg, "site-00", 0, str(tmp_path), policy)
    theta = rt.model.get_params(THETA_C)
    per_pass = -(-rt.data.train.n // min(cfg.model.batch_size, rt.data.train.n))
    conf = {"server-round": 1, "part": THETA_C, "local-epochs": 1}
    for asked, key in (({"min-local-steps": 2 * per_pass + 1}, "federation.min_local_steps"),
                       ({"local-epochs": 3}, "federation.local_epochs")):
        with pytest.raises(Refusal) as got:
            rt.train_round(theta, {**conf, **asked})
        assert (got.value.rule, got.value.key) == ("site_policy", key)
    # within the cap the same round trains, and its passes are the ones asked for
    _, _, ok = rt.train_round(theta, {**conf, "min-local-steps": 2 * per_pass})
    assert ok["epochs"] == 2 and ok["steps"] == 2 * per_pass
    # a run whose own config asks for more passes is refused before any work, naming the field
    more = build_config("tiny", {"federation": {"local_epochs": 3}})
    assert policy.admit(more)[1].key == "federation.local_epochs"


def test_the_generated_worlds_with_long_courses_train_with_their_own_minimum_of_steps(tmp_path):
    """``fcd run --dataset tumour`` (or carry-over) trains as its documented figures were measured: 32 steps a local
    round and the deterministic transition (``config.WORLD_DEFAULTS``); DKT-Synth's main job keeps Table II's one pass
    and the diffusion transition; what the caller names wins, and a config file read back without a preset re-runs
    its own value."""
    from fcd_secure.cli.resolve import RunOptions, resolve_config

    for world in ("tumour", "carryover"):
        assert build_config("default", {"data": {"dataset": world}}).federation.min_local_steps == 32
        assert build_config("tiny", {"data": {"dataset": world}}).federation.min_local_steps == 32
        assert build_config("default", {"data": {"dataset": world}}).model.transition == "deterministic"
    assert build_config("default").federation.min_local_steps == 0  # the README's main job: DKT-Synth
    assert build_config("default").model.transition == "diffusion"
    chosen = build_config("default", {"data": {"dataset": "tumour"}, "model": {"transition": "diffusion"}})
    assert chosen.model.transition == "diffusion" and chosen.federation.min_local_steps == 32
    assert build_config("paper", {"data": {"dataset": "statics2011"}}).federation.min_local_steps == 0
    named = build_config("default", {"data": {"dataset": "tumour"}, "federation": {"min_local_steps": 0}})
    assert named.federation.min_local_steps == 0
    assert resolve_config(RunOptions(dataset="tumour")).federation.min_local_steps == 32
    file = tmp_path / "run.toml"
    file.write_text(named.to_toml())
    assert resolve_config(RunOptions(config_file=file)).federation.min_local_steps == 0
