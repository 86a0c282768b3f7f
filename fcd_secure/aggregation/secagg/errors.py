"""Errors of the secure-aggregation protocol.

Every failure a peer (or a lying server) can provoke surfaces as one of these, never as a bare
``KeyError``/``IndexError`` or a hang, so the carrier can turn it into a dropout or an aborted round.
"""

from __future__ import annotations

from collections.abc import Mapping
from fcd_secure.errors import FcdError


class SecAggError(FcdError, Exception):
    """Base class of every secure-aggregation error."""


class ProtocolError(SecAggError):
    """A message is malformed, truncated, oversized, of the wrong type, or arrives in the wrong stage."""


class PolicyError(SecAggError):
    """The server asked for round parameters weaker than the site's pinned policy (docs/threats.md P3, P6, P10)."""


class AbortRound(SecAggError):
    """An honest party stops the round: inconsistent views, bad signatures, replay, too few survivors.

    Raised by a site when the server misbehaves (P1, P2, P5, P12, P19) and by the server when fewer than the
    threshold of sites survive a stage (P8). After it, the party reveals nothing more for that round.
    """


class Misbehaviour(AbortRound):
    """A named site broke the protocol in a way the party that raises it can check (docs/threats.md P26).

    Examples: a revealed Shamir share that does not match the commitment its dealer signed in the advertise
    stage (the responder is named), committed shares that do not reconstruct the committed secret (the dealer
    is named), a share received in stage 2 that differs from its dealer's commitment (the dealer is named).

    Attributes:
        culprits: site id -> what that site did.
    """

    def __init__(self, message: str, culprits: Mapping[str, str]) -> None:
        super().__init__(message)
        self.culprits = dict(culprits)


class BoundViolation(AbortRound):
    """The unmasked sum is outside what the selected sites' clipped, site-pinned inputs can add up to (P26).

    The server sees only the sum, so it cannot say which site sent the out-of-range input; the round is aborted
    and the global model stays unchanged.
    """


class EncodingError(SecAggError):
    """An input vector does not fit the layout (unknown or private tensor name, wrong shape, non-finite)."""
