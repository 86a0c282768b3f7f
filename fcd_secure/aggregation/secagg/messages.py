"""Strict, versioned byte encodings of every protocol message (Bonawitz et al., CCS 2017 Fig. 4/6 rounds).

Every message starts with the same header::

    magic "FSA" | version u8 | type u8 | session_id 16 B | round u64

followed by a type-specific body of fixed-width integers (big endian), length-prefixed strings, byte
strings and lists. Parsers check every length against explicit limits and the exact end of the buffer,
so malformed, truncated, oversized or wrongly typed input raises :class:`~.errors.ProtocolError` and
nothing else (fuzzed in ``tests/test_secagg_fuzz.py``). No pickle, no JSON, no eval.
"""

from __future__ import annotations

import hashlib
import math
import struct
from dataclasses import dataclass
from enum import IntEnum

import numpy as np

from .errors import ProtocolError

MAGIC = b"FSA"
VERSION = 2  # 2: signed secret and share commitments in ADVERTISE, signed UNMASK (docs/threats.md P26)
SESSION_BYTES = 16
HASH_BYTES = 32
KEY_BYTES = 32
SIG_BYTES = 64
SHARE_BYTES = 32
MAX_SITE_ID = 128
MAX_SITES = 1024
MAX_CIPHERTEXT = 512
MAX_VECTOR_WORDS = 1 << 28
HEADER = struct.Struct(">3sBB16sQ")


class MsgType(IntEnum):
    ROUND_PARAMS = 1  # server -> site: stage 0 request (advertise keys)
    ADVERTISE = 2  # site -> server: signed round public keys and secret/share commitments
    KEY_LIST = 3  # server -> site: stage 1 request (share keys)
    SHARE_KEYS = 4  # site -> server: encrypted shares, one per peer
    SHARES_RELAY = 5  # server -> site: stage 2 request (masked input)
    MASKED_INPUT = 6  # site -> server: the masked vector
    CONSISTENCY_REQUEST = 7  # server -> site: stage 3 request (U3)
    CONSISTENCY = 8  # site -> server: signature over U3 and the global model hash
    UNMASK_REQUEST = 9  # server -> site: stage 4 request (alive, dropped, signatures)
    UNMASK = 10  # site -> server: signed b-shares of alive sites, s-shares of dropped ones


class ShareKind(IntEnum):
    SELF_MASK_SEED = 1  # b_v: revealed only for sites that are alive (in U3)
    MASK_KEY = 2  # s_v^SK: revealed only for sites that dropped after sharing (U2 \ U3)


# -- low-level reader / writer -----------------------------------------------------------------------------
class _W:
    def __init__(self) -> None:
        self.parts: list[bytes] = []

    def u8(self, v: int) -> None:
        self.parts.append(struct.pack(">B", v))

    def u32(self, v: int) -> None:
        self.parts.append(struct.pack(">I", v))

    def u64(self, v: int) -> None:
        self.parts.append(struct.pack(">Q", v))

    def f64(self, v: float) -> None:
        self.parts.append(struct.pack(">d", v))

    def fixed(self, b: bytes, n: int) -> None:
        if len(b) != n:
            raise ProtocolError(f"field must be {n} bytes, got {len(b)}")
        self.parts.append(b)

    def blob(self, b: bytes) -> None:
        self.u32(len(b))
        self.parts.append(bytes(b))

    def text(self, s: str) -> None:
        raw = s.encode("utf-8")
        if not 0 < len(raw) <= MAX_SITE_ID:
            raise ProtocolError(f"site id must be 1..{MAX_SITE_ID} bytes of UTF-8")
        self.u8(len(raw))
        self.parts.append(raw)

    def done(self) -> bytes:
        return b"".join(self.parts)


