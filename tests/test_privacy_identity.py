"""A record's identity for the ε account holds against the coordinator (issue 44 findings 1 and 8; docs/threats.md
P45, P46).

Each attack runs the product's own parts: a deployed site (its own table, its strict policy, its state folder) trains
rounds under real Opacus DP-SGD through ``SiteRuntime.train_round`` with the standardisation statistics a request
carries, and the per-record spend is read back from the real ledger files by ``fcd privacy report``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
from typer.testing import CliRunner

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from conftest import GOOD_SPEC, make_long_table  # noqa: E402

SPEC_ONE_SITE = GOOD_SPEC.replace('site = "hospital"\n', "")
CAP = 2.0
PATIENTS = 96


def _cfg(spec, table):
    from fcd_secure.config import build_config

    return build_config("tiny", {"data": {"dataset": "spec", "spec": str(spec), "table": str(table)},
                                 "federation": {"rounds": 1, "secure_aggregation": False},
                                 "dp": {"enabled": True, "epsilon": CAP, "accountant": "rdp"}})


def _site(spec, table, state):
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.federation.site_policy import SitePolicy

    return SiteRuntime(_cfg(spec, table), "site-00", 0, str(state), policy=SitePolicy(),
                       own_table=(str(spec), str(table)))


def _statistics(site, nudge: float = 0.0) -> dict:
    """The consortium's statistics as the server sends them: from the site's own round-0 sums (a consortium of this
    site alone), every mean moved by ``nudge``."""
    from fcd_secure.data.moments import moments_to_statistics

    stats = moments_to_statistics(site.preprocessing_sums())
    for k in ("x_mean", "a_mean"):
        stats[k] = [m + nudge for m in stats[k]]
    return stats


def _train(site, stats: dict) -> dict:
    """One DP round of the site's training with the request's statistics (round 1 of a fresh run)."""
    from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY
    from fcd_secure.manifest import THETA_C

    theta = site.model.get_params(THETA_C)
    conf = {"server-round": 1, "part": THETA_C, "local-epochs": 1, STATISTICS_KEY: json.dumps(stats)}
    return site.train_round(theta, conf)[2]


def _records(state) -> dict:
    from fcd_secure.cli.main import app

    res = CliRunner().invoke(app, ["privacy", "report", str(state / "site-00"), "--json", "--no-files"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)["data"]["records"]


def test_P45_statistics_nudged_by_the_server_never_open_a_fresh_budget(tmp_path, long_case, one_torch_thread):
    """P45. The attack: every training request carries the pooled statistics, and the site keyed each record's ε by a
    hash of its *standardised* values. A run that spends the cap on the site's patients, then three runs whose means
    are nudged by 1e-6: every record id changed, the same patients trained at the cap three more times (four times
    the cap), four ledgers, and the report said "max = cap". Now a record is its raw values under the site's record
    secret: the nudged runs are refused before any data is read, one ledger, and the report's max is what the
    patients spent."""
    from fcd_secure.privacy.ledger import BudgetExceeded

    spec, table = long_case(make_long_table(PATIENTS), SPEC_ONE_SITE)
    state = tmp_path / "state"
    site = _site(spec, table, state)
    stats = _statistics(site)
    metrics = _train(site, stats)
    spent = metrics["dp_epsilon"]
    assert 0.5 * CAP < spent <= CAP + 1e-9
    trained = 1
    for k in (1, 2, 3):
        try:
            _train(_site(spec, table, state), _statistics(_site(spec, table, state), nudge=k * 1e-6))
            trained += 1
        except BudgetExceeded:
            pass
    ledgers = list((state / "site-00" / "privacy").glob("ledger-*.json"))
    assert trained == 1, f"the same patients trained {trained} times at ε ≈ {spent:.2f} each (cap {CAP})"
    assert len(ledgers) == 1
    records = _records(state)
    assert records["max"] == pytest.approx(spent, rel=1e-6) and records["max"] <= CAP + 1e-9


def test_P45_a_membership_change_keeps_every_records_history(tmp_path, long_case, one_torch_thread):
    """P45, the honest version: the consortium's statistics move because a site joined (other means and spreads), or
    because one patient was added to this site's table. Every record the site trained keeps its history: the next
    run is refused while its patients' budget is spent."""
    from fcd_secure.privacy.ledger import BudgetExceeded

    spec, table = long_case(make_long_table(PATIENTS), SPEC_ONE_SITE)
    state = tmp_path / "state"
    site = _site(spec, table, state)
    _train(site, _statistics(site))
    before = sorted(p.name for p in (state / "site-00" / "privacy").glob("ledger-*.json"))
    joined = _statistics(_site(spec, table, state))
    joined["x_mean"] = [m * 1.1 + 0.3 for m in joined["x_mean"]]
    joined["x_std"] = [s * 1.4 for s in joined["x_std"]]
    joined["a_mean"] = [m - 0.2 for m in joined["a_mean"]]
    with pytest.raises(BudgetExceeded, match="budget"):
        _train(_site(spec, table, state), joined)
    # one patient more in the site's own table (the others' rows unchanged)
    bigger = make_long_table(PATIENTS + 1)
    pd_rows = bigger[bigger["pid"] != f"p{PATIENTS:03d}"].reset_index(drop=True)
    assert pd_rows.equals(make_long_table(PATIENTS))
    bigger_table = tmp_path / "bigger.csv"
    bigger.to_csv(bigger_table, index=False)
    grown = _site(spec, bigger_table, state)
    with pytest.raises(BudgetExceeded, match="budget"):
        _train(grown, _statistics(grown))
    after = sorted(p.name for p in (state / "site-00" / "privacy").glob("ledger-*.json"))
    assert after == before


