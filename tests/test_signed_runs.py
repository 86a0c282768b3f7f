"""Sites check the run, not only the app (docs/threats.md P34).

The attack, as run against a real deployment: the consortium's app project was the same bytes for every consortium,
so anyone could rebuild it from the installed package, get the pinned app hash, and submit it through the Control API
with a run config of their own (``out``, ``seed``, ``data.test_fraction``); the sites' only check was that hash, and
the coordinator's own ServerApp ran the attacker's config as the coordinator. Now the app project binds the consortium
id, every run start carries the coordinator's signature over the app hash, the consortium id, a fresh session id and
the exact run config, and the site's executor (``engines.site_exec.task_refusal``) and the ServerApp
(``apps.server_app.check_signed_run``) refuse anything else.

Real parts: the real app project and the FAB bytes Flower builds from it, real Ed25519 keys, the real site policy.
"""

from __future__ import annotations

import json
import os

import pytest

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

from flwr.app import Context, RecordDict  # noqa: E402

from fcd_secure._flower.internals import fab_bytes  # noqa: E402
from fcd_secure.audit.signing import load_or_create_identity_key, public_key_bytes  # noqa: E402
from fcd_secure.config import build_config  # noqa: E402
from fcd_secure.engines.deployment import fab_sha256, signed_run_config, write_app_project  # noqa: E402
from fcd_secure.federation.records import RUN_CONFIG_KEY  # noqa: E402
from fcd_secure.federation.site_policy import AppPolicy, SitePolicy  # noqa: E402

CONSORTIUM = "north-hospitals"


@pytest.fixture
def consortium(tmp_path):
    key = load_or_create_identity_key(tmp_path / "coordinator.key")
    app = write_app_project(tmp_path / "app", CONSORTIUM)
    digest = fab_sha256(app)
    policy = SitePolicy(app=AppPolicy(fab_sha256=(digest,), coordinator_key=public_key_bytes(key).hex(),
                                      consortium_id=CONSORTIUM))
    cfg = build_config("tiny", {"out": str(tmp_path / "run"), "seed": 0})
    return key, digest, policy, cfg


def test_the_app_hash_differs_between_consortia(tmp_path):
    """P34: the pinned app of one consortium cannot be rebuilt from the installed package under another id."""
    a = fab_sha256(write_app_project(tmp_path / "a", "north-hospitals"))
    b = fab_sha256(write_app_project(tmp_path / "b", "south-hospitals"))
    again = fab_sha256(write_app_project(tmp_path / "c", "north-hospitals"))
    assert a != b and a == again
    assert b"north-hospitals" in fab_bytes(tmp_path / "a")


def test_a_site_refuses_the_pinned_app_with_a_run_config_the_coordinator_did_not_sign(tmp_path, consortium):
    """P34: the attacker rebuilt the pinned app; a run config of its own — unsigned, signed by another key, for another
    consortium or app, changed after signing, or with an extra entry — is refused before any code of the app runs."""
    from fcd_secure.engines.site_exec import task_refusal

    key, digest, policy, cfg = consortium
    good = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    assert task_refusal(policy, digest, good) == (None, "")

    evil = cfg.model_copy(update={"out": str(tmp_path / "attacker"), "seed": 7}).to_json()
    other_key = load_or_create_identity_key(tmp_path / "other.key")
    attacks = {
        "unsigned": {RUN_CONFIG_KEY: evil},
        "empty ticket": {RUN_CONFIG_KEY: evil, "fcd-run-ticket": ""},
        "another signer": signed_run_config(other_key, CONSORTIUM, digest, evil),
        "another consortium": signed_run_config(key, "south-hospitals", digest, cfg.to_json()),
        "another app": signed_run_config(key, CONSORTIUM, "0" * 64, cfg.to_json()),
        "config swapped after signing": {**good, RUN_CONFIG_KEY: evil},
        "an unsigned extra entry": {**good, "data.test_fraction": 0.9},
    }
    for name, run_config in attacks.items():
        refusal, why = task_refusal(policy, digest, run_config)
        assert refusal is not None and refusal.rule == "run_not_signed", name
        assert "not signed" in why, (name, why)
    # a site that pinned no coordinator key starts no deployed run at all
    bare = SitePolicy(app=AppPolicy(fab_sha256=(digest,)))
    assert task_refusal(bare, digest, good)[0].rule == "run_not_signed"
    # and an unpinned app is refused for that, first
    assert task_refusal(policy, "1" * 64, good)[0].rule == "app_not_pinned"


def test_the_server_app_refuses_a_run_the_coordinator_did_not_sign(tmp_path, consortium):
    """P34: the coordinator's own ServerApp, started by anyone through the Control API, checks the signature before
    it writes a file or sends a message as the coordinator."""
    from fcd_secure.apps.server_app import check_signed_run
    from fcd_secure.federation.run_ticket import CONSORTIUM_ENV, COORDINATOR_KEY_ENV, RunTicketError

    key, digest, _, cfg = consortium
    env = {COORDINATOR_KEY_ENV: public_key_bytes(key).hex(), CONSORTIUM_ENV: CONSORTIUM}

    def context(run_config):
        return Context(run_id=1, node_id=0, node_config={}, state=RecordDict(), run_config=run_config)

    check_signed_run(context(signed_run_config(key, CONSORTIUM, digest, cfg.to_json())), env)
    with pytest.raises(RunTicketError, match="no coordinator signature"):
        check_signed_run(context({RUN_CONFIG_KEY: cfg.to_json()}), env)
    with pytest.raises(RunTicketError, match="consortium"):
        check_signed_run(context(signed_run_config(key, "south-hospitals", digest, cfg.to_json())), env)


