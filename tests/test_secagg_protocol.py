"""The double-masking protocol end to end in memory, and one test per attack or fault of docs/threats.md:
P1 lying server, P2 substituted keys, P3 unsafe parameters, P5 replay, P7 plaintext numbers, P8 dropouts,
P9 late vector, P10 too few sites, P12 split global models, P18 secrets in logs."""

from __future__ import annotations

import base64
import dataclasses
import json
import logging
import struct
from collections.abc import Callable

import numpy as np
import pytest

from fcd_secure.aggregation.secagg import (
    AbortRound,
    ClientStage,
    PolicyError,
    ProtocolError,
    SecAggClient,
    SecAggPolicy,
    SecAggServer,
    plaintext_weighted_mean,
    theta_hash,
)
from fcd_secure.aggregation.secagg import keys, masks
from fcd_secure.aggregation.secagg.client import ReplayGuard, self_mask_key
from fcd_secure.aggregation.secagg.encoding import VectorLayout, encode

from fcd_secure.aggregation.secagg.messages import (
    Ciphertexts,
    KeyList,
    MaskedInput,
    MsgType,
    RoundParams,
    ShareKind,
    SiteList,
    Unmask,
    UnmaskRequest,
    peek_header,
)
from fcd_secure.manifest import THETA_C
from secagg_harness import STAGES, Rewrite, RoundLog, make_clients, make_identities, run_round, toy_manifest, toy_round


def _max_err(agg, ref):
    return max(float(np.abs(agg.theta_c[k] - ref[k]).max()) for k in ref)


def test_round_equals_plaintext_weighted_fedavg():
    t = toy_round(n_sites=5, d=200, seed=1)
    agg = run_round(t.server, t.clients)
    ref = plaintext_weighted_mean(t.policy, list(t.updates.values()))
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert agg.n_total == sum(n for _, n in t.updates.values())
    assert agg.n_sites == 5


# -- P8: dropouts at every stage ----------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("k", [1, 2])  # n = 7, t = floor(14/3) + 1 = 5: up to n - t = 2 sites may drop
def test_dropouts_at_every_stage_give_the_survivors_weighted_sum(stage, k):
    t = toy_round(n_sites=7, d=40, seed=10 + k)
    dropped = set(list(t.updates)[-k:])
    agg = run_round(t.server, t.clients, drop={stage: dropped})
    # a site whose masked vector arrived is in the sum even if it drops later (consistency / unmask)
    in_sum = set(t.updates) - dropped if stage in ("advertise_keys", "share_keys", "masked_input") else set(t.updates)
    ref = plaintext_weighted_mean(t.policy, [t.updates[s] for s in sorted(in_sum)])
    assert _max_err(agg, ref) <= agg.quantisation_bound
    assert agg.n_total == sum(t.updates[s][1] for s in in_sum)
    assert set(t.server.report.failures) == dropped


@pytest.mark.parametrize("stage", STAGES)
def test_too_few_survivors_abort_the_round(stage):
    t = toy_round(n_sites=5, d=16, seed=3)
    with pytest.raises(AbortRound, match="threshold"):
        run_round(t.server, t.clients, drop={stage: set(list(t.updates)[:3])})
    assert t.server.stage.value == "aborted"
    with pytest.raises(ProtocolError):
        t.server.finish()


# -- P1: lying server -------------------------------------------------------------------------------------------------
def _rewrite_unmask(fn):
    def rewrite(stage, site, req):
        if stage != "unmask":
            return req
        r = UnmaskRequest.parse(req)
        return fn(site, r).to_bytes()
    return rewrite


def test_site_listed_as_both_dropped_and_alive_is_refused_by_every_honest_site():
    t = toy_round(n_sites=5, d=32, seed=4)
    target = "site02"
    log = RoundLog()
    evil = _rewrite_unmask(lambda site, r: UnmaskRequest(r.session_id, r.round_id, r.alive, r.dropped + (target,), r.signatures))
    with pytest.raises(AbortRound):
        run_round(t.server, t.clients, rewrite=evil, log=log)
    assert set(log.refused) == set(t.updates)
    assert all("both alive and dropped" in str(e) for e in log.refused.values())
    # nothing about the target was revealed: no UNMASK message left any site
    assert all(peek_header(m).type is not MsgType.UNMASK for msgs in log.uplink.values() for m in msgs)


Signatures = tuple[tuple[str, bytes], ...]