def test_P45_statistics_the_sites_own_rows_make_implausible_are_refused(tmp_path, long_case):
    """P45: the site checks the statistics a request carries against its own raw rows before it standardises with
    them; a spread shrunk a million-fold (every z-score blown up) or a mean moved far off is refused, naming the
    column, and nothing is trained."""
    from fcd_secure.data.moments import check_statistics

    spec, table = long_case(make_long_table(PATIENTS), SPEC_ONE_SITE)
    site = _site(spec, table, tmp_path / "state")
    stats = _statistics(site)
    raw = site.data.train
    check_statistics(raw, stats)  # its own statistics pass
    check_statistics(raw, _statistics(_site(spec, table, tmp_path / "state"), nudge=1e-6))
    tiny = {**stats, "x_std": [s * 1e-6 for s in stats["x_std"]]}
    far = {**stats, "a_mean": [m + 50 * s for m, s in zip(stats["a_mean"], stats["a_std"])]}
    for bad, what in ((tiny, r"sd of x\[0\]"), (far, r"mean of a\[0\]")):
        with pytest.raises(ValueError, match=what):
            check_statistics(raw, bad)
        with pytest.raises(ValueError, match=what):
            _train(_site(spec, table, tmp_path / "state"), bad)
    assert not list((tmp_path / "state" / "site-00" / "privacy").glob("ledger-*.json"))


def test_P45_a_lost_record_secret_refuses_rather_than_starting_fresh_budgets(tmp_path):
    """P45: the record ids are keyed with the secret beside the ledgers; a new secret would make every record new.
    With ledgers of records in the folder and the secret gone, the site refuses to open a DP site."""
    from fcd_secure.privacy.config import DPConfig
    from fcd_secure.privacy.engine import DPSite
    from fcd_secure.privacy.errors import PrivacyLedgerError
    from fcd_secure.privacy.identity import RECORD_SECRET_FILE
    from tests.test_privacy_grads import tiny_site

    ds = tiny_site(n=60, L=3, seed=5)
    dp = DPConfig(enabled=True, epsilon=1.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")
    site = DPSite.for_dataset(tmp_path, ds, dp, planned_rounds=1, local_epochs=1, batch_size=10)
    res = site.reserve_round(round_id=1)
    site.ledger.commit(res.seq, res.steps)
    secret = tmp_path / "privacy" / RECORD_SECRET_FILE
    assert secret.stat().st_size == 32 and (secret.stat().st_mode & 0o777) == 0o600
    keys = json.loads(site.ledger.path.read_text())["records"]
    # keyed: the ledger's record list is not the public hash of a record's values
    from fcd_secure.privacy.identity import record_keys

    assert keys == record_keys(ds, secret.read_bytes()) and not set(keys) & set(record_keys(ds, b""))
    secret.unlink()
    with pytest.raises(PrivacyLedgerError, match=RECORD_SECRET_FILE):
        DPSite.for_dataset(tmp_path, ds, dp, planned_rounds=1, local_epochs=1, batch_size=10)


def test_P46_a_second_site_home_on_the_same_table_is_refused_naming_the_first(tmp_path, long_case):
    """P46. The attack (or a careless second consortium): ``fcd site init`` a second home on a table another home on
    this host trains on. Its ledgers, record secret and anchor start empty, so every patient of the table started
    again at ε 0 without a warning. Now init claims the table in the host's registry of site homes and refuses,
    naming the other home, whether the table is named by the same path or is a copy elsewhere; once the first home
    is gone the table may be installed again."""
    import shutil

    from fcd_secure.cli import site as site_cli

    spec, table = long_case(make_long_table(20), SPEC_ONE_SITE)

    def init(home, tbl, sid="h0"):
        return CliRunner().invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(tbl), "--home",
                                                 str(home), "--site-id", sid, "--min-trajectories", "10", "--json"])

    first = tmp_path / "consortium-a"
    assert init(first, table).exit_code == 0
    copy = tmp_path / "elsewhere" / "copy.csv"
    copy.parent.mkdir()
    shutil.copyfile(table, copy)
    for tbl in (table, copy):
        res = init(tmp_path / "consortium-b", tbl, "h1")
        assert res.exit_code == 2, res.output
        env = json.loads(res.stdout)
        assert str(first.resolve()) in env["message"] and "ε" in env["message"]
        assert not (tmp_path / "consortium-b").exists()
    # another table is another budget; the first home removed, its table may be installed again
    other = tmp_path / "other.csv"
    make_long_table(21, seed=3).to_csv(other, index=False)
    assert init(tmp_path / "consortium-c", other, "h2").exit_code == 0
    shutil.rmtree(first)
    assert init(tmp_path / "consortium-b", table, "h1").exit_code == 0
