"""Secure rounds in fewer round trips (``federation.secure.flow``): the next round's key advertisement and key sharing
ride on this round's consistency and unmask messages, and its training request carries the relayed shares.

Real parts throughout: the site's ClientApp actions (``apps.secure_site``) with the guard mod, real site state
on disk (identity keys, roster, replay counters), real crypto, Flower's Message API on the in-process grid
(``engines.inprocess``: every message crosses as a deflated and inflated copy), and the real egress-gate rules on
every reply. A toy 'training' stands in for the model. A lying server is a ``Comm`` that rewrites or replays requests;
a pipelined round must refuse whatever a round without keys set up ahead refuses, and never reveal both kinds of
share for one site and round.
"""

from __future__ import annotations

import numpy as np
import pytest
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.common.constant import SUPERLINK_NODE_ID
from flwr.supercore.task_identity import TaskIdentity

from fcd_secure.aggregation.secagg import SecAggPolicy, SecAggServer, plaintext_weighted_mean
from fcd_secure.aggregation.secagg.messages import MsgType, ShareKind, Unmask, UnmaskRequest, peek_header
from fcd_secure.audit.rules import GatePolicy, check_content
from fcd_secure.apps.guard import guard_mod
from fcd_secure.engines.inprocess import InProcessGrid
from fcd_secure.federation.messaging import Comm
from fcd_secure.federation.records import (
    REC_SECAGG,
    SECAGG_FIELD,
    SECAGG_NEXT_FIELD,
    pack_pair,
    secagg_round_id,
    unpack_pair,
)
from fcd_secure.federation.secure.flow import SecureAggregationFlow
from fcd_secure.federation.secure.setup import provision_roster, vector_layout
from fcd_secure.apps.secure_site import NEXT_KEY, register_secure_actions
from fcd_secure.federation.state import SiteState
from fcd_secure.manifest import THETA_C, THETA_S, Manifest, ManifestEntry

N_SITES = 5
D = 24
MANIFEST = Manifest.from_entries(
    ManifestEntry(name=n, shape=s, dtype="float32", part=p)
    for n, s, p in (("w", (D,), THETA_C), ("b", (2, 3), THETA_C), ("private_head", (4,), THETA_S))
)
PREFIX = "train.secagg_"


def _update(site_index: int, rnd: int, global_theta: dict) -> tuple[dict, int, float]:
    rng = np.random.default_rng([site_index, rnd])
    theta = {k: (global_theta[k] + 0.1 * rng.normal(size=global_theta[k].shape)).astype(np.float32) for k in sorted(global_theta)}
    return theta, 10 + 7 * site_index, float(1.0 + site_index)


class ToySite:
    def __init__(self, root: str, index: int, trained: list) -> None:
        self.site_index, self.site_id = index, f"site-{index:02d}"
        self.state = SiteState(root, self.site_id)
        self.cfg = None
        self.manifest = MANIFEST
        self.secagg_policy = SecAggPolicy()
        self._trained = trained

    def train_round(self, global_theta, round_config):
        self._trained.append((self.site_id, int(round_config["server-round"])))
        theta, n, loss = _update(self.site_index, int(round_config["server-round"]), global_theta)
        return theta, n, {"loss": loss}

    def identity_private_key(self) -> bytes:
        return self.state.identity_private_key()


class LyingComm(Comm):
    """The server's door with a hand on it: ``rewrite(message_type, site, fields) -> fields`` changes the secagg
    fields of a request before it leaves; every call and every reply is logged."""

    def __init__(self, grid, rewrite=None) -> None:
        super().__init__(grid, poll_s=0.0)
        self.rewrite = rewrite
        self.calls: list[tuple[int, str, dict[str, dict], dict[str, Message]]] = []
        #: (round, message type, the seconds the server waits for its replies)
        self.waits: list[tuple[int, str, float]] = []

    def send(self, node_ids, message_type, contents, timeout_s, *, round=None):
        node_ids = list(node_ids)
        per_node = {n: (contents if isinstance(contents, RecordDict) else contents[n]) for n in node_ids}
        if self.rewrite is not None:
            for n, content in per_node.items():
                if REC_SECAGG in content:
                    fields = self.rewrite(message_type, self.site_of.get(n), dict(content[REC_SECAGG]))
                    content = RecordDict({**dict(content.items()), REC_SECAGG: ConfigRecord(fields)})
                per_node[n] = content
        self.waits.append((self.round if round is None else round, message_type, float(timeout_s)))
        replies = super().send(node_ids, message_type, per_node, timeout_s, round=round)
        sent = {self.site_of.get(n): dict(c[REC_SECAGG]) if REC_SECAGG in c else {} for n, c in per_node.items()}
        self.calls.append((self.round if round is None else round, message_type, sent,
                           {self.site_of.get(n): r for n, r in replies.items()}))
        return replies

    def types(self, rnd: int) -> list[str]:
        return [t.removeprefix(PREFIX) for r, t, _, _ in self.calls if r == rnd]


