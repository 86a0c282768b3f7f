"""ε per record across every run on a site, resets that keep the spend, and the privacy settings a site pins.

Issue 31 item 3, docs/threats.md P36–P39. Each attack is run with the product's own parts (the DP site, its ledger
and anchor, the site's signed audit chain, the site policy, the CLI); no mocks. A DP round is reserved in the
write-ahead ledger and closed with the steps it reserved, which is exactly what the accountant charges for a round
that trained (the DP-SGD step itself is tested in tests/test_privacy_ledger.py).
"""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest
from typer.testing import CliRunner

from fcd_secure.cli.main import app
from fcd_secure.data.partition import train_test_split
from fcd_secure.privacy.config import DPConfig
from fcd_secure.privacy.engine import DPSite
from fcd_secure.privacy.identity import record_ids
from fcd_secure.privacy.ledger import BudgetExceeded, LedgerRollback, acknowledge_reset
from fcd_secure.privacy.planner import epsilon
from tests.test_privacy_grads import tiny_site

N, B = 200, 20
CAP = 1.0
DELTA = 1e-3


def cfg(**kw) -> DPConfig:
    base = dict(enabled=True, epsilon=CAP, delta=DELTA, accountant="rdp", noise_seed="run_seed")
    base.update(kw)
    return DPConfig(**base)


def _train(state, table, rounds: int = 1, c: DPConfig | None = None, **kw):
    """One run of ``rounds`` DP rounds on ``table``: the segments of the rounds that trained, ``None`` if none did."""
    done: list = []
    try:
        site = DPSite.for_dataset(state, table, c or cfg(), planned_rounds=rounds, local_epochs=1, batch_size=B, **kw)
        for r in range(rounds):
            res = site.reserve_round(round_id=r + 1)
            site.ledger.commit(res.seq, res.steps)
            done.append((res.sigma, res.q, res.steps))
    except BudgetExceeded:
        pass
    return done or None


def _per_record(history: dict[bytes, list]) -> list[float]:
    return [epsilon(segs, DELTA, "rdp") for segs in history.values()]


# -- P36: the budget split across seeds and fractions -------------------------------------------------------------
def test_a_new_split_each_run_never_gives_a_record_more_than_the_cap(tmp_path):
    """P36: the server changes ``data.test_fraction`` and the seed every run. Each training set then shares fewer than
    half its records with every earlier one, so a budget kept per "data identity" opened a fresh ε for each run
    (8 of 8 runs trained at ε = 1 while one patient sat in every one). The ledger charges ε to each record, across
    every run on the site: no record ever spends more than the cap, however the split is drawn."""
    site_table = tiny_site(n=N, L=4, seed=11)
    history: dict[bytes, list] = {}
    trained = 0
    for run, fraction in enumerate([0.6, 0.6, 0.2, 0.6, 0.45, 0.6, 0.7, 0.6]):
        train, _ = train_test_split(site_table, fraction, seed=100 + run)
        segs = _train(tmp_path / "site-00", train)
        if segs is None:
            continue
        trained += 1
        for rid in record_ids(train, b"key"):
            history.setdefault(rid, []).extend(segs)
    assert trained >= 1
    spent = _per_record(history)
    assert max(spent) <= CAP + 1e-9, f"a record spent ε = {max(spent):.3f} over {trained} runs (cap {CAP})"
    # the report states the same per-record spend, read from the ledgers
    rep = CliRunner().invoke(app, ["privacy", "report", str(tmp_path / "site-00"), "--json", "--no-files"])
    assert rep.exit_code == 0, rep.output
    records = json.loads(rep.stdout)["data"]["records"]
    assert records["max"] == pytest.approx(max(spent), rel=1e-6)
    assert records["median"] == pytest.approx(float(np.median(spent)), rel=1e-6)
    assert records["records"] == len(history) and records["max"] <= CAP + 1e-9


