"""The per-process caches on a small run's hot path never serve stale answers (cheap units, no Flower start).

Each cache here keys on what its value depends on; these tests change that input between two calls in one process
and check the second call sees the change: the egress gate's policy (``apps.egress.federation_policy``) follows a
rewritten site policy file; a site's loaded data and its cut (``federation.learner.load_site_data`` /
``load_own_site_data``) follow a rewritten table; the gate's fingerprints of private arrays (``audit.scanner.fingerprint_private``) and a site's fitted
behaviour models (``evaluation.propensity.HistoryPropensity.fit_design``) follow arrays changed in place; a
world's true effects (``OracleWorld.effects_of``) are the computed ones.
"""

from __future__ import annotations

import numpy as np
import pytest

from fcd_secure.apps.egress import federation_policy, site_gate_policy
from conftest import GOOD_SPEC, make_long_table

from fcd_secure.apps.site import SiteRuntime
from fcd_secure.audit.scanner import find_private, fingerprint_private
from fcd_secure.config import build_config
from fcd_secure.data.cohorts import row_ids
from fcd_secure.evaluation import propensity
from fcd_secure.federation import learner
from fcd_secure.federation.site_policy import SitePolicy


def test_the_gate_policy_follows_a_rewritten_site_policy_file(tmp_path):
    """A site whose policy file allows full sync lets Θs out in a full-sync run; after the file is rewritten to
    forbid it, the next message's gate (a fresh runtime, as every message builds) lets none out, though the
    memoised policy of the first message is still cached."""
    cfg = build_config("tiny", {"data": {"n_sites": 2}, "federation": {"clients_per_round": 2, "sync": "full",
                                                                       "secure_aggregation": False}})
    path = tmp_path / "site-00" / "site_policy.toml"
    base = SitePolicy.for_run(cfg)
    base.model_copy(update={"egress": base.egress.model_copy(update={"allow_full_sync": True})}).write(path)
    allowed = site_gate_policy(SiteRuntime(cfg, "site-00", 0, str(tmp_path)), None)
    assert allowed.allow_theta_s_upload
    base.model_copy(update={"egress": base.egress.model_copy(update={"allow_full_sync": False})}).write(path)
    after = SiteRuntime(cfg, "site-00", 0, str(tmp_path))
    assert after.cfg.federation.sync == "dss"
    assert not site_gate_policy(after, None).allow_theta_s_upload
    # the same question is one frozen policy; another question another one
    assert federation_policy(2, ("never", "always")) is federation_policy(2, ["never", "always"])
    assert federation_policy(2, ("never",)) != federation_policy(2, ("never", "always"))
    assert federation_policy(3, ("never",)) != federation_policy(2, ("never",))


def test_the_gates_fingerprints_follow_arrays_changed_in_place():
    """The same propensity and Θs objects with new numbers (a new round's Θs committed into the same buffer, another
    table's propensities): the next message's fingerprints are of the new numbers, not the memoised old ones."""
    rng = np.random.default_rng(0)
    P = rng.uniform(0.05, 0.95, size=(30, 6))
    theta = {"site_emb": rng.normal(size=(4, 8)).astype(np.float32)}
    first = fingerprint_private(theta, P, 8)
    assert find_private(P[3].tobytes(), first) == "propensity"
    assert find_private(theta["site_emb"][1].tobytes(), first) == "theta_s"
    assert fingerprint_private(theta, P, 8)[1] is first[1]  # the same numbers: the built group is reused
    P[:] = rng.uniform(0.05, 0.95, size=P.shape)
    theta["site_emb"][:] = rng.normal(size=(4, 8)).astype(np.float32)
    after = fingerprint_private(theta, P, 8)
    assert find_private(P[3].tobytes(), after) == "propensity"
    assert find_private(np.ascontiguousarray(P[:, 2]).astype(np.float32).tobytes(), after) == "propensity"
    assert find_private(theta["site_emb"][1].tobytes(), after) == "theta_s"
    assert find_private(theta["site_emb"][1].tobytes(), first) is None  # what the old fingerprints would miss