class Federation:
    """Five toy sites on the in-process grid and a secure flow; ``run`` plays rounds as the server's round loop does."""

    def __init__(self, tmp_path, rewrite=None) -> None:
        self.root = str(tmp_path / "state")
        provision_roster(self.root, [f"site-{i:02d}" for i in range(N_SITES)])
        self.trained: list[tuple[str, int]] = []
        app = ClientApp(mods=[guard_mod])

        @app.query("hello")
        def hello(msg: Message, context: Context) -> Message:
            return Message(RecordDict({"hello": ConfigRecord({"site-id": self.site(context).site_id})}), reply_to=msg)

        register_secure_actions(app, lambda msg, context: self.site(context))
        self.grid = InProcessGrid(app, N_SITES)
        TaskIdentity.task_id, TaskIdentity.run_id, TaskIdentity.node_id = 1, self.grid.run_id, SUPERLINK_NODE_ID
        self.comm = LyingComm(self.grid, rewrite)
        nodes = list(self.grid.get_node_ids())
        for nid, rep in self.comm.send(nodes, "query.hello", RecordDict({"hello": ConfigRecord({})}), 10).items():
            self.comm.site_of[nid] = str(rep.content["hello"]["site-id"])
        self.nodes = nodes
        self.flow = SecureAggregationFlow(MANIFEST)
        self.theta = {"w": np.zeros(D, np.float32), "b": np.zeros((2, 3), np.float32)}
        self.history: dict[int, tuple[dict, object]] = {}

    def site(self, context: Context) -> ToySite:
        return ToySite(self.root, int(context.node_config["partition-id"]), self.trained)

    def context_of(self, site_id: str) -> Context:
        return self.grid._contexts[next(n for n, s in self.comm.site_of.items() if s == site_id)]

    def run(self, rounds: range, *, ahead: bool = True, last: int | None = None):
        """Play ``rounds``; with ``ahead`` the flow knows each next round's sites until round ``last`` (default: the
        range's last)."""
        last = rounds.stop - 1 if last is None else last
        for rnd in rounds:
            self.comm.round = rnd
            nxt = self.nodes if ahead and rnd < last else None
            outcome = self.flow.run_round(self.comm, self.nodes, rnd, self.theta, {"part": THETA_C}, next_node_ids=nxt)
            self.history[rnd] = (dict(self.theta), outcome)
            if outcome.theta_c is not None:
                self.theta = outcome.theta_c
        return self

    def check_sum(self, rnd: int) -> None:
        before, outcome = self.history[rnd]
        assert outcome.theta_c is not None, outcome.metrics
        sites = sorted(int(self.comm.site_of[n].split("-")[1]) for n in outcome.participants)
        updates = [_update(i, rnd, before)[:2] for i in sites]
        deltas = [({k: t[k].astype(np.float64) - before[k] for k in t}, n) for t, n in updates]
        ref = {k: before[k] + v for k, v in plaintext_weighted_mean(SecAggPolicy(), deltas).items()}
        for k in ref:
            assert np.abs(outcome.theta_c[k] - ref[k]).max() <= outcome.metrics["quantisation_bound"], (rnd, k)
        assert outcome.n_total == sum(n for _, n in updates)

    def replies(self, rnd: int, stage: str) -> dict[str, Message]:
        return next(r for n, t, _, r in self.comm.calls if n == rnd and t == PREFIX + stage)


def _gate_ok(fed: Federation) -> None:
    """Every protocol reply passes the real egress-gate rules of the instruction it answers."""
    policy = GatePolicy(secure_only=True)
    for _, mtype, _, replies in fed.comm.calls:
        for rep in replies.values():
            if mtype.startswith(PREFIX) and not rep.has_error():
                check_content(rep.content, mtype, MANIFEST, policy, None, None)