def test_any_sequence_of_splits_seeds_and_restarts_keeps_every_record_within_the_cap(tmp_path_factory):
    """P36, as a property: whatever fractions, seeds, planned rounds and restarts a server chooses, the largest ε any
    record composes over all the runs that trained it stays within the cap."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    site_table = tiny_site(n=120, L=3, seed=12)
    runs = st.lists(st.tuples(st.floats(0.1, 0.9), st.integers(0, 10**6), st.integers(1, 3)), min_size=2, max_size=5)

    @settings(max_examples=8, deadline=None)
    @given(runs)
    def check(plan):
        state = tmp_path_factory.mktemp("site")
        history: dict[bytes, list] = {}
        for fraction, seed, rounds in plan:
            train, _ = train_test_split(site_table, fraction, seed=seed)
            segs = _train(state, train, rounds=rounds)  # a fresh DPSite each run: a restart between runs
            for rid in record_ids(train, b"key"):
                history.setdefault(rid, []).extend(segs or [])
        spent = [e for e in _per_record(history) if e > 0]
        assert not spent or max(spent) <= CAP + 1e-9

    check()


def test_records_with_budget_left_still_train_and_spent_records_are_refused_before_any_data(tmp_path):
    """P36: the refusal is per record, not per site: a table of new records trains at once; a table holding one
    record whose budget is spent is refused whole at reservation (write-ahead: the ledgers are left as they were)."""
    a = tiny_site(n=N, L=4, seed=21)
    assert _train(tmp_path, a, rounds=2) is not None  # spends the cap on every record of a
    fresh = tiny_site(n=N, L=4, seed=22)
    assert _train(tmp_path, fresh) is not None  # other patients: their own budget
    before = {p: p.read_bytes() for p in (tmp_path / "privacy").glob("ledger-*.json")}
    other = tiny_site(n=N - 1, L=4, seed=23)
    mixed = replace(other, X=np.concatenate([other.X, a.X[:1]]), A=np.concatenate([other.A, a.A[:1]]),
                    T=np.concatenate([other.T, a.T[:1]]), Y=np.concatenate([other.Y, a.Y[:1]]),
                    M=np.concatenate([other.M, a.M[:1]]))
    assert mixed.n == N
    with pytest.raises(BudgetExceeded, match="record"):
        site = DPSite.for_dataset(tmp_path, mixed, cfg(), planned_rounds=1, local_epochs=1, batch_size=B)
        site.reserve_round(round_id=1)
    after = {p: p.read_bytes() for p in (tmp_path / "privacy").glob("ledger-*.json") if p in before}
    assert after == before


# -- P37: an acknowledged reset carries the spend forward ---------------------------------------------------------
def test_an_acknowledged_reset_never_raises_the_remaining_budget(tmp_path):
    """P37: after ``fcd privacy acknowledge-reset``, the report said ε = 0.455 of 1 although the reset record listed
    0.9998 spent by the same records. The spend before the reset is carried forward: what is spent never goes down,
    what is left never goes up, and the rounds trained after it stay within the cap together with it."""
    ds = tiny_site(n=N, L=4, seed=31)
    site = DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    for r in range(2):
        res = site.reserve_round(round_id=r + 1)
        site.ledger.commit(res.seq, res.steps)
    spent, left = site.spent()[0], site.remaining()
    assert 0.3 < spent < CAP
    site.ledger.path.unlink()
    with pytest.raises(LedgerRollback):
        DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    (rec,) = acknowledge_reset(tmp_path, "disk replaced", operator="ops")
    assert rec.previous.epsilon == pytest.approx(spent)
    again = DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    assert again.spent()[0] >= spent - 1e-12 and again.remaining() <= left + 1e-12
    rep = CliRunner().invoke(app, ["privacy", "report", str(tmp_path), "--json", "--no-files"])
    assert rep.exit_code == 0, rep.output
    data = json.loads(rep.stdout)["data"]
    (s,) = data["sites"]
    assert s["epsilon_spent"] >= spent - 1e-12 and s["epsilon_remaining"] <= left + 1e-12
    assert data["records"]["max"] >= spent - 1e-12
    # what trains after the reset is bounded together with what was spent before it (basic composition)
    new: list = []
    for r in range(5):
        try:
            res = again.reserve_round(round_id=10 + r)
        except BudgetExceeded:
            break
        again.ledger.commit(res.seq, res.steps)
        new.append((res.sigma, res.q, res.steps))
    assert spent + epsilon(new, DELTA, "rdp") <= CAP + 1e-9


def test_a_restored_older_copy_acknowledged_keeps_the_spend_of_the_lost_rounds(tmp_path):
    """P37: restoring an older copy of the ledger and acknowledging it gave the lost rounds' ε back."""
    ds = tiny_site(n=N, L=4, seed=32)
    site = DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    res = site.reserve_round(round_id=1)
    site.ledger.commit(res.seq, res.steps)
    old = site.ledger.path.read_bytes()
    res = site.reserve_round(round_id=2)
    site.ledger.commit(res.seq, res.steps)
    spent = site.spent()[0]
    site.ledger.path.write_bytes(old)
    acknowledge_reset(tmp_path, "restored from backup", operator="ops")
    again = DPSite.for_dataset(tmp_path, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    assert again.spent()[0] >= spent - 1e-12


# -- P38: ledger and anchor deleted together ----------------------------------------------------------------------
def test_deleting_ledger_and_anchor_together_stops_training_at_start(tmp_path):
    """P38: with the ledger and ``privacy_anchor.json`` both deleted the site trained again at ε = 0, and only
    ``fcd audit verify`` noticed afterwards. The site's own signed audit chain records the heads it uploaded with;
    the DP step reads them at start and refuses until the operator acknowledges a reset, which keeps the spend."""
    from test_audit_support import Server, Site

    from fcd_secure.config import build_config
    from fcd_secure.federation import learner
    from fcd_secure.privacy.anchor import read_anchors

    site, server = Site(tmp_path), Server(tmp_path)
    state = tmp_path / site.site_id
    site.ctx.privacy_anchors = lambda: read_anchors(state)
    ds = tiny_site(n=N, L=4, seed=41)
    dp = DPSite.for_dataset(state, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    res = dp.reserve_round(round_id=1)
    dp.ledger.commit(res.seq, res.steps)
    spent = dp.spent()[0]
    server.receive(site.send(server.downlink("train", 1, 11)), site.site_id)  # the upload records the head
    dp.ledger.path.unlink()
    (state / "privacy_anchor.json").unlink()

    run_cfg = build_config("tiny", {"dp": {"enabled": True, "epsilon": CAP, "delta": DELTA, "accountant": "rdp"}})
    model = learner.build_model(run_cfg, learner.dims_of(ds, 4))
    opt = model.optimizer
    with pytest.raises(LedgerRollback, match="acknowledge-reset"):
        learner.train_local_dp(model, ds, run_cfg, 0, 4, 1, 0, opt, state, 2)
    assert not list((state / "privacy").glob("ledger-*.json"))  # refused before any ledger was written

    res = CliRunner().invoke(app, ["privacy", "acknowledge-reset", str(state), "--reason", "disk replaced",
                                   "--operator", "ops", "--json"])
    assert res.exit_code == 0, res.output
    (rec,) = json.loads(res.stdout)["data"]
    assert rec["previous"]["epsilon"] == pytest.approx(spent) and rec["current"] is None
    learner.check_privacy_witness(state)  # acknowledged: the site may train again
    again = DPSite.for_dataset(state, ds, cfg(), planned_rounds=3, local_epochs=1, batch_size=B)
    assert again.spent()[0] >= spent - 1e-12


# -- P39: the privacy settings a site pins ------------------------------------------------------------------------
@pytest.mark.parametrize(
    "change, field",
    [
        ({"dp": {"enabled": True, "delta": 0.4}}, "dp.delta"),
        ({"dp": {"enabled": False}}, "dp.enabled"),
        ({"dp": {"enabled": True}, "evaluation": {"ope_horizon": 6}}, "evaluation.ope_horizon"),
    ],
    ids=["delta-0.4", "dp-off", "longer-ope-horizon"],
)
def test_the_default_site_policy_refuses_a_server_asking_for_less(change, field):
    """P39: under the policy ``fcd site init`` writes, the server's δ = 0.4 was accepted (and ε reported at it), the
    server turned DP off, and it chose the OPE horizon. The site pins a δ ceiling (≤ 1/n), DP on, a horizon ceiling."""
    from fcd_secure.config import build_config
    from fcd_secure.federation.site_policy import SitePolicy

    request = build_config("tiny", change)
    effective, refusal = SitePolicy().admit(request)
    assert refusal is not None and refusal.rule == "site_policy" and refusal.key == field
    policy = SitePolicy()
    assert effective.dp.enabled and effective.dp.delta_max == policy.dp.delta_max
    assert effective.dp.resolve_delta(50) <= policy.dp.delta_max
    assert (effective.evaluation.ope_horizon or 0) <= policy.evaluation.ope_horizon_max


def test_the_default_site_policy_admits_a_server_asking_for_more():
    """P39: a smaller δ, a shorter horizon, a smaller ε are more protection: admitted and kept."""
    from fcd_secure.config import build_config
    from fcd_secure.federation.site_policy import SitePolicy

    request = build_config("tiny", {"dp": {"enabled": True, "epsilon": 1.0, "delta": 1e-9},
                                    "evaluation": {"ope_horizon": 1}})
    effective, refusal = SitePolicy().admit(request)
    assert refusal is None
    assert effective.dp.delta == 1e-9 and effective.dp.epsilon == 1.0 and effective.evaluation.ope_horizon == 1
    # no δ in the request: the default δ (1/(10 n) rounded down to a power of ten) lowered to the site's ceiling
    effective, refusal = SitePolicy().admit(build_config("tiny", {"dp": {"enabled": True}}))
    assert refusal is None and effective.dp.resolve_delta(50) == SitePolicy().dp.delta_max == 1e-5
    assert effective.dp.resolve_delta(10**6) == 1e-7
    # a server that writes its own ceiling into the request does not set the site's
    asked = build_config("tiny", {"dp": {"enabled": True, "delta_max": 0.5}})
    assert SitePolicy().admit(asked)[0].dp.delta_max == 1e-5
