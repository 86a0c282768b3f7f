"""The server's side of the double-masking protocol (Bonawitz et al., CCS 2017 §4, Fig. 6).

:class:`SecAggServer` is a state machine over bytes: :meth:`start` gives the stage-0 requests, the carrier
delivers each site's reply to :meth:`collect`, and :meth:`advance` closes the stage, fixes the set of
survivors (U1 ⊇ U2 ⊇ U3 ⊇ U4 ⊇ U5) and returns the next stage's requests. A site that does not answer a
stage before its deadline, or answers with a malformed message, is a dropout from then on (P8, P17).
Fewer than ``threshold`` survivors at any stage raise :class:`~.errors.AbortRound`: the round is aborted and
the global model stays as it was. After the unmask stage :meth:`finish` reconstructs the self-mask seeds of
the alive sites and the mask keys of the dropped ones, each share and each secret checked against the
commitments its dealer signed in stage 0 (:mod:`.commitments`), checks the unmasked sum against what n clipped
inputs allow (:mod:`.bounds`) and returns the weighted FedAvg (:class:`.encoding.Aggregate`). A site caught
breaking the protocol is named in :attr:`RoundReport.culprits` (docs/threats.md P26).

A masked vector arriving after the stage closed is refused (P9); even if the server kept it, the honest
sites have revealed only the *mask key* of a site they consider dropped, never its self-mask seed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

import numpy as np

from . import keys, shamir
from .bounds import check_aggregate
from .client import self_mask_key
from .commitments import SecretId, check_secret, sort_shares, too_few
from .config import SecAggPolicy
from .encoding import Aggregate, VectorLayout, decode
from .errors import AbortRound, Misbehaviour, ProtocolError, SecAggError
from .masks import MaskStream, pair_sign
from .messages import (
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
    peek_header,
    unmask_transcript,
)


#: The five protocol stages in order (Bonawitz et al. rounds 0-4); a carrier sends one request per stage.
STAGES = ("advertise_keys", "share_keys", "masked_input", "consistency", "unmask")


class ServerStage(str, Enum):
    ADVERTISE_KEYS = "advertise_keys"
    SHARE_KEYS = "share_keys"
    MASKED_INPUT = "masked_input"
    CONSISTENCY = "consistency"
    UNMASK = "unmask"
    FINISHED = "finished"
    ABORTED = "aborted"


_EXPECT = {
    ServerStage.ADVERTISE_KEYS: MsgType.ADVERTISE,
    ServerStage.SHARE_KEYS: MsgType.SHARE_KEYS,
    ServerStage.MASKED_INPUT: MsgType.MASKED_INPUT,
    ServerStage.CONSISTENCY: MsgType.CONSISTENCY,
    ServerStage.UNMASK: MsgType.UNMASK,
}
_NEXT = {
    ServerStage.ADVERTISE_KEYS: ServerStage.SHARE_KEYS,
    ServerStage.SHARE_KEYS: ServerStage.MASKED_INPUT,
    ServerStage.MASKED_INPUT: ServerStage.CONSISTENCY,
    ServerStage.CONSISTENCY: ServerStage.UNMASK,
}


@dataclass
class RoundReport:
    """Who took part in which stage; ``failures`` maps a site to why it was dropped; ``culprits`` maps a site to
    the protocol violation it was caught at (a share or secret that does not match its signed commitment, P26),
    whether the round could still finish or not; ``check_seconds`` is the CPU time (this thread) spent in those
    checks and in the bound check of the sum."""

    selected: tuple[str, ...]
    survivors: dict[str, tuple[str, ...]] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    culprits: dict[str, str] = field(default_factory=dict)
    check_seconds: float = 0.0


class SecAggServer:
    """One secure-aggregation round on the server. ``selected`` is U0; the threshold defaults to the policy's
    floor(2n/3) + 1. ``roster`` (site -> Ed25519 public key) lets the server drop a site with a bad signature early
    (sites check signatures themselves anyway) and makes every culprit it names rest on signed evidence: the
    commitments a site advertised and the shares it revealed are verified against its roster key (docs/threats.md P26)."""

    def __init__(
        self,
        policy: SecAggPolicy,
        layout: VectorLayout,
        selected: list[str] | tuple[str, ...],
        round_id: int,
        session_id: bytes | None = None,
        threshold: int | None = None,
        roster: Mapping[str, bytes] | None = None,
    ) -> None:
        sel = tuple(sorted(selected))
        if len(set(sel)) != len(sel):
            raise ValueError("selected sites must be distinct")
        n = len(sel)
        t = policy.min_threshold(n) if threshold is None else threshold
        # the server refuses to even propose what the sites would refuse (same checks, earlier and clearer)
        policy.check_round(n_sites=n, threshold=t, modulus_bits=policy.modulus_bits, clip=policy.clip,
                           scale_bits=policy.scale_bits, max_weight=policy.max_weight)
        self.policy = policy
        self.layout = layout
        self.roster = dict(roster) if roster is not None else None
        self.params = RoundParams(
            session_id=session_id if session_id is not None else os.urandom(16),
            round_id=round_id,
            selected=sel,
            threshold=t,
            modulus_bits=policy.modulus_bits,
            clip=policy.clip,
            scale_bits=policy.scale_bits,
            max_weight=policy.max_weight,
            layout_digest=layout.digest,
            vector_len=layout.length,
        )
        self._digest = self.params.digest
        self.stage = ServerStage.ADVERTISE_KEYS
        self.report = RoundReport(sel)
        self._alive: tuple[str, ...] = sel  # sites expected to answer the current stage
        self._inbox: dict[str, object] = {}
        self._adverts: dict[str, Advertise] = {}
        self._cts: dict[str, dict[str, bytes]] = {}  # sender -> receiver -> ciphertext
        self._u2: tuple[str, ...] = ()
        self._u3: tuple[str, ...] = ()
        self._sum: np.ndarray | None = None
        self._sigs: dict[str, bytes] = {}
        self._unmask: dict[str, Unmask] = {}

    @property
    def threshold(self) -> int:
        return self.params.threshold

    @property
    def expected(self) -> tuple[str, ...]:
        """Sites that are asked in the current stage."""
        return self._alive

    def start(self) -> dict[str, bytes]:
        req = self.params.to_bytes()
        return {s: req for s in self.params.selected}

    # -- receiving ----------------------------------------------------------------------------------------------
    def collect(self, site_id: str, data: bytes) -> None:
        """Take one site's reply for the current stage. A bad reply makes the site a dropout and raises
        :class:`ProtocolError`; a reply for a closed stage (a late vector, P9) is refused the same way."""
        try:
            self._collect(site_id, data)
        except ProtocolError as exc:
            self._drop(site_id, str(exc))
            raise

    def _collect(self, site_id: str, data: bytes) -> None:
        if self.stage not in _EXPECT:
            raise ProtocolError(f"round is {self.stage.value}; reply from {site_id!r} refused")
        h = peek_header(data)
        if h.session_id != self.params.session_id or h.round_id != self.params.round_id:
            raise ProtocolError(f"reply from {site_id!r} belongs to another session or round (replay, P5)")
        if h.type != _EXPECT[self.stage]:
            raise ProtocolError(f"reply from {site_id!r} is {h.type.name} but the stage is {self.stage.value} (late? P9)")
        if site_id not in self._alive:
            raise ProtocolError(f"{site_id!r} is not expected in stage {self.stage.value}")
        if site_id in self._inbox:
            raise ProtocolError(f"second reply from {site_id!r} in stage {self.stage.value}")
        if self.stage is ServerStage.ADVERTISE_KEYS:
            msg: object = Advertise.parse(data)
            assert isinstance(msg, Advertise)
            if len(msg.share_commits) != len(self.params.selected):
                raise ProtocolError(
                    f"{site_id!r} committed to {len(msg.share_commits)} shares, the round has {len(self.params.selected)} sites"
                )
            if self.roster is not None:
                tr = advertise_transcript(h.session_id, h.round_id, site_id, msg.c_pk, msg.s_pk, self._digest,
                                          msg.commit_s, msg.commit_b, msg.share_commits)
                if site_id not in self.roster or not keys.verify(self.roster[site_id], msg.signature, tr):
                    raise ProtocolError(f"advertised keys of {site_id!r} do not verify against the roster")
        elif self.stage is ServerStage.SHARE_KEYS:
            msg = Ciphertexts.parse(data, MsgType.SHARE_KEYS)
            assert isinstance(msg, Ciphertexts)
            others = set(self._alive) - {site_id}
            if {p for p, _ in msg.items} != others:
                raise ProtocolError(f"{site_id!r} did not send exactly one share to every other site")
        elif self.stage is ServerStage.MASKED_INPUT:
            msg = MaskedInput.parse(data, expect_len=self.layout.length)
        elif self.stage is ServerStage.CONSISTENCY:
            msg = Signed.parse(data)
        else:
            msg = Unmask.parse(data)
            assert isinstance(msg, Unmask)
            if self.roster is not None:
                t = time.thread_time()
                tr = unmask_transcript(h.session_id, h.round_id, self._digest, site_id, msg.shares)
                signed = site_id in self.roster and keys.verify(self.roster[site_id], msg.signature, tr)
                self.report.check_seconds += time.thread_time() - t
                if not signed:
                    raise ProtocolError(f"revealed shares of {site_id!r} are not signed by its roster identity key")
        if getattr(msg, "site_id") != site_id:
            raise ProtocolError(f"reply from {site_id!r} claims to come from {getattr(msg, 'site_id')!r}")
        self._inbox[site_id] = msg

    def _drop(self, site_id: str, why: str) -> None:
        self.report.failures.setdefault(site_id, why)

    # -- closing a stage ------------------------------------------------------------------------------------------
    def advance(self) -> dict[str, bytes]:
        """Close the current stage; return the next stage's request per surviving site (empty after unmask)."""
        if self.stage not in _EXPECT:
            raise ProtocolError(f"round is already {self.stage.value}")
        got = tuple(s for s in self._alive if s in self._inbox)
        for s in self._alive:
            if s not in self._inbox:
                self._drop(s, f"no reply in stage {self.stage.value} (late or gone)")
        self.report.survivors[self.stage.value] = got
        if len(got) < self.threshold:
            closing = self.stage.value
            self.stage = ServerStage.ABORTED
            raise AbortRound(f"only {len(got)} sites answered stage {closing}; threshold is {self.threshold}")
        inbox, self._inbox = self._inbox, {}
        stage = self.stage
        self._alive = got
        p = self.params
        if stage is ServerStage.ADVERTISE_KEYS:
            self._adverts = {s: inbox[s] for s in got}  # type: ignore[misc]
            req = KeyList(p.session_id, p.round_id, tuple(self._adverts[s] for s in got)).to_bytes()
            out = {s: req for s in got}
        elif stage is ServerStage.SHARE_KEYS:
            self._u2 = got
            self._cts = {s: dict(inbox[s].items) for s in got}  # type: ignore[attr-defined]
            out = {
                v: Ciphertexts(MsgType.SHARES_RELAY, p.session_id, p.round_id, v,
                               tuple((u, self._cts[u][v]) for u in got if u != v)).to_bytes()
                for v in got
            }
        elif stage is ServerStage.MASKED_INPUT:
            self._u3 = got
            total = np.zeros(self.layout.length, dtype=np.uint32)
            for s in got:
                np.add(total, inbox[s].vector, out=total)  # type: ignore[attr-defined]
            self._sum = total
            req = SiteList(p.session_id, p.round_id, got).to_bytes()
            out = {s: req for s in got}
        elif stage is ServerStage.CONSISTENCY:
            self._sigs = {s: inbox[s].signature for s in got}  # type: ignore[attr-defined]
            dropped = tuple(s for s in self._u2 if s not in self._u3)
            req = UnmaskRequest(p.session_id, p.round_id, self._u3, dropped, tuple(self._sigs.items())).to_bytes()
            out = {s: req for s in got}
        else:
            self._unmask = {s: inbox[s] for s in got}  # type: ignore[misc]
            out = {}
        self.stage = _NEXT.get(stage, ServerStage.FINISHED)
        return out

    # -- result ---------------------------------------------------------------------------------------------------
    def finish(self) -> Aggregate:
        """Remove every mask, check the sum and decode.

        Returns:
            The weighted FedAvg of the survivors' inputs. Sites whose revealed shares were wrong but could be left
            out are named in ``report.culprits``.

        Raises:
            Misbehaviour: a secret cannot be rebuilt from correct shares; the responders who revealed wrong shares
                or the dealer whose shares do not rebuild its committed secret are named (P26).
            BoundViolation: the unmasked sum is outside what the survivors' clipped inputs allow (P26).
            AbortRound: too few shares of a secret arrived at all.
            ProtocolError: the unmask stage has not completed.
        """
        if self.stage is not ServerStage.FINISHED or self._sum is None:
            raise ProtocolError(f"finish() needs a completed unmask stage, round is {self.stage.value}")
        try:
            return self._finish()
        except SecAggError as exc:
            self.stage = ServerStage.ABORTED
            if isinstance(exc, Misbehaviour):
                for site, why in exc.culprits.items():
                    self.report.culprits.setdefault(site, why)
            raise

    def _finish(self) -> Aggregate:
        assert self._sum is not None
        p = self.params
        index = {s: i + 1 for i, s in enumerate(p.selected)}
        dropped = [s for s in self._u2 if s not in self._u3]
        b_shares: dict[str, dict[str, tuple[int, bytes]]] = {s: {} for s in self._u3}
        s_shares: dict[str, dict[str, tuple[int, bytes]]] = {s: {} for s in dropped}
        for responder, msg in self._unmask.items():
            for owner, kind, share in msg.shares:
                if kind is ShareKind.SELF_MASK_SEED and owner in b_shares:
                    b_shares[owner][responder] = (index[responder], share)
                elif kind is ShareKind.MASK_KEY and owner in s_shares:
                    s_shares[owner][responder] = (index[responder], share)
        mask_keys: list[tuple[bytes, int]] = []
        for u in self._u3:
            b = self._rebuild(u, ShareKind.SELF_MASK_SEED, b_shares[u])
            mask_keys.append((self_mask_key(b, p.session_id, p.round_id, u), -1))
        for v in dropped:
            s_pk = self._adverts[v].s_pk
            s_sk = self._rebuild(v, ShareKind.MASK_KEY, s_shares[v], lambda sk, pk=s_pk: keys.x25519_public(sk) == pk)
            agree = keys.x25519_agreement(s_sk)
            for u in self._u3:
                # u added pair_sign(u, v)·PRG(s_uv); take it away
                mask_keys.append((keys.pair_key(agree(self._adverts[u].s_pk), p.session_id, p.round_id, u, v, "mask"),
                                  -pair_sign(u, v)))
        # every secret is rebuilt and checked before a single mask is removed
        total = self._sum.copy()
        MaskStream().apply_all(total, mask_keys)
        t = time.thread_time()
        check_aggregate(self.layout, self.policy, total, len(self._u3))
        self.report.check_seconds += time.thread_time() - t
        return decode(self.layout, self.policy, total, len(self._u3))

    def _rebuild(self, owner: str, kind: ShareKind, shares: dict[str, tuple[int, bytes]], also_valid=None) -> bytes:
        """One secret from its revealed shares, every share and the result checked against ``owner``'s commitments
        (:func:`.commitments.reconstruct`, with only the checks counted in ``report.check_seconds``)."""
        adv = self._adverts[owner]
        which = SecretId(self.params.session_id, self.params.round_id, owner, kind)
        t = time.thread_time()
        good, bad = sort_shares(which, shares=shares, share_commits=adv.share_commits)
        for site, why in bad.items():
            self.report.culprits.setdefault(site, why)
        self.report.check_seconds += time.thread_time() - t
        if len(good) < self.threshold:
            raise too_few(which, len(good), bad, self.threshold)
        secret = shamir.combine(good, self.threshold)
        t = time.thread_time()
        try:
            commit = adv.commit_s if kind is ShareKind.MASK_KEY else adv.commit_b
            check_secret(which, value=secret, secret_commit=commit, also_valid=also_valid)
        finally:
            self.report.check_seconds += time.thread_time() - t
        return secret
