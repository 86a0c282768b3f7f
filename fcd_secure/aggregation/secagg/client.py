"""The site's side of the double-masking protocol (Bonawitz et al., CCS 2017 §4, Fig. 6, active model).

One :class:`SecAggClient` per site and round. It is a state machine driven by :meth:`SecAggClient.handle`:
each server request (bytes) yields one response (bytes) or raises. Stages::

    ROUND_PARAMS        -> ADVERTISE      check policy (P3, P6, P10), fresh X25519 pairs and self-mask seed b,
                                          Shamir-share s_sk and b, commit to both secrets and every share,
                                          sign keys and commitments (P2, P26)
    KEY_LIST            -> SHARE_KEYS     verify every entry against the *configured* roster (P2), AES-GCM each
                                          dealt share to its peer
    SHARES_RELAY        -> MASKED_INPUT   decrypt the peers' shares, check each against its dealer's commitment
                                          (P26), y = x + PRG(b) + Σ ±PRG(s_uv)
    CONSISTENCY_REQUEST -> CONSISTENCY    check U3 against its own view, sign U3 with the hash of the global Θc
                                          this site received (P1, P12)
    UNMASK_REQUEST      -> UNMASK         every check of :meth:`SecAggClient._check_unmask_request` (P1, P19),
                                          then reveal b-shares of the alive and s-shares of the dropped, once
                                          (never both for one site), signed

The input may also come after the keys (``input_later=True``): stages 0 and 1 use only fresh per-round secrets and
never the input, so a carrier can run them for the next round while the current one finishes (Bonawitz et al. §4:
the input enters first in round 2). :meth:`SecAggClient.set_input` then binds the input to the round whose
parameters the client signed, once, before the masked input; a client without an input answers no stage-2 request.

After an :class:`~.errors.AbortRound` or a :class:`~.errors.PolicyError` the client is dead for the round
and reveals nothing more. The state survives between Flower invocations through :meth:`export` /
:meth:`restore` (it holds secrets: keep it in the node's memory state, never log it, P18).
"""

from __future__ import annotations

import base64
import json
import os
import time
from collections.abc import Collection, Mapping
from enum import Enum
from pathlib import Path

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from . import keys, shamir
from .bounds import check_input
from .commitments import commit_shares, secret_commitment, share_commitment
from .config import SecAggPolicy
from .encoding import VectorLayout
from .errors import AbortRound, Misbehaviour, PolicyError, ProtocolError
from .masks import MaskStream, pair_sign
from .messages import (
    HASH_BYTES,
    HEADER,
    KEY_BYTES,
    SHARE_BYTES,
    SIG_BYTES,
    Advertise,
    Ciphertexts,
    KeyList,
    MaskedInput,
    MsgType,
    RoundParams,
    ShareKind,
    Signed,
    SiteList,
    Unmask,
    UnmaskRequest,
    advertise_transcript,
    consistency_transcript,
    parse_share_plaintext,
    peek_header,
    share_aad,
    share_plaintext,
    unmask_transcript,
)

NONCE_BYTES = 12
#: AES-GCM's authentication tag (128 bits, the ``cryptography`` default)
TAG_BYTES = 16


class ClientStage(str, Enum):
    READY = "ready"
    ADVERTISED = "advertised"
    SHARED = "shared"
    MASKED = "masked"
    SIGNED = "signed"
    DONE = "done"
    ABORTED = "aborted"


#: The largest protocol round id a site takes part in (P31): far above any run's own (``federation.rounds`` is at most
#: 100 000, so training ids ``2r`` / ``2r + 1`` stay below 200 002; each evaluation and what-if question adds one
#: evaluation id), so one message cannot spend a session's whole id space.
MAX_ROUND_ID = 1 << 20