class _R:
    def __init__(self, data: bytes, pos: int) -> None:
        self.data = data
        self.pos = pos

    def take(self, n: int, what: str) -> bytes:
        if n < 0 or self.pos + n > len(self.data):
            raise ProtocolError(f"message truncated while reading {what}")
        b = self.data[self.pos : self.pos + n]
        self.pos += n
        return bytes(b)

    def u8(self, what: str) -> int:
        return self.take(1, what)[0]

    def u32(self, what: str) -> int:
        return struct.unpack(">I", self.take(4, what))[0]

    def u64(self, what: str) -> int:
        return struct.unpack(">Q", self.take(8, what))[0]

    def f64(self, what: str) -> float:
        v = struct.unpack(">d", self.take(8, what))[0]
        if not math.isfinite(v):
            raise ProtocolError(f"{what} is not a finite number")
        return v

    def blob(self, what: str, limit: int) -> bytes:
        n = self.u32(what + " length")
        if n > limit:
            raise ProtocolError(f"{what} is {n} bytes, limit {limit}")
        return self.take(n, what)

    def text(self, what: str) -> str:
        n = self.u8(what + " length")
        if n == 0:
            raise ProtocolError(f"{what} is empty")
        raw = self.take(n, what)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ProtocolError(f"{what} is not UTF-8") from exc

    def count(self, what: str, limit: int = MAX_SITES) -> int:
        n = self.u32(what + " count")
        if n > limit:
            raise ProtocolError(f"{what} has {n} entries, limit {limit}")
        return n

    def site_list(self, what: str) -> tuple[str, ...]:
        items = tuple(self.text(what) for _ in range(self.count(what)))
        if len(set(items)) != len(items):
            raise ProtocolError(f"{what} lists a site twice")
        return items

    def end(self) -> None:
        if self.pos != len(self.data):
            raise ProtocolError(f"{len(self.data) - self.pos} trailing bytes after the message")


def _site_list(w: _W, items: tuple[str, ...] | list[str]) -> None:
    w.u32(len(items))
    for s in items:
        w.text(s)


@dataclass(frozen=True)
class Header:
    type: MsgType
    session_id: bytes
    round_id: int


def _header(w: _W, t: MsgType, session_id: bytes, round_id: int) -> None:
    if len(session_id) != SESSION_BYTES:
        raise ProtocolError(f"session id must be {SESSION_BYTES} bytes")
    w.parts.append(HEADER.pack(MAGIC, VERSION, int(t), session_id, round_id))


def peek_header(data: bytes) -> Header:
    """Parse only the header; raises :class:`ProtocolError` for anything that is not one of ours."""
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"message must be bytes, got {type(data).__name__}")
    if len(data) < HEADER.size:
        raise ProtocolError(f"message of {len(data)} bytes is shorter than the {HEADER.size}-byte header")
    magic, version, t, session_id, round_id = HEADER.unpack_from(bytes(data[: HEADER.size]))
    if magic != MAGIC:
        raise ProtocolError("not a secure-aggregation message (bad magic)")
    if version != VERSION:
        raise ProtocolError(f"unsupported protocol version {version} (this site speaks {VERSION})")
    try:
        mt = MsgType(t)
    except ValueError as exc:
        raise ProtocolError(f"unknown message type {t}") from exc
    return Header(mt, session_id, round_id)


def _open(data: bytes, expect: MsgType) -> tuple[Header, _R]:
    h = peek_header(data)
    if h.type != expect:
        raise ProtocolError(f"expected a {expect.name} message, got {h.type.name}")
    return h, _R(bytes(data), HEADER.size)


# -- messages ------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class RoundParams:
    session_id: bytes
    round_id: int
    selected: tuple[str, ...]  # U0, in share-index order (index = position + 1)
    threshold: int
    modulus_bits: int
    clip: float
    scale_bits: int
    max_weight: int
    layout_digest: bytes
    vector_len: int

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.ROUND_PARAMS, self.session_id, self.round_id)
        _site_list(w, self.selected)
        w.u32(self.threshold)
        w.u8(self.modulus_bits)
        w.f64(self.clip)
        w.u8(self.scale_bits)
        w.u64(self.max_weight)
        w.fixed(self.layout_digest, HASH_BYTES)
        w.u64(self.vector_len)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "RoundParams":
        h, r = _open(data, MsgType.ROUND_PARAMS)
        selected = r.site_list("selected sites")
        out = cls(
            h.session_id, h.round_id, selected, r.u32("threshold"), r.u8("modulus_bits"), r.f64("clip"),
            r.u8("scale_bits"), r.u64("max_weight"), r.take(HASH_BYTES, "layout digest"), r.u64("vector_len"),
        )
        r.end()
        if out.vector_len > MAX_VECTOR_WORDS:
            raise ProtocolError(f"vector_len {out.vector_len} exceeds {MAX_VECTOR_WORDS}")
        return out

    @property
    def digest(self) -> bytes:
        return hashlib.sha256(self.to_bytes()).digest()