def split_view(everyone: list[str], target: str, group_b: set[str],
               signatures: Callable[[Signatures], Signatures] = lambda sigs: sigs) -> Rewrite:
    """The lying server of the split-view attacks: it tells ``group_b`` that ``target`` dropped (the survivors are
    ``everyone`` but the target) while the others hear it is alive, then asks group B to unmask the target with the
    ``signatures(...)`` of the consistency signatures it collected."""
    without = tuple(s for s in everyone if s != target)

    def evil(stage: str, site: str, req: bytes) -> bytes:
        if stage == "consistency" and site in group_b:
            r = SiteList.parse(req)
            return SiteList(r.session_id, r.round_id, without).to_bytes()
        if stage == "unmask" and site in group_b:
            r = UnmaskRequest.parse(req)
            return UnmaskRequest(r.session_id, r.round_id, without, (target,), signatures(r.signatures)).to_bytes()
        return req

    return evil


def test_split_views_of_the_survivors_reveal_nothing_individual():
    """The server tells {00, 01} that 04 is alive and {02, 03} that 04 dropped, hoping to get 04's self-mask
    seed from one group and its mask key from the other (then y_04 minus all masks = x_04)."""
    t = toy_round(n_sites=5, d=32, seed=5)
    target = "site04"
    group_b = {"site02", "site03"}
    log = RoundLog()
    # the group-B signers signed the set without the target; the others signed everyone; forward all signatures
    with pytest.raises(AbortRound):
        run_round(t.server, t.clients, rewrite=split_view(sorted(t.updates), target, group_b), log=log)
    # the server's own consistency stage saw the two kinds of signatures; group B refuses to unmask
    assert group_b <= set(log.refused)
    assert all("signed a different" in str(log.refused[s]) for s in group_b)
    # collect every share of the target's mask key that left any site: fewer than t, so s_sk is unrecoverable
    mask_key_shares = [
        (owner, kind)
        for msgs in log.uplink.values()
        for m in msgs
        if peek_header(m).type is MsgType.UNMASK
        for owner, kind, _ in Unmask.parse(m).shares
        if owner == target and kind is ShareKind.MASK_KEY
    ]
    assert len(mask_key_shares) == 0


def test_split_views_with_forged_signature_subset_still_refused():
    """Group B is shown only its own (valid) signatures on the reduced set: fewer than t, so it refuses."""
    t = toy_round(n_sites=5, d=32, seed=6)
    target, group_b = "site04", {"site02", "site03"}
    log = RoundLog()
    own = split_view(sorted(t.updates), target, group_b, lambda sigs: tuple((s, g) for s, g in sigs if s in group_b))
    with pytest.raises(AbortRound):
        run_round(t.server, t.clients, rewrite=own, log=log)
    assert group_b <= set(log.refused)
    assert all("only 2 consistency signatures" in str(log.refused[s]) for s in group_b)


def test_a_second_unmask_request_in_the_same_round_is_refused():
    t = toy_round(n_sites=4, d=8, seed=7)
    log = RoundLog()
    run_round(t.server, t.clients, log=log)
    last_req = log.downlink["site00"][-1]
    with pytest.raises(AbortRound, match="done"):
        t.clients["site00"].handle(last_req)


# -- P2: substituted public keys ------------------------------------------------------------------------------------
def test_substituted_public_key_aborts_before_any_masked_vector():
    t = toy_round(n_sites=5, d=32, seed=8)
    attacker_sk, attacker_pk = keys.x25519_keypair()
    log = RoundLog()

    def evil(stage, site, req):
        if stage != "share_keys":
            return req
        kl = KeyList.parse(req)
        entries = tuple(e if e.site_id != "site01" else dataclasses.replace(e, s_pk=attacker_pk) for e in kl.entries)
        return KeyList(kl.session_id, kl.round_id, entries).to_bytes()

    with pytest.raises(AbortRound):
        run_round(t.server, t.clients, rewrite=evil, log=log)
    assert set(log.refused) == set(t.updates)
    assert all("P2" in str(e) for e in log.refused.values())
    assert not any(peek_header(m).type is MsgType.MASKED_INPUT for msgs in log.uplink.values() for m in msgs)
    assert all(c.stage is ClientStage.ABORTED for c in t.clients.values())


