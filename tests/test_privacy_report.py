"""DP training of our model through DPSite, and the privacy report recomputed independently from the ledger."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from opacus.accountants import PRVAccountant
from opacus.accountants.analysis.rdp import compute_rdp, get_privacy_spent
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.model.networks import FedCausalDiff
from fcd_secure.privacy.config import DPConfig
from fcd_secure.privacy.engine import DPSite, dataset_fingerprint, train_round_private
from fcd_secure.privacy.report import build_report
from tests.test_privacy_grads import tiny_cfg, tiny_site

N_SITES = 2



pytestmark = pytest.mark.usefixtures("one_torch_thread")

def train_site(state_dir, ds, dp: DPConfig, rounds: int, seed: int = 0) -> tuple[FedCausalDiff, list[dict]]:
    cfg = tiny_cfg(dp_mode=False)
    site = DPSite(state_dir, dataset_fingerprint(ds), dp, ds.n, planned_rounds=rounds, local_epochs=1, batch_size=6)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES)
    out = [train_round_private(site, model, ds, cfg, 0, N_SITES, epochs=1, seed=seed + r, round_id=r + 1) for r in range(rounds)]
    return model, out


def independent_epsilon(ledger: dict, accountant: str) -> float:
    """ε straight from the raw JSON segments, without fcd_secure's planner."""
    segs = [(s["sigma"], s["q"], s["steps"] if s["status"] == "committed" else s["reserved_steps"]) for s in ledger["segments"]]
    delta = ledger["delta"]
    if accountant == "rdp":
        orders = [1 + x / 10.0 for x in range(1, 100)] + list(range(12, 64))
        rdp = sum(compute_rdp(q=q, noise_multiplier=s, steps=n, orders=orders) for s, q, n in segs)
        return float(get_privacy_spent(orders=orders, rdp=rdp, delta=delta)[0])
    acc = PRVAccountant()
    acc.history = segs
    return float(acc.get_epsilon(delta, eps_error=0.01))


