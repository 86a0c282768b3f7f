"""A malicious site breaks the bounds of secure aggregation in every round it joins (docs/threats.md P33): the server
sees only the sum, so ``BoundViolation`` cannot name it; the secure flow retries the violating round's sites leaving
one out at a time, names the site whose absence keeps the sum within bounds, and leaves it out afterwards.

Real parts throughout (the harness of ``test_secagg_pipeline``): the sites' ClientApp actions, site state on disk,
real crypto, Flower messages on the in-process grid. The malicious site skips its own input checks, as a site that
does not run our code can: it masks a value far outside the clip range.
"""

from __future__ import annotations

import numpy as np
import pytest

import fcd_secure.aggregation.secagg.client as secagg_client
from fcd_secure.audit import ServerAudit, load_or_create_identity_key
import fcd_secure.apps.secure_site as secure_site
from test_secagg_pipeline import N_SITES, Federation, ToySite

ATTACKER = "site-02"


class _Cheater(ToySite):
    """site-02: trains like the others, then masks an input ``encode`` could never write."""

    active = False

    def train_round(self, global_theta, round_config):
        _Cheater.active = self.site_id == ATTACKER
        return super().train_round(global_theta, round_config)


@pytest.fixture
def cheating_federation(tmp_path, monkeypatch):
    real_encode, real_check = secure_site.encode, secagg_client.check_input

    def encode(layout, policy, update, n, metrics=None):
        vector = real_encode(layout, policy, update, n, metrics)
        if _Cheater.active:
            vector.view(np.int32)[5] = 1 << 30  # a value word far outside ±clip
        return vector

    def check_input(layout, policy, vector):
        if _Cheater.active:  # the malicious site skips the check an honest site makes before masking
            _Cheater.active = False
            return
        real_check(layout, policy, vector)

    monkeypatch.setattr(secure_site, "encode", encode)
    monkeypatch.setattr(secagg_client, "check_input", check_input)

    class _Fed(Federation):
        def site(self, context):
            return _Cheater(self.root, int(context.node_config["partition-id"]), self.trained)

    fed = _Fed(tmp_path)
    # the server's signed ledger, as the ServerApp keeps it (receipts ride on the downlinks from here on)
    fed.comm.audit = ServerAudit(tmp_path / "server_audit", load_or_create_identity_key(tmp_path / "server.key"))
    return fed


def test_a_site_that_breaks_the_bound_is_found_named_and_left_out(cheating_federation):
    """P33: round 1 breaks a bound; the retries without site-00 and site-01 break it too; the retry without site-02
    stays within bounds and names it; later rounds run without it and aggregate."""
    fed = cheating_federation.run(range(1, 7))
    outcomes = {r: o for r, (_, o) in fed.history.items()}
    assert outcomes[1].theta_c is None and "outside the clip range" in outcomes[1].metrics["aborted"]
    named = [r for r, o in outcomes.items() if ATTACKER in o.metrics.get("dropped", {})]
    assert named, {r: o.metrics.get("aborted") for r, o in outcomes.items()}
    first = named[0]
    assert first <= 1 + N_SITES
    assert "broke a bound" in outcomes[first].metrics["dropped"][ATTACKER]
    # only the culprit is named, and no honest site was ever left out for good
    assert all(set(o.metrics.get("dropped", {})) <= {ATTACKER} for o in outcomes.values())
    assert fed.flow.excluded.keys() == {ATTACKER}
    for r in range(first, 7):
        o = outcomes[r]
        assert o.theta_c is not None, (r, o.metrics.get("aborted"))
        assert ATTACKER not in {fed.comm.site_of[n] for n in o.participants}
        assert len(o.participants) == N_SITES - 1
        fed.check_sum(r)  # the honest sites' weighted mean, within the quantisation bound
    # the attacker's site did not even train in the rounds after it was named
    assert not [rnd for s, rnd in fed.trained if s == ATTACKER and rnd > first]
    # named in the server's signed ledger, and verify says so (a note: the server's word, not a finding)
    from fcd_secure.audit.entries import ExclusionLine
    from fcd_secure.audit.verify import verify_path

    fed.comm.audit.close()
    lines = [e for e in fed.comm.audit.ledger.entries() if isinstance(e, ExclusionLine)]
    assert [(e.round, e.site_id) for e in lines] == [(first, ATTACKER)]
    res = verify_path(fed.comm.audit.ledger.path, allow_unpinned=True)
    notes = [f.message for f in res.findings if f.severity == "note" and "left site-02 out" in f.message]
    assert notes and f"from round {first}" in notes[0], [f.message for f in res.findings]


def test_an_honest_federation_never_searches(tmp_path):
    fed = Federation(tmp_path).run(range(1, 3))
    for _, o in fed.history.values():
        assert o.theta_c is not None and "retry" not in o.metrics["secagg"] and "dropped" not in o.metrics
    assert fed.flow.excluded == {}
