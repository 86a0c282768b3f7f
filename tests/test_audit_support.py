"""Shared fixtures for the audit tests: real Flower messages, real Ed25519 keys, real ledgers on disk.

No test lives here; the helpers are imported by ``test_audit_*.py`` (pytest puts this directory on ``sys.path``).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, Metadata, MetricRecord, RecordDict

from fcd_secure.audit import (
    RECEIPTS_MESSAGE_TYPE,
    GatePolicy,
    ServerAudit,
    SiteAuditContext,
    SiteLedger,
    load_or_create_identity_key,
    make_egress_gate,
)
from fcd_secure.audit.history import ThetaSHistory
from fcd_secure.manifest import Manifest, ManifestEntry

MANIFEST = Manifest.from_entries(
    [
        ManifestEntry(name="trunk.weight", shape=(6, 4), dtype="float32", part="theta_c"),
        ManifestEntry(name="trunk.bias", shape=(6,), dtype="float32", part="theta_c"),
        ManifestEntry(name="decoder.weight", shape=(3, 6), dtype="float32", part="theta_c"),
        ManifestEntry(name="eps_s.weight", shape=(6, 4), dtype="float32", part="theta_s"),
        ManifestEntry(name="ks_head.bias", shape=(5,), dtype="float32", part="theta_s"),
    ]
)
POLICY = GatePolicy(allowed_metrics=frozenset({"num/n", "metrics/loss"}))


def raw_key() -> bytes:
    return Ed25519PrivateKey.generate().private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())


def instruction(message_type: str = "train", round: int = 1, node_id: int = 11, message_id: str | None = None, content=None) -> Message:
    """A server->site message as the SuperNode hands it to the ClientApp (metadata set, as the runtime does)."""
    md = Metadata(
        run_id=7,
        message_id=message_id or f"ins-{message_type}-{round}-{node_id}-{time.monotonic_ns()}",
        src_node_id=0,
        dst_node_id=node_id,
        reply_to_message_id="",
        group_id=str(round),
        created_at=time.time(),
        ttl=3600.0,
        message_type=message_type,
    )
    return Message(metadata=md, content=content if content is not None else RecordDict({"config": ConfigRecord({"server-round": round})}))


def context(node_id: int = 11) -> Context:
    return Context(run_id=7, node_id=node_id, node_config={"partition-id": 0}, state=RecordDict(), run_config={})


class Site:
    """One site: Θs/Θc arrays, propensities, a ledger and the gate bound to them."""

    def __init__(
        self, root: Path, site_id: str = "site-00", seed: int = 0, policy: GatePolicy = POLICY, manifest: Manifest = MANIFEST
    ) -> None:
        self.rng = np.random.default_rng(seed)
        self.key = load_or_create_identity_key(root / site_id / "identity_ed25519.key")  # beside the ledger, as on a site
        self.site_id = site_id
        self.manifest = manifest
        self.theta_s = {e.name: self.rng.standard_normal(e.shape).astype(np.float32) for e in manifest.entries if e.part == "theta_s"}
        self.P = self.rng.uniform(0.05, 1.0, size=(20, 8)).astype(np.float32)
        self.ledger = SiteLedger.open(root / site_id, self.key, site_id)
        self.ctx = SiteAuditContext(
            site_id=site_id,
            manifest=manifest,
            theta_s=lambda: self.theta_s,
            ledger=self.ledger,
            policy=policy,
            propensities=lambda: self.P,
            privacy_ledger_hash=lambda: "ab" * 32,
            theta_s_history=ThetaSHistory(root / site_id / "theta_s_history.npz"),
        )
        self.gate = make_egress_gate(lambda c: self.ctx)

    def theta_c(self) -> dict[str, np.ndarray]:
        return {e.name: self.rng.standard_normal(e.shape).astype(np.float32) for e in self.manifest.entries if e.part == "theta_c"}

    def train_handler(self, mutate=None):
        """A handler returning Θc + sample count + loss, optionally mutated to plant a leak."""

        def handler(msg: Message, ctx: Context) -> Message:
            content = {
                "update": ArrayRecord({k: Array(v) for k, v in sorted(self.theta_c().items())}),
                "num": MetricRecord({"n": 20}),
                "metrics": MetricRecord({"loss": 0.25}),
            }
            if mutate is not None:
                mutate(content)
            return Message(RecordDict(content), reply_to=msg)

        return handler

    def send(self, msg: Message, handler=None) -> Message:
        return self.gate(msg, context(msg.metadata.dst_node_id), handler or self.train_handler())


class Server:
    """The server side as the ServerApp wires it: :class:`ServerAudit` records replies and returns receipts."""

    def __init__(self, root: Path) -> None:
        self.key = load_or_create_identity_key(root / "server" / "identity_ed25519.key")
        self.audit = ServerAudit(root / "server" / "audit", self.key)
        self.ledger = self.audit.ledger
        self.audit.record_manifest(MANIFEST)
        self._final: dict | None = None

    def receive(self, reply: Message, site_id: str) -> dict:
        return self.audit.on_reply(reply, site_id)

    def downlink(self, message_type: str, round: int, node_id: int) -> Message:
        if message_type == RECEIPTS_MESSAGE_TYPE:
            # the ServerApp sends the closing message to every owed node at once; final_contents pops them all
            if self._final is None:
                self._final = self.audit.final_contents()
            content = self._final.get(node_id, RecordDict())
        else:
            content = self.audit.attach(node_id, RecordDict({"config": ConfigRecord({"server-round": round})}))
        return instruction(message_type, round, node_id, content=content)


def run_rounds(root: Path, n_sites: int = 2, rounds: int = 3) -> tuple[list[Site], Server]:
    """A small federation driven by hand: every reply goes through a site's gate, the server receipts it, receipts
    ride on the next downlink and a final receipts message closes the last round."""
    sites = [Site(root, f"site-{i:02d}", seed=i) for i in range(n_sites)]
    server = Server(root)
    for r in range(1, rounds + 1):
        for i, s in enumerate(sites):
            reply = s.send(server.downlink("train", r, 100 + i))
            assert reply.has_content()
            server.receive(reply, s.site_id)
    close_run(sites, server, rounds, [100 + i for i in range(n_sites)])
    return sites, server


def close_run(sites: list[Site], server: Server, last_round: int, node_ids: list[int]) -> None:
    """The closing receipts message to every site, its acknowledgement back, and the server's last checkpoint."""
    for s, node in zip(sites, node_ids):
        ack = s.send(server.downlink(RECEIPTS_MESSAGE_TYPE, last_round, node), handler=lambda m, c: None)
        assert ack.has_content()
        server.receive(ack, s.site_id)
    server.audit.close()


def fingerprints(sites, server) -> tuple[list[str], list[str]]:
    return [s.ledger.fingerprint for s in sites], [server.ledger.fingerprint]
