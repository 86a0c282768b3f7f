"""fcd_secure.federation: Fed-CausalDiff's decoupled synchronisation (DSS, paper §III, Table II), the protocol both
ends of a round stand on.

Flower's apps live one floor up (``fcd_secure.apps``), the queries a site answers beside them (``fcd_secure.queries``);
this package holds what both of them use: the message vocabulary, the counted door to the sites, the aggregation
flows (plain and secure), the one bridge to the model and data layers, and a site's policy and state on disk.

=================  ==========================================================================================
module             role
=================  ==========================================================================================
``records``        message types, record names, array↔record helpers, ``RoundOutcome`` and the
                   ``AggregationFlow`` base class (hooks + one ``run_round`` template)
``messaging``      ``Comm``: push/pull with a short poll; exact serialized bytes of every message
``flows``          ``make_flow`` / ``check_flow``: the one place plain vs secure is chosen
``plain_flow``     ``PlainFedAvgFlow``: clear-text replies, sample-size-weighted FedAvg
``secure``         the server side of pairwise-masked secure aggregation (``secure.flow``: ``SecureAggregationFlow``,
                   ``secure_sum``) and what both ends are configured with (``secure.setup``: roster, vector layout)
``learner``        the one place federation calls the model, data and privacy layers
``site_policy``    ``SitePolicy``: the site's own TOML policy; a server request may ask for more, never less
``state``          per-site state directory (Θs, optimiser, RNG, identity key; atomic) and the server checkpoint
``sampler``        seeded client sampling with a checkpointable RNG
``run_ticket``     the coordinator's signed run ticket: sites check who started the run and with which config
=================  ==========================================================================================

Every privacy component (egress gate, secure aggregation, server ledger) is a direct import: a missing module stops
the app at import, it never runs without it.
"""