def test_steady_rounds_take_three_round_trips_and_equal_plain_fedavg(tmp_path):
    fed = Federation(tmp_path).run(range(1, 5))
    for rnd in range(1, 5):
        fed.check_sum(rnd)
        assert fed.history[rnd][1].metrics["secagg"]["pipelined"] is (rnd > 1)
        assert len(fed.history[rnd][1].participants) == N_SITES
    assert fed.comm.types(1) == ["train_advertise", "share_keys", "masked_input", "consistency_next", "unmask_next"]
    assert fed.comm.types(2) == fed.comm.types(3) == ["train_masked", "consistency_next", "unmask_next"]
    # the last round sets nothing up ahead: its combined messages carry only its own stages
    last = [sent for rnd, t, sent, _ in fed.comm.calls if rnd == 4 and t.endswith("_next")]
    assert all(SECAGG_NEXT_FIELD not in f and SECAGG_FIELD in f for sent in last for f in sent.values())
    # each site trained each round once; the protocol ids are 2r + 1 (set up in the round) and 2r (set up ahead)
    assert sorted(fed.trained) == sorted((f"site-{i:02d}", r) for i in range(N_SITES) for r in range(1, 5))
    ids = {rnd: {peek_header(f[SECAGG_FIELD]).round_id for f in sent.values()}
           for rnd, t, sent, _ in fed.comm.calls if t.endswith("train_masked") or t.endswith("train_advertise")}
    assert ids == {1: {secagg_round_id(1, pipelined=False)}, **{r: {secagg_round_id(r, pipelined=True)} for r in (2, 3, 4)}}
    _gate_ok(fed)
    # nothing of a finished run stays in node memory: no round in progress, no keys set up ahead
    for i in range(N_SITES):
        ctx = fed.context_of(f"site-{i:02d}")
        assert not dict(ctx.state[NEXT_KEY]) and "client" not in dict(ctx.state["secagg"])


def test_every_protocol_message_waits_for_the_sites_start_beside_its_stages_work(tmp_path):
    """A site with a cold executor starts a ClientApp process per message (imports of torch and Flower: ~3 s quiet,
    53 s at load 18): every message's deadline is its stages' work plus ``site_start``, once per message."""
    d = SecAggPolicy().deadlines
    waits = {(r, t.removeprefix(PREFIX)): w for r, t, w in Federation(tmp_path).run(range(1, 3)).comm.waits
             if t.startswith(PREFIX)}
    assert waits == {
        (1, "train_advertise"): d.train + d.advertise_keys + d.site_start,
        (1, "share_keys"): d.share_keys + d.site_start,
        (1, "masked_input"): d.masked_input + d.site_start,
        (1, "consistency_next"): max(d.consistency, d.advertise_keys) + d.site_start,
        (1, "unmask_next"): max(d.unmask, d.share_keys) + d.site_start,
        (2, "train_masked"): d.train + d.masked_input + d.site_start,
        (2, "consistency_next"): d.consistency + d.site_start,  # the last round sets nothing up ahead
        (2, "unmask_next"): d.unmask + d.site_start,
    }


def _unmask_requests(fed: Federation, rnd: int) -> dict[str, UnmaskRequest]:
    (sent,) = [s for r, t, s, _ in fed.comm.calls if r == rnd and t == PREFIX + "unmask_next"]
    return {site: UnmaskRequest.parse(f[SECAGG_FIELD]) for site, f in sent.items() if SECAGG_FIELD in f}


@pytest.mark.parametrize("ahead", [True, False], ids=["keys-set-up-ahead", "keys-set-up-in-round"])
def test_a_survivor_list_that_changes_between_consistency_and_unmask_is_refused_either_way(tmp_path, ahead):
    """Round 2's unmask request names one survivor as dropped (the server would get its self-mask seed's shares
    from nobody but its mask key's from everyone: its update in clear). Whether round 2's keys were set up during
    round 1 or in round 2 itself, every site refuses and reveals no share; the next round sets up its own keys."""

    def split_view(mtype, site, fields):
        if mtype == PREFIX + "unmask_next" and SECAGG_FIELD in fields and peek_header(fields[SECAGG_FIELD]).round_id // 2 == 2:
            req = UnmaskRequest.parse(fields[SECAGG_FIELD])
            victim = req.alive[0]
            sigs = tuple((s, g) for s, g in req.signatures if s != victim)
            fields[SECAGG_FIELD] = UnmaskRequest(req.session_id, req.round_id, tuple(s for s in req.alive if s != victim),
                                                 tuple(sorted(req.dropped + (victim,))), sigs).to_bytes()
        return fields

    fed = Federation(tmp_path, split_view).run(range(1, 3), ahead=ahead, last=4)
    for i in range(N_SITES):  # the keys a site held for round 3 went with the refusal, at once
        assert not dict(fed.context_of(f"site-{i:02d}").state[NEXT_KEY])
    fed.run(range(3, 5), ahead=ahead)
    fed.check_sum(1)
    rnd = 2
    assert fed.history[rnd][1].theta_c is None
    assert fed.history[rnd][1].metrics["secagg"]["pipelined"] is ahead
    unmask = fed.replies(rnd, "unmask_next")
    assert len(unmask) == N_SITES and all(r.has_error() for r in unmask.values())  # no share of any kind left
    # every site dropped the keys it held for the next round: that round sets up its own
    assert fed.history[rnd + 1][1].metrics["secagg"]["pipelined"] is False
    fed.check_sum(rnd + 1)
    fed.check_sum(rnd + 2)


