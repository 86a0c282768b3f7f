"""fcd_secure.federation: Fed-CausalDiff's decoupled synchronisation (DSS, paper §III, Table II) on Flower 1.42.

=====================  ==========================================================================================
module                 role
=====================  ==========================================================================================
``server_app``         ServerApp (Message API, ``@app.main()``): hello, seeded 5-of-10 sampling, rounds through the
                       aggregation flow, per-round checkpoint, server audit ledger, federated evaluation, run folder
``client_app``         ClientApp: ``query.hello``, ``train``, ``query.evaluate``, the secure-aggregation actions and
                       the closing audit receipts, behind the egress gate
``records``            message types, record names, array↔record helpers, ``RoundOutcome`` and the
                       ``AggregationFlow`` base class (hooks + one ``run_round`` template)
``flows``              ``make_flow`` / ``check_flow``: the one place plain vs secure is chosen
``plain_flow``         ``PlainFedAvgFlow``: clear-text replies, sample-size-weighted FedAvg
``secure_flow``        ``SecureAggregationFlow``: the server side of pairwise-masked secure aggregation
``secure_site``        the sites' ``train.secagg_*`` actions
``secure_setup``       secure-aggregation provisioning: roster, site policy, vector layout
``egress``             the audit egress gate bound to a site runtime (outermost ClientApp mod)
``mods``               ``client_mods``: [egress gate, guard], the mods of every site's ClientApp
``guard``              ``guard_mod``: no exception text or traceback leaves a site
``messaging``          ``Comm``: push/pull with a short poll; exact serialized bytes of every message
``site``               ``SiteRuntime``: a site's identity, data, model and on-disk state; ``train_round``
``state``              per-site state directory (Θs, optimiser, RNG, identity key; atomic) and the server checkpoint
``evaluation``         site-side aggregate sums (PEHE/ATE, policy values, OPE with ESS, AUC histogram) and merge
``learner``            the one place federation calls the model, data and privacy layers
``sampler``            seeded client sampling with a checkpointable RNG
``simulation``         ``run_simulated``: Flower's simulation engine in-process (one Ray actor, quiet, no telemetry)
``deployment``         ``LocalDeployment``: SuperLink + SuperNodes on 127.0.0.1 as real processes, ``flwr run``
``ablation``           Table III variants (DSS, full sync, w/o L_dis, local only, centralised)
``outputs``            the run folder (config, theta_c.npz, rounds, traffic, summary.json, Figs. 3–4)
=====================  ==========================================================================================

Every privacy component (egress gate, secure aggregation, server ledger) is a direct import: a missing module stops
the app at import, it never runs without it.
"""