def test_sybil_site_not_in_the_configured_roster_is_refused():
    t = toy_round(n_sites=4, d=8, seed=9)
    p = t.server.params
    forged = RoundParams(p.session_id, p.round_id, p.selected + ("sybil",), 4, 32, p.clip, p.scale_bits, p.max_weight, p.layout_digest, p.vector_len)
    with pytest.raises(AbortRound, match="roster"):
        t.clients["site00"].handle(forged.to_bytes())


def test_a_site_refuses_an_identity_key_that_is_not_its_roster_entry():
    t = toy_round(n_sites=4, d=8, seed=9)
    other = keys.ed25519_keypair()[0]
    with pytest.raises(PolicyError, match="roster"):
        SecAggClient("site00", other, t.roster, t.policy, t.layout)


# -- P3 / P10: unsafe parameters from the server -------------------------------------------------------------------
@pytest.mark.parametrize(
    "field,value,match",
    [
        ("threshold", 1, "threshold"),
        ("threshold", 2, "threshold"),  # n = 4: needs 3
        ("modulus_bits", 16, "modulus"),
        ("clip", 64.0, "clip"),
        ("scale_bits", 10, "scale_bits"),
        ("max_weight", 10**9, "max_weight"),
    ],
)
def test_server_parameters_below_the_site_policy_are_refused(field, value, match):
    t = toy_round(n_sites=4, d=8, seed=11)
    kw = {**t.server.params.__dict__, field: value}
    with pytest.raises(PolicyError, match=match):
        t.clients["site00"].handle(RoundParams(**kw).to_bytes())
    assert t.clients["site00"].stage is ClientStage.ABORTED


def test_fewer_than_four_sites_refused_in_secure_mode():
    t = toy_round(n_sites=4, d=8, seed=12)
    p = t.server.params
    for few in (("site00", "site01"), ("site00", "site01", "site02")):
        req = RoundParams(p.session_id, p.round_id, few, len(few), 32, p.clip, p.scale_bits, p.max_weight, p.layout_digest, p.vector_len)
        with pytest.raises(PolicyError, match="P10"):
            t.fresh(round_id=1).clients["site00"].handle(req.to_bytes())
        with pytest.raises(PolicyError, match="P10"):
            SecAggServer(t.policy, t.layout, list(few), round_id=1)


# -- P5: replay across rounds ----------------------------------------------------------------------------------------
def test_replayed_share_from_an_earlier_round_fails_authentication():
    t1 = toy_round(n_sites=4, d=16, seed=13)
    log1 = RoundLog()
    run_round(t1.server, t1.clients, log=log1)
    old_relay = Ciphertexts.parse(log1.downlink["site00"][2], MsgType.SHARES_RELAY)
    t2 = t1.fresh(round_id=2)

    def replay(stage, site, req):
        if stage == "masked_input" and site == "site00":
            r = Ciphertexts.parse(req, MsgType.SHARES_RELAY)
            items = tuple((p, dict(old_relay.items)[p]) if p == "site01" else (p, c) for p, c in r.items)
            return Ciphertexts(MsgType.SHARES_RELAY, r.session_id, r.round_id, r.site_id, items).to_bytes()
        return req

    log2 = RoundLog()
    run_round(t2.server, t2.clients, rewrite=replay, log=log2)  # 3 of 4 still make the threshold
    assert "site00" in log2.refused and "P5" in str(log2.refused["site00"])


def test_replayed_masked_vector_from_an_earlier_round_is_rejected_by_the_server():
    t1 = toy_round(n_sites=4, d=16, seed=14)
    log1 = RoundLog()
    run_round(t1.server, t1.clients, log=log1)
    old_vector = log1.uplink["site00"][2]
    assert peek_header(old_vector).type is MsgType.MASKED_INPUT
    t2 = t1.fresh(round_id=2)
    reqs = t2.server.start()
    for _ in range(2):  # advertise, share keys
        for s, r in reqs.items():
            t2.server.collect(s, t2.clients[s].handle(r))
        reqs = t2.server.advance()
    with pytest.raises(ProtocolError, match="another session or round"):
        t2.server.collect("site00", old_vector)