class ReplayGuard:
    """Round counters per session (P5, P30): within one session a site takes part in each round once and in
    increasing order, whichever protocol session id the server writes into its messages; a new session starts fresh;
    a round id outside ``0..max_round`` is refused before anything is claimed (P31).

    ``session`` is the *site's own* name for one run (``fcd_secure.federation.state.session_id_of``), never the
    protocol's ``session_id``, which the server chooses: keyed by that, a server could open a fresh protocol session
    in the same run and put the same trained update through two protocol runs with different survivor sets, whose
    sums differ by one site's update. Across the site's sessions a fresh counter takes nothing away: a round's masked
    input never outlives its run (a training update enters only the client of the call that trained it, and each
    server round is trained once per site state, ``apps.secure_site.TRAINED_SLOT``), and an evaluation computes its
    sums anew, whose repetition is the cohort rules' to limit (P22). What the counters must not do is spend a site for
    ever: one counter per site, as before, let an honest later run's round 0 be refused after a run that reached
    round 101, and one huge round id lock the site out of every later round.

    With a ``path`` the counters persist (JSON ``{"v": 2, "sessions": {hex: last round}}``, fsynced) in the site state,
    so a restarted site still refuses a replayed session's old rounds. A file of the first format (one counter for
    ever, ``{"_any": n, ...}``) is read as the counter of the unnamed session ``b""``, the one a guard without a
    session uses: no run a site can name again owns it.
    """

    #: key of the one counter of the first file format
    LEGACY_ANY = "_any"

    def __init__(self, path: str | Path | None = None, session: bytes = b"", max_round: int = MAX_ROUND_ID) -> None:
        self.path = Path(path) if path is not None else None
        self.session = bytes(session)
        self.max_round = int(max_round)
        self._last: dict[str, int] = {}
        if self.path is not None and self.path.exists():
            try:
                raw = json.loads(self.path.read_text())
                if raw.get("v") == 2:
                    self._last = {str(k): int(v) for k, v in raw["sessions"].items()}
                elif self.LEGACY_ANY in raw:
                    self._last = {"": int(raw[self.LEGACY_ANY])}
            except (ValueError, TypeError, AttributeError, KeyError) as exc:
                raise ProtocolError(f"{self.path}: replay counter is unreadable ({exc})") from exc

    @property
    def _key(self) -> str:
        return self.session.hex()

    def last_round(self) -> int | None:
        """The highest round this site has taken part in, in this session (None: none yet)."""
        return self._last.get(self._key)

    def check_fresh(self, round_id: int) -> None:
        """Refuse a round id outside ``0..max_round`` (P31) or not newer than every round of this session (P5)."""
        if not 0 <= int(round_id) <= self.max_round:
            raise AbortRound(f"round id {round_id} is outside 0..{self.max_round}: refused, nothing claimed (P31)")
        last = self.last_round()
        if last is not None and round_id <= last:
            raise AbortRound(f"round {round_id} is not newer than round {last} of this session: replay refused (P5)")

    def claim(self, session_id: bytes, round_id: int) -> None:
        """Spend ``round_id`` in this guard's session.

        Args:
            session_id: the protocol session the server wrote into the round's messages: not a key (see the class
                docstring), every protocol session of one site session shares its counter.
            round_id: the protocol round.

        Raises:
            AbortRound: the round is out of bounds or not newer than this session's last one.
        """
        self.check_fresh(round_id)
        self._last[self._key] = int(round_id)
        if self.path is not None:
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "w") as fh:
                fh.write(json.dumps({"v": 2, "sessions": self._last}, sort_keys=True))
                fh.flush()
                os.fsync(fh.fileno())
            tmp.replace(self.path)


def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode()


def _unb64(s: str) -> bytes:
    return base64.b64decode(s.encode())


