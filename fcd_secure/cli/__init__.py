"""fcd_secure.cli: the ``fcd`` command (Typer). Each command group is one module, thin: parse, call the layer below,
print; ``main`` assembles them. The table lists the command groups first, then what they share.

==================  ================================================================================================
module              role
==================  ================================================================================================
``main``            the ``fcd`` entry point: the root app, ``--version``, every command group attached
``run``             ``fcd run``: the federated job on the simulation engine, its printed summary
``deploy``          ``fcd deploy``: the same run on Flower's Deployment Engine on this machine, secure by default
``whatif``          ``fcd whatif``: ask a finished run what happens under policies (values, effects, intervals)
``select``          ``fcd select``: which finished run to answer with (truth-free causal criterion)
``train``           ``fcd train``: the centralised reference on the pooled training data
``ablate``          ``fcd ablate``: the ablations of paper Table III
``reproduce``       ``fcd reproduce``: the paper's tables and figures for every method and dataset
``report``          ``fcd report``: one self-contained HTML report of a run
``data``            ``fcd data``: validate a user's table against its spec, describe the datasets, export
``config``          ``fcd config show``: the resolved run configuration with every key's description
``privacy``         ``fcd privacy``: the budget report, a σ planner, acknowledging a lost ledger
``audit``           ``fcd audit``: key fingerprints, offline verification of the ledgers
``consortium``      ``fcd consortium``: the coordinator provisions a consortium and enrols its sites
``server``          ``fcd server``: the coordinator's SuperLink and the federated run on it
``site``            ``fcd site``: the hospital's installer (init, join, preflight, service)
``app``             the Typer group every command group is built from; the one place results and errors print
``envelope``        the JSON contract of every ``--json`` command and the exit codes
``options``         the options several commands declare alike (``--spec``, ``--table``, ``--set``, ``--seed``, ...)
``resolve``         command-line options → one validated ``RunConfig`` (the layers and their order)
``preflight``       everything a run needs, checked before any engine starts (exit 2 names the file and field)
``tables``          ``--spec SPEC --table TABLE``: the one way a user's table is named
``renamed``         the renamed options and the one place their old spellings are still read
``_provisioning``   the provisioning and site errors as the command line reports them
==================  ================================================================================================

Only ``typer`` (with ``click`` and ``rich``) is imported at module level: ``fcd --help`` loads nothing heavier.
"""
