"""fcd_secure.federation: Fed-CausalDiff's decoupled synchronisation (DSS, paper §III, Table II) on Flower 1.42.

=====================  ==========================================================================================
module                 role
=====================  ==========================================================================================
``server_app``         ServerApp (Message API, ``@app.main()``): hello, seeded 5-of-10 sampling, rounds through the
                       aggregation seam, per-round checkpoint, federated evaluation, run folder
``client_app``         ClientApp: ``query.hello``, ``train``, ``query.evaluate`` (+ secure and audit actions)
``flows``              the aggregation seam: ``AggregationFlow``, ``RoundOutcome``, ``PlainFedAvgFlow``,
                       ``make_flow`` (the one place plain vs secure is chosen)
``messaging``          ``Comm``: push/pull with a short poll; exact serialized bytes of every message
``site``               ``SiteRuntime``: a site's identity, data, model and on-disk state; ``train_round``
``state``              per-site state directory (Θs, optimiser, RNG; atomic) and the server checkpoint
``mods``               ``client_mods``: audit egress gate (outermost) + guard (no exception text leaves)
``evaluation``         site-side aggregate sums (PEHE/ATE, policy values, OPE with ESS, AUC histogram) and merge
``learner``            the one place federation calls the model, data and privacy layers
``sampler``            seeded client sampling with a checkpointable RNG
``simulation``         ``run_simulated``: Flower's simulation engine in-process (one Ray actor, quiet, no telemetry)
``deployment``         ``LocalDeployment``: SuperLink + SuperNodes on 127.0.0.1 as real processes, ``flwr run``
``ablation``           Table III variants (DSS, full sync, w/o L_dis, local only, centralised)
``outputs``            the run folder (config, theta_c.npz, rounds, traffic, summary.json, Figs. 3–4)
=====================  ==========================================================================================
"""
