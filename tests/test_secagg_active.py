"""Secure aggregation against an active adversary (Bonawitz et al., CCS 2017 §4 Fig. 6 and §6; docs/threats.md P1, P10,
P19, P26): a server colluding with a site that signs two survivor views, the 3-site timeout, every check a site
makes before it reveals a share, corrupted Shamir shares (responder or dealer named, never a garbage aggregate),
and inputs outside the clip range or with a negative weight. All parties are real ``SecAggClient`` /
``SecAggServer`` state machines over real crypto; a malicious party is a real client whose messages are altered
(and re-signed with its own identity key where the protocol signs them)."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fcd_secure.aggregation.secagg import (
    AbortRound,
    BoundViolation,
    EncodingError,
    Misbehaviour,
    PolicyError,
    SecAggClient,
    SecAggError,
    SecAggPolicy,
    SecAggServer,
    plaintext_weighted_mean,
    theta_hash,
)
from fcd_secure.aggregation.secagg import bounds, commitments, keys, masks, shamir
from fcd_secure.aggregation.secagg.client import self_mask_key
from fcd_secure.aggregation.secagg.encoding import VectorLayout, encode
from fcd_secure.aggregation.secagg.messages import (
    Advertise,
    MaskedInput,
    MsgType,
    RoundParams,
    ShareKind,
    Signed,
    SiteList,
    Unmask,
    UnmaskRequest,
    consistency_transcript,
    peek_header,
    unmask_transcript,
)
from fcd_secure.manifest import THETA_C
from secagg_harness import STAGES, RoundLog, run_round, toy_manifest, toy_round


class _MajorityRule(SecAggPolicy):
    """The rule sites accepted before (t = floor(n/2) + 1, three sites allowed). The configuration refuses it, so
    it is built here without validation, only as the negative control that shows the attacks work under it."""

    def min_threshold(self, n_sites: int) -> int:
        return n_sites // 2 + 1


def _old_rule(**kw) -> SecAggPolicy:
    return _MajorityRule.model_construct(min_sites=3, max_weight=1000, **kw)


def _max_err(agg, ref) -> float:
    return max(float(np.abs(agg.theta_c[k] - ref[k]).max()) for k in ref)


def _unmasks(log: RoundLog) -> list[Unmask]:
    return [Unmask.parse(m) for msgs in log.uplink.values() for m in msgs if peek_header(m).type is MsgType.UNMASK]


# -- what a server learns from the messages it saw -----------------------------------------------------------------
def _recover_individual_inputs(uplinks: list[bytes], params: RoundParams) -> dict[str, np.ndarray]:
    """Every site input the server can unmask *alone* from the uplinks: a site whose self-mask seed b_u and mask key
    s_u^SK both have >= t revealed shares gives y_u - PRG(b_u) - Σ_v ±PRG(s_uv) = x_u exactly."""
    index = {s: i + 1 for i, s in enumerate(params.selected)}
    s_pk, y, shares = {}, {}, {}
    for m in uplinks:
        kind = peek_header(m).type
        if kind is MsgType.ADVERTISE:
            a = Advertise.parse(m)
            s_pk[a.site_id] = a.s_pk
        elif kind is MsgType.MASKED_INPUT:
            v = MaskedInput.parse(m)
            y[v.site_id] = v.vector
        elif kind is MsgType.UNMASK:
            u = Unmask.parse(m)
            for owner, k, share in u.shares:
                shares.setdefault((owner, k), {})[index[u.site_id]] = share
    out = {}
    stream = masks.MaskStream()
    for u in y:
        b_sh, s_sh = shares.get((u, ShareKind.SELF_MASK_SEED), {}), shares.get((u, ShareKind.MASK_KEY), {})
        if len(b_sh) < params.threshold or len(s_sh) < params.threshold:
            continue
        b = shamir.combine(list(b_sh.items()), params.threshold)
        s_sk = shamir.combine(list(s_sh.items()), params.threshold)
        x = np.array(y[u], dtype=np.uint32)
        stream.apply(x, self_mask_key(b, params.session_id, params.round_id, u), -1)
        for v in s_pk:
            if v != u:
                k = keys.pair_key(keys.x25519_agree(s_sk, s_pk[v]), params.session_id, params.round_id, u, v, "mask")
                stream.apply(x, k, -masks.pair_sign(u, v))
        out[u] = x
    return out


def _split_view_attack(policy: SecAggPolicy, group_a: tuple[str, ...], seed: int = 0):
    """P19: 5 sites, site04 colludes with the server. The server drives the real round through the masked-input
    stage, then shows group A the survivor list A + {site04} and group B = the other honest sites the list
    B + {site04}; the colluder signs both (its state is copied into a twin, a real ``SecAggClient`` too) and reveals
    its shares under both views. Returns (inputs the server recovered, true inputs, sites that refused, uplinks)."""
    t = toy_round(n_sites=5, d=24, seed=seed, policy=policy)
    srv, cl, p = t.server, t.clients, t.server.params
    colluder = "site04"
    honest = [s for s in p.selected if s != colluder]
    group_b = tuple(s for s in honest if s not in group_a)
    uplinks: list[bytes] = []
    reqs = srv.start()
    for _stage in STAGES[:3]:
        for s, r in reqs.items():
            rep = cl[s].handle(r)
            uplinks.append(rep)
            srv.collect(s, rep)
        reqs = srv.advance()
    twin = SecAggClient(colluder, t.identities[colluder], t.roster, policy, t.layout)
    twin.restore(cl[colluder].export())
    views = {"A": (tuple(sorted(group_a + (colluder,))), group_a, cl[colluder]),
             "B": (tuple(sorted(group_b + (colluder,))), group_b, twin)}
    refused: dict[str, str] = {}
    signatures: dict[str, list[tuple[str, bytes]]] = {}
    for name, (view, members, c) in views.items():
        signatures[name] = []
        for site, client in [(m, cl[m]) for m in members] + [(colluder, c)]:
            try:
                sig = Signed.parse(client.handle(SiteList(p.session_id, p.round_id, view).to_bytes()))
            except SecAggError as exc:
                refused[site] = str(exc)
                continue
            uplinks.append(sig.to_bytes())
            signatures[name].append((site, sig.signature))
    for name, (view, members, c) in views.items():
        dropped = tuple(s for s in p.selected if s not in view)
        req = UnmaskRequest(p.session_id, p.round_id, view, dropped, tuple(signatures[name])).to_bytes()
        for site, client in [(m, cl[m]) for m in members if m not in refused] + [(colluder, c)]:
            try:
                uplinks.append(client.handle(req))
            except SecAggError as exc:
                refused.setdefault(site, str(exc))
    truth = {s: encode(t.layout, policy, *t.updates[s]) for s in honest}
    return _recover_individual_inputs(uplinks, p), truth, refused, uplinks


def test_one_colluding_signer_unmasks_every_honest_update_under_the_old_majority_rule():
    """The negative control: with t = 3 of 5 each half of the honest sites plus the colluder reaches t signatures,
    one half reveals self-mask seeds and the other mask keys, and the server recovers all four honest inputs."""
    recovered, truth, refused, _ = _split_view_attack(_old_rule(), ("site00", "site01"))
    assert not refused
    assert set(recovered) >= set(truth)
    for s, x in truth.items():
        assert np.array_equal(recovered[s], x), s  # bit for bit


@pytest.mark.parametrize(
    "group_a",
    [a for k in (1, 2, 3) for a in itertools.combinations(("site00", "site01", "site02", "site03"), k)],
    ids=lambda a: "+".join(a),
)
def test_one_colluding_signer_learns_no_honest_update_under_the_default_threshold(group_a):
    """Under the default (t = floor(10/3) + 1 = 4 of 5) every way of splitting the honest sites fails: a view signed
    by t sites needs three honest signers, so the other view has at most one and is refused (P19)."""
    policy = SecAggPolicy(max_weight=1000)
    recovered, truth, refused, uplinks = _split_view_attack(policy, group_a)
    assert not set(recovered) & set(truth), "the server unmasked an honest site's input"
    small = group_a if len(group_a) < 3 else tuple(s for s in truth if s not in group_a)
    assert set(small) <= set(refused)
    assert all("threshold is 4" in refused[s] for s in small)
    if len(group_a) == 2:  # neither half reaches t: no honest site reveals a single share
        honest_unmasks = [m for m in uplinks if peek_header(m).type is MsgType.UNMASK and Unmask.parse(m).site_id in truth]
        assert honest_unmasks == []


def test_server_and_one_colluder_learn_nothing_from_a_three_site_timeout():
    """n = 3: under the old rule (t = 2) the server and one colluder read the third site's update off the sum as
    soon as the second honest site times out; secure mode now refuses three sites outright (P10)."""
    t = toy_round(n_sites=3, d=24, seed=3, policy=_old_rule())
    target, timed_out, colluder = "site00", "site01", "site02"
    agg = run_round(t.server, t.clients, drop={"masked_input": {timed_out}})
    n_c = t.updates[colluder][1]
    x_c = {k: np.clip(np.asarray(v, np.float64), -1, 1) for k, v in t.updates[colluder][0].items()}
    n_t = agg.n_total - n_c
    assert n_t == t.updates[target][1]
    learned = {k: (agg.theta_c[k] * agg.n_total - n_c * x_c[k]) / n_t for k in x_c}
    true = {k: np.clip(np.asarray(v, np.float64), -1, 1) for k, v in t.updates[target][0].items()}
    assert max(float(np.abs(learned[k] - true[k]).max()) for k in true) < 1e-4  # the attack works under the old rule

    policy = SecAggPolicy(max_weight=1000)
    three = ["site00", "site01", "site02"]
    with pytest.raises(PolicyError, match="P10"):
        SecAggServer(policy, t.layout, three, round_id=1)
    p = t.server.params
    proposal = RoundParams(p.session_id, 5, tuple(three), 3, 32, policy.clip, policy.scale_bits, policy.max_weight,
                           p.layout_digest, p.vector_len)
    site = SecAggClient("site00", t.identities["site00"], t.roster, policy, t.layout)
    site.set_input(encode(t.layout, policy, *t.updates["site00"]), bytes(32))
    with pytest.raises(PolicyError, match="P10"):
        site.handle(proposal.to_bytes())
    with pytest.raises(ValidationError, match="min_sites"):
        SecAggPolicy(min_sites=3)
    with pytest.raises(ValidationError, match="threshold_rule") as err:
        SecAggPolicy(threshold_rule="majority")
    assert "P19" in str(err.value)


def test_tolerated_colluders_follow_the_arithmetic_of_the_policy():
    p = SecAggPolicy()
    assert [p.tolerated_colluders(n, p.min_threshold(n)) for n in (4, 5, 7, 10)] == [1, 2, 2, 3]
    for n in range(4, 32):
        t = p.min_threshold(n)
        c = p.tolerated_colluders(n, t)
        assert c >= 1
        assert 2 * (t - c) > n - c  # two disjoint honest groups cannot both reach t: no split view
        assert t - c >= 2  # every accepted sum keeps two honest inputs
        assert n - (t - 1) >= 2
    assert SecAggPolicy.tolerated_colluders(5, 3) == 0  # the old rule at n = 5: one colluder is already too many


# -- every check a site makes before revealing a share (P1, P12, P19) -------------------------------------------------
def _sig_on(t, signer: str, survivors: tuple[str, ...]) -> bytes:
    """``signer``'s real signature on another survivor list (what a colluding signer gives the server)."""
    p = t.server.params
    tr = consistency_transcript(p.session_id, p.round_id, p.digest, survivors, theta_hash(t.layout, t.global_theta))
    return keys.sign(t.identities[signer], tr)


