"""P30, P31: replay protection is per session, and round ids are bounded.

A site's replay counters used to be one number per site for ever: after a run whose evaluation round ids reached 101,
an honest later run could not run its secure round 0 ("only 0 sites are ready"), and a server that sent one huge
round id locked the site out of every later round. The counters are now keyed by the site's own name for the run
(``federation.state.session_id_of``: the Flower run id and the run config it received): within a session rounds are
taken once and in order, whatever protocol session id the server writes (P5); a replayed session is still refused;
a new session starts fresh; a round id above the bound is refused without being claimed.

Real parts: the site's secure actions (``apps.secure_site``) behind the guard, real site state and roster on disk,
real crypto, the server's own ``SecureEvaluation`` over Flower's Message API on the in-process grid (one grid per run,
each with its own run id, as Flower gives each run).
"""

from __future__ import annotations

import pytest
from test_secagg_pipeline import MANIFEST, N_SITES, Federation, ToySite

from fcd_secure.aggregation.secagg import AbortRound, SecAggPolicy
from fcd_secure.aggregation.secagg.client import ReplayGuard
from fcd_secure.federation.secure.secure_evaluation import SecureEvaluation


class EvalSite(ToySite):
    """A toy site that also evaluates: its sums are fixed numbers of its own (the server only ever sees their total)."""

    def evaluate(self, global_theta, eval_config):
        return {"n_test": 30.0 + self.site_index, "effect.sse": 0.5 * (self.site_index + 1)}


class Run(Federation):
    """One run (one Flower run id) of five evaluating toy sites over a shared state root."""

    def site(self, context):
        return EvalSite(self.root, int(context.node_config["partition-id"]), self.trained)

    def evaluate(self, round_id: int):
        totals, failed, reason = SecureEvaluation(MANIFEST, SecAggPolicy()).totals(
            self.comm, self.nodes, self.theta, {}, round_id=round_id)
        return totals, reason


def _ok(result) -> None:
    totals, reason = result
    assert reason is None and totals is not None, reason
    assert totals["n_test"] == pytest.approx(sum(30.0 + i for i in range(N_SITES)))


def _refused(result) -> None:
    totals, reason = result
    assert totals is None and "only 0 sites are ready" in reason


def test_a_later_run_starts_fresh_and_a_replayed_run_is_still_refused(tmp_path):
    """P30. Run A evaluates up to round 101; run B, later, on the same site state, runs its round 0 (today: "only 0
    sites are ready"). Run A's session stays spent: its round 101 again, or any earlier one, is refused (P5)."""
    a = Run(tmp_path)
    _ok(a.evaluate(101))
    b = Run(tmp_path)
    assert b.grid.run_id != a.grid.run_id
    _ok(b.evaluate(0))
    _refused(a.evaluate(101))
    _refused(a.evaluate(50))
    _refused(b.evaluate(0))
    _ok(a.evaluate(102))


def test_a_huge_round_id_is_refused_unclaimed(tmp_path):
    """P31. A server sends round id 2**40: every site refuses it before anything is claimed, so the same run's next
    ordinary round still runs (today the huge id was claimed and every later round refused)."""
    run = Run(tmp_path)
    _ok(run.evaluate(3))
    _refused(run.evaluate(2**40))
    _refused(run.evaluate(2**20 + 1))  # aggregation.secagg.client.MAX_ROUND_ID + 1
    _ok(run.evaluate(4))


def test_the_session_is_the_sites_own_name_for_the_run(tmp_path):
    """P30, P5. Within one session the counter is shared by every protocol session id the server writes (a fresh
    server session cannot reuse a spent round); another session has its own; the counters persist."""
    from fcd_secure.federation.state import run_config_hash, session_id_of

    path = tmp_path / "rounds.json"
    s1 = session_id_of(7, run_config_hash({"fcd-config": "{}"}))
    s2 = session_id_of(8, run_config_hash({"fcd-config": "{}"}))
    s3 = session_id_of(7, run_config_hash({"fcd-config": '{"seed": 1}'}))
    assert len({s1, s2, s3}) == 3 and all(len(s) == 16 for s in (s1, s2, s3))
    assert s1 == session_id_of(7, run_config_hash({"fcd-config": "{}"}))
    ReplayGuard(path, session=s1).claim(b"S" * 16, 5)
    with pytest.raises(AbortRound, match="P5"):
        ReplayGuard(path, session=s1).claim(b"T" * 16, 5)  # another protocol session of the same run
    ReplayGuard(path, session=s2).claim(b"S" * 16, 0)
    ReplayGuard(path, session=s3).check_fresh(1)
    assert ReplayGuard(path, session=s1).last_round() == 5 and ReplayGuard(path, session=s2).last_round() == 0
    with pytest.raises(AbortRound, match="P31"):
        ReplayGuard(path, session=s2).check_fresh(-1)


def test_a_counter_file_of_the_old_format_is_the_unnamed_session(tmp_path):
    """A site upgraded in place: its one counter for ever belongs to no run it can name again, so it keeps only the
    unnamed session's counter and a named session starts fresh."""
    from fcd_secure.federation.state import run_config_hash, session_id_of

    path = tmp_path / "rounds.json"
    path.write_text('{"_any": 101, "' + (b"S" * 16).hex() + '": 101}')
    assert ReplayGuard(path).last_round() == 101
    with pytest.raises(AbortRound):
        ReplayGuard(path).check_fresh(5)
    ReplayGuard(path, session=session_id_of(1, run_config_hash({}))).claim(b"S" * 16, 0)
    assert ReplayGuard(path).last_round() == 101


class ConfiguredSite(ToySite):
    """A toy site serving a run of three rounds (a real ``RunConfig``)."""

    def __init__(self, *args) -> None:
        super().__init__(*args)
        from fcd_secure.config import build_config

        self.cfg = build_config("tiny", {"federation": {"rounds": 3}})


class ConfiguredRun(Federation):
    def site(self, context):
        return ConfiguredSite(self.root, int(context.node_config["partition-id"]), self.trained)


def test_a_training_round_the_run_does_not_have_is_refused_untrained(tmp_path):
    """P31. In a run of three rounds the server asks for round 9 after round 1: every site refuses it before
    training, so nothing is trained or spent and rounds 2 and 3 still run (today round 9 was trained and claimed, and
    every later round refused)."""
    fed = ConfiguredRun(tmp_path).run(range(1, 2), ahead=False)
    fed.run(range(9, 10), ahead=False)
    assert fed.history[9][1].theta_c is None
    assert all(r != 9 for _, r in fed.trained)
    fed.run(range(2, 4), ahead=False)
    fed.check_sum(2)
    fed.check_sum(3)
