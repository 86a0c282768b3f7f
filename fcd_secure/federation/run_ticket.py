"""The coordinator's signature on a run start: sites check the run, not only the app (docs/threats.md P34).

A site's SuperExec runs only the app whose FAB hash the site pins (P27), but that says nothing about *who* started the
run or with *which* run config: anyone who reaches the Control API could rebuild the pinned app (its bytes are the
installed package's) and submit it with a run config of their own. So every run start carries a ticket in its run
config (entry :data:`RUN_TICKET_KEY`), signed with the coordinator's Ed25519 key::

    {"format": "fcd-run/1", "consortium_id", "app_fab_sha256", "session_id", "run_config_sha256", "issued"}

* ``consortium_id`` — the consortium; the app project binds it too (``engines.deployment.write_app_project``), so
  the pinned app hash differs between consortia;
* ``app_fab_sha256`` — the FAB the coordinator submitted; the site compares it with the bytes it received;
* ``session_id`` — 16 fresh random bytes (hex) per run start: the key a site's replay protection uses for this run
  (:func:`ticket_session_id`);
* ``run_config_sha256`` — SHA-256 of the exact ``fcd-config`` text that reaches the sites; the run config may hold
  nothing else but the ticket itself.

The signature is Ed25519 over SHA-256 of the canonical JSON of those fields (the audit ledgers' encoding,
``audit.signing.canonical``). :func:`verify_run_ticket` is the site's check (``engines.site_exec``) and the
ServerApp's (``apps.server_app``): an unsigned run, another signer, another consortium, another app or a changed
run config is refused, naming what differs.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from fcd_secure.audit.signing import canonical, private_key, public_key_bytes, sign_hash, signature_ok, utc_now
from fcd_secure.errors import FcdError
from fcd_secure.federation.records import RUN_CONFIG_KEY

#: The run-config entry that carries the ticket (the app project declares it, empty, next to ``fcd-config``).
RUN_TICKET_KEY = "fcd-run-ticket"
TICKET_FORMAT = "fcd-run/1"
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
    format: str = TICKET_FORMAT

    def digest(self) -> str:
        return hashlib.sha256(canonical(asdict(self))).hexdigest()


def config_digest(run_config_text: str) -> str:
    """SHA-256 (hex) of the ``fcd-config`` text as it reaches the sites."""
    return hashlib.sha256(run_config_text.encode("utf-8")).hexdigest()


def sign_run_ticket(key: bytes, *, consortium_id: str, app_fab_sha256: str, run_config_text: str,
                    session_id: str | None = None) -> str:
    """The ticket entry (JSON text) of a run start, signed with the coordinator's raw Ed25519 private ``key``.

    Args:
        key: the coordinator's signing key.
        consortium_id: the consortium the run belongs to.
        app_fab_sha256: SHA-256 of the FAB that is submitted.
        run_config_text: the exact ``fcd-config`` value of the submitted run config.
        session_id: the run's session id (hex); a fresh 16 random bytes when omitted.
    """
    ticket = RunTicket(consortium_id, app_fab_sha256, session_id or os.urandom(16).hex(),
                       config_digest(run_config_text), utc_now())
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