def _lie(field: str, victim: str, t):
    """A rewrite of the server's request to ``victim`` that breaks one thing the victim can check."""

    def rewrite(stage, site, req):
        if site != victim:
            return req
        if stage == "consistency":
            r = SiteList.parse(req)
            if field == "survivor_never_shared":
                return SiteList(r.session_id, r.round_id, r.sites + ("site05",)).to_bytes()
            if field == "self_not_survivor":
                return SiteList(r.session_id, r.round_id, tuple(s for s in r.sites if s != victim)).to_bytes()
            if field == "too_few_survivors":
                return SiteList(r.session_id, r.round_id, r.sites[:3] if victim in r.sites[:3] else (victim,) + r.sites[:2]).to_bytes()
            return req
        if stage != "unmask":
            return req
        r = UnmaskRequest.parse(req)
        alive, dropped, sigs = r.alive, r.dropped, r.signatures
        other = next(s for s in alive if s != victim)
        if field == "alive_and_dropped":
            dropped = dropped + (other,)
        elif field == "self_dropped":
            alive, dropped = tuple(s for s in alive if s != victim), dropped + (victim,)
        elif field == "alive_differs":
            alive = tuple(s for s in alive if s != other)
        elif field == "dropped_never_shared":
            dropped = dropped + ("site05",)
        elif field == "dropped_omitted":
            dropped = ()
        elif field == "signature_other_view":
            view = tuple(s for s in alive if s != other)
            sigs = tuple((s, _sig_on(t, s, view) if s == other else g) for s, g in sigs)
        elif field == "signer_not_survivor":
            sigs = sigs + (("site04", _sig_on(t, "site04", alive)),)
        elif field == "own_signature_missing":
            sigs = tuple((s, g) for s, g in sigs if s != victim)
        elif field == "too_few_signatures":
            sigs = tuple((s, g) for s, g in sigs if s == victim) + tuple((s, g) for s, g in sigs if s != victim)[:2]
        return UnmaskRequest(r.session_id, r.round_id, alive, dropped, sigs).to_bytes()

    return rewrite


