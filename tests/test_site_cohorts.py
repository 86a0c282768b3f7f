"""The site owns its data identity: its train / validation / test cut and its what-if cohorts (issue 31 items 1-2,
issue 32 item 6; docs/threats.md P43-P46)."""

from __future__ import annotations

import stat

import numpy as np
import pytest

from conftest import GOOD_SPEC, make_long_table

SPEC_ONE_SITE = GOOD_SPEC.replace('site = "hospital"\n', "")


def _site_cfg(spec, table, test_fraction: float, seed: int):
    from fcd_secure.config import build_config

    return build_config("tiny", {"seed": seed, "data": {"dataset": "spec", "spec": str(spec), "table": str(table),
                                                        "test_fraction": test_fraction, "n_sites": 4}})


def test_P43_no_server_fraction_or_seed_moves_a_deployed_sites_cut(tmp_path, long_case):
    """P43. The attack: two runs asking a deployed site (its own table, the strict default policy) for test fractions
    0.2 and 0.2035, or for seeds 0 and 1. Before, the site cut its table with the run's values: the round-0 secure
    preprocessing sums (over its training rows) of the two runs differed by exactly one patient's statics, lab sums
    and action counts, and the evaluation cohorts by that patient. Now the cut is the site's (its split secret, its
    policy's fractions): every run sees the same training, validation and test entities, the same round-0 sums and
    the same evaluation rows."""
    from fcd_secure.apps.site import SPLIT_SLOT, SiteRuntime
    from fcd_secure.data.cohorts import SECRET_FILE, row_ids
    from fcd_secure.federation.site_policy import SitePolicy

    spec, table = long_case(make_long_table(112), SPEC_ONE_SITE)  # 0.2 vs 0.2035 of 112: 22 or 23 rows before
    state = tmp_path / "state"
    seen = []
    for tf, seed in ((0.2, 0), (0.2035, 0), (0.2, 1), (0.6, 7)):
        site = SiteRuntime(_site_cfg(spec, table, tf, seed), "site-00", 0, str(state), policy=SitePolicy(),
                           own_table=(str(spec), str(table)))
        assert site.cfg.data.test_fraction == 0.2  # the policy's fraction, not the request's
        sums = site.preprocessing_sums()
        parts = {k: sorted(row_ids(getattr(site.data, k))) for k in ("train", "validation", "test")}
        rows = site.evaluation_rows({}).tolist()
        seen.append((sums, parts, rows))
    first = seen[0]
    assert set(first[1]["test"]).isdisjoint(first[1]["train"]) and set(first[1]["validation"]).isdisjoint(
        first[1]["train"] + first[1]["test"])
    assert len(first[1]["validation"]) > 0 and len(first[1]["test"]) >= 20
    for other in seen[1:]:
        assert other[0] == first[0]  # round-0 totals: identical, not one patient apart
        assert other[1] == first[1]
        assert other[2] == first[2]
    # the secret is the site's own, kept private on its disk; the cut is recorded once
    secret = state / "site-00" / SECRET_FILE
    assert secret.stat().st_size == 32 and stat.S_IMODE(secret.stat().st_mode) == 0o600
    import json

    cuts = json.loads((state / "site-00" / "slots" / SPLIT_SLOT).read_text())["cuts"]
    assert len(cuts) == 1 and cuts[0]["test_fraction"] == 0.2
    # another site (another secret) cuts the same table differently: the order is the secret's, nobody else's
    other = SiteRuntime(_site_cfg(spec, table, 0.2, 0), "site-01", 0, str(state), policy=SitePolicy(),
                        own_table=(str(spec), str(table)))
    assert sorted(row_ids(other.data.test)) != first[1]["test"]


def test_P43_simulated_sites_cut_from_a_secret_derived_from_the_dataset_seed(long_case):
    """P43 in simulation: each simulated site's secret comes from the dataset seed and its index, the fractions sit
    on a 5 % grid, so test fractions 0.2 and 0.2035 are one cut (before: one patient apart at 57 rows), and the cut
    is exactly the keyed order of the entity ids under that secret."""
    from fcd_secure.data.cohorts import row_ids, seeded_secret, split_rows
    from fcd_secure.data.partition import site_split_seed
    from fcd_secure.federation import learner

    spec, table = long_case(make_long_table(57 * 3))  # three hospitals of 57 patients
    a = [learner.load_site_data(_site_cfg(spec, table, 0.2, 3), i) for i in range(3)]
    b = [learner.load_site_data(_site_cfg(spec, table, 0.2035, 3), i) for i in range(3)]
    for i, (x, y) in enumerate(zip(a, b)):
        assert row_ids(x.test) == row_ids(y.test) and row_ids(x.train) == row_ids(y.train)
        everyone = row_ids(x.train) + row_ids(x.validation) + row_ids(x.test)
        secret = seeded_secret(site_split_seed(3, i))
        rest, test = split_rows(everyone, 0.2, secret)
        assert sorted(row_ids(x.test)) == sorted(everyone[j] for j in test)
        fit, val = split_rows([everyone[j] for j in rest], 0.2, secret)
        assert sorted(row_ids(x.validation)) == sorted(everyone[rest[j]] for j in val)
