"""fcd_secure.privacy — optional record-level DP-SGD on each site, its write-ahead budget ledger, and the report.

Each site may train with DP-SGD (Abadi et al. 2016; Opacus 1.6) under its own lifetime budget per record and refuses
a round that would overspend it for any record. One concept per module:

* ``config.DPConfig``   — the ``[dp]`` table (ε cap, δ rule, C, accountant, Poisson, hooks, L_align under DP).
* ``planner``           — ε of a history of ``(σ, q, steps)`` segments; σ planned once for a whole planned use.
* ``identity``          — which records a budget belongs to: record ids keyed on raw values, the order-free fingerprint,
                          "the same data" by bottom-k sketch (a reordered table or a record dropped keeps its budget).
* ``ledger``            — the per-dataset write-ahead ledger on disk (``dataset_fingerprint``, ``find_ledger``,
                          ``acknowledge_reset``); each lists the records it charges.
* ``spend``             — ε per record across every ledger of a site (the cap bounds what any single record spent,
                          whatever split or seed trained it; acknowledged resets carried forward).
* ``anchor``            — the site's anchor of each ledger's head: a deleted or rolled-back ledger is refused
                          (``LedgerRollback``) until an operator acknowledges; the heads go into the audit chain.
* ``errors``            — ``BudgetExceeded``, ``PrivacyLedgerError``, ``LedgerRollback`` (no torch, no Opacus).
* ``engine.DPSite``     — the one entry point for a site's round (reserve → make_private → commit;
                          ``DPSite.for_dataset`` keys it by the table's records), and
                          ``engine.train_round_private`` which runs the model's ``train_local`` inside it.
* ``report``            — the per-site and consortium privacy budget report (``fcd privacy report``).

This ``__init__`` imports nothing heavy: ``fcd_secure.config`` reads ``DPConfig`` without pulling in torch/Opacus.
"""