def test_dp_training_of_our_model_is_deterministic_and_accounted(tmp_path):
    ds = tiny_site(n=30, L=4, seed=1)  # q = 1/5; a few Poisson batches are empty, training must cope
    dp = DPConfig(enabled=True, epsilon=6.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    m1, out1 = train_site(tmp_path / "a", ds, dp, rounds=2)
    m2, out2 = train_site(tmp_path / "b", ds, dp, rounds=2)
    for p1, p2 in zip(m1.parameters(), m2.parameters()):
        assert torch.equal(p1, p2)
    assert [o["dp_epsilon"] for o in out1] == [o["dp_epsilon"] for o in out2]
    assert out1[1]["dp_epsilon"] > out1[0]["dp_epsilon"] > 0 and out1[1]["dp_epsilon"] <= 6.0
    assert out1[0]["dp_steps"] == 5.0
    assert all(np.isfinite(p.detach().numpy()).all() for p in m1.parameters())
    # with the default site-secret noise seed, two sites with the same run seed draw different noise
    secret = dp.model_copy(update={"noise_seed": "site_secret"})
    s1, _ = train_site(tmp_path / "c", ds, secret, rounds=1)
    s2, _ = train_site(tmp_path / "d", ds, secret, rounds=1)
    assert not torch.equal(s1.decoder[0].weight, s2.decoder[0].weight)


@pytest.mark.parametrize("accountant", ["rdp", "prv"])
def test_report_epsilon_equals_an_independent_accountant(tmp_path, accountant):
    dp = DPConfig(enabled=True, epsilon=8.0, delta=1e-3, accountant=accountant, noise_seed="run_seed")
    for i, site_id in enumerate(["site-00", "site-01"]):
        train_site(tmp_path / "state" / site_id, tiny_site(n=30, L=3, seed=10 + i), dp, rounds=1 + i)
    rep = build_report(tmp_path / "state")
    assert [s["site"] for s in rep["sites"]] == ["site-00", "site-01"]
    for s in rep["sites"]:
        raw = json.loads(open(s["ledger"]).read())
        want = independent_epsilon(raw, accountant)
        assert s["epsilon_spent"] == pytest.approx(want, rel=1e-6)
        assert s["segments"][-1]["epsilon_after"] == pytest.approx(want, rel=1e-6)
        assert s["epsilon_remaining"] == pytest.approx(8.0 - want, rel=1e-6)
        assert s["mechanism"]["rounds"] == len(raw["segments"])
        assert s["mechanism"]["total_steps"] == sum(x["steps"] for x in raw["segments"])
    assert rep["consortium"]["epsilon"] == max(s["epsilon_spent"] for s in rep["sites"])


def test_cli_report_writes_json_markdown_and_plot(tmp_path):
    dp = DPConfig(enabled=True, epsilon=5.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    train_site(tmp_path / "state" / "site-00", tiny_site(n=30, L=3), dp, rounds=2)
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(json.dumps({"state_root": str(tmp_path / "state")}))
    res = CliRunner().invoke(app, ["privacy", "report", str(run), "--json"])
    assert res.exit_code == 0, res.output
    rep = json.loads(res.stdout)["data"]
    site = rep["sites"][0]
    assert site["adjacency"].startswith("add/remove one trajectory")
    assert site["unit_of_privacy"].startswith("one trajectory")
    assert site["libraries"]["opacus"] == "1.6.0"
    assert site["batch_terms_under_dp"] == "off"
    assert any("L_align was OFF" in x for x in site["not_covered"])
    assert any("non-cryptographic" in x for x in site["not_covered"])
    md = (run / "privacy_report.md").read_text()
    for needle in ("δ = 0.001", "cap 5", "remaining", "clip C = 1", "Poisson q = 0.2", "| 2 | 2 |", "Not covered"):
        assert needle in md, needle
    assert (run / "privacy_epsilon.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((run / "privacy_report.json").read_text())["sites"][0]["epsilon_spent"] == site["epsilon_spent"]
    # a missing folder is a clear error and writes nothing
    bad = CliRunner().invoke(app, ["privacy", "report", str(tmp_path / "nope")])
    assert bad.exit_code == 2 and "no such run" in " ".join(bad.output.split())
    empty = tmp_path / "empty"
    empty.mkdir()
    res = CliRunner().invoke(app, ["privacy", "report", str(empty)])
    assert res.exit_code == 2 and "no privacy ledger" in " ".join(res.output.split())
    assert list(empty.iterdir()) == []


def test_cli_plan_matches_the_planner():
    res = CliRunner().invoke(app, ["privacy", "plan", "--trajectories", "2048", "--batch-size", "64", "--rounds", "20",
                                   "--dp-epsilon", "8", "--accountant", "rdp", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)["data"]
    assert (out["q"], out["steps"], out["delta"]) == (1 / 32, 640, 1e-5)
    assert out["sigma"] == pytest.approx(0.8508, abs=0.005)  # dp-anchors §3.2, cross-checked with dp-accounting


def test_cli_plan_counts_the_passes_min_local_steps_adds():
    """A run with ``federation.min_local_steps`` makes more passes a round (``learner.round_epochs``); a plan that
    ignored them would print a σ below the one the site uses, i.e. promise an ε the run would exceed."""
    from fcd_secure.federation.learner import round_epochs
    from fcd_secure.privacy.planner import plan_noise_multiplier

    args = ["privacy", "plan", "--trajectories", "190", "--rounds", "10", "--accountant", "rdp", "--json"]
    plain = json.loads(CliRunner().invoke(app, args).stdout)["data"]
    res = CliRunner().invoke(app, [*args, "--min-local-steps", "32"])
    assert res.exit_code == 0, res.output
    floor = json.loads(res.stdout)["data"]
    passes = round_epochs(1, 32, 190, 64)
    assert (plain["passes_per_round"], floor["passes_per_round"]) == (1, passes) and passes == 11
    assert floor["steps"] == 10 * passes * 3 == 11 * plain["steps"]
    assert floor["sigma"] == pytest.approx(plan_noise_multiplier(epsilon_cap=8.0, delta=floor["delta"], q=floor["q"],
                                                                 planned_steps=floor["steps"], accountant="rdp"))
    assert floor["sigma"] > plain["sigma"]


def test_a_plan_for_a_named_run_counts_the_run_s_own_use(tmp_path):
    """``fcd privacy plan --dataset tumour`` plans the use ``fcd run --dataset tumour`` makes: the preset's rounds and
    the world's 32 optimiser steps a round (``config.WORLD_DEFAULTS``). Before, the plan knew no run: its defaults
    counted 20 rounds of one pass, so a privacy officer planning the tumour run was shown a σ ~4x below the one the
    site then uses. The same from the run's config file; an option given wins over the run's value."""
    from fcd_secure.config import build_config

    cfg = build_config("default", {"data": {"dataset": "tumour"}})
    assert cfg.federation.min_local_steps == 32 and cfg.federation.rounds == 40  # the use the plan must count
    base = ["privacy", "plan", "--trajectories", "190", "--accountant", "rdp", "--json"]

    def data(*extra: str) -> dict:
        res = CliRunner().invoke(app, [*base, *extra])
        assert res.exit_code == 0, res.output
        return json.loads(res.stdout)["data"]

    named = data("--dataset", "tumour")
    spelled = data("--rounds", "40", "--min-local-steps", "32", "--batch-size", str(cfg.model.batch_size))
    assert named["use"] == {"rounds": 40, "local_epochs": 1, "min_local_steps": 32, "batch_size": cfg.model.batch_size}
    assert (named["steps"], named["sigma"]) == (spelled["steps"], spelled["sigma"])
    assert named["sigma"] > data()["sigma"]  # the plan's own defaults (20 rounds, one pass) under-count this run
    path = tmp_path / "config.toml"
    path.write_text(cfg.to_toml())
    assert data("--config", str(path))["steps"] == named["steps"]
    fewer = data("--dataset", "tumour", "--rounds", "10")
    assert fewer["use"]["rounds"] == 10 and fewer["use"]["min_local_steps"] == 32
    assert fewer["steps"] * 4 == named["steps"]
    bad = CliRunner().invoke(app, [*base, "--dataset", "tumourr"])
    assert bad.exit_code == 2 and "did you mean 'tumour'" in bad.output
    spec = CliRunner().invoke(app, [*base, "--dataset", "spec"])
    assert spec.exit_code == 2 and "--config" in spec.output
    # the run's own [dp] cap and accountant, unless named here
    capped = build_config("default", {"data": {"dataset": "tumour"}, "dp": {"enabled": True, "epsilon": 2.0}})
    path.write_text(capped.to_toml())
    res = CliRunner().invoke(app, ["privacy", "plan", "--trajectories", "190", "--config", str(path), "--json"])
    out = json.loads(res.stdout)["data"]
    assert (out["epsilon_cap"], out["accountant"], out["steps"]) == (2.0, capped.dp.accountant, named["steps"])
    assert data("--config", str(path))["epsilon_cap"] == 2.0 and data("--config", str(path))["accountant"] == "rdp"


def test_an_empty_poisson_batch_still_takes_a_noisy_accounted_step(tmp_path):
    """Skipping the noise when Poisson sampling draws nobody would reveal the empty batch (add/remove adjacency)."""
    from fcd_secure.model.training import batch_loss, dataset_tensors, make_loader, make_optimizer

    ds = tiny_site(n=8, L=3)
    cfg = tiny_cfg()
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES)
    dp = DPConfig(enabled=True, epsilon=8.0, delta=1e-2, accountant="rdp", noise_seed="run_seed")
    site = DPSite(tmp_path, dataset_fingerprint(ds), dp, ds.n, planned_rounds=1, local_epochs=1, batch_size=4)
    res = site.reserve_round()
    model, opt, _ = site.make_private(model, make_optimizer(model, cfg), make_loader(ds, 4, 0, 0), seed=0)
    empty = tuple(t[:0] for t in dataset_tensors(ds, 0))
    before = [p.detach().clone() for p in model.parameters()]
    opt.zero_grad()
    loss, _ = batch_loss(model, empty, cfg, N_SITES)
    loss.backward()
    opt.step()
    moved = [not torch.equal(p, b) for p, b in zip(model.parameters(), before)]
    assert all(moved), "every parameter must receive Gaussian noise on an empty batch"
    site.commit(res)
    seg = site.ledger.load().segments[0]
    assert (seg.status, seg.steps) == ("committed", 1)


def test_ablation_without_l_dis_trains_under_dp_and_leaves_the_unused_heads_alone(tmp_path):
    """Opacus refuses parameters without per-sample gradients; the heads L_dis would train are frozen instead."""
    ds = tiny_site(n=12, L=3)
    cfg = tiny_cfg(use_dis=False)
    model = FedCausalDiff.from_dims(cfg, ds.dx, ds.da, ds.n_actions, N_SITES)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    dp = DPConfig(enabled=True, epsilon=8.0, delta=1e-2, accountant="rdp", noise_seed="run_seed")
    site = DPSite(tmp_path, dataset_fingerprint(ds), dp, ds.n, planned_rounds=1, local_epochs=1, batch_size=4)
    out = train_round_private(site, model, ds, cfg, 0, N_SITES, epochs=1, seed=0)
    assert out["dp_steps"] == 3.0
    for name, p in model.named_parameters():
        assert p.requires_grad, f"{name} left frozen after the round"
        unchanged = torch.equal(p, before[name])
        assert unchanged == name.startswith(("site_disc.", "parallel_head.")), name


def test_report_lists_an_acknowledged_reset_and_a_ledger_behind_its_anchor(tmp_path):
    """The ε spent before a reset is not in "ε spent" any more: the report says so, with the reason and the ε lost."""
    from fcd_secure.privacy.ledger import LedgerRollback, acknowledge_reset

    dp = DPConfig(enabled=True, epsilon=8.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    state = tmp_path / "state" / "site-00"
    ds = tiny_site(n=30, L=3, seed=2)
    train_site(state, ds, dp, rounds=3)
    (ledger,) = (state / "privacy").glob("ledger-*.json")
    raw = json.loads(ledger.read_text())
    raw["segments"] = raw["segments"][:2]  # the copy from before round 3 put back
    ledger.write_text(json.dumps(raw))
    rep = build_report(tmp_path / "state")
    (site,) = rep["sites"]
    assert site["anchor"]["behind"] and any("BEHIND ITS ANCHOR" in x for x in site["not_covered"])
    with pytest.raises(LedgerRollback):
        train_site(state, ds, dp, rounds=1)
    (rec,) = acknowledge_reset(state, "restored from backup", operator="ops")
    assert rec.previous.segments == 3 and rec.current.segments == 2
    rep = build_report(tmp_path / "state")
    (site,) = rep["sites"]
    assert not site["anchor"]["behind"]
    assert [r["reason"] for r in site["resets"]] == ["restored from backup"]
    assert any("acknowledged reset" in x for x in site["not_covered"])
    from fcd_secure.privacy.report import render_markdown

    assert "Acknowledged reset" in render_markdown(rep, None)


def _dp_run_folder(tmp_path, sampled: dict[str, int], all_sites: list[str]):
    """A run folder whose state holds DP ledgers for the sites in ``sampled`` (site -> rounds trained)."""
    dp = DPConfig(enabled=True, epsilon=5.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    state = tmp_path / "run" / "state"
    for i, (site_id, rounds) in enumerate(sampled.items()):
        train_site(state / site_id, tiny_site(n=30, L=3, seed=20 + i), dp, rounds=rounds)
    for site_id in all_sites:
        (state / site_id).mkdir(parents=True, exist_ok=True)
    run = tmp_path / "run"
    (run / "summary.json").write_text(json.dumps({"site_ids": all_sites}))
    (run / "config.json").write_text(json.dumps({"dp": {"enabled": True, "epsilon": 5.0}}))
    return run


def test_run_report_lists_every_site_and_states_common_text_once(tmp_path):
    from fcd_secure.privacy.report import consortium_curve, epsilon_by_round, render_markdown

    run = _dp_run_folder(tmp_path, {"site-00": 2, "site-02": 1}, ["site-00", "site-01", "site-02"])
    rep = build_report(run)
    assert [s["site"] for s in rep["sites"]] == ["site-00", "site-01", "site-02"]
    never = rep["sites"][1]
    assert never["epsilon_spent"] == 0.0 and never["ledger"] is None and "never sampled" in never["note"]
    assert rep["consortium"]["sites"] == 3
    assert rep["consortium"]["epsilon"] == max(s["epsilon_spent"] for s in rep["sites"])
    md = render_markdown(rep, "privacy_epsilon.png")
    for once in ("Unit of privacy:", "Adjacency:", "Setting:", "Libraries:", "Covered:"):
        assert md.count(once) == 1, once
    assert "| site-01 | 0 (never sampled) |" in md
    # the plot's consortium line is the worst site after each round
    xs0, ys0 = epsilon_by_round(rep["sites"][0])
    xs2, ys2 = epsilon_by_round(rep["sites"][2])
    grid, cons = consortium_curve(rep)
    assert grid == [0.0, 1.0, 2.0] and cons[0] == 0.0
    assert cons[1] == max(ys0[1], ys2[1]) and cons[2] == ys0[2]
    res = CliRunner().invoke(app, ["privacy", "report", str(run)], env={"COLUMNS": "80"}, terminal_width=80)
    assert res.exit_code == 0, res.output
    assert "site-01" in res.stdout and "Never trained under DP (ε = 0): site-01" in res.stdout
    # prose and tables fit 80 columns; a path is printed whole on its own line (the terminal wraps it)
    assert max(len(line) for line in res.stdout.splitlines() if str(run) not in line) <= 80
    assert any(line == f"plot: {run / 'privacy_epsilon.png'}" for line in res.stdout.splitlines())
    assert (run / "privacy_epsilon.png").read_bytes()[:4] == b"\x89PNG"


def test_a_run_without_dp_says_there_is_no_guarantee(tmp_path):
    run = tmp_path / "run"
    (run / "state" / "site-00").mkdir(parents=True)
    (run / "config.json").write_text(json.dumps({"dp": {"enabled": False}}))
    res = CliRunner().invoke(app, ["privacy", "report", str(run)])
    assert res.exit_code == 0, res.output
    assert "No DP guarantee" in res.stdout and "no ledger" not in res.output
    res = CliRunner().invoke(app, ["privacy", "report", str(run), "--json", "--no-files"])
    env = json.loads(res.stdout)
    assert env["exit_code"] == 0 and env["data"]["dp"] is False and "no DP guarantee" in env["message"]
    assert "No DP guarantee" in (run / "privacy_report.md").read_text()
    assert not (run / "privacy_epsilon.png").exists()
