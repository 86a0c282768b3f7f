"""The server side of a secure round (Bonawitz et al., CCS 2017, carried over Flower's Message API).

``flow``: ``SecureAggregationFlow`` (Θc) and ``secure_sum`` (any vector of sums); ``setup``: the roster and the vector
layout both ends are configured with. The protocol itself (no Flower) is ``fcd_secure.aggregation.secagg``; the sites'
side of the stages is ``fcd_secure.apps.secure_site``.
"""