def test_a_site_takes_part_in_each_round_once_and_in_order(tmp_path):
    guard = ReplayGuard(tmp_path / "rounds.json")
    guard.claim(b"S" * 16, 3)
    with pytest.raises(AbortRound, match="P5"):
        ReplayGuard(tmp_path / "rounds.json").claim(b"S" * 16, 3)  # persisted across restarts
    with pytest.raises(AbortRound):
        guard.claim(b"S" * 16, 2)
    # a fresh session chosen by the server cannot reuse a spent round: otherwise the same update could enter two
    # protocol runs with different survivors and the difference of the two sums would isolate one site's update
    with pytest.raises(AbortRound, match="P5"):
        guard.claim(b"T" * 16, 3)
    with pytest.raises(AbortRound, match="P5"):
        guard.claim(b"T" * 16, 1)
    guard.claim(b"T" * 16, 4)  # a newer round in a new session is fine
    assert ReplayGuard(tmp_path / "rounds.json").last_round() == 4
    # the Flower carrier asks this before training: a spent round is never re-trained into a second copy
    with pytest.raises(AbortRound, match="P5"):
        ReplayGuard(tmp_path / "rounds.json").check_fresh(4)
    ReplayGuard(tmp_path / "rounds.json").check_fresh(5)


def test_an_update_runs_only_under_the_round_it_was_trained_for():
    t = toy_round(n_sites=4, d=50, seed=21)
    site, client = next(iter(t.clients.items()))
    vec = client._x.copy()
    client.set_input(vec, client._global_hash, round_id=t.server.params.round_id + 1)
    with pytest.raises(AbortRound, match="trained for round"):
        client.handle(t.server.start()[site])


def test_same_input_in_two_rounds_gives_uncorrelated_masked_vectors():
    t1 = toy_round(n_sites=4, d=2000, seed=15)
    log1, log2 = RoundLog(), RoundLog()
    run_round(t1.server, t1.clients, log=log1)
    t2 = t1.fresh(round_id=2)
    run_round(t2.server, t2.clients, log=log2)
    y1 = MaskedInput.parse(log1.uplink["site00"][2]).vector.astype(np.float64)
    y2 = MaskedInput.parse(log2.uplink["site00"][2]).vector.astype(np.float64)
    assert abs(np.corrcoef(y1, y2)[0, 1]) < 0.1
    assert not np.array_equal(y1, y2)


# -- P7: nothing about one site in clear ----------------------------------------------------------------------------------
def test_no_plaintext_counts_or_metrics_in_any_uplink():
    policy = SecAggPolicy(clip=8.0, scale_bits=22, max_weight=100_000)
    layout = VectorLayout.from_manifest(toy_manifest([("w", (300,), THETA_C)]), metrics=["loss"])

    sites = ["a", "b", "c", "d"]
    counts = {"a": 70001, "b": 70002, "c": 70003, "d": 70004}
    losses = {"a": 1.2345678, "b": 2.25, "c": 3.125, "d": 0.0625}
    ids, roster = make_identities(sites)
    rng = np.random.default_rng(16)
    updates = {s: ({"w": rng.normal(size=300).astype(np.float32)}, counts[s]) for s in sites}
    clients = make_clients(policy, layout, updates, ids, roster, metrics={s: {"loss": losses[s]} for s in sites})
    server = SecAggServer(policy, layout, sites, round_id=1, roster=roster)
    log = RoundLog()
    agg = run_round(server, clients, log=log)
    assert agg.metrics["loss"] == pytest.approx(sum(losses[s] * counts[s] for s in sites) / sum(counts.values()), abs=1e-4)
    for s in sites:
        patterns = [struct.pack(fmt, counts[s]) for fmt in (">I", "<I", ">Q", "<Q")]
        patterns += [struct.pack(fmt, losses[s]) for fmt in (">d", "<d", ">f", "<f")]
        patterns += [str(counts[s]).encode(), repr(losses[s]).encode()]
        for m in log.uplink[s]:
            for pat in patterns:
                assert pat not in m, f"{s}: a plaintext number appears in a {peek_header(m).type.name} uplink"
        vec = MaskedInput.parse(log.uplink[s][2]).vector
        assert int(vec[0]) != counts[s]  # the weight slot is masked like every other word


