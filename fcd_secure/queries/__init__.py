"""What runs on a site and returns sums: evaluation, what-if questions and the round-0 statistics.

Each query gathers a site's own rows, calls the pure estimators of ``fcd_secure.evaluation`` and hands back additive
sums only; the server merges consortium totals (in clear under plain aggregation, through ``secure_sum`` otherwise).

=====================  ======================================================================================
module                 role
=====================  ======================================================================================
``evaluation``         site-side aggregate sums (PEHE/ATE, policy values, OPE with ESS, AUC histogram) and merge
``whatif``             simulated policy values with intervals, contrasts, per-entity effects kept on the site
``cohort``             which test rows a site evaluates (its minimum cohort, no differenceable cohorts)
``eval_vector``        the exact multi-digit fixed-point encoding of evaluation sums in the masked vector
``secure_evaluation``  ``SecureEvaluation``: evaluation sums through secure aggregation (server sees totals only)
``secure_stats``       round 0: standardisation statistics from per-site (n, Σx, Σx²) under secure aggregation
=====================  ======================================================================================
"""