@dataclass(frozen=True)
class Advertise:
    """Stage 0 reply: the round's public keys and the commitments to the two secrets the site will share.

    ``commit_s`` / ``commit_b`` commit to s_u^SK and to the self-mask seed b_u; ``share_commits[j]`` is the pair
    (commitment of the share of s_u^SK, commitment of the share of b_u) dealt to the site of share index ``j + 1``
    (:mod:`.commitments`). All of it is signed with the site's Ed25519 identity key, so a revealed share, a
    reconstructed secret and the dealer's own shares can all be checked later (docs/threats.md P26).
    """

    session_id: bytes
    round_id: int
    site_id: str
    c_pk: bytes
    s_pk: bytes
    commit_s: bytes
    commit_b: bytes
    share_commits: tuple[tuple[bytes, bytes], ...]
    signature: bytes

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.ADVERTISE, self.session_id, self.round_id)
        _advert_body(w, self)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "Advertise":
        h, r = _open(data, MsgType.ADVERTISE)
        out = _read_advert(h, r)
        r.end()
        return out


def _commit_list(w: _W, items: tuple[tuple[bytes, bytes], ...]) -> None:
    w.u32(len(items))
    for cs, cb in items:
        w.fixed(cs, HASH_BYTES)
        w.fixed(cb, HASH_BYTES)


def _advert_body(w: _W, e: Advertise) -> None:
    w.text(e.site_id)
    w.fixed(e.c_pk, KEY_BYTES)
    w.fixed(e.s_pk, KEY_BYTES)
    w.fixed(e.commit_s, HASH_BYTES)
    w.fixed(e.commit_b, HASH_BYTES)
    _commit_list(w, e.share_commits)
    w.fixed(e.signature, SIG_BYTES)


def _read_advert(h: Header, r: _R) -> Advertise:
    site = r.text("site id")
    c_pk, s_pk = r.take(KEY_BYTES, "c_pk"), r.take(KEY_BYTES, "s_pk")
    commit_s, commit_b = r.take(HASH_BYTES, "commitment of s_sk"), r.take(HASH_BYTES, "commitment of b")
    commits = tuple(
        (r.take(HASH_BYTES, "share commitment"), r.take(HASH_BYTES, "share commitment"))
        for _ in range(r.count("share commitments"))
    )
    return Advertise(h.session_id, h.round_id, site, c_pk, s_pk, commit_s, commit_b, commits, r.take(SIG_BYTES, "signature"))


def advertise_transcript(
    session_id: bytes,
    round_id: int,
    site_id: str,
    c_pk: bytes,
    s_pk: bytes,
    params_digest: bytes,
    commit_s: bytes,
    commit_b: bytes,
    share_commits: tuple[tuple[bytes, bytes], ...],
) -> bytes:
    """What a site signs in stage 0: its round keys and secret/share commitments, bound to the exact round
    parameters it was shown."""
    w = _W()
    w.parts.append(b"fcd/secagg/v1/advertise")
    w.fixed(session_id, SESSION_BYTES)
    w.u64(round_id)
    w.text(site_id)
    w.fixed(c_pk, KEY_BYTES)
    w.fixed(s_pk, KEY_BYTES)
    w.fixed(params_digest, HASH_BYTES)
    w.fixed(commit_s, HASH_BYTES)
    w.fixed(commit_b, HASH_BYTES)
    _commit_list(w, share_commits)
    return w.done()


@dataclass(frozen=True)
class KeyList:
    session_id: bytes
    round_id: int
    entries: tuple[Advertise, ...]  # U1

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.KEY_LIST, self.session_id, self.round_id)
        w.u32(len(self.entries))
        for e in self.entries:
            _advert_body(w, e)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "KeyList":
        h, r = _open(data, MsgType.KEY_LIST)
        entries = tuple(_read_advert(h, r) for _ in range(r.count("key list")))
        r.end()
        if len({e.site_id for e in entries}) != len(entries):
            raise ProtocolError("key list names a site twice")
        return cls(h.session_id, h.round_id, entries)