# -- P9: a late vector after unmasking began --------------------------------------------------------------------------------
def test_late_vector_is_refused_and_its_self_mask_seed_never_revealed():
    t = toy_round(n_sites=5, d=64, seed=17)
    late = "site03"
    log = RoundLog()
    # run the round with site03 silent at the masked-input stage, but keep the vector it would have sent
    held: dict[str, bytes] = {}
    srv, cl = t.server, t.clients
    reqs = srv.start()
    for stage in STAGES:
        for s, r in reqs.items():
            reply = cl[s].handle(r)
            log.uplink.setdefault(s, []).append(reply)
            if stage == "masked_input" and s == late:
                held[s] = reply
                continue
            srv.collect(s, reply)
        reqs = srv.advance()
        if stage == "consistency":
            with pytest.raises(ProtocolError, match="late"):
                srv.collect(late, held[late])  # unmasking has begun: the late vector is refused
    srv.finish()
    revealed = [(o, k) for s in log.uplink for m in log.uplink[s] if peek_header(m).type is MsgType.UNMASK for o, k, _ in Unmask.parse(m).shares]
    assert (late, ShareKind.MASK_KEY) in revealed
    assert (late, ShareKind.SELF_MASK_SEED) not in revealed
    # a curious server that kept y_late and strips every pairwise mask still faces PRG(b_late)
    from fcd_secure.aggregation.secagg import shamir

    idx = {s: i + 1 for i, s in enumerate(srv.params.selected)}
    shares = [(idx[s], sh) for s in log.uplink for m in log.uplink[s] if peek_header(m).type is MsgType.UNMASK
              for o, k, sh in Unmask.parse(m).shares if o == late]
    s_sk = shamir.combine(shares, srv.threshold)
    y = MaskedInput.parse(held[late]).vector.copy()
    stream = masks.MaskStream()
    for v in srv.params.selected:
        if v != late:
            sec = keys.x25519_agree(s_sk, srv._adverts[v].s_pk)
            stream.apply(y, keys.pair_key(sec, srv.params.session_id, srv.params.round_id, late, v, "mask"), -masks.pair_sign(late, v))
    x = encode(t.layout, t.policy, *t.updates[late])
    assert np.mean(y == x) < 0.01


# -- P12: different global models to different sites ----------------------------------------------------------------------
def test_different_global_models_abort_the_round():
    t = toy_round(n_sites=4, d=16, seed=18)
    other_global = {k: v + 1 for k, v in t.global_theta.items()}
    victim = "site02"
    c = SecAggClient(victim, t.identities[victim], t.roster, t.policy, t.layout)
    c.set_input(encode(t.layout, t.policy, *t.updates[victim]), theta_hash(t.layout, other_global))
    t.clients[victim] = c
    log = RoundLog()
    with pytest.raises(AbortRound):
        run_round(t.server, t.clients, log=log)
    assert set(log.refused) == set(t.updates)
    assert any("P12" in str(e) for e in log.refused.values())
    assert not any(peek_header(m).type is MsgType.UNMASK for msgs in log.uplink.values() for m in msgs)


# -- P18: no key material in logs or error messages ----------------------------------------------------------------------------
def _secret_renderings(blob: bytes) -> list[str]:
    return [blob.hex(), blob.hex().upper(), base64.b64encode(blob).decode(), base64.urlsafe_b64encode(blob).decode().rstrip("="), repr(blob)[2:-1]]


def test_no_key_material_in_logs_or_errors(caplog):
    caplog.set_level(logging.DEBUG)
    t = toy_round(n_sites=4, d=16, seed=19)
    secrets: list[bytes] = list(t.identities.values())
    reqs = t.server.start()
    texts: list[str] = []
    for stage in STAGES:
        for s, r in reqs.items():
            t.server.collect(s, t.clients[s].handle(r))
            st = json.loads(t.clients[s].export())
            for k in ("c_sk", "s_sk", "b"):
                if st[k]:
                    secrets.append(base64.b64decode(st[k]))
            secrets += [base64.b64decode(a) for pair in st["held"].values() for a in pair]
            secrets += [base64.b64decode(a) for pair in st["dealt"] + [st["own"]] for a in pair]
            texts.append(repr(t.clients[s]))
        reqs = t.server.advance()
        texts.append(repr(t.server))
    t.server.finish()
    try:  # and an abort path
        t.clients["site00"].handle(b"FSA" + bytes(30))
    except Exception as exc:  # noqa: BLE001 - we only read its message
        texts.append(str(exc))
    texts += [r.getMessage() for r in caplog.records]
    texts.append(str(t.server.report))
    haystack = "\n".join(texts)
    secrets = [s for s in secrets if s]
    assert len(secrets) > 20
    for s in secrets:
        for rendering in _secret_renderings(s):
            assert rendering not in haystack
