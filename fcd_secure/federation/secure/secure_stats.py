"""Round 0: the consortium's standardisation statistics through secure aggregation; no site's sums are seen alone.

With ``data.standardize = "secure"`` no process pools raw rows (a deployed site holds only its own table). Before
the first training round the server runs one secure round of the *evaluation* kind
(``federation.secure.secure_evaluation``: same protocol, same roster, same replay guard, same exact encoding):

1. ``train.secagg_evaluate`` with ``purpose = "stats"``: each site computes, over its own unscaled training set, per
   continuous column the count ``n``, ``Σx`` and ``Σx²`` (:func:`fcd_secure.data.moments.moment_sums`), keeps them
   in node memory and replies with their schema (names and lengths);
2. the masked vectors are summed; the server decodes the totals (``federation.secure.eval_vector``: each value an
   exact fixed-point integer with 24 fractional bits in multi-digit words, so a total is exact to
   ``n_sites · 2**-25`` ≈ 3e-8 per site for any magnitude below 2**70; the resulting means and standard deviations
   equal the pooled ones to about 1e-9 on data of unit scale);
3. the means and standard deviations (:func:`fcd_secure.data.moments.moments_to_statistics`) go to the sites with
   every training and evaluation request (``STATISTICS_KEY`` of the round config); each site z-scores its own data
   with them. With them go the consortium's anchor actions, from the summed histogram of logged actions: every
   site binds the paper's four policies to the same two actions, as a pooled run would.

Only these consortium-wide statistics exist at the server: its ledger records the replies' sizes and hashes (schema,
masked bytes), never a site's sums. Every site must take part: a round 0 that any site misses stops the run (the
statistics would silently leave a hospital out). A server that sends false statistics can only hurt the model's
fit: the statistics enter a site's computation, never its uplink.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any
from fcd_secure.errors import FcdError

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from fcd_secure.config import RunConfig
    from fcd_secure.federation.messaging import Comm
    from fcd_secure.manifest import Manifest

#: ``purpose`` of the evaluation request that asks for the sites' moment sums
PURPOSE_KEY, STATS_PURPOSE = "purpose", "stats"
#: the round-config key that carries the consortium's statistics (JSON) to the sites
STATISTICS_KEY = "standardization"
#: the protocol round id of the statistics round (evaluation rounds of a run count from 1)
STATS_ROUND = 0


class SecureStatisticsError(FcdError, RuntimeError):
    """Round 0 could not produce the consortium's statistics (a site missing, the protocol aborted)."""


def statistics_from_config(config: dict[str, Any]) -> dict[str, list[float]] | None:
    """The statistics a request carries (``None`` when it carries none).

    Raises:
        ValueError: the value is not the JSON of four lists of numbers.
    """
    raw = config.get(STATISTICS_KEY)
    if raw in (None, ""):
        return None
    doc = json.loads(str(raw))
    keys = ("x_mean", "x_std", "a_mean", "a_std")
    optional = ("anchors",)  # the consortium's anchor actions (``data.moments``), absent in older run folders
    if (not isinstance(doc, dict) or not set(keys) <= set(doc) <= set(keys + optional)
            or not all(isinstance(doc[k], list) for k in doc)):
        raise ValueError(f"round config {STATISTICS_KEY!r}: expected {{{', '.join(keys)}}} lists (and optionally anchors)")
    if "anchors" in doc and (len(doc["anchors"]) != 2 or len({int(a) for a in doc["anchors"]}) != 2):
        raise ValueError(f"round config {STATISTICS_KEY!r}: anchors must be two distinct action ids")
    return {k: [float(v) for v in doc[k]] for k in doc}


def secure_statistics(
    comm: "Comm", node_ids: list[int], theta: "dict[str, np.ndarray]", cfg: "RunConfig", manifest: "Manifest"
) -> dict[str, list[float]]:
    """Run round 0 over ``node_ids`` (module docstring) and return the consortium's means and standard deviations.

    Raises:
        SecureStatisticsError: secure aggregation is off, or the round did not include every site.
    """
    from fcd_secure.data.moments import moments_to_statistics  # noqa: PLC0415
    from fcd_secure.federation.secure.secure_evaluation import secure_evaluation_for  # noqa: PLC0415

    secure = secure_evaluation_for(cfg, manifest)
    if secure is None:
        raise SecureStatisticsError("data.standardize = 'secure' needs secure aggregation (federation.secure_aggregation)")
    totals, failed, reason = secure.totals(comm, node_ids, theta, {PURPOSE_KEY: STATS_PURPOSE}, round_id=STATS_ROUND)
    if totals is None or failed:
        raise SecureStatisticsError(
            f"the secure statistics round did not include every site ({reason or 'sites failed: ' + ', '.join(failed)}); "
            "the run stops rather than standardise without them"
        )
    return moments_to_statistics(totals)
