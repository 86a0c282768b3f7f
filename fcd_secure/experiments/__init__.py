"""fcd_secure.experiments — the studies of the paper on top of federation, model and evaluation (the layer the CLI
calls; nothing below imports it).

=================  ================================================================================================
module             role
=================  ================================================================================================
``centralised``    the one centralised reference (one epoch rule, one seed rule): ``fcd train --centralised`` and the
                   ``centralised`` row of ``fcd ablate``
``ablation``       Table III variants (DSS, full sync, w/o L_dis, local only, centralised) over seeds
``evaluate``       scoring any :class:`~fcd_secure.model.simulator.Simulator` with the federated evaluation
``tables``         mean ± s.d. over seeds (the cells of Table III)
``report_html``    ``fcd report``: one self-contained HTML page of a run for a privacy officer and an auditor
``reproduction``   the paper reproduction (``fcd reproduce``): the four baselines and Fed-CausalDiff federated on the
                   four datasets, Tables III–IV and Figs. 2–4 beside the paper's numbers, cached per cell
=================  ================================================================================================

Figures come from :mod:`fcd_secure.evaluation.plots`.
"""

__all__ = ["matched_epochs", "mean_sd_table", "run_centralised", "run_centralised_seeds"]


def __getattr__(name: str):
    """The public names, loaded on first use (PEP 562): a command that checks its arguments against a light
    submodule (``variants``, ``reproduction.presets``) does not import torch by importing this package first."""
    if name in ("matched_epochs", "run_centralised", "run_centralised_seeds"):
        from fcd_secure.experiments import centralised  # noqa: PLC0415

        return getattr(centralised, name)
    if name == "mean_sd_table":
        from fcd_secure.experiments.tables import mean_sd_table  # noqa: PLC0415

        return mean_sd_table
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
