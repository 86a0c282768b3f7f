"""fcd_secure: federated causal diffusion (Fed-CausalDiff) with decoupled synchronisation, secure aggregation,
DP-SGD and an auditable egress ledger. See README.md and docs/architecture.md.

Packages, top layer first: a layer imports only layers below it, never a sibling (``aggregation``, ``privacy``,
``audit``; ``model``, ``evaluation``); the torch-free contract and ``_flower`` sit at the bottom
(``tests/test_layers.py`` checks it).

=================== ================================================================================================
package / module    role
=================== ================================================================================================
``cli``             the ``fcd`` command (Typer): one module per command group
``experiments``     the studies of the paper: centralised reference, ablations, reproduction, the HTML report
``provisioning``    the multi-hospital installation: consortium, enrolment, the coordinator's and the sites' processes
``engines``         Flower's simulation and Deployment Engines, TLS and SuperNode keys, the site executor
``apps``            the ServerApp, the ClientApp and the site runtime behind the egress gate
``queries``         the answers: what the logs identify, per-entity effects, the what-if questions
``federation``      the federated run: messages, rounds, secure and plain aggregation flows, site policy, state
``config``          ``RunConfig``: one run's configuration, composed of each layer's section
``aggregation``     FedAvg and pairwise-masked secure aggregation
``privacy``         DP-SGD (Opacus), the per-record privacy ledgers and reports
``audit``           the egress gate, signed hash-chained ledgers, offline verification
``model``           the Fed-CausalDiff network, its losses, training, do-simulation, and the baselines
``evaluation``      the paper's metrics, off-policy evaluation, intervals, TSTR, figures
``data``            datasets, specs, sites, the two oracle worlds, policies
``_flower``         the one Flower version (``pins``) and the Flower internals reached into
``manifest``        the Θc / Θs contract (paper §III-A, "Θ = Θc ∪ {Θs_i}")
``anchor_records``  the privacy-anchor record: where a site's DP ledger stood, and its acknowledged resets
``errors``          ``FcdError``, the root of every exception the package raises
``fingerprints``    key fingerprints as people compare and pin them (``SHA256:<hex>``), one format
``_io``             atomic writes, inter-process locks, secrets created once with mode 0600
``_versions``       package versions from metadata, nothing imported
=================== ================================================================================================
"""

__version__ = "0.1.0"