def test_every_run_start_has_a_fresh_signed_session_id(consortium):
    from fcd_secure.federation.run_ticket import RUN_TICKET_KEY, ticket_session_id

    key, digest, _, cfg = consortium
    first = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    second = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    a, b = ticket_session_id(first), ticket_session_id(second)
    assert a and b and a != b and len(bytes.fromhex(a)) == 16
    assert json.loads(first[RUN_TICKET_KEY])["ticket"]["session_id"] == a
    assert ticket_session_id({RUN_CONFIG_KEY: cfg.to_json()}) is None


def test_the_sites_replay_session_follows_the_signed_run_start(consortium):
    """P34 with P30: a site's session (the key of its replay counters) changes with every signed run start and stays
    the same for a replayed one, even under the same Flower run id and run config."""
    from fcd_secure.federation.state import run_config_hash, session_id_of

    key, digest, _, cfg = consortium
    first = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    second = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    assert session_id_of(7, run_config_hash(first)) != session_id_of(7, run_config_hash(second))
    assert session_id_of(7, run_config_hash(first)) == session_id_of(7, run_config_hash(dict(first)))


def test_P55_a_site_runs_a_signed_run_start_once(tmp_path, consortium):
    """P52: the signed run config resubmitted under a new Flower run id (no key needed) ran as a fresh run at every
    site. A site now keeps the run starts it accepted in its state folder: the same run's later tasks pass, the same
    ticket under another run id is refused (also after the executor restarts), and a ticket first seen after its
    expiry is refused."""
    from fcd_secure.engines.site_exec import task_refusal
    from fcd_secure.federation.run_ticket import RUN_TICKET_KEY, AcceptedRuns, sign_run_ticket
    from fcd_secure.federation.state import SiteState

    key, digest, policy, cfg = consortium
    site = SiteState(tmp_path / "state", "h0")
    signed = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())
    assert task_refusal(policy, digest, signed, accepted=AcceptedRuns(site.dir), run_id=7) == (None, "")
    assert task_refusal(policy, digest, signed, accepted=AcceptedRuns(site.dir), run_id=7) == (None, "")  # round 2
    for executor in (AcceptedRuns(site.dir), AcceptedRuns(SiteState(tmp_path / "state", "h0").dir)):
        refusal, why = task_refusal(policy, digest, dict(signed), accepted=executor, run_id=8)
        assert refusal is not None and refusal.rule == "run_replayed" and "already used by run 7" in why, why
    fresh = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())  # the coordinator's next run start
    assert task_refusal(policy, digest, fresh, accepted=AcceptedRuns(site.dir), run_id=8) == (None, "")

    stale = {RUN_CONFIG_KEY: cfg.to_json(),
             RUN_TICKET_KEY: sign_run_ticket(key, consortium_id=CONSORTIUM, app_fab_sha256=digest,
                                             run_config_text=cfg.to_json(), valid_s=-1.0)}
    assert task_refusal(policy, digest, stale) == (None, "")  # the signature itself is good
    refusal, why = task_refusal(policy, digest, stale, accepted=AcceptedRuns(site.dir), run_id=9)
    assert refusal is not None and refusal.rule == "run_replayed" and "expired" in why, why
    assert set(json.loads((site.dir / "accepted_runs.json").read_text())) == {
        json.loads(signed[RUN_TICKET_KEY])["ticket"]["session_id"], json.loads(fresh[RUN_TICKET_KEY])["ticket"]["session_id"]}


def test_P55_the_server_app_refuses_a_replayed_run_start(tmp_path, consortium):
    """P52: the coordinator's ServerApp records each signed run start it ran in the server state; the same signed
    config under a new Flower run id is refused before the run folder is touched (a replay overwrote it)."""
    from fcd_secure.apps.server_app import accept_run_start, check_signed_run
    from fcd_secure.federation.run_ticket import CONSORTIUM_ENV, COORDINATOR_KEY_ENV, RunTicketError

    key, digest, _, cfg = consortium
    env = {COORDINATOR_KEY_ENV: public_key_bytes(key).hex(), CONSORTIUM_ENV: CONSORTIUM}
    signed = signed_run_config(key, CONSORTIUM, digest, cfg.to_json())

    def start(run_id: int) -> None:
        context = Context(run_id=run_id, node_id=0, node_config={}, state=RecordDict(), run_config=dict(signed))
        accept_run_start(check_signed_run(context, env), run_id, cfg)

    start(11)
    with pytest.raises(RunTicketError, match="already used by run 11"):
        start(12)
    assert (cfg.state_root() / "_server" / "accepted_runs.json").is_file()
