"""The answers layer: what runs on a site and returns sums, and how the server merges them.

Every answer is one :class:`~fcd_secure.queries.base.Query` (its site-side sums, the names it sends, its merge),
registered in :mod:`~fcd_secure.queries.registry`; the egress gate's evaluation allow-list is derived from those
declarations. A site gathers its own rows and calls the pure estimators of ``fcd_secure.evaluation``; only additive
sums leave it, through whatever transport the run uses (clear replies, or secure aggregation,
``federation.secure``).

=====================  ======================================================================================
module                 role
=====================  ======================================================================================
``base``               ``Query``, ``Totals`` (the consortium's sums), ``SiteContext``, ``MergeContext``
``registry``           the registered queries in order; site sums, merge, the names and list caps they send
``request``            ``WhatIfRequest`` (the question) and ``EvaluationRequest`` (validated on the site)
``answers``            the typed answer every renderer reads (run table, ``fcd whatif``, HTML report)
``policy_answers``     the typed records of one policy's answer and the base ``Record``
``evaluation``         a site's evaluation (``site_metrics``), the server's request and merge, coverage
``effects``            PEHE / skill / |ATE error| against an oracle, the factual AUC
``targeted``           the identified one-step effect (``OneStep``) and values over the first h steps
                       (``Identified``)
``dr_learner``         per-entity effects: the federated DR-learner's fit and effects, its held-out check
``selection``          the truth-free round selection (D₁ with paired SEs, D_h, natural course) and the Θs kept per round
``policy_values``      the what-if answer: ``PolicyValues`` and its parts; simulated values, support
``policy_terms``       the per-policy terms of a question on a site (rollouts, residual), computed once
``logged``             what a policy does on the logged rows: π(logged a_t | history), logged support
``doubly_robust``      per-decision doubly robust values and contrasts with unseen-mass bounds
``off_policy``         IPW / SNIPW / per-decision DR diagnostics per policy
``pi_source``          where a stochastic policy's π_k came from (logged, or the site's model)
``propensities``       where the weighted answers' propensities came from, their overlap and calibration
``sequential_dr``      sequential doubly robust values (Q̂ from each logged history), withheld below their support
``sensitivity``        Γ-bounds under the marginal sensitivity model: the one-step effect, the values at the horizon
``declared``           the user's declared unrecorded confounding: the weighted answers marked not identified
``kinds``              what kind each answer is (checked by weighting, g-computation, extrapolation) and its assumptions
``incremental``        stochastic policies on a site: the behaviour model they act through, their weights
``budget``             the site's question budget (differencing, threshold firing; P41-P43)
``cohort``             which test rows a site evaluates (its minimum cohort, no differenceable cohorts)
``per_entity``         the per-entity file a question writes on the site's own disk
``vocabulary``         the run's action labels and context columns as the server knows them; policy binding
=====================  ======================================================================================
"""
