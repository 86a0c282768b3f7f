"""fcd_secure.audit: prove afterwards what left each site (paper §III-B: only Θc is transmitted).

* :mod:`~fcd_secure.audit.gate`: the egress gate, the outermost ClientApp mod of every site
  (``make_egress_gate(get_site)``); its rules are :mod:`~fcd_secure.audit.rules`, its byte and value scanner
  :mod:`~fcd_secure.audit.scanner`, the federation's exact allow-list :mod:`~fcd_secure.audit.allowlist`, the Θs of
  earlier rounds it also refuses :mod:`~fcd_secure.audit.history`.
* :mod:`~fcd_secure.audit.accounting`: the one definition of a message's bytes and hashes, used at both ends.
* :mod:`~fcd_secure.audit.ledger`: signed, hash-chained JSONL ledgers (site and server) of the typed lines in
  :mod:`~fcd_secure.audit.entries`, signed as :mod:`~fcd_secure.audit.signing` says; server receipts
  (:mod:`~fcd_secure.audit.receipts`).
* :mod:`~fcd_secure.audit.server`: ``ServerAudit``, the server's ledger and the receipts it returns to sites.
* :mod:`~fcd_secure.audit.verify` / :mod:`~fcd_secure.audit.report`: offline verification for auditors
  (``fcd audit verify``); :mod:`~fcd_secure.audit.pins`: the pin file of key fingerprints the operator hands the
  auditor out of band (``fcd audit fingerprints --out pins.toml``).

Audit sits above model/ and data/, beside aggregation/ and privacy/, reads the Θc/Θs contract
(:mod:`fcd_secure.manifest`), and never imports the federation layer above it.
"""

from fcd_secure.audit.accounting import describe_message, message_bytes, payload_bytes, tree_bytes
from fcd_secure.audit.allowlist import federation_gate_policy
from fcd_secure.audit.gate import (
    GATE_ERROR_CODE,
    GENERIC_ERROR_REASON,
    POLICY_ERROR_CODE,
    POLICY_REASON_PREFIX,
    RECEIPTS_MESSAGE_TYPE,
    GatePolicy,
    SiteAuditContext,
    make_egress_gate,
    record_site_refusal,
)
from fcd_secure.audit.history import THETA_S_HISTORY_FILE, ThetaSHistory
from fcd_secure.audit.ledger import SERVER_LEDGER_FILE, SITE_LEDGER_FILE, ServerLedger, SiteLedger
from fcd_secure.audit.receipts import HEAD_RECORD
from fcd_secure.audit.rules import (
    REFUSAL_RULES,
    SITE_ERRORS,
    ConfigFieldRule,
    Refusal,
    SecaggReplyRule,
    SiteFailure,
    note_declined,
    site_error_name,
)
from fcd_secure.audit.server import ServerAudit
from fcd_secure.audit.signing import load_or_create_identity_key

#: What the layers above use; import these names from ``fcd_secure.audit``.
__all__ = [
    "GATE_ERROR_CODE",
    "GENERIC_ERROR_REASON",
    "HEAD_RECORD",
    "POLICY_ERROR_CODE",
    "POLICY_REASON_PREFIX",
    "RECEIPTS_MESSAGE_TYPE",
    "REFUSAL_RULES",
    "SERVER_LEDGER_FILE",
    "SITE_ERRORS",
    "SITE_LEDGER_FILE",
    "THETA_S_HISTORY_FILE",
    "ConfigFieldRule",
    "GatePolicy",
    "Refusal",
    "SecaggReplyRule",
    "ServerAudit",
    "ServerLedger",
    "SiteAuditContext",
    "SiteFailure",
    "SiteLedger",
    "ThetaSHistory",
    "describe_message",
    "federation_gate_policy",
    "load_or_create_identity_key",
    "make_egress_gate",
    "message_bytes",
    "note_declined",
    "payload_bytes",
    "record_site_refusal",
    "site_error_name",
    "tree_bytes",
]