class SecAggClient:
    """One site in one secure-aggregation round. See the module docstring."""

    def __init__(
        self,
        site_id: str,
        identity_key: bytes,
        roster: Mapping[str, bytes],
        policy: SecAggPolicy,
        layout: VectorLayout,
        replay_guard: ReplayGuard | None = None,
        *,
        input_later: bool = False,
    ) -> None:
        if site_id not in roster:
            raise PolicyError(f"site {site_id!r} is not in its own configured roster")
        if keys.ed25519_public(identity_key) != roster[site_id]:
            raise PolicyError(f"site {site_id!r}: identity key does not match the roster entry")
        self.site_id = site_id
        self._identity = identity_key
        self.roster = dict(roster)
        self.policy = policy
        self.layout = layout
        self.guard = replay_guard if replay_guard is not None else ReplayGuard()
        self.stage = ClientStage.READY
        #: stages 0 and 1 may run before :meth:`set_input` (module docstring)
        self.input_later = bool(input_later)
        self._x: np.ndarray | None = None
        self._global_hash: bytes | None = None
        self._input_round: int | None = None
        self._params: RoundParams | None = None
        self._params_digest = b""
        self._c_sk = self._s_sk = b""
        self._keys: dict[str, tuple[bytes, bytes]] = {}  # U1: site -> (c_pk, s_pk)
        self._b_seed = b""
        self._dealt: list[tuple[bytes, bytes]] = []  # (s-share, b-share) per share index, kept from stage 0 to 1
        self._own_shares: tuple[bytes, bytes] = (b"", b"")  # (s-share, b-share) of this site's own secrets
        self._commits: dict[str, tuple[bytes, bytes]] = {}  # U1 peer -> its commitments of the shares dealt to us
        self._held: dict[str, tuple[bytes, bytes]] = {}  # U2 peer -> (s-share, b-share) it gave us
        self._u2: tuple[str, ...] = ()
        self._u3: tuple[str, ...] = ()
        self._own_sig = b""  # this site's consistency signature (stage 3), which the unmask request must carry
        #: CPU seconds (this thread) spent in the input-bound and commitment checks (a benchmark column of its own)
        self.check_seconds = 0.0

    # -- input -------------------------------------------------------------------------------------------------
    def set_input(self, vector: np.ndarray, global_hash: bytes, round_id: int | None = None) -> None:
        """The encoded plaintext vector (:func:`.encoding.encode`), the hash of the global Θc received and, when known,
        the round the vector was trained for: the protocol then runs only under that round id (P5), so one update can
        never enter two protocol runs under different round ids. The client takes the vector over and masks it in
        place in stage 2 (pass a copy to keep the plaintext).

        On a client whose keys came first (``input_later``), the input is taken once, in stage 0 or 1, and only for
        the round whose parameters the client signed.

        Raises:
            EncodingError: the vector is not one :func:`.encoding.encode` can produce under this site's policy (a
                negative, zero or oversized weight; a value outside the clip range), naming the word (P26).
            ProtocolError: wrong dtype, length or hash size; an input after stage 1 or a second one.
            AbortRound: the input is for another round than the one this client advertised keys for (P5).
        """
        if self._params is not None:
            if self.stage not in (ClientStage.ADVERTISED, ClientStage.SHARED) or self._x is not None:
                raise ProtocolError(f"site {self.site_id} in stage {self.stage.value} takes no (further) input")
            if round_id is None or int(round_id) != self._params.round_id:
                self._abort()
                raise AbortRound(f"the update was trained for round {round_id}, the keys for round {self._params.round_id} (P5)")
        if vector.dtype != np.uint32 or vector.shape != (self.layout.length,):
            raise ProtocolError(f"input must be uint32 of length {self.layout.length}")
        if len(global_hash) != 32:
            raise ProtocolError("global model hash must be 32 bytes")
        t = time.thread_time()
        check_input(self.layout, self.policy, vector)  # a negative weight or an unclipped value never gets masked
        self.check_seconds += time.thread_time() - t
        self._x = np.require(vector, dtype=np.uint32, requirements=["C_CONTIGUOUS", "WRITEABLE"])
        self._global_hash = bytes(global_hash)
        self._input_round = None if round_id is None else int(round_id)

    # -- dispatch -----------------------------------------------------------------------------------------------
    def handle(self, request: bytes) -> bytes:
        if self.stage in (ClientStage.ABORTED, ClientStage.DONE):
            raise AbortRound(f"site {self.site_id}: round is {self.stage.value}; nothing more is revealed")
        try:
            h = peek_header(request)
            if self._params is not None and (h.session_id != self._params.session_id or h.round_id != self._params.round_id):
                raise AbortRound("request belongs to another session or round (replay refused, P5)")
            expected = {
                ClientStage.READY: (MsgType.ROUND_PARAMS, self._advertise),
                ClientStage.ADVERTISED: (MsgType.KEY_LIST, self._share_keys),
                ClientStage.SHARED: (MsgType.SHARES_RELAY, self._masked_input),
                ClientStage.MASKED: (MsgType.CONSISTENCY_REQUEST, self._consistency),
                ClientStage.SIGNED: (MsgType.UNMASK_REQUEST, self._unmask),
            }[self.stage]
            if h.type != expected[0]:
                raise ProtocolError(f"site {self.site_id} in stage {self.stage.value} got {h.type.name}, expected {expected[0].name}")
            return expected[1](request)
        except Exception:
            self._abort()
            raise

    def _abort(self) -> None:
        self.stage = ClientStage.ABORTED
        # forget every secret of the round: an aborted site must not be talked into revealing anything later
        self._c_sk = self._s_sk = self._b_seed = b""
        self._held.clear()
        self._dealt = []
        self._own_shares = (b"", b"")
        self._x = None

    # -- stage 0 ----------------------------------------------------------------------------------------------
    def _advertise(self, request: bytes) -> bytes:
        p = RoundParams.parse(request)
        n = len(p.selected)
        self.policy.check_round(
            n_sites=n, threshold=p.threshold, modulus_bits=p.modulus_bits, clip=p.clip, scale_bits=p.scale_bits,
            max_weight=p.max_weight,
        )
        if self.site_id not in p.selected:
            raise ProtocolError(f"site {self.site_id} is not among the selected sites")
        unknown = [s for s in p.selected if s not in self.roster]
        if unknown:
            raise AbortRound(f"selected site {unknown[0]!r} is not in the configured roster (P2)")
        if p.layout_digest != self.layout.digest or p.vector_len != self.layout.length:
            raise AbortRound("the server's vector layout differs from this site's manifest (P15)")
        if (self._x is None or self._global_hash is None) and not self.input_later:
            raise ProtocolError(f"site {self.site_id} has no trained update for this round")
        if self._input_round is not None and p.round_id != self._input_round:
            raise AbortRound(f"the update was trained for round {self._input_round}, not round {p.round_id} (P5)")
        self.guard.claim(p.session_id, p.round_id)
        self._params = p
        self._params_digest = p.digest
        self._c_sk, c_pk = keys.x25519_keypair()
        self._s_sk, s_pk = keys.x25519_keypair()
        self._b_seed = os.urandom(32)
        s_shares, b_shares = self._deal(p)
        t = time.thread_time()
        commit_s = secret_commitment(p.session_id, p.round_id, self.site_id, ShareKind.MASK_KEY, self._s_sk)
        commit_b = secret_commitment(p.session_id, p.round_id, self.site_id, ShareKind.SELF_MASK_SEED, self._b_seed)
        share_commits = commit_shares(p.session_id, p.round_id, self.site_id, s_shares, b_shares)
        self.check_seconds += time.thread_time() - t
        self._dealt = list(zip(s_shares, b_shares))
        me = p.selected.index(self.site_id)
        self._own_shares = self._dealt[me]
        tr = advertise_transcript(p.session_id, p.round_id, self.site_id, c_pk, s_pk, self._params_digest, commit_s,
                                  commit_b, share_commits)
        sig = keys.sign(self._identity, tr)
        self.stage = ClientStage.ADVERTISED
        return Advertise(p.session_id, p.round_id, self.site_id, c_pk, s_pk, commit_s, commit_b, share_commits, sig).to_bytes()

    def _deal(self, p: RoundParams) -> tuple[list[bytes], list[bytes]]:
        """t-of-n Shamir shares of s_sk and of b, share j (1-based) for the j-th selected site (Bonawitz et al. §4)."""
        n = len(p.selected)
        s_shares = [sh for _, sh in shamir.split(self._s_sk, p.threshold, n)]
        b_shares = [sh for _, sh in shamir.split(self._b_seed, p.threshold, n)]
        return s_shares, b_shares

    def _share_for(self, peer: str, index: int) -> tuple[bytes, bytes]:
        """The (s-share, b-share) this site deals to ``peer`` (share ``index``)."""
        return self._dealt[index - 1]

    # -- stage 1 ----------------------------------------------------------------------------------------------
    def _share_keys(self, request: bytes) -> bytes:
        p = self._p
        kl = KeyList.parse(request)
        u1 = [e.site_id for e in kl.entries]
        if len(u1) < p.threshold:
            raise AbortRound(f"only {len(u1)} sites advertised keys, threshold is {p.threshold}")
        n = len(p.selected)
        index = {s: i + 1 for i, s in enumerate(p.selected)}
        me = index[self.site_id]
        seen_keys: set[bytes] = set()
        for e in kl.entries:
            if e.site_id not in p.selected:
                raise AbortRound(f"key list names {e.site_id!r}, which was not selected for the round")
            tr = advertise_transcript(p.session_id, p.round_id, e.site_id, e.c_pk, e.s_pk, self._params_digest,
                                      e.commit_s, e.commit_b, e.share_commits)
            if not keys.verify(self.roster[e.site_id], e.signature, tr):
                raise AbortRound(f"public keys of {e.site_id!r} are not signed by its roster identity key (P2)")
            if len(e.share_commits) != n:
                raise AbortRound(f"{e.site_id!r} committed to {len(e.share_commits)} shares, the round has {n} sites (P26)")
            if e.c_pk in seen_keys or e.s_pk in seen_keys or e.c_pk == e.s_pk:
                raise AbortRound("a public key is repeated in the key list")
            seen_keys |= {e.c_pk, e.s_pk}
            self._keys[e.site_id] = (e.c_pk, e.s_pk)
            self._commits[e.site_id] = e.share_commits[me - 1]
        mine = self._keys.get(self.site_id)
        if mine is None or mine != (keys.x25519_public(self._c_sk), keys.x25519_public(self._s_sk)):
            raise AbortRound("the key list does not carry this site's own keys unchanged (P2)")
        items = []
        agree = keys.x25519_agreement(self._c_sk)
        for v in u1:
            if v == self.site_id:
                continue
            k = keys.pair_key(agree(self._keys[v][0]), p.session_id, p.round_id, self.site_id, v, "share-enc", 32)
            nonce = os.urandom(NONCE_BYTES)
            s_share, b_share = self._share_for(v, index[v])
            pt = share_plaintext(self.site_id, v, s_share, b_share)
            items.append((v, nonce + AESGCM(k).encrypt(nonce, pt, share_aad(p.session_id, p.round_id, self.site_id, v))))
        self._dealt = []  # the other sites' shares have left, encrypted; only this site's own pair stays
        self.stage = ClientStage.SHARED
        return Ciphertexts(MsgType.SHARE_KEYS, p.session_id, p.round_id, self.site_id, tuple(items)).to_bytes()

    # -- stage 2 ----------------------------------------------------------------------------------------------
    def _masked_input(self, request: bytes) -> bytes:
        p = self._p
        if self._x is None or self._global_hash is None:
            raise ProtocolError(f"site {self.site_id} has no trained update for this round")
        relay = Ciphertexts.parse(request, MsgType.SHARES_RELAY)
        if relay.site_id != self.site_id:
            raise AbortRound("shares relayed for another site")
        u2 = sorted({src for src, _ in relay.items} | {self.site_id})
        if len(u2) < p.threshold:
            raise AbortRound(f"only {len(u2)} sites shared keys, threshold is {p.threshold}")
        me = p.selected.index(self.site_id) + 1
        agree = keys.x25519_agreement(self._c_sk)
        for src, ct in relay.items:
            if src == self.site_id or src not in self._keys:
                raise AbortRound(f"relayed share from {src!r}, which is not in the signed key list")
            if len(ct) <= NONCE_BYTES:
                raise ProtocolError(f"share ciphertext from {src!r} is too short")
            k = keys.pair_key(agree(self._keys[src][0]), p.session_id, p.round_id, self.site_id, src, "share-enc", 32)
            try:
                pt = AESGCM(k).decrypt(ct[:NONCE_BYTES], ct[NONCE_BYTES:], share_aad(p.session_id, p.round_id, src, self.site_id))
            except InvalidTag as exc:
                raise AbortRound(f"share from {src!r} fails authentication (tampered or replayed, P5)") from exc
            s_src, s_dst, s_share, b_share = parse_share_plaintext(pt)
            if (s_src, s_dst) != (src, self.site_id):
                raise AbortRound(f"share from {src!r} names the wrong sender or receiver")
            t = time.thread_time()
            # a share that differs from its dealer's signed commitment would later be blamed on this site: the
            # dealer is named now, and nothing of this round is revealed (P26)
            c_s, c_b = self._commits[src]
            if (share_commitment(p.session_id, p.round_id, src, me, ShareKind.MASK_KEY, s_share) != c_s
                    or share_commitment(p.session_id, p.round_id, src, me, ShareKind.SELF_MASK_SEED, b_share) != c_b):
                raise Misbehaviour(
                    f"{src!r} dealt this site a share that does not match its signed commitment (P26)",
                    {src: "dealt a share that does not match its own commitment"},
                )
            self.check_seconds += time.thread_time() - t
            self._held[src] = (s_share, b_share)
        self._u2 = tuple(u2)
        mask_keys = [(self_mask_key(self._b_seed, p.session_id, p.round_id, self.site_id), 1)]
        agree = keys.x25519_agreement(self._s_sk)
        for v in u2:
            if v == self.site_id:
                continue
            mask_keys.append((keys.pair_key(agree(self._keys[v][1]), p.session_id, p.round_id, self.site_id, v, "mask"),
                              pair_sign(self.site_id, v)))
        # masked in place: the plaintext does not outlive this stage in the client's memory
        y, self._x = self._x, None
        MaskStream().apply_all(y, mask_keys)
        self.stage = ClientStage.MASKED
        return MaskedInput(p.session_id, p.round_id, self.site_id, y).to_bytes()

    # -- stage 3 ----------------------------------------------------------------------------------------------
    def _consistency(self, request: bytes) -> bytes:
        p = self._p
        req = SiteList.parse(request)
        u3 = tuple(sorted(req.sites))
        if self.site_id not in u3:
            raise AbortRound("this site's masked input is not among the survivors")
        extra = [s for s in u3 if s not in self._u2]
        if extra:
            raise AbortRound(f"survivor {extra[0]!r} never shared keys with this site (U3 must be within U2, P1)")
        if len(u3) < p.threshold:
            raise AbortRound(f"only {len(u3)} survivors, threshold is {p.threshold}")
        self._u3 = u3
        assert self._global_hash is not None
        self._own_sig = keys.sign(self._identity, consistency_transcript(p.session_id, p.round_id, self._params_digest, u3, self._global_hash))
        self.stage = ClientStage.SIGNED
        return Signed(p.session_id, p.round_id, self.site_id, self._own_sig).to_bytes()

    # -- stage 4 ----------------------------------------------------------------------------------------------
    def _check_unmask_request(self, req: UnmaskRequest) -> None:
        """Every check of the unmask request that this site can make from what it saw (Bonawitz et al. §4, Fig. 6,
        round 4, active model; docs/threats.md P1, P12, P19). Any failure aborts before a single share is revealed.

        1. no site is both alive and dropped (P1);
        2. this site is not listed as dropped: it is alive and answering;
        3. the alive list is exactly the survivor list U3 this site signed;
        4. the dropped list names only sites whose shares this site holds (within its U2) and is exactly U2 ∖ U3,
           its own view of who shared keys but sent no vector;
        5. every signer is a survivor, every signature verifies on *this site's* transcript (U3, round parameters
           and the global model hash it received): a signature on another survivor list is a split view (P19), on
           another model hash a model-inconsistency attack (P12);
        6. the list carries this site's own signature unchanged;
        7. at least t signatures: with t = floor(2n/3) + 1 no two disjoint groups of honest signers plus the
           tolerated colluders can both reach t (:mod:`.config`).
        """
        p = self._p
        alive, dropped = set(req.alive), set(req.dropped)
        both = alive & dropped
        if both:
            raise AbortRound(f"site {sorted(both)[0]!r} is listed as both alive and dropped (P1)")
        if self.site_id in dropped:
            raise AbortRound("the unmask request lists this site as dropped while it is alive (P1)")
        if alive != set(self._u3):
            raise AbortRound("the alive list differs from the survivors this site signed (P1)")
        unseen = sorted(dropped - set(self._u2))
        if unseen:
            raise AbortRound(f"the dropped list names {unseen[0]!r}, whose shares this site never received (P1)")
        if dropped != set(self._u2) - set(self._u3):
            raise AbortRound("the dropped list differs from this site's view of who shared keys (P1)")
        assert self._global_hash is not None
        tr = consistency_transcript(p.session_id, p.round_id, self._params_digest, self._u3, self._global_hash)
        sigs = dict(req.signatures)
        for signer, sig in req.signatures:
            if signer not in alive:
                raise AbortRound(f"signature from {signer!r}, which is not a survivor")
            if not keys.verify(self.roster[signer], sig, tr):
                raise AbortRound(f"{signer!r} signed a different survivor set or global model (P1, P12, P19)")
        if sigs.get(self.site_id) != self._own_sig:
            raise AbortRound("the signatures do not carry this site's own consistency signature unchanged (P19)")
        if len(req.signatures) < p.threshold:
            raise AbortRound(f"only {len(req.signatures)} consistency signatures, threshold is {p.threshold} (P19)")

    def _unmask(self, request: bytes) -> bytes:
        p = self._p
        req = UnmaskRequest.parse(request)
        self._check_unmask_request(req)
        out: list[tuple[str, ShareKind, bytes]] = []
        for v in sorted(req.alive):
            b = self._own_shares[1] if v == self.site_id else self._held[v][1]
            out.append((v, ShareKind.SELF_MASK_SEED, b))
        for v in sorted(req.dropped):
            out.append((v, ShareKind.MASK_KEY, self._held[v][0]))
        shares = tuple(out)
        sig = keys.sign(self._identity, unmask_transcript(p.session_id, p.round_id, self._params_digest, self.site_id, shares))
        self.stage = ClientStage.DONE
        self._c_sk = self._s_sk = self._b_seed = b""
        self._held.clear()
        return Unmask(p.session_id, p.round_id, self.site_id, shares, sig).to_bytes()

    @property
    def _p(self) -> RoundParams:
        if self._params is None:
            raise ProtocolError("round parameters not received yet")
        return self._params

    # -- persistence between Flower invocations --------------------------------------------------------------
    def export(self) -> bytes:
        """Serialise the round state (includes secrets: keep it in node memory state only, never log it)."""
        d = {
            "stage": self.stage.value,
            "input_later": self.input_later,
            "x": _b64(self._x.tobytes()) if self._x is not None else None,
            "global_hash": _b64(self._global_hash) if self._global_hash else None,
            "params": _b64(self._params.to_bytes()) if self._params else None,
            "c_sk": _b64(self._c_sk),
            "s_sk": _b64(self._s_sk),
            "b": _b64(self._b_seed),
            "keys": {k: [_b64(a), _b64(b)] for k, (a, b) in self._keys.items()},
            "dealt": [[_b64(a), _b64(b)] for a, b in self._dealt],
            "own": [_b64(self._own_shares[0]), _b64(self._own_shares[1])],
            "commits": {k: [_b64(a), _b64(b)] for k, (a, b) in self._commits.items()},
            "held": {k: [_b64(a), _b64(b)] for k, (a, b) in self._held.items()},
            "u2": list(self._u2),
            "u3": list(self._u3),
            "own_sig": _b64(self._own_sig),
        }
        return json.dumps(d).encode()

    def restore(self, blob: bytes) -> None:
        try:
            d = json.loads(blob)
            self.stage = ClientStage(d["stage"])
            self.input_later = bool(d.get("input_later", False))
            self._x = np.frombuffer(_unb64(d["x"]), dtype=np.uint32).copy() if d["x"] else None
            self._global_hash = _unb64(d["global_hash"]) if d["global_hash"] else None
            self._params = RoundParams.parse(_unb64(d["params"])) if d["params"] else None
            self._params_digest = self._params.digest if self._params else b""
            self._c_sk, self._s_sk, self._b_seed = _unb64(d["c_sk"]), _unb64(d["s_sk"]), _unb64(d["b"])
            self._keys = {k: (_unb64(a), _unb64(b)) for k, (a, b) in d["keys"].items()}
            self._dealt = [(_unb64(a), _unb64(b)) for a, b in d["dealt"]]
            self._own_shares = (_unb64(d["own"][0]), _unb64(d["own"][1]))
            self._commits = {k: (_unb64(a), _unb64(b)) for k, (a, b) in d["commits"].items()}
            self._held = {k: (_unb64(a), _unb64(b)) for k, (a, b) in d["held"].items()}
            self._u2, self._u3 = tuple(d["u2"]), tuple(d["u3"])
            self._own_sig = _unb64(d["own_sig"])
        except (KeyError, ValueError, TypeError) as exc:
            raise ProtocolError(f"stored client state is unreadable ({type(exc).__name__})") from exc


