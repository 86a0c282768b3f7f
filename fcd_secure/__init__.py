"""fcd_secure: federated causal diffusion (Fed-CausalDiff) with decoupled synchronisation, secure aggregation,
DP-SGD and an auditable egress ledger. See README.md and docs/architecture.md."""

__version__ = "0.1.0"
