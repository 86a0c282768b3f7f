"""What runs on a site and returns sums: evaluation and what-if questions.

Each query gathers a site's own rows, calls the pure estimators of ``fcd_secure.evaluation`` and hands back additive
sums only; the server merges consortium totals (in clear under plain aggregation, through secure aggregation
otherwise: ``fcd_secure.federation.secure``).

=====================  ======================================================================================
module                 role
=====================  ======================================================================================
``evaluation``         site-side aggregate sums (PEHE/ATE, policy values, OPE with ESS, AUC histogram) and merge
``whatif``             simulated policy values with intervals, contrasts, per-entity effects kept on the site
``cohort``             which test rows a site evaluates (its minimum cohort, no differenceable cohorts)
=====================  ======================================================================================
"""
