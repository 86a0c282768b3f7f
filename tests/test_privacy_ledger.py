"""The per-site privacy ledger: planning once, write-ahead refusal at the cap, no reset on restart or new run."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from fcd_secure.privacy.config import DPConfig
from fcd_secure.privacy.engine import DPSite
from fcd_secure.privacy.ledger import BudgetExceeded, Ledger, PrivacyLedgerError, dataset_fingerprint, ledger_path
from fcd_secure.privacy.planner import epsilon, plan_noise_multiplier, sample_rate
from tests.test_privacy_grads import tiny_site

FP = "0123456789abcdef" * 4
N, B = 60, 12  # q = 1/5, 5 steps per epoch



pytestmark = pytest.mark.usefixtures("one_torch_thread")

def cfg(**kw) -> DPConfig:
    base = dict(enabled=True, epsilon=3.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    base.update(kw)
    return DPConfig(**base)


def one_round(site: DPSite, model: nn.Module, opt: torch.optim.Optimizer, seed: int = 0, round_id=None) -> float:
    """A real DP-SGD round on a linear model through the site's reservation and Opacus."""
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(N, 4, generator=g), torch.randn(N, 1, generator=g))
    res = site.reserve_round(round_id=round_id)
    m, o, dl = site.make_private(model, opt, DataLoader(data, batch_size=B), seed=seed)
    for xb, yb in dl:
        o.zero_grad()
        ((m(xb) - yb) ** 2).mean().backward()
        o.step()
    return site.commit(res)


def new_site(tmp_path, c: DPConfig | None = None, rounds: int = 3, fp: str = FP) -> DPSite:
    return DPSite(tmp_path, fp, c or cfg(), N, planned_rounds=rounds, local_epochs=1, batch_size=B)


def test_plan_once_meets_cap_and_make_private_with_epsilon_style_replanning_would_overspend():
    q, steps = 1 / 8, 8
    sigma = plan_noise_multiplier(epsilon_cap=3.0, delta=1e-3, q=q, planned_steps=5 * steps, accountant="rdp")
    planned = epsilon([(sigma, q, 5 * steps)], 1e-3, "rdp")
    assert 2.95 <= planned <= 3.0
    # the trap: σ re-derived "from zero" for one round, five times over
    sigma_1 = plan_noise_multiplier(epsilon_cap=3.0, delta=1e-3, q=q, planned_steps=steps, accountant="rdp")
    assert epsilon([(sigma_1, q, 5 * steps)], 1e-3, "rdp") > 1.5 * 3.0
    # planning the rest of a budget composes with the history instead of restarting it
    hist = [(sigma, q, 3 * steps)]
    sigma_rest = plan_noise_multiplier(epsilon_cap=3.0, delta=1e-3, q=q, planned_steps=4 * steps, history=hist, accountant="rdp")
    assert sigma_rest > sigma
    assert epsilon(hist + [(sigma_rest, q, 4 * steps)], 1e-3, "rdp") <= 3.0


def test_epsilon_is_opacus_accountants_bit_for_bit_on_a_history_of_several_segments():
    """``planner.epsilon`` composes per-(σ, q) RDP vectors it keeps (``planner._rdp_per_step``): for RDP itself and
    for the RDP bound of PRV's discretisation domain, instead of Opacus recomputing every segment each time. The ε
    must be Opacus' accountants' exactly, whether the vectors were already kept or not, whatever the order."""
    from opacus.accountants import PRVAccountant, RDPAccountant

    hist = [(1.3, 1 / 5, 10), (1.1, 1 / 8, 3), (1.3, 1 / 5, 7)]  # (1.3, 1/5) twice, apart: two segments
    for history in (hist, hist[::-1]):
        rdp = RDPAccountant()
        rdp.history = list(history)
        assert epsilon(history, 1e-5, "rdp") == rdp.get_epsilon(1e-5), history
    prv = PRVAccountant()
    prv.history = hist[:2]
    assert epsilon(hist[:2], 1e-5, "prv") == prv.get_epsilon(1e-5, eps_error=0.01)


