"""A site whose DP ledgers predate ``record_secret.key`` (issue 44 follow-up): it refuses to train (P45) until the
ledgers are migrated; the migration keeps every record's spent ε (each record of the site's table is charged every
old ledger) and leaves a note beside them."""

from __future__ import annotations

import json

import pytest

from fcd_secure.privacy.config import DPConfig
from fcd_secure.privacy.engine import DPSite
from fcd_secure.privacy.errors import PrivacyLedgerError
from fcd_secure.privacy.identity import RECORD_SECRET_FILE, record_keys
from fcd_secure.privacy.ledger import MIGRATION_NOTE, migrate_to_record_secret, site_holdings
from fcd_secure.privacy.spend import site_spend
from tests.test_privacy_grads import tiny_site

DP = DPConfig(enabled=True, epsilon=4.0, delta=1e-3, accountant="rdp", noise_seed="run_seed")


def _train(state, ds, rounds: int = 1) -> None:
    site = DPSite.for_dataset(state, ds, DP, planned_rounds=rounds, local_epochs=1, batch_size=10)
    for r in range(1, rounds + 1):
        res = site.reserve_round(round_id=r)
        site.ledger.commit(res.seq, res.steps)


def test_ledgers_older_than_the_record_secret_are_migrated_keeping_every_records_spend(tmp_path):
    ds, other = tiny_site(n=60, L=3, seed=5), tiny_site(n=60, L=3, seed=6)
    _train(tmp_path, ds, rounds=2)
    _train(tmp_path, other)  # a second table: its own ledger
    folder = tmp_path / "privacy"
    before = site_spend(site_holdings(folder), DP.accountant)
    worst = max(e for e, _ in before)
    (folder / RECORD_SECRET_FILE).unlink()  # what a folder written before the secret existed looks like
    with pytest.raises(PrivacyLedgerError, match="fcd site migrate"):
        DPSite.for_dataset(tmp_path, ds, DP, planned_rounds=1, local_epochs=1, batch_size=10)

    note = migrate_to_record_secret(folder, [ds])
    assert len(note["ledgers"]) == 2 and note["records_charged"] == 60
    assert json.loads((folder / MIGRATION_NOTE).read_text()) == note
    secret = folder / RECORD_SECRET_FILE
    assert secret.stat().st_size == 32 and (secret.stat().st_mode & 0o777) == 0o600
    # every record of the table is charged every old ledger: none spent less than the most any record had
    after = site_spend(site_holdings(folder), DP.accountant)
    assert sum(n for _, n in after) == 60 and min(e for e, _ in after) >= worst - 1e-9
    keys = set(record_keys(ds, secret.read_bytes()))
    assert all(set(h.records) == keys for h in site_holdings(folder))
    # the site trains again, within what is left
    DPSite.for_dataset(tmp_path, ds, DP, planned_rounds=1, local_epochs=1, batch_size=10)
    with pytest.raises(PrivacyLedgerError, match="nothing to migrate"):
        migrate_to_record_secret(folder, [ds])


def test_a_folder_without_ledgers_of_records_has_nothing_to_migrate(tmp_path):
    (tmp_path / "privacy").mkdir()
    with pytest.raises(PrivacyLedgerError, match="no ledger that lists records"):
        migrate_to_record_secret(tmp_path / "privacy", [tiny_site(n=20, L=3, seed=1)])


def test_fcd_site_migrate_charges_the_records_the_site_trains_on(tmp_path, long_case):
    """`fcd site migrate` on a site home: the record ids it charges are those the site's DP training keys its ledger
    by (its own table read with its spec, cut by its split secret), so the training split's records keep their
    spend; a home with its secret has nothing to migrate (exit 2)."""
    from typer.testing import CliRunner

    from conftest import GOOD_SPEC, make_long_table
    from fcd_secure.apps.site import SiteRuntime
    from fcd_secure.cli import site as site_cli
    from fcd_secure.config import build_config
    from fcd_secure.federation.site_policy import SitePolicy

    spec, table = long_case(make_long_table(96, seed=2), spec=GOOD_SPEC.replace('site = "hospital"\n', ""))
    home = tmp_path / "home"
    runner = CliRunner()
    res = runner.invoke(site_cli.app, ["init", "--spec", str(spec), "--table", str(table), "--home", str(home),
                                       "--site-id", "h0", "--min-trajectories", "5", "--json"])
    assert res.exit_code == 0, res.stdout
    cfg = build_config("tiny", {"data": {"dataset": "spec", "spec": str(home / "spec.toml"), "table": str(table)},
                                "dp": {"enabled": True}})
    rt = SiteRuntime(cfg, "h0", 0, str(home / "state"), policy=SitePolicy(), own_table=(str(home / "spec.toml"),
                                                                                           str(table)))
    train = rt.data.train
    _train(rt.state.dir, train, rounds=2)
    folder = rt.state.dir / "privacy"
    worst = max(e for e, _ in site_spend(site_holdings(folder), DP.accountant))
    (folder / RECORD_SECRET_FILE).unlink()
    res = runner.invoke(site_cli.app, ["migrate", "--home", str(home), "--json"])
    assert res.exit_code == 0, res.stdout
    assert json.loads(res.stdout)["data"]["records_charged"] >= train.n
    secret = (folder / RECORD_SECRET_FILE).read_bytes()
    charged = set().union(*(h.records for h in site_holdings(folder)))
    assert set(record_keys(train, secret)) <= charged  # the training split's records, as training keys them
    after = site_spend(site_holdings(folder), DP.accountant)
    assert min(e for e, _ in after) >= worst - 1e-9
    DPSite.for_dataset(rt.state.dir, train, DP, planned_rounds=1, local_epochs=1, batch_size=10)
    res = runner.invoke(site_cli.app, ["migrate", "--home", str(home), "--json"])
    assert res.exit_code == 2 and "nothing to migrate" in json.loads(res.stdout)["message"]
