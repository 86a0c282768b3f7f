"""Consortium provisioning: the coordinator's side of a multi-hospital installation.

Distributed provisioning in the NVIDIA FLARE sense (NVIDIA FLARE documentation, "Provisioning in NVIDIA FLARE"): every private key is
generated where it is used and never travels; only public keys, certificates and *signed* documents move, and each
party checks the other's key fingerprint out of band (read aloud, typed in).

=================  ================================================================================================
module             role
=================  ================================================================================================
``signed``         the one signed-document format (canonical JSON payload, Ed25519 signature, signer's key)
``versions``       the versions a consortium pins (fcd_secure, flwr, torch, opacus), read without importing them
``consortium``     ``consortium init``: id, CA + SuperLink certificate, coordinator key, ``consortium.toml``
``enrolment``      a site's enrolment request (its public keys, signed with its identity key) and its checks
``bundle``         ``consortium add-site``: the signed roster and the signed bundle each site joins with
``server``         ``fcd server start|stop|status|run``: the coordinator's processes and runs
``processes``      long-lived processes (SuperLink, SuperNode, site executor), started detached, stopped by PID
``site_install``   the hospital's side: ``fcd site init|join|preflight|start|service``
=================  ================================================================================================
"""