def test_sample_rate_is_opacus_q():
    assert sample_rate(60, 12) == 1 / 5
    assert sample_rate(61, 12) == 1 / 6  # Opacus: 1/len(loader), not B/N
    assert len(DataLoader(TensorDataset(torch.zeros(61)), batch_size=12)) == 6


def test_refuses_at_the_cap_and_never_trains_past_it(tmp_path):
    site = new_site(tmp_path)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    eps = [one_round(site, model, opt, seed=r, round_id=r) for r in range(3)]
    assert eps == sorted(eps) and eps[-1] <= 3.0 and eps[-1] > 2.5
    before = json.loads(site.ledger.path.read_text())
    weights = model.weight.detach().clone()
    with pytest.raises(BudgetExceeded, match="exhausted"):
        site.reserve_round(round_id=3)
    # the refused round left no trace and the budget is untouched
    assert json.loads(site.ledger.path.read_text()) == before
    assert torch.equal(model.weight, weights)
    assert site.spent()[0] == pytest.approx(eps[-1])
    with pytest.raises(BudgetExceeded, match="reservation"):
        site.make_private(model, opt, DataLoader(TensorDataset(torch.zeros(N, 4), torch.zeros(N, 1)), batch_size=B))


def test_restart_and_new_run_on_same_data_do_not_reset_the_budget(tmp_path):
    # a cap of ε = 0.5 plans σ ≈ 4.4, where Opacus' fractional-order RDP series converge in a few terms: the cold
    # plan costs 0.39 s of CPU against 0.78-1.0 s at ε = 3 (σ ≈ 1.27); the claim does not depend on the cap
    c = cfg(epsilon=0.5)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    first = new_site(tmp_path, c)
    one_round(first, model, opt, round_id=1)
    spent_1 = first.spent()[0]
    # a restart mid-plan (fresh object, same state dir and data): the same σ, the budget carries on
    restarted = new_site(tmp_path, c)
    assert restarted.noise_multiplier == first.noise_multiplier
    assert restarted.spent()[0] == pytest.approx(spent_1)
    one_round(restarted, model, opt, round_id=2)
    one_round(restarted, model, opt, round_id=3)
    spent_3 = restarted.spent()[0]
    assert spent_3 > spent_1
    # a new run with the same plan after it is used up: it cannot restart the count
    again = new_site(tmp_path, c)
    assert again.spent()[0] == pytest.approx(spent_3)
    with pytest.raises(BudgetExceeded):
        again.reserve_round(round_id=1)
    # a new run with a longer plan gets a σ for what is left (larger), never a fresh budget
    longer = DPSite(tmp_path, FP, cfg(epsilon=c.epsilon, max_noise_multiplier=1000), N, planned_rounds=2, local_epochs=1, batch_size=B)
    assert longer.noise_multiplier > first.noise_multiplier
    one_round(longer, model, opt)
    assert spent_3 < longer.spent()[0] <= c.epsilon
    # a different dataset has its own ledger
    other = new_site(tmp_path, c, fp="f" * 64)
    assert other.spent()[0] == 0.0


def test_a_new_run_with_a_fresh_state_dir_keeps_the_budget_in_the_ledger_dir(tmp_path):
    """``fcd run`` makes a state folder per run; the ledger folder is what carries the budget across runs."""
    c = cfg(ledger_dir=str(tmp_path / "ledgers"))
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    run1 = DPSite(tmp_path / "run1" / "site-00", FP, c, N, planned_rounds=3, local_epochs=1, batch_size=B)
    for r in range(3):
        one_round(run1, model, opt, round_id=r)
    run2 = DPSite(tmp_path / "run2" / "site-03", FP, c, N, planned_rounds=3, local_epochs=1, batch_size=B)
    assert run2.ledger.path == run1.ledger.path == tmp_path / "ledgers" / f"ledger-{FP[:32]}.json"
    assert run2.spent() == run1.spent()
    with pytest.raises(BudgetExceeded):
        run2.reserve_round()
    assert Ledger(run2.ledger.path).load().sites == ["site-00", "site-03"]


