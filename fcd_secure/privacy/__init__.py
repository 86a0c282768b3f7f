"""fcd_secure.privacy — optional record-level DP-SGD on each site, its write-ahead budget ledger, and the report.

Each site may train with DP-SGD (Abadi et al. 2016; Opacus 1.6) under its own lifetime budget and refuses a round
that would overspend it. One concept per module:

* ``config.DPConfig``   — the ``[dp]`` table (ε cap, δ rule, C, accountant, Poisson, hooks, L_align under DP).
* ``planner``           — ε of a history of ``(σ, q, steps)`` segments; σ planned once for a whole planned use.
* ``ledger``            — the per-dataset write-ahead ledger on disk (``BudgetExceeded``, ``LedgerError``,
                          ``dataset_fingerprint``).
* ``engine.DPSite``     — the one entry point for a site's round (reserve → make_private → commit), and
                          ``engine.train_round_private`` which runs the model's ``train_local`` inside it.
* ``report``            — the per-site and consortium privacy budget report (``fcd privacy report``).

This ``__init__`` imports nothing heavy: ``fcd_secure.config`` reads ``DPConfig`` without pulling in torch/Opacus.
"""