def test_no_site_reveals_both_shares_of_one_site_in_one_round(tmp_path):
    """Over rounds set up ahead, the unmask replies of each round reveal, per owner, self-mask-seed shares or
    mask-key shares, never both; and a round's reveal only ever concerns that round's protocol id."""
    fed = Federation(tmp_path).run(range(1, 4))
    for rnd in range(1, 4):
        kinds: dict[str, set] = {}
        for rep in fed.replies(rnd, "unmask_next").values():
            first, _ = unpack_pair(rep.content[REC_SECAGG][SECAGG_FIELD])
            msg = Unmask.parse(first)
            assert msg.round_id // 2 == rnd
            for owner, kind, _ in msg.shares:
                kinds.setdefault(owner, set()).add(kind)
        assert kinds and all(len(k) == 1 and k == {ShareKind.SELF_MASK_SEED} for k in kinds.values())


def test_a_round_trains_once_whichever_message_asks(tmp_path):
    """Round 3's keys were set up during round 2. After the sites trained round 3 into them, the server asks for
    round 3 again, with fresh keys (protocol id 2r + 1) and again with the relayed shares: two masked inputs of one
    update under different survivor sets would let it difference them (P5). Every site refuses both, training
    nothing; and a round that trained with fresh keys refuses the keys set up ahead afterwards."""
    fed = Federation(tmp_path).run(range(1, 4))
    fed.check_sum(3)
    trained = list(fed.trained)
    content = RecordDict({**dict(fed.flow.configure(_round(fed, 3)).items())})
    fresh = SecAggServer(SecAggPolicy(), vector_layout(MANIFEST), sorted(fed.comm.site_of.values()),
                         round_id=secagg_round_id(3, pipelined=False), session_id=fed.flow.session_id).start()
    relay = {s: f for _, t, sent, _ in fed.comm.calls if t == PREFIX + "train_masked" for s, f in sent.items()}
    for stage, fields in (("train_advertise", {s: {SECAGG_FIELD: fresh[s]} for s in fresh}),
                          ("train_masked", {s: dict(relay[s]) for s in relay})):
        per_node = {n: RecordDict({**dict(content.items()), REC_SECAGG: ConfigRecord(fields[s])})
                    for n, s in fed.comm.site_of.items()}
        replies = fed.comm.send(list(per_node), PREFIX + stage, per_node, 10, round=3)
        assert len(replies) == N_SITES and all(r.has_error() for r in replies.values()), stage
    assert fed.trained == trained

    # the other order: round 3 trains with fresh keys; the keys set up ahead for it are then useless
    fed2 = Federation(tmp_path / "b").run(range(1, 3), last=3)  # round 2 set round 3 up ahead
    saved = fed2.flow._ahead
    fed2.flow._ahead = None
    fed2.run(range(3, 4))
    assert fed2.history[3][1].metrics["secagg"]["pipelined"] is False
    fed2.check_sum(3)
    per_node = {n: RecordDict({**dict(fed2.flow.configure(_round(fed2, 3)).items()),
                               REC_SECAGG: ConfigRecord({SECAGG_FIELD: saved.requests[s]})})
                for n, s in fed2.comm.site_of.items()}
    replies = fed2.comm.send(list(per_node), PREFIX + "train_masked", per_node, 10, round=3)
    assert all(r.has_error() for r in replies.values())


def _round(fed: Federation, rnd: int):
    from fcd_secure.federation.records import Round

    return Round(fed.comm, fed.nodes, rnd, fed.theta, {"part": THETA_C})


