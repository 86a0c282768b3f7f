"""Round 0: standardisation statistics from per-site sums under secure aggregation, through the real ServerApp and
ClientApp on the in-process engine (``engines.inprocess``, pinned to Flower's simulation engine bit for bit in
``test_federation_inprocess.py``; secure aggregation on the simulation engine itself is that file's equality proof).

The consortium's means and standard deviations equal the pooled ones (``Standardizer.fit`` over all sites' raw
training rows) within 1e-6, and no file the server writes (ledger, checkpoint, run folder) holds a site's own sums.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import GOOD_SPEC, make_long_table

from fcd_secure.data.moments import moment_sums, moments_to_statistics, standardizer_for
from fcd_secure.data.preprocess import Standardizer


def _table(tmp_path, n_entities: int = 160):
    df = make_long_table(n_entities, seed=3)
    df["hospital"] = [f"h{int(p[1:]) % 4}" for p in df["pid"]]
    df["age"] = df["age"] * 3.7 + 100.0  # away from unit scale: the statistics must carry the offset and spread
    spec, table = tmp_path / "spec.toml", tmp_path / "table.csv"
    spec.write_text(GOOD_SPEC)
    df.to_csv(table, index=False)
    return spec, table


def test_moments_of_sites_give_the_pooled_standardizer(tmp_path):
    from fcd_secure.data.registry import load_spec_federated

    spec, table = _table(tmp_path)
    raw = load_spec_federated(spec, table, seed=0, standardize=False)
    pooled = Standardizer.fit(raw.train)
    totals: dict = {}
    for ds in raw.train:
        for k, v in moment_sums(ds).items():
            totals[k] = np.asarray(totals.get(k, 0.0)) + np.asarray(v)
    stats = moments_to_statistics(totals)
    std = standardizer_for(raw.train[0], stats)
    for a, b in (("x_mean", pooled.x_mean), ("x_std", pooled.x_std), ("a_mean", pooled.a_mean), ("a_std", pooled.a_std)):
        assert np.allclose(getattr(std, a), b, rtol=0, atol=1e-9)
    with pytest.raises(ValueError, match="raw values"):
        moment_sums(std.apply(raw.train[0]))


def test_secure_round0_equals_pooled_and_server_keeps_no_site_sums(tmp_path, one_torch_thread):
    from fcd_secure.config import build_config
    from fcd_secure.data.registry import load_spec_federated
    from fcd_secure.engines.inprocess import run_inprocess

    spec, table = _table(tmp_path)
    cfg = build_config("tiny", {
        "data": {"dataset": "spec", "spec": str(spec), "table": str(table), "n_sites": 4, "standardize": "secure"},
        "federation": {"rounds": 1, "clients_per_round": 4, "secure_aggregation": True},
        "out": str(tmp_path / "run"), "state_dir": str(tmp_path / "state"),
    })
    result = run_inprocess(cfg)
    stats = result.extra["standardization"]
    pooled = load_spec_federated(spec, table, seed=cfg.seed, test_fraction=cfg.data.test_fraction).description["standardization"]
    pooled_anchors = load_spec_federated(spec, table, seed=cfg.seed, test_fraction=cfg.data.test_fraction).anchors
    assert len(stats["x_mean"]) == 1 and len(stats["a_mean"]) == 1  # age; lab
    for key in ("x_mean", "x_std", "a_mean", "a_std"):
        assert np.allclose(stats[key], pooled[key], rtol=0, atol=1e-6), (key, stats[key], pooled[key])
    assert abs(stats["x_mean"][0] - 100) > 10  # the offset is real: not a vacuous comparison of z-scores
    assert [int(a) for a in stats["anchors"]] == list(pooled_anchors)  # one pair of anchor actions for every site
    # the rounds trained on data scaled with these statistics
    assert result.history and not result.history[0]["aborted"]
    # no site's own sums in anything the server wrote
    raw = load_spec_federated(spec, table, seed=cfg.seed, test_fraction=cfg.data.test_fraction, standardize=False)
    site_values = []
    for ds in raw.train:
        s = moment_sums(ds)
        site_values += [s["x.sum"][0], s["x.sumsq"][0], s["a.sum"][0], s["a.sumsq"][0]]
    blobs = []
    for root in (tmp_path / "run", tmp_path / "state" / "server"):
        for f in root.rglob("*"):
            if f.is_file() and f.suffix in (".json", ".jsonl", ".csv", ".toml", ".txt", ""):
                blobs.append(f.read_bytes().decode("utf-8", "replace"))
    text = "\n".join(blobs)
    assert "standardization" in text  # the consortium-wide statistics are recorded
    for v in site_values:
        for form in (f"{v:.6g}", f"{v:.9g}", repr(float(v))):
            # as a number of its own, not as digits inside another one (an integer sum like 8408 occurs in the
            # digits of some float by chance)
            assert not re.search(rf"(?<![0-9.]){re.escape(form)}(?![0-9])", text), (form, "a site's own sum reached a server file")


def test_sites_with_different_practice_bind_the_policies_to_the_consortiums_anchors(tmp_path):
    """Each site's own table would give its own anchor pair (its two most used actions); the histogram summed in
    round 0 gives the pooled pair, and every site's data carries it."""
    from fcd_secure.data.policy import anchor_actions
    from fcd_secure.data.registry import load_spec_federated
    from fcd_secure.federation.learner import consortium_anchors
    from fcd_secure.federation.secure.secure_stats import STATISTICS_KEY, statistics_from_config
    import json

    spec, table = _table(tmp_path)
    raw = load_spec_federated(spec, table, seed=0, standardize=False)
    # skew one site towards the action the consortium uses least, so its own pair differs
    pooled = anchor_actions(raw.train)
    rare = int(np.argmin(sum(np.bincount(d.T[d.M > 0], minlength=d.n_actions) for d in raw.train)))
    skewed = raw.train[0]
    valid = skewed.M > 0
    idx = np.flatnonzero(valid.ravel())
    flat = skewed.T.reshape(-1)
    flat[idx[0::2]], flat[idx[1::2]] = rare, pooled[1]  # this hospital never uses the consortium's a_off
    own = anchor_actions(skewed)
    assert pooled[0] not in own and own != anchor_actions(raw.train)
    totals: dict = {}
    for ds in raw.train:
        for k, v in moment_sums(ds).items():
            totals[k] = np.asarray(totals.get(k, 0.0)) + np.asarray(v)
    stats = moments_to_statistics(totals)
    assert [int(a) for a in stats["anchors"]] == list(anchor_actions(raw.train))
    sent = statistics_from_config({STATISTICS_KEY: json.dumps(stats)})
    assert consortium_anchors(sent, own) == anchor_actions(raw.train) != own
    assert consortium_anchors(None, own) == own
    with pytest.raises(ValueError, match="anchors"):
        statistics_from_config({STATISTICS_KEY: json.dumps({**stats, "anchors": [1, 1]})})
