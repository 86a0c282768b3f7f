"""An in-memory driver of one secure-aggregation round: every site in this process, bytes passed by hand.

Used by the tests (attacks are injected by rewriting the server's requests), by ``benchmarks/secagg.py``
and as the reference of what a carrier (``federation.secure.flow`` / ``apps.secure_site``) must do per stage.
No Flower here. A plain module beside the tests (``from secagg_harness import ...``), not part of the package.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

import numpy as np

from fcd_secure.aggregation.secagg import keys
from fcd_secure.aggregation.secagg.client import SecAggClient
from fcd_secure.aggregation.secagg.config import SecAggPolicy
from fcd_secure.aggregation.secagg.encoding import Aggregate, VectorLayout, encode, theta_hash
from fcd_secure.aggregation.secagg.errors import SecAggError
from fcd_secure.aggregation.secagg.server import STAGES, SecAggServer
from fcd_secure.manifest import THETA_C, THETA_S, Manifest, ManifestEntry

__all__ = ["STAGES", "RoundLog", "ToyRound", "make_clients", "make_identities", "run_round", "toy_manifest", "toy_round"]

#: rewrite(stage, site, request) -> request: how a test plays a lying server
Rewrite = Callable[[str, str, bytes], bytes]


@dataclass
class RoundLog:
    """Everything that crossed the wire, and what each party spent."""

    downlink: dict[str, list[bytes]] = field(default_factory=dict)
    uplink: dict[str, list[bytes]] = field(default_factory=dict)
    refused: dict[str, SecAggError] = field(default_factory=dict)  # site -> why it stopped
    client_seconds: dict[str, float] = field(default_factory=dict)
    server_seconds: float = 0.0

    def uplink_bytes(self) -> int:
        return sum(len(b) for msgs in self.uplink.values() for b in msgs)


def toy_manifest(entries: Iterable[tuple[str, tuple[int, ...], str]]) -> Manifest:
    """A float32 manifest from ``(name, shape, part)`` triples, in the given order."""
    return Manifest.from_entries(ManifestEntry(name=n, shape=tuple(s), dtype="float32", part=p) for n, s, p in entries)


def make_identities(site_ids: list[str]) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """(private identity keys, roster of public keys) for a set of sites."""
    priv = {s: keys.ed25519_keypair()[0] for s in site_ids}
    return priv, {s: keys.ed25519_public(k) for s, k in priv.items()}


def make_clients(
    policy: SecAggPolicy,
    layout: VectorLayout,
    updates: Mapping[str, tuple[Mapping[str, np.ndarray], int]],
    identities: Mapping[str, bytes],
    roster: Mapping[str, bytes],
    global_theta: Mapping[str, np.ndarray] | None = None,
    metrics: Mapping[str, Mapping[str, float]] | None = None,
) -> dict[str, SecAggClient]:
    gh = theta_hash(layout, global_theta) if global_theta is not None else bytes(32)
    out = {}
    for s, (arrays, n) in updates.items():
        c = SecAggClient(s, identities[s], roster, policy, layout)
        c.set_input(encode(layout, policy, arrays, n, (metrics or {}).get(s)), gh)
        out[s] = c
    return out


def run_round(
    server: SecAggServer,
    clients: Mapping[str, SecAggClient],
    drop: Mapping[str, set[str]] | None = None,
    rewrite: Rewrite | None = None,
    log: RoundLog | None = None,
) -> Aggregate:
    """Drive all five stages. ``drop[stage]``: sites that stay silent from that stage on. A site whose
    ``handle`` raises is recorded in ``log.refused`` and treated as silent. Raises what the server raises."""
    drop = drop or {}
    log = log if log is not None else RoundLog()
    gone: set[str] = set()
    t0 = time.perf_counter()
    requests = server.start()
    log.server_seconds += time.perf_counter() - t0
    for stage in STAGES:
        gone |= set(drop.get(stage, ()))
        for site, req in requests.items():
            if site in gone or site in log.refused:
                continue
            if rewrite is not None:
                req = rewrite(stage, site, req)
            log.downlink.setdefault(site, []).append(req)
            t = time.perf_counter()
            try:
                reply = clients[site].handle(req)
            except SecAggError as exc:
                log.refused[site] = exc
                continue
            finally:
                log.client_seconds[site] = log.client_seconds.get(site, 0.0) + time.perf_counter() - t
            log.uplink.setdefault(site, []).append(reply)
            t = time.perf_counter()
            try:
                server.collect(site, reply)
            except SecAggError:
                pass  # the server records it as a dropout
            log.server_seconds += time.perf_counter() - t
        t = time.perf_counter()
        requests = server.advance()
        log.server_seconds += time.perf_counter() - t
    t = time.perf_counter()
    agg = server.finish()
    log.server_seconds += time.perf_counter() - t
    return agg


@dataclass
class ToyRound:
    policy: SecAggPolicy
    layout: VectorLayout
    identities: dict[str, bytes]
    roster: dict[str, bytes]
    updates: dict[str, tuple[dict[str, np.ndarray], int]]
    global_theta: dict[str, np.ndarray]
    server: SecAggServer
    clients: dict[str, SecAggClient]

    def fresh(self, round_id: int, session_id: bytes | None = None) -> "ToyRound":
        """The same sites and inputs in a new round (new server, new client state machines)."""
        server = SecAggServer(self.policy, self.layout, list(self.updates), round_id=round_id,
                              session_id=session_id if session_id is not None else self.server.params.session_id,
                              roster=self.roster)
        clients = make_clients(self.policy, self.layout, self.updates, self.identities, self.roster, self.global_theta)
        return ToyRound(self.policy, self.layout, self.identities, self.roster, self.updates, self.global_theta, server, clients)


def toy_round(
    n_sites: int = 5,
    d: int = 64,
    seed: int = 0,
    policy: SecAggPolicy | None = None,
    round_id: int = 1,
    scale: float = 1.0,
) -> ToyRound:
    """n sites with seeded random Θc updates (one tensor ``w`` of d values plus a Θs tensor in the manifest)."""
    policy = policy or SecAggPolicy(max_weight=1000)
    manifest = toy_manifest([("w", (d,), THETA_C), ("bias", (3,), THETA_C), ("site_head", (4,), THETA_S)])
    layout = VectorLayout.from_manifest(manifest)
    rng = np.random.default_rng(seed)
    sites = [f"site{i:02d}" for i in range(n_sites)]
    updates = {
        s: (
            {"w": (rng.normal(size=d) * scale).astype(np.float32), "bias": rng.normal(size=3).astype(np.float32)},
            int(rng.integers(1, policy.max_weight + 1)),
        )
        for s in sites
    }
    global_theta = {"w": np.zeros(d, np.float32), "bias": np.zeros(3, np.float32)}
    identities, roster = make_identities(sites)
    server = SecAggServer(policy, layout, sites, round_id=round_id, roster=roster)
    clients = make_clients(policy, layout, updates, identities, roster, global_theta)
    return ToyRound(policy, layout, identities, roster, updates, global_theta, server, clients)
