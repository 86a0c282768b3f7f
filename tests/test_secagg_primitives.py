"""Secure-aggregation primitives: masks (P4, P16), Shamir, fixed point (P6, P14), layout (P15), policy (P3, P10)."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest
from Crypto.Cipher import AES
from hypothesis import example, given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from fcd_secure.aggregation import secagg
from fcd_secure.aggregation.secagg import keys, masks, shamir
from fcd_secure.aggregation.secagg.config import SecAggPolicy, StageDeadlines
from fcd_secure.aggregation.secagg.encoding import VectorLayout, decode, encode, plaintext_weighted_mean
from fcd_secure.aggregation.secagg.errors import EncodingError, PolicyError
from fcd_secure.manifest import THETA_C, THETA_S
from secagg_harness import toy_manifest

PKG = pathlib.Path(secagg.__file__).parent


# -- P4 / P16: mask quality -------------------------------------------------------------------------------------
def test_mask_known_answer_fips197_zero_key():
    # AES-128(key=0, block=0) = 66e94bd4ef8a2c3b884cfa59ca342b2e (well-known FIPS-197 value); counter 0 first
    m = masks.MaskStream().expand(bytes(16), 4)
    expected = np.frombuffer(bytes.fromhex("66e94bd4ef8a2c3b884cfa59ca342b2e"), dtype="<u4")
    assert np.array_equal(m, expected)


def test_mask_matches_independent_aes_ctr_across_chunk_boundaries():
    key = bytes(range(16))
    stream = masks.MaskStream(chunk_words=1000)  # small chunks: several chunk boundaries, one partial block
    ours = stream.expand(key, 2503)
    # independent implementation: pycryptodome AES-ECB over the big-endian 128-bit counter 0, 1, 2, ...
    blocks = b"".join(i.to_bytes(16, "big") for i in range((2503 * 4 + 15) // 16))
    ref = np.frombuffer(AES.new(key, AES.MODE_ECB).encrypt(blocks)[: 2503 * 4], dtype="<u4")
    assert np.array_equal(ours, ref)


def test_one_bit_key_change_changes_the_mask():
    key = bytes.fromhex("000102030405060708090a0b0c0d0e0f")
    stream = masks.MaskStream()
    base = stream.expand(key, 256)
    for bit in range(128):
        flipped = bytearray(key)
        flipped[bit // 8] ^= 1 << (bit % 8)
        other = stream.expand(bytes(flipped), 256)
        differing = np.unpackbits((base ^ other).view(np.uint8)).mean()
        assert 0.4 < differing < 0.6, f"bit {bit}: only {differing:.2f} of mask bits changed"


def test_mask_words_are_uniform_on_z_2_32():
    words = masks.MaskStream().expand(keys.hkdf(b"k" * 32, b"uniformity", 16), 1_000_000)
    for shift in (0, 8, 16, 24):  # every byte of the word: chi-square over 256 buckets, df = 255
        counts = np.bincount((words >> shift) & 0xFF, minlength=256)
        chi2 = float(((counts - 1e6 / 256) ** 2 / (1e6 / 256)).sum())
        assert chi2 < 400, f"byte at shift {shift}: chi2 {chi2:.1f}"
    bits = np.unpackbits(words.view(np.uint8)).reshape(-1, 32).mean(axis=0)
    assert np.all(np.abs(bits - 0.5) < 0.003)
    assert words.max() > 0xFFFF0000 and words.min() < 0x0000FFFF  # the top of Z_R is reachable (P16)


def test_mask_does_not_depend_on_numpy_global_random_state():
    np.random.seed(1)
    a = masks.MaskStream().expand(b"\x07" * 16, 100)
    np.random.seed(2)
    np.random.rand(1000)
    assert np.array_equal(a, masks.MaskStream().expand(b"\x07" * 16, 100))


def test_no_numpy_or_python_random_and_no_flower_in_the_protocol_package():
    for path in PKG.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom):
                mods = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                for m in mods:
                    assert not m.startswith("flwr"), f"{path.name} imports Flower"
                    assert m.split(".")[0] != "random", f"{path.name} imports random"
            if isinstance(node, ast.Attribute) and node.attr == "random":
                assert not (isinstance(node.value, ast.Name) and node.value.id in ("np", "numpy")), (
                    f"{path.name}:{node.lineno} uses numpy.random"
                )


def test_pair_keys_bind_session_round_pair_and_purpose():
    secret = b"s" * 32
    base = keys.pair_key(secret, b"A" * 16, 1, "a", "b", "mask")
    assert keys.pair_key(secret, b"A" * 16, 1, "b", "a", "mask") == base  # unordered pair, same on both sides
    variants = [
        keys.pair_key(secret, b"B" * 16, 1, "a", "b", "mask"),
        keys.pair_key(secret, b"A" * 16, 2, "a", "b", "mask"),
        keys.pair_key(secret, b"A" * 16, 1, "a", "c", "mask"),
        keys.pair_key(secret, b"A" * 16, 1, "a", "b", "share-enc"),
        keys.pair_key(secret, b"A" * 16, 1, "a", "bb", "mask"),
    ]
    assert len({base, *variants}) == 6


def test_x25519_agreement_is_symmetric_and_rejects_small_order_points():
    a_sk, a_pk = keys.x25519_keypair()
    b_sk, b_pk = keys.x25519_keypair()
    assert keys.x25519_agree(a_sk, b_pk) == keys.x25519_agree(b_sk, a_pk)
    with pytest.raises(secagg.AbortRound):
        keys.x25519_agree(a_sk, bytes(32))  # the all-zero point gives an all-zero secret
    with pytest.raises(secagg.ProtocolError):
        keys.x25519_agree(a_sk, b"short")


@given(st.lists(st.integers(min_value=0, max_value=2**32 - 1), min_size=4, max_size=4), st.integers(3, 12), st.data())
@settings(max_examples=25, deadline=None)
def test_mask_cancellation_over_pairs(seed_words, n, data):
    """Σ_u Σ_{v≠u} Δ(u,v)·PRG(k_uv) = 0 mod 2^32 for any set of sites (the pairwise masks cancel)."""
    sites = [f"s{i}" for i in range(n)]
    stream = masks.MaskStream(chunk_words=50)
    seed = b"".join(w.to_bytes(4, "little") for w in seed_words)
    total = np.zeros(123, dtype=np.uint32)
    for u in sites:
        for v in sites:
            if u != v:
                k = keys.pair_key(seed, b"S" * 16, 3, u, v, "mask")
                stream.apply(total, k, masks.pair_sign(u, v))
    assert not total.any()


# -- Shamir -----------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("t,n", [(3, 5), (6, 10), (2, 3)])
def test_shamir_any_t_shares_reconstruct_and_fewer_do_not(t, n):
    secret = keys.x25519_keypair()[0]
    shares = shamir.split(secret, t, n)
    assert len(shares) == n and all(len(s) == 32 for _, s in shares)
    rng = np.random.default_rng(t * n)
    for _ in range(3):
        pick = [shares[i] for i in rng.choice(n, size=t, replace=False)]
        assert shamir.combine(pick, t) == secret
    with pytest.raises(secagg.AbortRound):
        shamir.combine(shares[: t - 1], t)
    # t-1 genuine shares plus a guessed one give garbage, not the secret
    fake = shares[: t - 1] + [(shares[t - 1][0], bytes(32))]
    assert shamir.combine(fake, t) != secret


def test_shamir_is_interoperable_with_pycryptodome_both_ways():
    from Crypto.Protocol.SecretSharing import Shamir, _Element

    rng = np.random.default_rng(7)
    for _ in range(30):  # the field arithmetic itself, against pycryptodome's element type
        a, b = (int.from_bytes(rng.bytes(16), "big") for _ in range(2))
        assert shamir.gf_mul(a, b) == int(_Element(a) * _Element(b))
        assert shamir.gf_mul(a, shamir.gf_inv(a)) == 1
    secret = bytes(rng.bytes(32))
    ours = shamir.split(secret, 4, 7)
    assert Shamir.combine([(i, s[:16]) for i, s in ours[2:6]]) == secret[:16]
    assert Shamir.combine([(i, s[16:]) for i, s in ours[1:5]]) == secret[16:]
    lo, hi = Shamir.split(4, 7, secret[:16]), Shamir.split(4, 7, secret[16:])
    theirs = [(i, a + b) for (i, a), (_, b) in zip(lo, hi)]
    assert shamir.combine(theirs[3:], 4) == secret


def test_shamir_refuses_other_secret_lengths():
    with pytest.raises(ValueError):
        shamir.split(b"x" * 31, 2, 3)


# -- fixed point (P6, P14) ----------------------------------------------------------------------------------------
LAYOUT = VectorLayout.from_manifest(
    toy_manifest([("a", (7,), THETA_C), ("b", (2, 3), THETA_C), ("s", (4,), THETA_S)]), metrics=["loss"]
)


@given(
    st.lists(
        st.tuples(
            st.lists(st.floats(-12, 12, allow_nan=False, width=32), min_size=13, max_size=13),
            st.integers(1, 1000),
            st.floats(-5, 5, allow_nan=False),
        ),
        min_size=1,
        max_size=8,
    )
)
@example([([0.0] * 12 + [3.1693577766418457], 54, 0.0)])  # a value on a half step: the error is the bound exactly
@settings(max_examples=60, deadline=None)
def test_encode_decode_round_trip_within_the_quantisation_bound(sites):
    policy = SecAggPolicy(clip=8.0, scale_bits=22, max_weight=1000)
    total = np.zeros(LAYOUT.length, dtype=np.uint32)
    updates = []
    for vals, n, loss in sites:
        arr = np.asarray(vals, dtype=np.float32)
        u = {"a": arr[:7], "b": arr[7:].reshape(2, 3)}
        updates.append((u, n))
        np.add(total, encode(LAYOUT, policy, u, n, {"loss": loss}), out=total)
    agg = decode(LAYOUT, policy, total, len(sites))
    ref = plaintext_weighted_mean(policy, updates)
    # the bound is exact (a value on a half step rounds by exactly half a step); both sides are float64 results, so
    # the comparison allows their own rounding, a few ulps of the values (found by Hypothesis: 3.1693577766418457 at
    # n = 54 erred by the bound + 1.6e-17)
    def ulps(x) -> float:
        return 4 * np.finfo(np.float64).eps * float(np.abs(x).max())

    for k in ref:
        assert np.abs(agg.theta_c[k] - ref[k]).max() <= agg.quantisation_bound + ulps(ref[k])
    n_total = sum(n for _, n, _ in sites)
    assert agg.n_total == n_total
    loss_ref = sum(loss * n for _, n, loss in sites) / n_total
    assert abs(agg.metrics["loss"] - loss_ref) <= agg.quantisation_bound + ulps(loss_ref)
    clipped = sum(int(np.sum(np.abs(np.asarray(v, np.float32)) > 8.0)) for v, _, _ in sites)
    assert agg.clipped_fraction == pytest.approx(clipped / (len(sites) * 14))


def test_clipped_fraction_is_reported_through_the_aggregate():
    policy = SecAggPolicy(clip=8.0, scale_bits=22, max_weight=10)
    big = {"a": np.full(7, 100.0, np.float32), "b": np.zeros((2, 3), np.float32)}
    small = {"a": np.zeros(7, np.float32), "b": np.zeros((2, 3), np.float32)}
    total = encode(LAYOUT, policy, big, 5, {"loss": 0.0}) + encode(LAYOUT, policy, small, 5, {"loss": 0.0})
    agg = decode(LAYOUT, policy, total, 2)
    assert agg.clipped_fraction == pytest.approx(7 / 28)
    assert np.allclose(agg.theta_c["a"], 4.0, atol=agg.quantisation_bound)  # (8*5 + 0*5) / 10


def _overflow_policy() -> SecAggPolicy:
    # B = 1 * 2**28: at most (2**31 - 1) // 2**28 = 7 sites
    return SecAggPolicy(clip=1.0, scale_bits=28, max_weight=1000)


def test_overflow_bound_exactly_at_the_limit_decodes_and_one_past_is_refused():
    policy = _overflow_policy()
    assert policy.max_overflow_sites() == 7
    layout = VectorLayout.from_manifest(toy_manifest([("a", (4,), THETA_C)]))
    extreme = {"a": np.array([1.0, -1.0, 1.0, -1.0], np.float32)}
    total = np.zeros(layout.length, np.uint32)
    for _ in range(7):
        np.add(total, encode(layout, policy, extreme, policy.max_weight), out=total)
    agg = decode(layout, policy, total, 7)
    assert np.allclose(agg.theta_c["a"], extreme["a"], atol=agg.quantisation_bound)
    policy.check_round(n_sites=7, threshold=5, modulus_bits=32, clip=1.0, scale_bits=28, max_weight=1000)
    with pytest.raises(PolicyError, match="overflow"):
        policy.check_round(n_sites=8, threshold=6, modulus_bits=32, clip=1.0, scale_bits=28, max_weight=1000)
    # and the refusal is needed: with 8 sites the same sum wraps and decodes with the wrong sign
    np.add(total, encode(layout, policy, extreme, policy.max_weight), out=total)
    wrapped = decode(layout, policy, total, 8)
    assert wrapped.theta_c["a"][0] < 0
    names = [f"s{i}" for i in range(8)]
    with pytest.raises(PolicyError, match="overflow"):
        secagg.SecAggServer(policy, layout, names, round_id=1)


def test_encode_refuses_bad_inputs_with_clear_errors():
    policy = SecAggPolicy(max_weight=100)
    good = {"a": np.zeros(7, np.float32), "b": np.zeros((2, 3), np.float32)}
    with pytest.raises(EncodingError, match="max_weight"):
        encode(LAYOUT, policy, good, 101, {"loss": 0.0})
    with pytest.raises(EncodingError, match="n_samples"):
        encode(LAYOUT, policy, good, 0, {"loss": 0.0})
    with pytest.raises(EncodingError, match="'b'.*shape"):
        encode(LAYOUT, policy, {**good, "b": np.zeros(6, np.float32)}, 1, {"loss": 0.0})
    with pytest.raises(EncodingError, match="NaN"):
        encode(LAYOUT, policy, {**good, "a": np.full(7, np.nan, np.float32)}, 1, {"loss": 0.0})
    with pytest.raises(EncodingError, match="missing"):
        encode(LAYOUT, policy, {"a": good["a"]}, 1, {"loss": 0.0})


# -- P15: a Θs tensor may never enter the vector -----------------------------------------------------------------
def test_theta_s_name_offered_to_the_vector_is_refused():
    policy = SecAggPolicy(max_weight=100)
    update = {"a": np.zeros(7, np.float32), "b": np.zeros((2, 3), np.float32), "s": np.zeros(4, np.float32)}
    with pytest.raises(EncodingError, match="'s'.*theta_s.*P15"):
        encode(LAYOUT, policy, update, 1, {"loss": 0.0})
    with pytest.raises(EncodingError, match="not a shared"):
        encode(LAYOUT, policy, {"a": update["a"], "b": update["b"], "unknown": np.zeros(1, np.float32)}, 1, {"loss": 0.0})
    manifest = toy_manifest([("a", (7,), THETA_C), ("s", (4,), THETA_S)])
    with pytest.raises(EncodingError, match="site-private"):
        VectorLayout.from_manifest(manifest, allowed_names=["a", "s"])
    assert VectorLayout.from_manifest(manifest, allowed_names=["a"]).n_params == 7


def test_layout_digest_changes_with_names_shapes_and_order():
    a = VectorLayout.from_manifest(toy_manifest([("x", (2,), THETA_C), ("y", (3,), THETA_C)]))
    b = VectorLayout.from_manifest(toy_manifest([("y", (3,), THETA_C), ("x", (2,), THETA_C)]))
    c = VectorLayout.from_manifest(toy_manifest([("x", (3,), THETA_C), ("y", (2,), THETA_C)]))
    assert len({a.digest, b.digest, c.digest}) == 3


# -- P3 / P10 / P17: policy -----------------------------------------------------------------------------------------
def test_policy_refuses_fewer_than_four_sites_and_weak_thresholds():
    for few in (2, 3):
        with pytest.raises(ValidationError, match="min_sites"):
            SecAggPolicy(min_sites=few)
    p = SecAggPolicy()
    assert p.min_sites == 4 and p.threshold_rule == "two_thirds"
    for n in (2, 3):
        with pytest.raises(PolicyError, match="P10"):
            p.check_round(n_sites=n, threshold=n, modulus_bits=32, clip=p.clip, scale_bits=p.scale_bits, max_weight=p.max_weight)
    for n in (4, 5, 10, 11):
        need = 2 * n // 3 + 1
        assert p.min_threshold(n) == need
        p.check_round(n_sites=n, threshold=need, modulus_bits=32, clip=p.clip, scale_bits=p.scale_bits, max_weight=p.max_weight)
        with pytest.raises(PolicyError, match="threshold"):
            p.check_round(n_sites=n, threshold=need - 1, modulus_bits=32, clip=p.clip, scale_bits=p.scale_bits, max_weight=p.max_weight)
    assert SecAggPolicy(threshold_rule="two_thirds").min_threshold(9) == 7
    assert [p.min_threshold(n) for n in (4, 5, 6, 7, 10)] == [3, 4, 5, 5, 7]


def test_stage_deadlines_must_be_positive_and_named():
    with pytest.raises(ValidationError):
        StageDeadlines(share_keys=0)
    d = StageDeadlines(unmask=5)
    assert d.for_stage("unmask") == 5.0
    with pytest.raises(KeyError):
        d.for_stage("nap")
    with pytest.raises(KeyError):  # the start allowance is no stage
        d.for_stage("site_start")


def test_every_protocol_message_allows_the_sites_start():
    """A cold site starts a ClientApp process per message (53 s of imports at load 18): a message's deadline is its
    stages' work plus ``site_start``, so a 30 s stage does not drop every cold site before it has started."""
    d = StageDeadlines()
    assert d.site_start >= 60.0
    assert d.for_message(d.for_stage("advertise_keys")) == d.advertise_keys + d.site_start
    assert StageDeadlines(site_start=0).for_message(4.0) == 4.0  # warm sites may pin none
    with pytest.raises(ValidationError):
        StageDeadlines(site_start=-1)
