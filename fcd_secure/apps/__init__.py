"""Flower's two apps (Message API) and the site runtime they drive.

==================  =====================================================================================
module              role
==================  =====================================================================================
``server_loop``     ``ServerLoop``: the server's one loop (hello, model check, audit, checkpoint/resume, rounds,
                    evaluation, closing receipts) with hooks, as Flower's strategies own theirs
``server_app``      ServerApp (``@app.main()``): the training loop, seeded 5-of-10 sampling, rounds through the
                    aggregation flow, round selection, federated evaluation, run folder
``whatif_app``      the what-if ServerApp: the same loop with no training round and one evaluation with the question
``client_app``      ClientApp: ``query.hello``, ``train``, ``query.evaluate``, the secure-aggregation actions and
                    the closing audit receipts, behind the egress gate
``site``            ``SiteRuntime``: a site's identity, policy, data, model and on-disk state; ``admit``,
                    ``train_round``, ``evaluate``
``secure_site``     the sites' ``train.secagg_*`` actions (training and evaluation rounds)
``egress``          the audit egress gate bound to a site runtime (outermost ClientApp mod)
``guard``           ``guard_mod``: no exception text or traceback leaves a site
``mods``            ``client_mods``: [egress gate, guard], the mods of every site's ClientApp
``outputs``         the run folder (config, theta_c.npz, rounds, traffic, summary.json, Figs. 3–4)
``sandbox``         the ServerApp gives up reading the coordinator's signing and TLS keys (Landlock; threats P35)
==================  =====================================================================================
"""