@pytest.mark.parametrize(
    "field,match",
    [
        ("survivor_never_shared", "never shared keys"),
        ("self_not_survivor", "not among the survivors"),
        ("too_few_survivors", "only 3 survivors"),
        ("alive_and_dropped", "both alive and dropped"),
        ("self_dropped", "lists this site as dropped"),
        ("alive_differs", "alive list differs"),
        ("dropped_never_shared", "never received"),
        ("dropped_omitted", "dropped list differs"),
        ("signature_other_view", "signed a different survivor set"),
        ("signer_not_survivor", "not a survivor"),
        ("own_signature_missing", "own consistency signature"),
        ("too_few_signatures", "only 3 consistency signatures"),
    ],
)
def test_a_site_reveals_no_share_when_what_it_can_check_is_inconsistent(field, match):
    """7 sites (t = 5): site05 drops before sharing keys, site04 after sharing (so the honest dropped list is
    (site04,)), and the server lies to site00 alone in one way per case."""
    t = toy_round(n_sites=7, d=16, seed=31)
    victim = "site00"
    log = RoundLog()
    try:
        run_round(t.server, t.clients, drop={"share_keys": {"site05"}, "masked_input": {"site04"}},
                  rewrite=_lie(field, victim, t), log=log)
    except SecAggError:
        pass  # the others may or may not still reach the threshold; only the victim's behaviour matters here
    assert victim in log.refused, f"{field}: the site went on"
    assert match in str(log.refused[victim])
    assert not any(u.site_id == victim for u in _unmasks(log)), "a share left the site"
    assert t.clients[victim].stage.value == "aborted"