def test_the_retired_train_action_is_gone_and_a_training_input_enters_only_with_its_training(tmp_path):
    """The server no longer sends ``train.secagg_train`` (train, keep the encoded update in node memory, acknowledge
    ``ready``): a site has no such action, so it trains nothing. Nor does a training round's input enter through the
    plain stage 0 (only an evaluation prepares its input ahead): a fresh run's ``advertise_keys`` for a training
    round is refused untrained. Neither refusal spends the round: it then runs as usual."""
    fed = Federation(tmp_path).run(range(1, 2), ahead=False)
    trained = list(fed.trained)
    content = fed.flow.configure(_round(fed, 2))
    replies = fed.comm.send(fed.nodes, PREFIX + "train", content, 10, round=2)
    assert len(replies) == N_SITES and all(r.has_error() for r in replies.values())
    assert all("No train function registered with name 'secagg_train'" in r.error.reason for r in replies.values())
    fresh = SecAggServer(SecAggPolicy(), vector_layout(MANIFEST), sorted(fed.comm.site_of.values()),
                         round_id=secagg_round_id(2, pipelined=False), session_id=fed.flow.session_id).start()
    per_node = {n: RecordDict({**dict(content.items()), REC_SECAGG: ConfigRecord({SECAGG_FIELD: fresh[s]})})
                for n, s in fed.comm.site_of.items()}
    replies = fed.comm.send(list(per_node), PREFIX + "advertise_keys", per_node, 10, round=2)
    assert len(replies) == N_SITES and all(r.has_error() for r in replies.values())
    assert fed.trained == trained
    for i in range(N_SITES):
        assert "client" not in dict(fed.context_of(f"site-{i:02d}").state["secagg"])
    fed.run(range(2, 3), ahead=False)
    fed.check_sum(2)
    assert fed.comm.types(2)[-5:] == ["train_advertise", "share_keys", "masked_input", "consistency_next", "unmask_next"]


@pytest.mark.parametrize("attack", ["swap-parts", "replay-advertise", "unmask-before-consistency"])
def test_reordered_or_replayed_combined_stages_are_refused(tmp_path, attack):
    """The two rounds of a combined message are two clients with their own state machines: this round's request in
    the next round's field (and the other way round), the next round's key advertisement asked twice, or this
    round's unmask request before its consistency stage are refused; the round aborts unrevealed and both of the
    site's rounds are cleared, so the round after sets up its own keys."""
    seen: dict[str, bytes] = {}

    def evil(mtype, site, fields):
        this_round = fields.get(SECAGG_FIELD)
        if not mtype.endswith("_next") or this_round is None or peek_header(this_round).round_id // 2 != 2:
            return fields
        if attack == "swap-parts" and mtype == PREFIX + "consistency_next":
            fields[SECAGG_FIELD], fields[SECAGG_NEXT_FIELD] = fields[SECAGG_NEXT_FIELD], fields[SECAGG_FIELD]
        if attack == "replay-advertise" and mtype == PREFIX + "consistency_next":
            seen[site] = fields[SECAGG_NEXT_FIELD]
        if attack == "replay-advertise" and mtype == PREFIX + "unmask_next":
            fields[SECAGG_NEXT_FIELD] = seen[site]  # round 3's stage 0 again, instead of its stage 1
        if attack == "unmask-before-consistency" and mtype == PREFIX + "consistency_next":
            fields[SECAGG_FIELD] = _fake_unmask_request(this_round)
        return fields

    fed = Federation(tmp_path, evil).run(range(1, 5))
    fed.check_sum(1)
    outcome = fed.history[2][1]
    stage = "unmask_next" if attack == "replay-advertise" else "consistency_next"
    replies = fed.replies(2, stage)
    assert all(r.has_error() for r in replies.values()), attack
    assert outcome.theta_c is None
    assert fed.history[3][1].metrics["secagg"]["pipelined"] is False  # round 3 set up its own keys
    fed.check_sum(3)
    fed.check_sum(4)
    for i in range(N_SITES):
        assert not dict(fed.context_of(f"site-{i:02d}").state[NEXT_KEY])


def _fake_unmask_request(consistency_request: bytes) -> bytes:
    h = peek_header(consistency_request)
    assert h.type is MsgType.CONSISTENCY_REQUEST
    from fcd_secure.aggregation.secagg.messages import SiteList

    alive = SiteList.parse(consistency_request).sites
    return UnmaskRequest(h.session_id, h.round_id, alive, (), ()).to_bytes()


def test_pair_framing_is_strict():
    assert unpack_pair(pack_pair(b"ab", b"")) == (b"ab", b"")
    for bad in (b"", b"\x00\x00\x00", pack_pair(b"a", b"b") + b"x", b"\x00\x00\x00\x05ab\x00\x00\x00\x00"):
        with pytest.raises(ValueError):
            unpack_pair(bad)
