"""The coordinator's signature on a run start: sites check the run, not only the app (docs/threats.md P34).

A site's SuperExec runs only the app whose FAB hash the site pins (P27), but that says nothing about *who* started the
run or with *which* run config: anyone who reaches the Control API could rebuild the pinned app (its bytes are the
installed package's) and submit it with a run config of their own. So every run start carries a ticket in its run
config (entry :data:`RUN_TICKET_KEY`), signed with the coordinator's Ed25519 key::

    {"format": "fcd-run/2", "consortium_id", "app_fab_sha256", "session_id", "run_config_sha256", "issued",
     "expires"}

* ``consortium_id`` — the consortium; the app project binds it too (``engines.deployment.write_app_project``), so
  the pinned app hash differs between consortia;
* ``app_fab_sha256`` — the FAB the coordinator submitted; the site compares it with the bytes it received;
* ``session_id`` — 16 fresh random bytes (hex) per run start: the key a site's replay protection uses for this run
  (:func:`ticket_session_id`);
* ``run_config_sha256`` — SHA-256 of the exact ``fcd-config`` text that reaches the sites; the run config may hold
  nothing else but the ticket itself;
* ``issued``, ``expires`` — UTC times (ISO 8601); a party first accepts a run start only before ``expires``
  (:data:`RUN_START_VALID_S` after signing by default).

A signed run start is used once (docs/threats.md P52): a signature says who started the run and with what, not under
which Flower run id, so anyone who reached the Control API could resubmit a signed run config under a new run id and
every site ran it again as a fresh run (and the ServerApp overwrote the old run folder). So each party keeps the run
starts it accepted, session id -> Flower run id (:class:`AcceptedRuns`, a file in its own state): a session id seen
under another run id is refused, as is a ticket first seen after it expired; further tasks of an accepted run pass
(every round's task carries the same ticket). Entries are dropped a day after their ticket expired, when the expiry
alone refuses a replay, so the file stays bounded.

The signature is Ed25519 over SHA-256 of the canonical JSON of those fields (the audit ledgers' encoding,
``audit.signing.canonical``). :func:`verify_run_ticket` is the site's check (``engines.site_exec``) and the
ServerApp's (``apps.server_app``): an unsigned run, another signer, another consortium, another app or a changed
run config is refused, naming what differs.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

from fcd_secure._io import atomic_write_text
from fcd_secure.audit.signing import canonical, private_key, public_key_bytes, sign_hash, signature_ok
from fcd_secure.errors import FcdError
from fcd_secure.federation.records import RUN_CONFIG_KEY

#: The run-config entry that carries the ticket (the app project declares it, empty, next to ``fcd-config``).
RUN_TICKET_KEY = "fcd-run-ticket"
TICKET_FORMAT = "fcd-run/2"  # 2: issued/expires, single use (P52)
#: how long after signing a run start may first be accepted: the sites' executors receive its first task within
#: seconds of ``flwr run``; an hour leaves room for a slow start and a coordinator clock a little ahead
RUN_START_VALID_S = 3600.0
#: how long an accepted run start is remembered after its expiry (clock skew between the coordinator and a site)
FORGET_AFTER_S = 86400.0
#: the file, in a party's own state folder, that holds the run starts it accepted
ACCEPTED_RUNS_FILE = "accepted_runs.json"
#: Environment variables through which ``fcd server start`` (and a local deployment) tell the ServerApp which
#: coordinator key and consortium a run must be signed for (the SuperLink's executor passes its environment on).
COORDINATOR_KEY_ENV = "FCD_COORDINATOR_PUBLIC_KEY"
CONSORTIUM_ENV = "FCD_CONSORTIUM_ID"


class RunTicketError(FcdError, ValueError):
    """A run start without a valid coordinator signature, or one signed for another consortium, app or config."""


@dataclass(frozen=True)
class RunTicket:
    """The signed fields of a run start (module docstring)."""

    consortium_id: str
    app_fab_sha256: str
    session_id: str
    run_config_sha256: str
    issued: str
    expires: str
    format: str = TICKET_FORMAT

    def digest(self) -> str:
        return hashlib.sha256(canonical(asdict(self))).hexdigest()


def config_digest(run_config_text: str) -> str:
    """SHA-256 (hex) of the ``fcd-config`` text as it reaches the sites."""
    return hashlib.sha256(run_config_text.encode("utf-8")).hexdigest()


def _utc(seconds_from_now: float = 0.0) -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC) + datetime.timedelta(seconds=seconds_from_now)


def sign_run_ticket(key: bytes, *, consortium_id: str, app_fab_sha256: str, run_config_text: str,
                    session_id: str | None = None, valid_s: float = RUN_START_VALID_S) -> str:
    """The ticket entry (JSON text) of a run start, signed with the coordinator's raw Ed25519 private ``key``.

    Args:
        key: the coordinator's signing key.
        consortium_id: the consortium the run belongs to.
        app_fab_sha256: SHA-256 of the FAB that is submitted.
        run_config_text: the exact ``fcd-config`` value of the submitted run config.
        session_id: the run's session id (hex); a fresh 16 random bytes when omitted.
        valid_s: seconds from now until a party no longer first accepts it (``expires``).
    """
    now = _utc()
    ticket = RunTicket(consortium_id, app_fab_sha256, session_id or os.urandom(16).hex(),
                       config_digest(run_config_text), now.isoformat(timespec="microseconds"),
                       (now + datetime.timedelta(seconds=valid_s)).isoformat(timespec="microseconds"))
    return json.dumps({"ticket": asdict(ticket), "signer": public_key_bytes(key).hex(),
                       "sig": sign_hash(private_key(key), ticket.digest())}, sort_keys=True)


def _parse(text: object) -> tuple[RunTicket, str, str]:
    if not isinstance(text, str) or not text:
        raise RunTicketError(f"the run carries no coordinator signature (run config entry {RUN_TICKET_KEY!r})")
    try:
        doc = json.loads(text)
        ticket = RunTicket(**doc["ticket"])
        return ticket, str(doc["signer"]), str(doc["sig"])
    except (json.JSONDecodeError, KeyError, TypeError):
        raise RunTicketError(f"run config entry {RUN_TICKET_KEY!r} is not a run ticket") from None


def ticket_session_id(run_config: Mapping[str, object] | None) -> str | None:
    """The session id of the run's ticket (hex), or ``None`` when the run carries none (simulation, in-process).

    Read it only where the ticket was verified for this run (a deployed site's executor verifies it before the
    ClientApp runs; the ServerApp verifies it before the first message): it is then the coordinator's signed, fresh
    session id of this run start.
    """
    raw = (run_config or {}).get(RUN_TICKET_KEY)
    if not raw:
        return None
    try:
        return _parse(raw)[0].session_id
    except RunTicketError:
        return None


def verify_run_ticket(run_config: Mapping[str, object], *, coordinator_public_key: str, consortium_id: str | None,
                      fab_sha256: str | None) -> RunTicket:
    """Check that the coordinator signed this run start as it reached us.

    Args:
        run_config: the run config the run carries (``Context.run_config``).
        coordinator_public_key: the coordinator's Ed25519 public key (hex) this party pins.
        consortium_id: the consortium this party belongs to (``None``: not checked).
        fab_sha256: SHA-256 of the FAB this party received (``None``: not checked, the ServerApp's case).

    Returns:
        The verified ticket.

    Raises:
        RunTicketError: no ticket, a run-config entry beside the signed ones, another signer, a bad signature, another
            consortium or app, or a run config other than the signed one (the message says which).
    """
    ticket, signer, sig = _parse(run_config.get(RUN_TICKET_KEY))
    extra = sorted(set(run_config) - {RUN_CONFIG_KEY, RUN_TICKET_KEY})
    if extra:
        raise RunTicketError(f"the run config holds entries the coordinator did not sign: {extra}")
    if signer != coordinator_public_key.lower():
        raise RunTicketError("the run was signed by another key than the consortium's coordinator")
    if ticket.format != TICKET_FORMAT or not signature_ok(bytes.fromhex(signer), ticket.digest(), sig):
        raise RunTicketError("the coordinator's signature on the run does not verify (the ticket was changed)")
    if consortium_id is not None and ticket.consortium_id != consortium_id:
        raise RunTicketError(f"the run was signed for consortium {ticket.consortium_id!r}, not {consortium_id!r}")
    if fab_sha256 is not None and ticket.app_fab_sha256 != fab_sha256:
        raise RunTicketError(f"the run was signed for app {ticket.app_fab_sha256[:16]}, not the app received "
                             f"({fab_sha256[:16]})")
    if ticket.run_config_sha256 != config_digest(str(run_config.get(RUN_CONFIG_KEY) or "")):
        raise RunTicketError("the run config that arrived is not the one the coordinator signed")
    return ticket


class AcceptedRuns:
    """The signed run starts one party accepted (module docstring, P52): ``session id -> Flower run id`` in
    ``<state folder>/accepted_runs.json``, read and written under an exclusive ``flock`` (a site's tasks run in
    separate processes)."""

    def __init__(self, folder: str | Path) -> None:
        self.path = Path(folder) / ACCEPTED_RUNS_FILE

    def accept(self, ticket: RunTicket, run_id: int, now: datetime.datetime | None = None) -> None:
        """Record that this party runs ``ticket`` as Flower run ``run_id``, or refuse.

        Raises:
            RunTicketError: the ticket's session id was accepted under another run id (a replayed run start), or it
                is first seen after it expired (or carries no readable expiry).
        """
        now = now or _utc()
        try:
            expires = datetime.datetime.fromisoformat(ticket.expires)
        except (TypeError, ValueError):
            raise RunTicketError("the run start carries no readable expiry") from None
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path.with_suffix(".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            seen = self._read()
            earlier = seen.get(ticket.session_id)
            if earlier is not None:
                if int(earlier["run_id"]) != int(run_id):
                    raise RunTicketError(
                        f"this signed run start was already used by run {earlier['run_id']} (accepted "
                        f"{earlier['accepted']}); a run start is used once: the coordinator signs a new one")
                return
            if now >= expires:
                raise RunTicketError(f"the signed run start expired at {ticket.expires} (now {now.isoformat()}); "
                                     "the coordinator signs a new one")
            keep = {sid: e for sid, e in seen.items()
                    if datetime.datetime.fromisoformat(e["expires"]) + datetime.timedelta(seconds=FORGET_AFTER_S) > now}
            keep[ticket.session_id] = {"run_id": int(run_id), "accepted": now.isoformat(), "expires": ticket.expires}
            atomic_write_text(self.path, json.dumps(keep, indent=1, sort_keys=True) + "\n")

    def _read(self) -> dict[str, dict]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError):
            # a record that cannot be read cannot say a run start is new: refuse every run until it is looked at
            raise RunTicketError(f"{self.path}: the record of accepted run starts is unreadable") from None
        if not isinstance(data, dict):
            raise RunTicketError(f"{self.path}: the record of accepted run starts is not a JSON object")
        return data