def self_mask_key(seed: bytes, session_id: bytes, round_id: int, site_id: str) -> bytes:
    """AES key of the self-mask PRG(b_u), bound to session, round and owner."""
    return keys.hkdf(seed, keys.kdf_info(session_id, round_id, site_id, site_id, "self-mask"), 16)


# -- what a site's reply is, exactly ------------------------------------------------------------------------------
#: request type -> the type of the reply a site answers it with (Bonawitz et al. CCS 2017, Fig. 6 rounds 0-4)
REPLY_TYPE = {
    MsgType.ROUND_PARAMS: MsgType.ADVERTISE,
    MsgType.KEY_LIST: MsgType.SHARE_KEYS,
    MsgType.SHARES_RELAY: MsgType.MASKED_INPUT,
    MsgType.CONSISTENCY_REQUEST: MsgType.CONSISTENCY,
    MsgType.UNMASK_REQUEST: MsgType.UNMASK,
}


def _text_bytes(s: str) -> int:
    return 1 + len(s.encode("utf-8"))


def _known(names: Collection[str], roster: Collection[str], what: str) -> None:
    unknown = [n for n in names if n not in roster]
    if unknown:
        raise ProtocolError(f"the request's {what} name {unknown[0]!r}, which is not in the roster")


def reply_bytes(request: bytes, site_id: str, vector_words: int, roster: Collection[str]) -> int:
    """The exact length of the reply :class:`SecAggClient` sends for ``request``: a function of the request, the site's
    id and the vector layout only, never of a secret or of the site's data (docs/threats.md P29).

    * ADVERTISE: header, site id, two X25519 keys, two secret commitments, one commitment pair per selected site, a
      signature;
    * SHARE_KEYS: header, site id, one AES-GCM ciphertext (nonce, share plaintext, tag) per other site of the key list;
    * MASKED_INPUT: header, site id, the word count and ``4 · vector_words`` bytes;
    * CONSISTENCY: header, site id, a signature;
    * UNMASK: header, site id, one share per alive and per dropped site, a signature.

    Args:
        request: the server's request (parsed whole by its strict parser).
        site_id: this site.
        vector_words: the words of the round's vector layout (training: Θc and the metrics; evaluation: the agreed
            evaluation layout).
        roster: the site ids this site knows; a request naming another site has no reply.

    Raises:
        ProtocolError: the request does not parse, names a site outside the roster, or has no reply.
    """
    h = peek_header(request)
    head = HEADER.size + _text_bytes(site_id)
    if h.type is MsgType.ROUND_PARAMS:
        selected = RoundParams.parse(request).selected
        _known(selected, roster, "selected sites")
        return head + 2 * KEY_BYTES + 2 * HASH_BYTES + 4 + 2 * HASH_BYTES * len(selected) + SIG_BYTES
    if h.type is MsgType.KEY_LIST:
        peers = [e.site_id for e in KeyList.parse(request).entries if e.site_id != site_id]
        _known(peers, roster, "key list")
        return head + 4 + sum(
            _text_bytes(v) + 4 + NONCE_BYTES + len(share_plaintext(site_id, v, bytes(SHARE_BYTES), bytes(SHARE_BYTES)))
            + TAG_BYTES for v in peers
        )
    if h.type is MsgType.SHARES_RELAY:
        relay = Ciphertexts.parse(request, MsgType.SHARES_RELAY)
        _known([p for p, _ in relay.items], roster, "relayed shares")
        return head + 8 + 4 * int(vector_words)
    if h.type is MsgType.CONSISTENCY_REQUEST:
        _known(SiteList.parse(request).sites, roster, "survivors")
        return head + SIG_BYTES
    if h.type is MsgType.UNMASK_REQUEST:
        req = UnmaskRequest.parse(request)
        _known(req.alive + req.dropped, roster, "alive and dropped sites")
        return head + 4 + sum(_text_bytes(v) + 1 + SHARE_BYTES for v in req.alive + req.dropped) + SIG_BYTES
    raise ProtocolError(f"a {h.type.name} message is not a request a site answers")