@dataclass(frozen=True)
class Ciphertexts:
    """SHARE_KEYS (site -> server: ``peer`` = receiver) and SHARES_RELAY (server -> site: ``peer`` = sender)."""

    type: MsgType
    session_id: bytes
    round_id: int
    site_id: str  # the sender (SHARE_KEYS) or the receiver (SHARES_RELAY)
    items: tuple[tuple[str, bytes], ...]

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, self.type, self.session_id, self.round_id)
        w.text(self.site_id)
        w.u32(len(self.items))
        for peer, ct in self.items:
            w.text(peer)
            w.blob(ct)
        return w.done()

    @classmethod
    def parse(cls, data: bytes, expect: MsgType) -> "Ciphertexts":
        if expect not in (MsgType.SHARE_KEYS, MsgType.SHARES_RELAY):
            raise ProtocolError("not a ciphertext message type")
        h, r = _open(data, expect)
        site = r.text("site id")
        items = tuple((r.text("peer id"), r.blob("ciphertext", MAX_CIPHERTEXT)) for _ in range(r.count("ciphertexts")))
        r.end()
        if len({p for p, _ in items}) != len(items):
            raise ProtocolError("two ciphertexts for the same peer")
        return cls(expect, h.session_id, h.round_id, site, items)


@dataclass(frozen=True)
class MaskedInput:
    session_id: bytes
    round_id: int
    site_id: str
    vector: np.ndarray  # uint32

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.MASKED_INPUT, self.session_id, self.round_id)
        w.text(self.site_id)
        v = np.ascontiguousarray(self.vector, dtype="<u4")
        w.u64(v.shape[0])
        w.parts.append(memoryview(v).cast("B"))  # joined once by done(), not copied twice
        return w.done()

    @classmethod
    def parse(cls, data: bytes, expect_len: int | None = None) -> "MaskedInput":
        h, r = _open(data, MsgType.MASKED_INPUT)
        site = r.text("site id")
        n = r.u64("vector length")
        if n > MAX_VECTOR_WORDS:
            raise ProtocolError(f"vector of {n} words exceeds {MAX_VECTOR_WORDS}")
        if expect_len is not None and n != expect_len:
            raise ProtocolError(f"vector has {n} words, the round needs {expect_len}")
        if r.pos + 4 * n > len(r.data):
            raise ProtocolError("message truncated while reading vector")
        # a read-only view on the received bytes: no copy of a vector that may be tens of MB
        vec = np.frombuffer(r.data, dtype="<u4", count=n, offset=r.pos)
        r.pos += 4 * n
        r.end()
        return cls(h.session_id, h.round_id, site, vec)


@dataclass(frozen=True)
class SiteList:
    """CONSISTENCY_REQUEST: the survivors U3 that every site is asked to sign."""

    session_id: bytes
    round_id: int
    sites: tuple[str, ...]

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.CONSISTENCY_REQUEST, self.session_id, self.round_id)
        _site_list(w, self.sites)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "SiteList":
        h, r = _open(data, MsgType.CONSISTENCY_REQUEST)
        sites = r.site_list("survivors")
        r.end()
        return cls(h.session_id, h.round_id, sites)


@dataclass(frozen=True)
class Signed:
    """CONSISTENCY: one site's signature over the consistency transcript."""

    session_id: bytes
    round_id: int
    site_id: str
    signature: bytes

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.CONSISTENCY, self.session_id, self.round_id)
        w.text(self.site_id)
        w.fixed(self.signature, SIG_BYTES)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "Signed":
        h, r = _open(data, MsgType.CONSISTENCY)
        out = cls(h.session_id, h.round_id, r.text("site id"), r.take(SIG_BYTES, "signature"))
        r.end()
        return out


def consistency_transcript(session_id: bytes, round_id: int, params_digest: bytes, survivors: tuple[str, ...] | list[str], global_hash: bytes) -> bytes:
    """What a site signs in stage 3: U3 and the hash of the global Θc *it* received (P1, P12)."""
    w = _W()
    w.parts.append(b"fcd/secagg/v1/consistency")
    w.fixed(session_id, SESSION_BYTES)
    w.u64(round_id)
    w.fixed(params_digest, HASH_BYTES)
    _site_list(w, sorted(survivors))
    w.fixed(global_hash, HASH_BYTES)
    return w.done()


