"""The one place where a run's aggregation flow is chosen (``federation.secure_aggregation``).

* ``PlainFedAvgFlow`` (``federation.plain_flow``): clear-text replies, sample-size-weighted FedAvg.
* ``SecureAggregationFlow`` (``federation.secure.flow``): pairwise-masked secure aggregation; the server only
  learns the weighted sum.

Both are :class:`~fcd_secure.federation.records.AggregationFlow` subclasses, so the ServerApp has one code path.
What they synchronise is :func:`synchronised_part`.
"""

from __future__ import annotations

from fcd_secure.config import RunConfig
from fcd_secure.federation.plain_flow import PlainFedAvgFlow
from fcd_secure.federation.records import AggregationFlow
from fcd_secure.federation.secure.flow import SecureAggregationFlow
from fcd_secure.manifest import FULL, THETA_C, Manifest, Part


def synchronised_part(config: RunConfig) -> Part:
    """The part of the parameters a round synchronises: Θc under DSS (``federation.sync = "dss"``, paper §III-B: the
    site-specific Θs never leaves a site), else every parameter but the site-bound ones (the "w/o DSS" ablation,
    ``fcd_secure.manifest.FULL``)."""
    return THETA_C if config.federation.sync == "dss" else FULL


def check_flow(config: RunConfig) -> None:
    """Refuse, before any engine starts, a configuration the chosen flow cannot run.

    Raises:
        SecureAggregationConfigError: secure mode with ``sync = "full"`` or an unusable number of sites per round.
    """
    if config.federation.secure_aggregation:
        SecureAggregationFlow.check_config(config)


def make_flow(config: RunConfig, manifest: Manifest) -> AggregationFlow:
    """The aggregation flow of a run.

    Args:
        config: the run config (``federation.secure_aggregation``, timeouts, ``[secagg]`` policy).
        manifest: the server's Θc/Θs manifest (the secure flow lays out its masked vector from it).

    Raises:
        SecureAggregationConfigError: as :func:`check_flow`.
    """
    fed = config.federation
    if fed.secure_aggregation:
        return SecureAggregationFlow.from_config(config, manifest)
    return PlainFedAvgFlow(
        manifest.specs(synchronised_part(config)), max_count=config.secagg.max_weight, timeout_s=fed.round_timeout_s, min_replies=fed.min_replies
    )