def check_reply(request: bytes, reply: bytes, site_id: str, vector_words: int, roster: Collection[str]) -> None:
    """Raise unless ``reply`` is exactly a reply of this site to ``request`` (docs/threats.md P29).

    Its header answers the request (the reply type of the request's type, the same session and round), it is
    exactly :func:`reply_bytes` long, its type's strict parser reads it whole, it names this site, and the sites it
    lists are exactly those the request asks about, in the order the client writes them. What is left free are the
    fields of fixed width a protocol message must carry (keys, commitments, nonces, ciphertexts, signatures, masked
    words): no length, count or name is the site's choice.

    Raises:
        ProtocolError: naming the first thing that differs.
    """
    req, rep = peek_header(request), peek_header(reply)
    expected = REPLY_TYPE.get(req.type)
    if rep.type is not expected:
        raise ProtocolError(f"a {req.type.name} request is answered by {getattr(expected, 'name', 'nothing')}, not {rep.type.name}")
    if (rep.session_id, rep.round_id) != (req.session_id, req.round_id):
        raise ProtocolError("the reply's session or round is not the request's")
    size = reply_bytes(request, site_id, vector_words, roster)
    if len(reply) != size:
        raise ProtocolError(f"the reply is {len(reply)} bytes, a {rep.type.name} of this site to this request is {size}")
    if rep.type is MsgType.ADVERTISE:
        adv = Advertise.parse(reply)
        names, want = (adv.site_id,), (site_id,)
        if len(adv.share_commits) != len(RoundParams.parse(request).selected):
            raise ProtocolError("one share commitment pair per selected site")
    elif rep.type is MsgType.SHARE_KEYS:
        ct = Ciphertexts.parse(reply, MsgType.SHARE_KEYS)
        names = (ct.site_id, *(p for p, _ in ct.items))
        want = (site_id, *(e.site_id for e in KeyList.parse(request).entries if e.site_id != site_id))
    elif rep.type is MsgType.MASKED_INPUT:
        names, want = (MaskedInput.parse(reply, expect_len=int(vector_words)).site_id,), (site_id,)
    elif rep.type is MsgType.CONSISTENCY:
        names, want = (Signed.parse(reply).site_id,), (site_id,)
    else:
        un, ur = Unmask.parse(reply), UnmaskRequest.parse(request)
        names = (un.site_id, *((o, k) for o, k, _ in un.shares))
        want = (site_id, *((v, ShareKind.SELF_MASK_SEED) for v in sorted(ur.alive)),
                *((v, ShareKind.MASK_KEY) for v in sorted(ur.dropped)))
    if tuple(names) != tuple(want):
        raise ProtocolError(f"the {rep.type.name} reply names other sites (or another order) than this site's reply")