def test_a_sites_data_is_read_again_when_its_table_file_changes(long_case):
    """The site stays the authority over its data: the per-process caches of the loaded table and of each site's
    cut key on the files' identity, so after the table is rewritten (another patient set) the next message's data
    are the new table's, in simulation and for a deployed site's own table; the same file serves the cached cut."""
    spec, table = long_case(make_long_table(60, seed=0), GOOD_SPEC.replace('site = "hospital"\n', ""))
    cfg = build_config("tiny", {"seed": 0, "data": {"dataset": "spec", "spec": str(spec), "table": str(table),
                                                    "n_sites": 2}, "federation": {"clients_per_round": 2}})
    first = learner.load_site_data(cfg, 0)
    again = learner.load_site_data(cfg, 0)
    assert again.train is first.train and again.validation is first.validation  # one cut per process
    own = learner.load_own_site_data(cfg, spec, table, 0, secret=b"k" * 32)
    assert learner.load_own_site_data(cfg, spec, table, 0, secret=b"k" * 32).train is own.train
    df = make_long_table(60, seed=1)
    df["pid"] = "q" + df["pid"]  # other patients, other numbers
    df.to_csv(table, index=False)
    after = learner.load_site_data(cfg, 0)
    assert not set(row_ids(after.train)) & set(row_ids(first.train))
    assert all(r.startswith("q") for r in row_ids(after.train) + row_ids(after.test))
    own_after = learner.load_own_site_data(cfg, spec, table, 0, secret=b"k" * 32)
    assert all(r.startswith("q") for r in row_ids(own_after.train) + row_ids(own_after.test))


def test_a_behaviour_fit_is_kept_only_for_the_same_rows_and_settings():
    """The kept fit is bit for bit the fit itself; rows changed in place, or another penalty, fit again."""
    rng = np.random.default_rng(1)
    F, a = rng.normal(size=(200, 4)), rng.integers(0, 3, size=200)

    def fit(F, a, l2=1e-3):
        return propensity.HistoryPropensity(3, 0, l2=l2).fit_design(F, a)

    first = fit(F, a)
    assert np.array_equal(fit(F, a).coef, first.coef)
    propensity._FITS.clear()
    assert np.array_equal(fit(F, a).coef, first.coef)  # the memoised coefficients are the L-BFGS fit's own
    F[:, 0] += 2.0 * a  # the same objects, other rows
    moved = fit(F, a)
    assert not np.allclose(moved.coef, first.coef)
    propensity._FITS.clear()
    assert np.array_equal(fit(F, a).coef, moved.coef)
    assert not np.allclose(fit(F, a, l2=1.0).coef, moved.coef)


def test_a_worlds_true_effects_are_kept_per_question_and_are_the_computed_ones(tiny_dkt_site):
    """The true effects a run asks at every evaluated round: the kept answer is the computed one, a copy (a caller
    writing into it changes nothing kept), and another window or rows is computed anew."""
    world = tiny_dkt_site[1].oracle
    first = world.true_effects(0, "test")
    kept = first.copy()
    first[:] = 99.0
    again = world.true_effects(0, "test")
    assert np.array_equal(again, kept, equal_nan=True)
    world.__dict__.pop("_effects_memo")
    assert np.array_equal(again, world.true_effects(0, "test"), equal_nan=True)
    assert not np.array_equal(world.true_effects(0, "test", horizon=1), again, equal_nan=True)
    assert world.true_effects(0, "test", rows=[0, 1]).shape == (2,)


@pytest.fixture
def flushed(monkeypatch) -> list[str]:
    """The real path of every file ``os.fsync`` flushes from here on (the real flush, counted)."""
    import os

    real_fsync, paths = os.fsync, []

    def fsync(fd):
        paths.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    return paths