def test_crash_mid_round_is_charged_in_full(tmp_path):
    site = new_site(tmp_path)
    res = site.reserve_round(round_id=1)  # write-ahead, then the process dies before commit
    after = new_site(tmp_path)
    q = sample_rate(N, B)
    assert after.spent()[0] == pytest.approx(epsilon([(site.noise_multiplier, q, res.steps)], 1e-3, "rdp"))
    state = Ledger(site.ledger.path).load()
    assert [s.status for s in state.segments] == ["reserved"]


def test_step_guard_stops_steps_beyond_the_reservation(tmp_path):
    site = new_site(tmp_path)
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    data = TensorDataset(torch.randn(N, 4), torch.randn(N, 1))
    res = site.reserve_round(steps=2)
    m, o, dl = site.make_private(model, opt, DataLoader(data, batch_size=B), seed=0)
    it = iter(dl)
    for _ in range(2):
        xb, yb = next(it)
        o.zero_grad()
        ((m(xb) - yb) ** 2).mean().backward()
        o.step()
    frozen = model.weight.detach().clone()
    xb, yb = next(it)
    o.zero_grad()
    ((m(xb) - yb) ** 2).mean().backward()
    with pytest.raises(BudgetExceeded, match="reserved 2 steps"):
        o.step()
    assert torch.equal(model.weight, frozen)
    site.commit(res)
    seg = Ledger(site.ledger.path).load().segments[0]
    assert (seg.status, seg.steps) == ("committed", 2)


def test_loader_must_match_the_planned_q(tmp_path):
    site = new_site(tmp_path)
    site.reserve_round()
    model = nn.Linear(4, 1)
    bad = DataLoader(TensorDataset(torch.zeros(N, 4), torch.zeros(N, 1)), batch_size=B + 3)
    with pytest.raises(ValueError, match="batch_size=12"):
        site.make_private(model, torch.optim.SGD(model.parameters(), lr=0.1), bad)


def test_ledger_fails_closed(tmp_path):
    site = new_site(tmp_path)
    path = site.ledger.path
    site.reserve_round()
    # raising the cap or changing δ of an existing budget is refused
    with pytest.raises(PrivacyLedgerError, match="never raised"):
        new_site(tmp_path, cfg(epsilon=5.0))
    with pytest.raises(PrivacyLedgerError, match="δ"):
        new_site(tmp_path, cfg(delta=1e-4))
    lowered = new_site(tmp_path, cfg(epsilon=2.0))
    assert Ledger(path).load().epsilon_cap == 2.0
    assert lowered.remaining() < 2.0
    # a deleted segment, a corrupt file: refuse, never "no history"
    raw = json.loads(path.read_text())
    raw["segments"] = raw["segments"][1:] + raw["segments"][:0]
    raw["segments"].append({**json.loads(path.read_text())["segments"][0], "seq": 2})
    path.write_text(json.dumps(raw))
    with pytest.raises(PrivacyLedgerError, match="not 1..n"):
        new_site(tmp_path)
    path.write_text("{not json")
    with pytest.raises(PrivacyLedgerError, match="unreadable"):
        new_site(tmp_path)


def test_delta_default_and_bounds():
    assert DPConfig(enabled=True).resolve_delta(2048) == pytest.approx(1e-5)
    assert DPConfig(enabled=True).resolve_delta(60) <= 1 / (10 * 60)
    with pytest.raises(ValueError, match="delta"):
        DPConfig(enabled=True, delta=0.05).resolve_delta(60)
    with pytest.raises(ValueError, match="poisson"):
        DPConfig(enabled=True, poisson=False)


def test_fingerprint_keys_the_records_not_the_name(tmp_path):
    ds = tiny_site(n=8)
    fp = dataset_fingerprint(ds)
    assert dataset_fingerprint(replace(ds, name="renamed", meta={"x": 1})) == fp
    Y = ds.Y.copy()
    Y[3, 0] = 1.0 - Y[3, 0]
    assert dataset_fingerprint(replace(ds, Y=Y)) != fp
    assert ledger_path(tmp_path, fp).name == f"ledger-{fp[:32]}.json"
    assert np.array_equal(ds.Y, tiny_site(n=8).Y)


