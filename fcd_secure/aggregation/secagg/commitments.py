"""Commitments to the shared secrets and to every dealt share; reconstruction checked against them (docs/threats.md P26).

Bonawitz et al. (CCS 2017 §4, rounds 1 and 4) reconstruct the self-mask seed b_u and the mask key s_u^SK from
any t shares without checking them: one corrupted share yields a wrong secret, the server removes a wrong mask and
accepts a garbage aggregate. Here each dealer commits, in its signed stage-0 message (:class:`.messages.Advertise`),
to

* each secret: ``H("secret" | session | round | owner | kind | secret)`` for s_u^SK and b_u, and
* each share it deals: ``H("share" | session | round | dealer | index | kind | share)`` for the share of index j
  of both secrets,

with H = SHA-256. The secrets and shares are 256-bit uniform strings, so the hashes hide them (finding a share
from its commitment is a 2^256 search). Then

* the holder of share j checks, when it decrypts it in stage 2, that it matches the dealer's commitment (a
  mismatch names the dealer: :class:`~.errors.Misbehaviour`);
* the server checks every share revealed in stage 4 against its commitment, so a corrupted share is detected
  and its *sender* is named, and the round goes on if t correct shares remain (:func:`reconstruct`);
* the server checks the reconstructed secret against its commitment (and s_u^SK against the advertised public
  key s_u^PK), so committed shares that do not lie on one polynomial through the committed secret name the
  *dealer*.

No corrupted share can therefore turn into a silently wrong mask, and the culprit is always one named site.
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from . import shamir
from .errors import AbortRound, Misbehaviour
from .messages import HASH_BYTES, SESSION_BYTES, ShareKind

_LABEL = b"fcd/secagg/v2/commit/"


def _hash(what: bytes, session_id: bytes, round_id: int, site: str, index: int, kind: ShareKind, value: bytes) -> bytes:
    if len(session_id) != SESSION_BYTES:
        raise ValueError(f"session id must be {SESSION_BYTES} bytes")
    raw = site.encode()
    h = hashlib.sha256(_LABEL + what)
    h.update(session_id + struct.pack(">QI", round_id, len(raw)) + raw + struct.pack(">IB", index, int(kind)) + value)
    return h.digest()


def secret_commitment(session_id: bytes, round_id: int, owner: str, kind: ShareKind, secret: bytes) -> bytes:
    """Commitment to one of ``owner``'s two shared secrets (s_u^SK for ``MASK_KEY``, b_u for ``SELF_MASK_SEED``)."""
    return _hash(b"secret", session_id, round_id, owner, 0, kind, secret)


def share_commitment(session_id: bytes, round_id: int, dealer: str, index: int, kind: ShareKind, share: bytes) -> bytes:
    """Commitment to the share of index ``index`` (1-based) of one of ``dealer``'s secrets."""
    return _hash(b"share", session_id, round_id, dealer, index, kind, share)


def commit_shares(
    session_id: bytes, round_id: int, dealer: str, s_shares: list[bytes], b_shares: list[bytes]
) -> tuple[tuple[bytes, bytes], ...]:
    """``(commitment of s-share j, commitment of b-share j)`` for j = 1..n, in index order."""
    return tuple(
        (
            share_commitment(session_id, round_id, dealer, j, ShareKind.MASK_KEY, s),
            share_commitment(session_id, round_id, dealer, j, ShareKind.SELF_MASK_SEED, b),
        )
        for j, (s, b) in enumerate(zip(s_shares, b_shares, strict=True), start=1)
    )


@dataclass(frozen=True)
class SecretId:
    """Which committed secret: one of ``owner``'s two secrets (``kind``) in one round of one session. Its commitment
    and every commitment to its shares are bound to exactly these four (:func:`secret_commitment`,
    :func:`share_commitment`)."""

    session_id: bytes
    round_id: int
    owner: str
    kind: ShareKind

    @property
    def what(self) -> str:
        return "mask key s_sk" if self.kind is ShareKind.MASK_KEY else "self-mask seed b"


