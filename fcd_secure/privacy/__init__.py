"""fcd_secure.privacy — optional record-level DP-SGD on each site, its write-ahead budget ledger, and the report.

DESIGN.md "Sites may train with DP-SGD (Opacus); each site keeps its own privacy budget and refuses to overspend";
../shared/research/dp-anchors.md for the Opacus 1.6 traps and the accounting pattern. One concept per module:

* ``config.DPConfig``   — the ``[dp]`` table (ε cap, δ rule, C, accountant, Poisson, hooks, L_align under DP).
* ``planner``           — ε of a history of ``(σ, q, steps)`` segments; σ planned once for a whole planned use.
* ``ledger``            — the per-dataset write-ahead ledger on disk (``BudgetExceeded``, ``LedgerError``,
                          ``dataset_fingerprint``).
* ``engine.DPSite``     — the one entry point for a site's round (reserve → make_private → commit), and
                          ``engine.train_round_private`` which runs the model's ``train_local`` inside it.
* ``report``            — the per-site and consortium privacy budget report (``fcd privacy report``).

This ``__init__`` imports nothing heavy: ``fcd_secure.config`` reads ``DPConfig`` without pulling in torch/Opacus.
"""