def test_any_sequence_of_rounds_restarts_and_crashes_stays_within_the_cap(tmp_path_factory):
    """Property: whatever the order of reservations, commits, crashes (no commit) and restarts, the ledger's ε
    never exceeds the cap, never decreases, and a refused reservation leaves the file unchanged."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    ops = st.lists(st.sampled_from(["round", "crash", "restart", "short"]), min_size=1, max_size=12)

    @settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
    @given(ops)
    def run(seq):
        d = tmp_path_factory.mktemp("prop")
        site = new_site(d, rounds=4)
        model = nn.Linear(4, 1)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        last = 0.0
        for op in seq:
            if op == "restart":
                site = new_site(d, rounds=4)
                continue
            before = site.ledger.path.read_text()
            try:
                if op == "round":
                    one_round(site, model, opt)  # a real DP-SGD round: reserve, train 5 steps, commit
                else:
                    res = site.reserve_round(steps=2 if op == "short" else None)
                    if op == "short":
                        site.commit(res)  # closed without training: charged 0 steps
            except BudgetExceeded:
                assert site.ledger.path.read_text() == before
                continue
            eps = site.spent()[0]
            assert last - 1e-9 <= eps <= 3.0
            last = eps

    run()


def test_two_datasets_in_one_state_folder_never_share_a_noise_stream(tmp_path):
    # ledger segments restart at 1 for every dataset, so the noise seed must also bind the dataset fingerprint
    a = new_site(tmp_path, fp="a" * 64)
    b = new_site(tmp_path, fp="b" * 64)
    for purpose in ("noise", "poisson"):
        ga, gb = a._generator(purpose, 0, 1), b._generator(purpose, 0, 1)
        assert ga.initial_seed() != gb.initial_seed()
    assert a._generator("noise", 0, 1).initial_seed() == new_site(tmp_path, fp="a" * 64)._generator("noise", 0, 1).initial_seed()


# -- the budget cannot be reset by deleting, restoring or reshaping the data ---------------------------------------
def test_deleting_the_ledger_makes_the_site_refuse_until_an_operator_acknowledges(tmp_path):
    """P25: with the ledger file gone the same records would start again at ε = 0; the site's anchor remembers the
    head, so the site refuses until ``fcd privacy acknowledge-reset`` records why, and the reset stays on record."""
    from typer.testing import CliRunner

    from fcd_secure.cli.main import app
    from fcd_secure.privacy.anchor import read_anchors
    from fcd_secure.privacy.ledger import LedgerRollback

    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    site = new_site(tmp_path)
    one_round(site, model, opt, round_id=1)
    spent = site.spent()[0]
    site.ledger.path.unlink()
    with pytest.raises(LedgerRollback, match="acknowledge-reset"):
        new_site(tmp_path)
    with pytest.raises(LedgerRollback):
        site.reserve_round(round_id=2)  # an object made before the deletion refuses too
    assert not site.ledger.path.exists()  # a refusal writes no fresh ledger
    runner = CliRunner()
    assert runner.invoke(app, ["privacy", "acknowledge-reset", str(tmp_path), "--reason", " "]).exit_code == 2
    res = runner.invoke(app, ["privacy", "acknowledge-reset", str(tmp_path), "--reason", "disk replaced", "--operator", "ops"])
    assert res.exit_code == 0, res.output
    again = new_site(tmp_path)
    # a new ledger, the old head is on record, and its spend is carried forward (P37): the reset reopens nothing
    assert again.ledger.load().segments == [] and again.spent()[0] == pytest.approx(spent)
    (anchor,) = read_anchors(tmp_path)
    assert anchor.resets == 1 and anchor.last_reset.reason == "disk replaced" and anchor.last_reset.operator == "ops"
    assert anchor.last_reset.previous.segments == 1 and anchor.last_reset.previous.epsilon == pytest.approx(spent)
    assert anchor.last_reset.current is None
    # nothing left to acknowledge: a second acknowledgement is a usage error, not a silent no-op
    assert runner.invoke(app, ["privacy", "acknowledge-reset", str(tmp_path), "--reason", "again"]).exit_code == 2


def test_restoring_an_older_copy_of_the_ledger_is_refused(tmp_path):
    model = nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    site = new_site(tmp_path)
    one_round(site, model, opt, round_id=1)
    old = site.ledger.path.read_bytes()
    one_round(site, model, opt, round_id=2)
    site.ledger.path.write_bytes(old)  # the copy from before round 2: one segment instead of two
    from fcd_secure.privacy.ledger import LedgerRollback

    with pytest.raises(LedgerRollback, match="1 segment"):
        new_site(tmp_path)
    # a rewritten history of the same length (fewer steps in round 1) is a rollback too
    raw = json.loads(old)
    raw["segments"][0]["reserved_at"] += 1.0
    site.ledger.path.write_text(json.dumps(raw))
    with pytest.raises(LedgerRollback):
        new_site(tmp_path)


def test_reordered_rows_keep_the_budget(tmp_path):
    ds = tiny_site(n=N, L=4, seed=3)
    perm = np.random.default_rng(1).permutation(N)
    shuffled = replace(ds, X=ds.X[perm], A=ds.A[perm], T=ds.T[perm], Y=ds.Y[perm], M=ds.M[perm])
    assert dataset_fingerprint(shuffled) == dataset_fingerprint(ds)
    model = nn.Linear(4, 1)
    first = new_site(tmp_path, fp=dataset_fingerprint(ds))
    one_round(first, model, torch.optim.SGD(model.parameters(), lr=0.05), round_id=1)
    again = new_site(tmp_path, fp=dataset_fingerprint(shuffled))
    assert again.ledger.path == first.ledger.path
    assert first.spent()[0] > 0 and again.spent()[0] == pytest.approx(first.spent()[0])


def test_dropping_one_record_keeps_the_budget(tmp_path):
    ds = tiny_site(n=N, L=4, seed=3)
    longest = int(np.argmax(ds.lengths))  # dropping the longest trajectory also changes the padded width
    keep = np.setdiff1d(np.arange(N), [longest])
    L = int(ds.lengths[keep].max())
    smaller = replace(ds, X=ds.X[keep], A=ds.A[keep, :L], T=ds.T[keep, :L], Y=ds.Y[keep, :L], M=ds.M[keep, :L])
    assert dataset_fingerprint(smaller) != dataset_fingerprint(ds)
    model = nn.Linear(4, 1)
    first = DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    one_round(first, model, torch.optim.SGD(model.parameters(), lr=0.05), round_id=1)
    again = DPSite.for_dataset(tmp_path, smaller, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    assert again.ledger.path == first.ledger.path
    assert first.spent()[0] > 0 and again.spent()[0] == pytest.approx(first.spent()[0])
    assert again.n_site == N - 1 and Ledger(first.ledger.path).load().n_site == N - 1
    # a table that shares few records with it is other data: its own ledger
    other = DPSite.for_dataset(tmp_path, tiny_site(n=N, L=4, seed=4), cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    assert other.ledger.path != first.ledger.path and other.spent()[0] == 0.0


def test_the_same_data_survives_any_reordering_and_a_few_dropped_records():
    """Property of the record identity: row order never changes the fingerprint; dropping or adding up to a tenth of
    the records keeps the data "the same" (shared fraction ≥ 0.5 of the smaller table)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from fcd_secure.privacy.identity import dataset_identity, same_data

    base = tiny_site(n=300, L=5, seed=7)
    KEY = b"site record secret"
    ident = dataset_identity(base, KEY)

    def rows(ds, idx):
        return replace(ds, X=ds.X[idx], A=ds.A[idx], T=ds.T[idx], Y=ds.Y[idx], M=ds.M[idx])

    @settings(max_examples=20, deadline=None)
    @given(st.randoms(use_true_random=False), st.integers(0, 30))
    def run(rnd, drop):
        idx = list(range(base.n))
        rnd.shuffle(idx)
        shuffled = rows(base, np.array(idx))
        assert dataset_identity(shuffled, KEY).fingerprint == ident.fingerprint
        fewer = dataset_identity(rows(base, np.array(idx[drop:])), KEY)
        assert same_data(fewer, ident) and same_data(ident, fewer)

    run()
    assert not same_data(dataset_identity(tiny_site(n=300, L=5, seed=8), KEY), ident)