def test_an_honest_round_passes_every_check_and_names_nobody():
    t = toy_round(n_sites=7, d=16, seed=31)
    agg = run_round(t.server, t.clients, drop={"share_keys": {"site05"}, "masked_input": {"site04"}})
    ref = plaintext_weighted_mean(t.policy, [t.updates[s] for s in sorted(t.updates) if s not in ("site04", "site05")])
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert t.server.report.culprits == {}


# -- corrupted shares: detected, sender named, never a garbage aggregate (P26) -----------------------------------------
class _Tamper:
    """A malicious site: a real client whose UNMASK reply has one share altered and is re-signed with its own key
    (so the server's signature check passes and only the commitment check can catch it)."""

    def __init__(self, inner: SecAggClient, identity: bytes, params: RoundParams, owner: str, kind: ShareKind,
                 pos: int = 0, xor: int = 1) -> None:
        self.inner, self.identity, self.params = inner, identity, params
        self.owner, self.kind, self.pos, self.xor = owner, kind, pos, xor
        self.tampered = False

    def handle(self, req: bytes) -> bytes:
        rep = self.inner.handle(req)
        if peek_header(rep).type is not MsgType.UNMASK:
            return rep
        u = Unmask.parse(rep)
        shares = []
        for owner, kind, share in u.shares:
            if (owner, kind) == (self.owner, self.kind):
                b = bytearray(share)
                b[self.pos] ^= self.xor
                share = bytes(b)
                self.tampered = True
            shares.append((owner, kind, share))
        p = self.params
        sig = keys.sign(self.identity, unmask_transcript(p.session_id, p.round_id, p.digest, u.site_id, tuple(shares)))
        return Unmask(u.session_id, u.round_id, u.site_id, tuple(shares), sig).to_bytes()


