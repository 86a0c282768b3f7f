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
``secure_site``        the sites' ``train.secagg_*`` actions (training and evaluation rounds)
``secure_setup``       secure-aggregation provisioning: roster, vector layout
``secure_evaluation``  ``SecureEvaluation``: evaluation sums through secure aggregation (server sees totals only)
``eval_vector``        the exact multi-digit fixed-point encoding of evaluation sums in the masked vector
``site_policy``        ``SitePolicy``: the site's own TOML policy; a server request may ask for more, never less
``cohort``             which test rows a site evaluates (its minimum cohort, no differenceable cohorts)
``egress``             the audit egress gate bound to a site runtime (outermost ClientApp mod)
``mods``               ``client_mods``: [egress gate, guard], the mods of every site's ClientApp
``guard``              ``guard_mod``: no exception text or traceback leaves a site
``messaging``          ``Comm``: push/pull with a short poll; exact serialized bytes of every message
``site``               ``SiteRuntime``: a site's identity, policy, data, model and on-disk state; ``admit``,
                       ``train_round``, ``evaluate``
``state``              per-site state directory (Θs, optimiser, RNG, identity key; atomic) and the server checkpoint
``evaluation``         site-side aggregate sums (PEHE/ATE, policy values, OPE with ESS, AUC histogram) and merge
``learner``            the one place federation calls the model, data and privacy layers
``sampler``            seeded client sampling with a checkpointable RNG
``simulation``         ``run_simulated``: Flower's simulation engine in-process (one Ray actor, quiet, no telemetry)
``deployment``         ``LocalDeployment``: secure by default (TLS, SuperNode auth, pinned app, secure aggregation),
                       SuperLink + SuperNodes + site executors on 127.0.0.1, ``flwr run``, evidence collection
``pki``                CA, SuperLink certificate (SANs), EC P-384 SuperNode keys; checks naming file and field
``site_exec``          the site's own SuperExec: runs the site's installed ClientApp only for a pinned FAB hash
``outputs``            the run folder (config, theta_c.npz, rounds, traffic, summary.json, Figs. 3–4)
``secure_stats``       round 0: standardisation statistics from per-site (n, Σx, Σx²) under secure aggregation
``provisioning``       the coordinator: ``consortium init``/``add-site``, signed roster and bundles, ``server``
``site_install``       the hospital: ``site init``/``join``/``preflight``/``start``, install lines, systemd unit
=====================  ==========================================================================================

Every privacy component (egress gate, secure aggregation, server ledger) is a direct import: a missing module stops
the app at import, it never runs without it.
"""
