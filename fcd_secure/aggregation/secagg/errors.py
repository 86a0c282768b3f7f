"""Errors of the secure-aggregation protocol.

Every failure a peer (or a lying server) can provoke surfaces as one of these, never as a bare
``KeyError``/``IndexError`` or a hang, so the carrier can turn it into a dropout or an aborted round.
"""

from __future__ import annotations


class SecAggError(Exception):
    """Base class of every secure-aggregation error."""


class ProtocolError(SecAggError):
    """A message is malformed, truncated, oversized, of the wrong type, or arrives in the wrong stage."""


class PolicyError(SecAggError):
    """The server asked for round parameters weaker than the site's pinned policy (DESIGN P3, P6, P10)."""


class AbortRound(SecAggError):
    """An honest party stops the round: inconsistent views, bad signatures, replay, too few survivors.

    Raised by a site when the server misbehaves (P1, P2, P5, P12) and by the server when fewer than the
    threshold of sites survive a stage (P8). After it, the party reveals nothing more for that round.
    """


class EncodingError(SecAggError):
    """An input vector does not fit the layout (unknown or private tensor name, wrong shape, non-finite)."""