def _corrupted_round(n_sites, seed, bad, owner, kind, drop=None, pos=0, xor=1):
    t = toy_round(n_sites=n_sites, d=20, seed=seed)
    tamper = _Tamper(t.clients[bad], t.identities[bad], t.server.params, owner, kind, pos, xor)
    clients = {**t.clients, bad: tamper}
    drop = drop or {}
    try:
        agg = run_round(t.server, clients, drop=drop)
    except Misbehaviour as exc:
        agg = exc
    assert tamper.tampered
    gone = set(drop.get("advertise_keys", ())) | set(drop.get("share_keys", ())) | set(drop.get("masked_input", ()))
    ref = plaintext_weighted_mean(t.policy, [t.updates[s] for s in sorted(t.updates) if s not in gone])
    return t, agg, ref


@pytest.mark.parametrize("seed", range(8))
def test_a_corrupted_self_mask_share_is_detected_and_its_sender_named(seed):
    """5 sites (t = 4), one site alters one revealed share of a self-mask seed b_u. With all five answering the
    server leaves the share out, names the sender and still returns the right aggregate; with one site silent only
    four shares remain (t) and the round aborts naming the sender. Never a garbage aggregate."""
    rng = np.random.default_rng(seed)
    sites = [f"site{i:02d}" for i in range(5)]
    bad, owner = str(rng.choice(sites)), str(rng.choice(sites))
    pos, xor = int(rng.integers(0, 32)), int(rng.integers(1, 256))
    t, agg, ref = _corrupted_round(5, seed, bad, owner, ShareKind.SELF_MASK_SEED, pos=pos, xor=xor)
    assert not isinstance(agg, Exception), agg
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert set(t.server.report.culprits) == {bad} and owner in t.server.report.culprits[bad]

    silent = next(s for s in sites if s != bad)
    t, agg, _ = _corrupted_round(5, seed, bad, owner, ShareKind.SELF_MASK_SEED, drop={"unmask": {silent}}, pos=pos, xor=xor)
    assert isinstance(agg, Misbehaviour)
    assert set(agg.culprits) == {bad} and repr(bad) in str(agg)
    assert t.server.report.culprits == agg.culprits
    assert t.server.stage.value == "aborted"


@pytest.mark.parametrize("seed", range(4))
def test_a_corrupted_mask_key_share_of_a_dropped_site_is_detected_and_its_sender_named(seed):
    """A site dropped after sharing keys: its mask key s_v^SK is rebuilt to remove the survivors' pairwise masks.
    7 sites (t = 5), one dropped: six shares, one corrupted -> left out, sender named, right aggregate. 5 sites (t = 4),
    one dropped: four shares, one corrupted -> abort naming the sender (the public-key check alone named nobody)."""
    rng = np.random.default_rng(100 + seed)
    pos, xor = int(rng.integers(0, 32)), int(rng.integers(1, 256))
    t, agg, ref = _corrupted_round(7, seed, "site02", "site06", ShareKind.MASK_KEY, drop={"masked_input": {"site06"}},
                                   pos=pos, xor=xor)
    assert not isinstance(agg, Exception), agg
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert set(t.server.report.culprits) == {"site02"}

    t, agg, _ = _corrupted_round(5, seed, "site01", "site04", ShareKind.MASK_KEY, drop={"masked_input": {"site04"}},
                                 pos=pos, xor=xor)
    assert isinstance(agg, Misbehaviour) and set(agg.culprits) == {"site01"}