def sort_shares(
    secret: SecretId, *, shares: Mapping[str, tuple[int, bytes]], share_commits: tuple[tuple[bytes, bytes], ...]
) -> tuple[list[tuple[int, bytes]], dict[str, str]]:
    """Split revealed shares into those that match the owner's commitments and the responders of the others.

    Returns:
        ``(index, share)`` of the correct shares in responder order, and ``{responder: reason}`` for the rest.
    """
    col = 0 if secret.kind is ShareKind.MASK_KEY else 1
    good: list[tuple[int, bytes]] = []
    bad: dict[str, str] = {}
    owner = secret.owner
    for responder in sorted(shares):
        index, share = shares[responder]
        ok = 1 <= index <= len(share_commits) and len(share) == shamir.SHARE_BYTES and (
            share_commitment(secret.session_id, secret.round_id, owner, index, secret.kind, share)
            == share_commits[index - 1][col]
        )
        if ok:
            good.append((index, share))
        else:
            bad[responder] = f"revealed a share of {owner!r}'s {secret.what} that does not match {owner!r}'s commitment"
    return good, bad


def check_secret(
    secret: SecretId, *, value: bytes, secret_commit: bytes, also_valid: Callable[[bytes], bool] | None = None
) -> None:
    """Raise :class:`Misbehaviour` naming the owner (the dealer) unless ``value`` is the secret it committed to."""
    if len(secret_commit) != HASH_BYTES or secret_commitment(
        secret.session_id, secret.round_id, secret.owner, secret.kind, value
    ) != secret_commit or (also_valid is not None and not also_valid(value)):
        why = f"dealt shares of its {secret.what} that do not rebuild the secret it committed to"
        raise Misbehaviour(f"{secret.owner!r} dealt inconsistent shares of its {secret.what}", {secret.owner: why})


def too_few(secret: SecretId, good: int, bad: Mapping[str, str], threshold: int) -> AbortRound:
    """The error for fewer than ``threshold`` correct shares: :class:`Misbehaviour` naming the senders of wrong ones."""
    if bad:
        return Misbehaviour(
            f"only {good} correct shares of {secret.owner!r}'s {secret.what}, threshold is {threshold}; corrupted by "
            f"{', '.join(repr(s) for s in sorted(bad))}",
            bad,
        )
    return AbortRound(f"only {good} shares of {secret.owner!r}'s {secret.what}, threshold is {threshold}")


def reconstruct(
    secret: SecretId,
    *,
    shares: Mapping[str, tuple[int, bytes]],
    share_commits: tuple[tuple[bytes, bytes], ...],
    secret_commit: bytes,
    threshold: int,
    also_valid: Callable[[bytes], bool] | None = None,
) -> tuple[bytes, dict[str, str]]:
    """Rebuild one of ``owner``'s secrets from the shares its peers revealed, checking every share and the result.

    Args:
        secret: Which secret is rebuilt: its owner (the dealer of the shares), kind (``MASK_KEY``: s_u^SK,
            ``SELF_MASK_SEED``: b_u), round and session.
        shares: responder -> (share index, share) as revealed in stage 4.
        share_commits: The owner's signed per-index share commitments (stage 0).
        secret_commit: The owner's signed commitment to this secret (stage 0).
        threshold: t of the round.
        also_valid: A further check of the rebuilt secret (s_u^SK: its public key is the advertised s_u^PK).

    Returns:
        The secret and ``{responder: reason}`` for every share that did not match its commitment and was left
        out (those responders are culprits even though the round goes on).

    Raises:
        Misbehaviour: Fewer than ``threshold`` correct shares remain (the responders of the wrong ones are named),
            or the correct shares do not rebuild the committed secret (the dealer, ``owner``, is named).
        AbortRound: Fewer than ``threshold`` shares arrived at all and none was wrong.
    """
    good, bad = sort_shares(secret, shares=shares, share_commits=share_commits)
    if len(good) < threshold:
        raise too_few(secret, len(good), bad, threshold)
    value = shamir.combine(good, threshold)
    try:
        check_secret(secret, value=value, secret_commit=secret_commit, also_valid=also_valid)
    except Misbehaviour as exc:
        raise Misbehaviour(str(exc), {**bad, **exc.culprits}) from None
    return value, bad
