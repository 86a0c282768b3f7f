"""The server side of a secure round (Bonawitz et al., CCS 2017, carried over Flower's Message API).

=====================  ======================================================================================
module                 role
=====================  ======================================================================================
``flow``               ``SecureAggregationFlow`` (Θc) and ``secure_sum`` (any vector of sums)
``setup``              the roster and the vector layout both ends are configured with
``eval_vector``        the exact multi-digit fixed-point encoding of evaluation sums in the masked vector
``secure_evaluation``  ``SecureEvaluation``: evaluation sums through secure aggregation (server sees totals only)
``secure_stats``       round 0: standardisation statistics from per-site (n, Σx, Σx²) under secure aggregation
=====================  ======================================================================================

The protocol itself (no Flower) is ``fcd_secure.aggregation.secagg``; the sites' side of the stages is
``fcd_secure.apps.secure_site``.
"""
