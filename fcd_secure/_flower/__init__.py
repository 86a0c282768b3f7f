"""Every use of Flower's internals, in one place, for one Flower version.

Everything else in the package uses Flower's public API only (``flwr.app``, ``flwr.serverapp``, ``flwr.clientapp``,
``flwr.simulation``, the ``flwr`` and ``flower-*`` commands). What reaches past it lives here and is checked when it
is imported (:mod:`fcd_secure._flower.pins`): the installed Flower must be :data:`~fcd_secure._flower.pins.FLWR_VERSION`
and every Flower function we patch or copy must still have the source we read, else the start stops with a message
naming the function.

==================  =====================================================================================
module              role
==================  =====================================================================================
``pins``            the supported Flower version (one constant) and the source hashes of what we patch or copy
``waits``           Flower's hard-wired sleeps and backoffs, capped (SuperNode loop, object pulls, HTTP grid)
``wake``            the SuperNode wakes the site's executor through a pipe instead of being polled
``supernode_main``  ``flower-supernode`` with the short waits, under a supervisor that restarts it
``superlink_main``  ``flower-superlink`` whose Control API answers only the coordinator host
``superexec``       Flower's SuperExec loop, copied so a site's executor runs only its pinned app
``register``        ``flwr supernode register`` of several keys in one process (the CLI imported once)
``internals``       the few internals the rest of the package needs (transport copy, serialized bytes, FAB bytes)
==================  =====================================================================================
"""
