"""Pairwise-masked secure aggregation of Θc (Bonawitz et al., CCS 2017, double masking, active model).

Pure Python over bytes and numpy: no Flower import anywhere in this package (``federation.secure.flow`` and
``apps.secure_site`` only carry its messages; the in-memory test driver is ``tests/secagg_harness.py``). Modules:

- :mod:`.config`    site-pinned :class:`SecAggPolicy` (at least 4 sites, t >= floor(2n/3) + 1, modulus, clip, deadlines)
- :mod:`.encoding`  vector layout from the Θc manifest, fixed point with clipping, decode to weighted FedAvg
- :mod:`.bounds`    what one encoded input and the unmasked sum of n inputs may hold (site and server checks)
- :mod:`.keys`      X25519 + HKDF-SHA256 with bound info, Ed25519 site identity
- :mod:`.masks`     AES-128-CTR keystream masks over uint32 words, chunked into a reused buffer
- :mod:`.shamir`    t-of-n sharing of 32-byte secrets (pycryptodome, GF(2^128) halves)
- :mod:`.commitments` signed commitments to each secret and share; reconstruction that names a corrupted share
- :mod:`.messages`  strict versioned byte encodings; parsers raise :class:`ProtocolError`
- :mod:`.client`, :mod:`.server`  the two state machines
- :mod:`.errors`    the protocol's errors (:class:`ProtocolError`, :class:`PolicyError`, :class:`AbortRound`)
"""

from .client import ClientStage, ReplayGuard, SecAggClient
from .config import MIN_SITES, SecAggPolicy, StageDeadlines
from .encoding import Aggregate, VectorLayout, decode, encode, plaintext_weighted_mean, quantisation_bound, theta_hash
from .errors import AbortRound, BoundViolation, EncodingError, Misbehaviour, PolicyError, ProtocolError, SecAggError
from .keys import ed25519_keypair, ed25519_public
from .server import RoundReport, SecAggServer, ServerStage

__all__ = [
    "MIN_SITES",
    "AbortRound",
    "Aggregate",
    "BoundViolation",
    "ClientStage",
    "EncodingError",
    "Misbehaviour",
    "PolicyError",
    "ProtocolError",
    "ReplayGuard",
    "RoundReport",
    "SecAggClient",
    "SecAggError",
    "SecAggPolicy",
    "SecAggServer",
    "ServerStage",
    "StageDeadlines",
    "VectorLayout",
    "decode",
    "ed25519_keypair",
    "ed25519_public",
    "encode",
    "plaintext_weighted_mean",
    "quantisation_bound",
    "theta_hash",
]
