"""fcd_secure.audit: prove afterwards what left each site (DESIGN.md "What the product is"; paper §III-B: only Θc
is transmitted).

* :mod:`~fcd_secure.audit.gate`: the egress gate, the outermost ClientApp mod of every site
  (``make_egress_gate(get_site)``); :mod:`~fcd_secure.audit.egress` binds it to a federation site runtime.
* :mod:`~fcd_secure.audit.accounting`: one definition of a message's bytes and hashes, used at both ends.
* :mod:`~fcd_secure.audit.ledger`: signed, hash-chained JSONL ledgers (site and server), checkpoints, receipts.
* :mod:`~fcd_secure.audit.server`: ``ServerAudit``, the server's ledger and the receipts it returns to sites.
* :mod:`~fcd_secure.audit.verify` / :mod:`~fcd_secure.audit.report`: offline verification for auditors
  (``fcd audit verify``).

Flower is imported by the gate and the accounting (audit sits above model/ and data/, beside aggregation/ and
privacy/, and never imports the federation layer above it).
"""