class _BadDealer(SecAggClient):
    """A malicious dealer: ``mode='commit'`` commits to shares off its polynomial (every holder's share verifies,
    the secret does not); ``mode='send'`` commits honestly but sends one holder a different share."""

    mode = "commit"
    victim = "site01"

    def _deal(self, p):
        s_sh, b_sh = super()._deal(p)
        if self.mode == "commit":
            me = p.selected.index(self.site_id)
            b_sh = [sh if j == me else bytes(a ^ c for a, c in zip(sh, keys.hkdf(sh, b"off", 32))) for j, sh in enumerate(b_sh)]
        return s_sh, b_sh

    def _share_for(self, peer, index):
        s_sh, b_sh = super()._share_for(peer, index)
        if self.mode == "send" and peer == self.victim:
            b_sh = bytes([b_sh[0] ^ 0x80]) + b_sh[1:]
        return s_sh, b_sh


def _with_bad_dealer(mode: str):
    t = toy_round(n_sites=5, d=20, seed=41)
    dealer = "site03"
    bad = type("Dealer", (_BadDealer,), {"mode": mode})(dealer, t.identities[dealer], t.roster, t.policy, t.layout)
    bad.set_input(encode(t.layout, t.policy, *t.updates[dealer]), theta_hash(t.layout, t.global_theta))
    return t, {**t.clients, dealer: bad}, dealer


def test_committed_shares_that_do_not_rebuild_the_committed_seed_name_the_dealer():
    t, clients, dealer = _with_bad_dealer("commit")
    with pytest.raises(Misbehaviour) as err:
        run_round(t.server, clients)
    assert set(err.value.culprits) == {dealer}
    assert "inconsistent shares" in str(err.value)
    assert t.server.report.culprits == {dealer: err.value.culprits[dealer]}


def test_a_share_that_differs_from_its_dealers_commitment_is_refused_by_its_holder():
    t, clients, dealer = _with_bad_dealer("send")
    log = RoundLog()
    try:
        run_round(t.server, clients, log=log)
    except SecAggError:
        pass
    err = log.refused[_BadDealer.victim]
    assert isinstance(err, Misbehaviour) and set(err.culprits) == {dealer}
    # the holder stopped before masking: nothing of it (and so nothing to blame on it) ever left
    assert not any(peek_header(m).type is MsgType.MASKED_INPUT for m in log.uplink[_BadDealer.victim])


# -- inputs out of bounds, negative weights (P26) -------------------------------------------------------------------------
def _malicious_input(word_fn, seed=51):
    """Site site02 skips its own input checks (a malicious site can) and masks ``word_fn(x)`` instead of x."""
    t = toy_round(n_sites=5, d=20, seed=seed)
    c = t.clients["site02"]
    x = c._x.copy()
    c._x = word_fn(x.view(np.int32)).view(np.uint32)
    return t


@pytest.mark.parametrize(
    "name,word_fn,match",
    [
        ("value far outside the clip range", lambda v: np.concatenate([v[:5], [1 << 30], v[6:]]).astype(np.int32), "tensor 'w'\\[3\\]"),
        ("negative weight", lambda v: np.concatenate([[-5000], v[1:]]).astype(np.int32), "total sample count"),
        ("inflated weight", lambda v: np.concatenate([[1 << 20], v[1:]]).astype(np.int32), "total sample count"),
        ("clipped count", lambda v: np.concatenate([v[:1], [1 << 28], v[2:]]).astype(np.int32), "clipped count"),
    ],
)
def test_a_sum_outside_what_clipped_inputs_allow_aborts_the_round(name, word_fn, match):
    t = _malicious_input(word_fn)
    with pytest.raises(BoundViolation, match=match) as err:
        run_round(t.server, t.clients)
    assert "global model unchanged" in str(err.value)
    assert t.server.stage.value == "aborted"