def test_a_worlds_true_policy_values_are_kept_per_policy_and_rows_and_are_the_computed_ones(tiny_dkt_site):
    """The true policy values a run asks for every policy at every evaluated round: the kept answer is the computed
    one, and another policy (even under the same name), other rows, rollouts or horizons are computed anew."""
    from fcd_secure.data.policy import default_policies

    world = tiny_dkt_site[1].oracle
    pols = {p.name: p for p in default_policies()}
    never, always = pols["never"], pols["always"]
    first = world.true_policy_values_at(never, 0, "test", (None, 2), n_rollouts=2)
    assert len(world.__dict__["_values_memo"]) >= 1
    assert world.true_policy_values_at(never, 0, "test", (None, 2), n_rollouts=2) == first
    world.__dict__.pop("_values_memo")
    assert world.true_policy_values_at(never, 0, "test", (None, 2), n_rollouts=2) == first
    # the same name with always' rule: keyed by the policy's content, not its name
    renamed = always.model_copy(update={"name": "never"})
    assert world.true_policy_values_at(renamed, 0, "test", (None, 2), n_rollouts=2) == \
        world.true_policy_values_at(always, 0, "test", (None, 2), n_rollouts=2) != first
    assert world.true_policy_values_at(never, 1, "test", (None, 2), n_rollouts=2) != first  # other rows
    assert world.true_policy_values_at(never, 0, "test", (None, 1), n_rollouts=2) != first  # another horizon
    assert world.true_policy_values_at(never, 0, "test", (None, 2), n_rollouts=3) != first  # more rollouts


def test_the_gate_flushes_a_messages_ledger_lines_once_before_the_reply_leaves(tmp_path, flushed):
    """Closing round 1 on a round-2 message writes a checkpoint and the upload line: both are on disk when the reply
    comes back from the gate, by one fsync of the ledger file (``SiteLedger.deferred_sync``), not one per line."""
    import os

    from test_audit_support import Site, instruction

    site = Site(tmp_path)
    path = os.path.realpath(site.ledger.path)
    assert not site.send(instruction("train", round=1)).has_error()
    before, flushed[:] = len(site.ledger.lines()), []
    reply = site.send(instruction("train", round=2))
    assert not reply.has_error()
    kinds = [line["kind"] for line in site.ledger.lines()[before:]]
    assert "checkpoint" in kinds and kinds[-1] == "upload" and len(kinds) >= 2
    assert flushed.count(path) == 1


def test_the_server_ledger_flushes_the_lines_of_one_pull_of_replies_once_before_their_receipts_leave(
        tmp_path, flushed):
    """Three sites answer one message; the in-process grid hands the server the three replies in one pull: their
    three received lines are on disk, flushed by one fsync of the server ledger (``ServerAudit.deferred_sync``), and
    each site's receipt rides on the next message to it."""
    import os

    from flwr.app import ConfigRecord, Context, Message, RecordDict
    from flwr.clientapp import ClientApp
    from flwr.common.constant import SUPERLINK_NODE_ID
    from flwr.supercore.task_identity import TaskIdentity

    from fcd_secure.audit import ServerAudit, load_or_create_identity_key
    from fcd_secure.audit.receipts import RECEIPTS_RECORD
    from fcd_secure.engines.inprocess import InProcessGrid
    from fcd_secure.federation.messaging import Comm

    app = ClientApp()

    @app.query("hello")
    def hello(msg: Message, context: Context) -> Message:
        return Message(RecordDict({"hello": ConfigRecord({"ok": 1})}), reply_to=msg)

    grid = InProcessGrid(app, 3)
    TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, grid.run_id, SUPERLINK_NODE_ID
    audit = ServerAudit(tmp_path / "audit", load_or_create_identity_key(tmp_path / "server.key"))
    path = os.path.realpath(audit.ledger.path)
    comm = Comm(grid, poll_s=0.0, audit=audit)
    nodes = list(grid.get_node_ids())
    flushed.clear()  # the ledger's open line is flushed by itself
    replies = comm.send(nodes, "query.hello", RecordDict({"hello": ConfigRecord({})}), 10, round=0)
    assert sorted(replies) == sorted(nodes)
    assert [line["kind"] for line in audit.ledger.lines()][1:] == ["received"] * 3
    assert flushed.count(path) == 1
    assert all(RECEIPTS_RECORD in audit.attach(n, RecordDict({})) for n in nodes)