@dataclass(frozen=True)
class UnmaskRequest:
    session_id: bytes
    round_id: int
    alive: tuple[str, ...]
    dropped: tuple[str, ...]
    signatures: tuple[tuple[str, bytes], ...]

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.UNMASK_REQUEST, self.session_id, self.round_id)
        _site_list(w, self.alive)
        _site_list(w, self.dropped)
        w.u32(len(self.signatures))
        for s, sig in self.signatures:
            w.text(s)
            w.fixed(sig, SIG_BYTES)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "UnmaskRequest":
        h, r = _open(data, MsgType.UNMASK_REQUEST)
        alive = r.site_list("alive sites")
        dropped = r.site_list("dropped sites")
        sigs = tuple((r.text("signer"), r.take(SIG_BYTES, "signature")) for _ in range(r.count("signatures")))
        r.end()
        if len({s for s, _ in sigs}) != len(sigs):
            raise ProtocolError("two signatures from the same site")
        return cls(h.session_id, h.round_id, alive, dropped, sigs)


@dataclass(frozen=True)
class Unmask:
    """Stage 4 reply: the shares a site reveals, signed with its identity key so that a corrupted share is
    evidence against its sender, not something the channel could have done (docs/threats.md P26)."""

    session_id: bytes
    round_id: int
    site_id: str
    shares: tuple[tuple[str, ShareKind, bytes], ...]
    signature: bytes

    def to_bytes(self) -> bytes:
        w = _W()
        _header(w, MsgType.UNMASK, self.session_id, self.round_id)
        w.text(self.site_id)
        _share_list(w, self.shares)
        w.fixed(self.signature, SIG_BYTES)
        return w.done()

    @classmethod
    def parse(cls, data: bytes) -> "Unmask":
        h, r = _open(data, MsgType.UNMASK)
        site = r.text("site id")
        shares = []
        for _ in range(r.count("shares")):
            owner = r.text("share owner")
            k = r.u8("share kind")
            try:
                kind = ShareKind(k)
            except ValueError as exc:
                raise ProtocolError(f"unknown share kind {k}") from exc
            shares.append((owner, kind, r.take(SHARE_BYTES, "share")))
        sig = r.take(SIG_BYTES, "signature")
        r.end()
        if len({o for o, _, _ in shares}) != len(shares):
            raise ProtocolError("two shares for the same owner (a site never reveals both kinds for one peer)")
        return cls(h.session_id, h.round_id, site, tuple(shares), sig)


def _share_list(w: _W, shares: tuple[tuple[str, ShareKind, bytes], ...]) -> None:
    w.u32(len(shares))
    for owner, kind, share in shares:
        w.text(owner)
        w.u8(int(kind))
        w.fixed(share, SHARE_BYTES)


def unmask_transcript(
    session_id: bytes, round_id: int, params_digest: bytes, site_id: str, shares: tuple[tuple[str, ShareKind, bytes], ...]
) -> bytes:
    """What a site signs in stage 4: the shares it reveals, bound to the round parameters."""
    w = _W()
    w.parts.append(b"fcd/secagg/v1/unmask")
    w.fixed(session_id, SESSION_BYTES)
    w.u64(round_id)
    w.fixed(params_digest, HASH_BYTES)
    w.text(site_id)
    _share_list(w, shares)
    return w.done()


def share_plaintext(src: str, dst: str, s_share: bytes, b_share: bytes) -> bytes:
    w = _W()
    w.text(src)
    w.text(dst)
    w.fixed(s_share, SHARE_BYTES)
    w.fixed(b_share, SHARE_BYTES)
    return w.done()


def parse_share_plaintext(data: bytes) -> tuple[str, str, bytes, bytes]:
    if not isinstance(data, bytes | bytearray | memoryview):
        raise ProtocolError(f"share plaintext must be bytes, got {type(data).__name__}")
    r = _R(bytes(data), 0)
    out = (r.text("share sender"), r.text("share receiver"), r.take(SHARE_BYTES, "s-share"), r.take(SHARE_BYTES, "b-share"))
    r.end()
    return out


def share_aad(session_id: bytes, round_id: int, src: str, dst: str) -> bytes:
    """AES-GCM associated data: binds session, round, stage, sender and receiver (P5)."""
    w = _W()
    w.parts.append(b"fcd/secagg/v1/share_keys")
    w.fixed(session_id, SESSION_BYTES)
    w.u64(round_id)
    w.text(src)
    w.text(dst)
    return w.done()
