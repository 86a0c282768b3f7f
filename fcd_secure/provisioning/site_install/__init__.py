"""The hospital's side of an installation: ``fcd site init``, ``join``, ``preflight`` and the service unit.

=============  ====================================================================================================
module         role
=============  ====================================================================================================
``home``       the site's folder: keys made here (never leaving), the strict site policy, the enrolment request,
               the bundle's verification and the pins it leaves (CA, consortium terms, spec, roster)
``tables``     which home on this host holds which table: a second home on the same table is refused (P46)
``records``    the signed ``install`` lines every init, join and preflight appends to the site ledger
``preflight``  the readiness checks (data against the pinned spec, keys, certificates, clock, telemetry, disk,
               versions, the SuperLink over TLS): exit 0 ready, 1 not ready
``service``    a systemd unit that starts the site (``fcd site service``)
``runner``     ``fcd site start|stop|status``: the site's SuperNode and its own executor
=============  ====================================================================================================
"""