def test_a_site_refuses_to_mask_a_negative_weight_or_an_unclipped_value():
    t = toy_round(n_sites=4, d=10, seed=52)
    arrays, n = t.updates["site00"]
    with pytest.raises(EncodingError, match="n_samples=-3"):
        encode(t.layout, t.policy, arrays, -3)
    good = encode(t.layout, t.policy, arrays, n)
    client = SecAggClient("site00", t.identities["site00"], t.roster, t.policy, t.layout)
    cases = {
        "weight word .* -7": lambda v: v.__setitem__(0, -7),
        "weight word .* 0,": lambda v: v.__setitem__(0, 0),
        "weight word .* 1001": lambda v: v.__setitem__(0, 1001),
        "clipped-count word": lambda v: v.__setitem__(1, -1),
        "tensor 'w'\\[4\\] encodes": lambda v: v.__setitem__(6, 1 << 29),
        "tensor 'bias'\\[2\\] encodes": lambda v: v.__setitem__(14, -(1 << 29)),
    }
    for match, fn in cases.items():
        bad = good.copy()
        fn(bad.view(np.int32))
        with pytest.raises(EncodingError, match=match):
            client.set_input(bad, bytes(32))
    client.set_input(good, bytes(32))  # the honest vector passes


_SMALL = VectorLayout.from_manifest(toy_manifest([("w", (3,), THETA_C), ("bias", (3,), THETA_C)]))


@given(
    st.lists(st.tuples(st.lists(st.floats(-50, 50, allow_nan=False, width=32), min_size=6, max_size=6),
                       st.integers(1, 1000)), min_size=4, max_size=9),
    st.sampled_from([0.5, 1.0, 8.0]),
)
@settings(max_examples=80, deadline=None)
def test_honest_inputs_never_break_a_bound(sites, clip):
    """No false alarm: every vector encode produces passes the site's check, and every sum of them the server's,
    including values far beyond the clip range (clipped first) and weights at max_weight."""
    policy = SecAggPolicy(clip=clip, scale_bits=22, max_weight=1000)
    layout = _SMALL
    total = np.zeros(layout.length, np.uint32)
    for vals, n in sites:
        arr = np.asarray(vals, np.float32)
        x = encode(layout, policy, {"w": arr[:3], "bias": arr[3:]}, n)
        bounds.check_input(layout, policy, x)
        np.add(total, x, out=total)
    bounds.check_aggregate(layout, policy, total, len(sites))


# -- property tests of the consistency checks ---------------------------------------------------------------------------
@given(n=st.integers(4, 7), seed=st.integers(0, 2**16), data=st.data())
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_random_honest_rounds_always_reconstruct(n, seed, data):
    policy = SecAggPolicy(max_weight=1000)
    spare = n - policy.min_threshold(n)
    stage = data.draw(st.sampled_from(STAGES))
    k = data.draw(st.integers(0, spare))
    t = toy_round(n_sites=n, d=12, seed=seed)
    dropped = set(sorted(t.updates)[n - k:])
    agg = run_round(t.server, t.clients, drop={stage: dropped})
    in_sum = set(t.updates) - dropped if stage in STAGES[:3] else set(t.updates)
    ref = plaintext_weighted_mean(t.policy, [t.updates[s] for s in sorted(in_sum)])
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert t.server.report.culprits == {}


