"""Persistent state on disk: one directory per site, keyed by the site's identity, and the server checkpoint.

Flower keeps ``Context.state`` only in SuperNode memory and loses it on a restart; node ids are random per run
(the pinned Flower's ``Context.state``, :data:`fcd_secure._flower.pins.FLWR_VERSION`). Everything a site must not lose therefore lives here, under
``<state_root>/<site_id>/``, written atomically (``fcd_secure._io.atomic_write_bytes``: temp file, ``fsync``,
``os.replace``) so a kill at any moment leaves either the old or the new file, never half of one:

============================  ===========================================================================
``site_state.npz``            Θs_i (never leaves the site), optimiser state, RNG state, last finished round
                              and manifest layout hash: one file, so one ``os.replace`` commits a round
``site_state.prev.npz``       the same as it was before the last finished round
``identity_ed25519.key``      the site's Ed25519 identity key (raw 32 bytes, mode 0600), created on first use by
                              the same function as the server's (``fcd_secure.audit.load_or_create_identity_key``)
``slots/<name>``              opaque slots for other layers (DP ledger, audit ledger, secure-aggregation keys)
============================  ===========================================================================

Re-running a round the server never saw finish (server killed after the site committed but before the server's
checkpoint) must not train Θs twice: ``begin_round(r)`` returns the ``.prev`` snapshot when the site already
finished round ``r``, so the resumed run equals an uninterrupted one.

The server checkpoint (``<state_root>/_server/checkpoint.npz``): global Θc, the last finished round, the sampler's
RNG state and the config hash, written after every finished round.

A site's name for the run it is serving, :func:`session_id_of`, keys the replay counters of secure aggregation
(``apps.secure_site``, P30): within a session rounds are taken once and in order; a new session starts fresh.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from fcd_secure._io import FileKept, atomic_write_bytes, npz_bytes, read_npz
from fcd_secure.audit import load_or_create_identity_key
from fcd_secure.errors import FcdError

SERVER_DIR = "_server"
STATE_FILE = "site_state.npz"
PREV_FILE = "site_state.prev.npz"
IDENTITY_FILE = "identity_ed25519.key"
_SITE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


#: bytes of a session id (the protocol header's session field has the same width)
SESSION_BYTES = 16


def run_config_hash(run_config: Mapping[str, object]) -> str:
    """SHA-256 (hex) of a run config as a site received it (Flower's ``Context.run_config``; in deployment it holds the
    resolved ``RunConfig`` under ``fcd-config``): canonical JSON, keys sorted, so equal configs hash equal."""
    doc = json.dumps({str(k): run_config[k] for k in run_config}, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(doc.encode("utf-8")).hexdigest()


def session_id_of(run_id: int, config_hash: str) -> bytes:
    """The site's own name for one run: 16 bytes of SHA-256 over the Flower run id and the hash of the run config it
    received (:func:`run_config_hash`). Secure aggregation keys its replay counters by it (P30): the same run (a
    replayed session) continues its counters, any other run starts fresh. The server never chooses it: it is derived
    on the site from what every message of the run carries.

    This is the one place a site names a session. In a deployment the run config carries the coordinator's signed run
    start (``federation.run_ticket``, P34: a fresh random session id, checked by the site's executor before the
    ClientApp runs), so the hash covers that signed id: every signed run start is a new session, and a replayed one
    (same ticket, same config, same run) is the same session. ``run_ticket.ticket_session_id`` reads the signed id.

    Args:
        run_id: Flower's run id (``Context.run_id``), an unsigned 64-bit integer.
        config_hash: :func:`run_config_hash` of the run config.
    """
    h = hashlib.sha256(b"fcd/session/v1\0" + int(run_id).to_bytes(8, "big") + str(config_hash).encode("ascii"))
    return h.digest()[:SESSION_BYTES]


class StateError(FcdError, RuntimeError):
    """State on disk that cannot be used (corrupt file, different model layout, bad site id)."""


#: the arrays of each state file as this process last read them (:class:`~fcd_secure._io.FileKept`; every commit
#: replaces the file): a site reads its state on several messages of a round (the egress gate's current Θs, the
#: round's snapshot, the layout check), and each read of a tiny model's file cost 26 ms where a copy costs 0.3 ms
_STATE_FILES: FileKept[dict[str, np.ndarray]] = FileKept(32)


def _read_state_file(path: Path) -> dict[str, np.ndarray]:
    """Every array of a state file, a copy of its own for the caller; :class:`StateError` naming the file if it
    cannot be read."""
    try:
        kept = _STATE_FILES.get(path, lambda: read_npz(path))
    except (OSError, ValueError) as exc:
        raise StateError(f"{path}: unreadable state file ({exc})") from None
    return {k: v.copy() for k, v in kept.items()}


def check_site_id(site_id: str) -> str:
    if not isinstance(site_id, str) or not _SITE_ID_RE.match(site_id) or site_id == SERVER_DIR:
        raise StateError(f"invalid site id {site_id!r}: use 1-64 characters [A-Za-z0-9._-], not starting with '.'")
    return site_id


@dataclass(frozen=True)
class SiteSnapshot:
    """One committed training state of a site."""

    theta_s: dict[str, np.ndarray]
    optimizer_state: bytes | None
    rng_state: bytes | None
    last_round: int
    layout_hash: str


class SiteState:
    """The on-disk state of one site (see the module docstring for the files)."""

    def __init__(self, root: str | Path, site_id: str) -> None:
        self.site_id = check_site_id(site_id)
        self.dir = Path(root) / site_id
        self.dir.mkdir(parents=True, exist_ok=True)

    # -- generic helpers -----------------------------------------------------------------------------
    def path(self, name: str) -> Path:
        return self.dir / name

    def slot(self, name: str) -> Path:
        """A path other layers own inside this site's directory (e.g. ``slot("dp_ledger.json")``)."""
        if "/" in name or name.startswith("."):
            raise StateError(f"invalid slot name {name!r}")
        (self.dir / "slots").mkdir(exist_ok=True)
        return self.dir / "slots" / name

    # -- the training state: one file, one atomic commit ----------------------------------------------
    def load(self) -> SiteSnapshot | None:
        """The state after the last finished round, or None for a site that never trained."""
        return self._read(self.path(STATE_FILE))

    def _read(self, p: Path) -> SiteSnapshot | None:
        if not p.exists():
            return None
        z = _read_state_file(p)
        if "__meta__" not in z:
            raise StateError(f"{p}: not a site state file")
        meta = json.loads(z.pop("__meta__").tobytes().decode())
        opt = z.pop("__optimizer__", None)
        rng = z.pop("__rng__", None)
        return SiteSnapshot(
            theta_s={k[len("theta_s/"):]: v for k, v in z.items() if k.startswith("theta_s/")},
            optimizer_state=None if opt is None else opt.tobytes(),
            rng_state=None if rng is None else rng.tobytes(),
            last_round=int(meta["last_round"]),
            layout_hash=str(meta["layout_hash"]),
        )

    @property
    def last_round(self) -> int:
        snap = self.load()
        return 0 if snap is None else snap.last_round

    def check_layout(self, layout_hash: str) -> None:
        """Refuse state written for a different model layout (a silent mismatch would corrupt Θs)."""
        snap = self.load()
        if snap is not None and snap.layout_hash != layout_hash:
            raise StateError(
                f"{self.dir}: state was written for model layout {snap.layout_hash[:12]}, this run uses "
                f"{layout_hash[:12]}; use a fresh state directory"
            )

    def begin_round(self, server_round: int) -> SiteSnapshot | None:
        """The state to train ``server_round`` from.

        Normally the current state. If this site already finished ``server_round`` (the server crashed before its
        checkpoint and replays the round), the snapshot taken before that round, so Θs is not trained twice.
        """
        snap = self.load()
        if snap is None or server_round > snap.last_round:
            return snap
        prev = self._read(self.path(PREV_FILE))
        prev_round = 0 if prev is None else prev.last_round
        if server_round != snap.last_round or prev_round >= server_round:
            raise StateError(
                f"{self.dir}: asked to train round {server_round} but the site already finished round "
                f"{snap.last_round}; only the last round can be replayed"
            )
        return prev

    def commit(
        self,
        server_round: int,
        layout_hash: str,
        theta_s: dict[str, np.ndarray],
        optimizer_state: bytes | None = None,
        rng_state: bytes | None = None,
    ) -> None:
        """Save the state after training ``server_round`` in one atomic write; keep the state it replaces as
        the ``.prev`` snapshot (unless this is a replay of the same round, whose predecessor is already there)."""
        cur = self.path(STATE_FILE)
        snap = self.load()
        if snap is not None and snap.last_round < server_round:
            atomic_write_bytes(self.path(PREV_FILE), cur.read_bytes())
        arrays: dict[str, np.ndarray] = {f"theta_s/{k}": np.asarray(v) for k, v in theta_s.items()}
        meta = {"site_id": self.site_id, "last_round": int(server_round), "layout_hash": layout_hash}
        arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        if optimizer_state is not None:
            arrays["__optimizer__"] = np.frombuffer(optimizer_state, dtype=np.uint8)
        if rng_state is not None:
            arrays["__rng__"] = np.frombuffer(rng_state, dtype=np.uint8)
        atomic_write_bytes(cur, npz_bytes(arrays))

    # -- identity ------------------------------------------------------------------------------------
    def identity_private_key(self) -> bytes:
        """Raw 32-byte Ed25519 private key of this site, created (from the OS CSPRNG, mode 0600) on first use."""
        return load_or_create_identity_key(self.path(IDENTITY_FILE))


class ServerCheckpoint:
    """Global Θc + last finished round + sampler RNG state, one atomic file per run state root."""

    def __init__(self, root: str | Path) -> None:
        self.path = Path(root) / SERVER_DIR / "checkpoint.npz"

    def exists(self) -> bool:
        return self.path.exists()

    def save(self, server_round: int, theta_c: dict[str, np.ndarray], sampler_state: dict, config_hash: str, extra: dict | None = None) -> None:
        meta = {"round": int(server_round), "sampler": sampler_state, "config_hash": config_hash, "extra": extra or {}}
        arrays = {f"theta/{k}": v for k, v in theta_c.items()}
        arrays["__meta__"] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
        atomic_write_bytes(self.path, npz_bytes(arrays))

    def load(self) -> tuple[int, dict[str, np.ndarray], dict, str, dict]:
        z = _read_state_file(self.path)
        if "__meta__" not in z:
            raise StateError(f"{self.path}: not a server checkpoint")
        meta = json.loads(z.pop("__meta__").tobytes().decode())
        theta = {k[len("theta/"):]: v for k, v in z.items() if k.startswith("theta/")}
        return int(meta["round"]), theta, meta["sampler"], meta["config_hash"], meta.get("extra", {})
