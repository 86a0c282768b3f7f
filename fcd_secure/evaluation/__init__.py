"""fcd_secure.evaluation — the paper's metrics (§IV-C): PEHE / ATE / value error, factual AUC, MMD, off-policy
evaluation (IPW, SNIPW, PDIS, DM, per-decision DR) with support diagnostics, TSTR/TRTR utility, and the figures of
the federated run. Pure numpy (+ matplotlib for plots); depends only on ``fcd_secure.data``.

``plot_metric_vs_round`` / ``plot_utility_vs_uplink`` are imported lazily so that importing metrics never pulls in
matplotlib.

- :mod:`.metrics`: PEHE, ATE error, value error, factual AUC, MMD
- :mod:`.ope`: IPW, SNIPW, PDIS, DM and per-decision DR with support diagnostics
- :mod:`.discrepancy`: the truth-free one-step doubly robust discrepancy D₁ (model selection)
- :mod:`.intervals`: intervals for policy values and effects from consortium sums alone
- :mod:`.propensity`: a site's own model of its logging policy
- :mod:`.tstr`: TSTR / TRTR utility with one fixed predictor
- :mod:`.plots`: the paper's figures
"""

from fcd_secure.evaluation.metrics import (
    AUCStats,
    EffectStats,
    Summary,
    ate_error,
    factual_auc,
    mmd,
    pehe,
    rmse,
    summarise,
    value_error,
)
from fcd_secure.evaluation.ope import (
    DM,
    ESTIMATORS,
    IPW,
    PDIS,
    SNIPW,
    OPEEstimator,
    OPEResult,
    PerDecisionDR,
    SupportWarning,
    combine,
    estimate_on_site,
)
from fcd_secure.evaluation.tstr import StepPredictor, trtr, tstr, utility_report

__all__ = [
    "AUCStats", "EffectStats", "Summary", "ate_error", "factual_auc", "mmd", "pehe", "rmse", "summarise",
    "value_error", "DM", "ESTIMATORS", "IPW", "PDIS", "SNIPW", "OPEEstimator", "OPEResult", "PerDecisionDR",
    "SupportWarning", "combine", "estimate_on_site", "StepPredictor", "trtr", "tstr", "utility_report",
    "plot_metric_vs_round", "plot_utility_vs_uplink",
]


def __getattr__(name: str):  # PEP 562 lazy attribute: matplotlib only when a plot is asked for
    if name in ("plot_metric_vs_round", "plot_utility_vs_uplink"):
        from fcd_secure.evaluation import plots

        return getattr(plots, name)
    raise AttributeError(f"module 'fcd_secure.evaluation' has no attribute {name!r}")