@given(n=st.integers(4, 6), seed=st.integers(0, 2**16), data=st.data())
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_any_single_corrupted_share_in_a_round_is_detected_and_named(n, seed, data):
    """Any responder, any owner, either kind, any byte, any non-zero change: the aggregate is right and the sender
    named, or the round aborts naming the sender. Never a silently wrong aggregate."""
    t_min = SecAggPolicy().min_threshold(n)
    sites = [f"site{i:02d}" for i in range(n)]
    n_drop = data.draw(st.integers(0, n - t_min))  # dropped after sharing: their mask keys get rebuilt
    dropped = set(sites[n - n_drop:])
    alive = [s for s in sites if s not in dropped]
    n_silent = data.draw(st.integers(0, len(alive) - t_min))
    silent = set(data.draw(st.permutations(alive))[:n_silent])
    bad = data.draw(st.sampled_from([s for s in alive if s not in silent]))
    kind = data.draw(st.sampled_from([ShareKind.SELF_MASK_SEED] + ([ShareKind.MASK_KEY] if dropped else [])))
    owner = data.draw(st.sampled_from(alive if kind is ShareKind.SELF_MASK_SEED else sorted(dropped)))
    pos, xor = data.draw(st.integers(0, 31)), data.draw(st.integers(1, 255))
    t, agg, ref = _corrupted_round(n, seed, bad, owner, kind, drop={"masked_input": dropped, "unmask": silent},
                                   pos=pos, xor=xor)
    assert set(t.server.report.culprits) == {bad}
    if isinstance(agg, Misbehaviour):
        assert set(agg.culprits) == {bad}
        assert len(alive) - len(silent) - 1 < t_min  # it aborts only when too few correct shares remain
    else:
        assert _max_err(agg, ref) <= agg.quantisation_bound


@given(
    t=st.integers(2, 8), extra=st.integers(0, 6), secret=st.binary(min_size=32, max_size=32), data=st.data()
)
@settings(max_examples=150, deadline=None)
def test_reconstruction_checks_every_share_and_the_secret(t, extra, secret, data):
    """The check itself, over random thresholds and share counts: untouched shares always rebuild the committed
    secret; one changed share is always excluded and its sender named (or, with too few left, the round aborts
    naming it); shares off the dealer's polynomial name the dealer."""
    n = t + extra
    sid, rnd = b"S" * 16, 7
    kind = data.draw(st.sampled_from([ShareKind.SELF_MASK_SEED, ShareKind.MASK_KEY]))
    dealt = [sh for _, sh in shamir.split(secret, t, n)]
    other = [sh for _, sh in shamir.split(bytes(32), t, n)]
    s_list, b_list = (dealt, other) if kind is ShareKind.MASK_KEY else (other, dealt)
    share_commits = commitments.commit_shares(sid, rnd, "dealer", s_list, b_list)
    commit = commitments.secret_commitment(sid, rnd, "dealer", kind, secret)
    m = data.draw(st.integers(t, n))
    responders = data.draw(st.permutations(range(1, n + 1)))[:m]
    shares = {f"r{j:02d}": (j, dealt[j - 1]) for j in responders}
    which = commitments.SecretId(sid, rnd, "dealer", kind)
    kw = dict(share_commits=share_commits, secret_commit=commit, threshold=t)
    assert commitments.reconstruct(which, shares=shares, **kw) == (secret, {})

    victim = data.draw(st.sampled_from(sorted(shares)))
    j, sh = shares[victim]
    pos, xor = data.draw(st.integers(0, 31)), data.draw(st.integers(1, 255))
    corrupted = {**shares, victim: (j, sh[:pos] + bytes([sh[pos] ^ xor]) + sh[pos + 1:])}
    if m - 1 >= t:
        got, bad = commitments.reconstruct(which, shares=corrupted, **kw)
        assert got == secret and set(bad) == {victim}
    else:
        with pytest.raises(Misbehaviour) as err:
            commitments.reconstruct(which, shares=corrupted, **kw)
        assert set(err.value.culprits) == {victim}

    # the dealer committed to a share off its polynomial, and that share is among those used
    off = {**shares}
    first = min(off, key=lambda r: off[r][0])
    fj, fsh = off[first]
    fake = bytes(a ^ 1 for a in fsh)
    s2, b2 = list(s_list), list(b_list)
    (s2 if kind is ShareKind.MASK_KEY else b2)[fj - 1] = fake
    off[first] = (fj, fake)
    with pytest.raises(Misbehaviour) as err:
        commitments.reconstruct(which, shares=off, **{**kw, "share_commits": commitments.commit_shares(sid, rnd, "dealer", s2, b2)})
    assert set(err.value.culprits) == {"dealer"}
