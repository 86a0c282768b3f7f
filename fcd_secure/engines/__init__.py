"""Where the apps run: Flower's simulation engine, its Deployment Engine on this machine, or in this process.

===============  =======================================================================================
module           role
===============  =======================================================================================
``simulation``   ``run_simulated``: Flower's simulation engine in-process (one Ray actor, quiet, no telemetry)
``inprocess``    ``run_inprocess``: the same apps without Ray (a Grid that hands each message to the ClientApp)
``choice``       ``Engine``: which of the two a run uses (``fcd run --engine``), as ``summary.json`` records it
``local``        ``run_on``: start either with the same arguments
``deployment``   ``LocalDeployment``: secure by default (TLS, SuperNode auth, pinned app, secure aggregation),
                 SuperLink + SuperNodes + site executors on 127.0.0.1, ``flwr run``, evidence collection
``site_exec``    the site's own SuperExec: runs the site's installed ClientApp only for a pinned FAB hash
``whatif_run``   the what-if ServerApp (``apps.whatif_app``) on a finished run's state (``fcd whatif``)
``pki``          CA, SuperLink certificate (SANs), EC P-384 SuperNode keys; checks naming file and field
===============  =======================================================================================
"""
