"""The paper reproduction (``fcd reproduce``): the four baselines and Fed-CausalDiff federated under paper Table II on
the four datasets, Tables III–IV and Figs. 2–4 beside the paper's numbers.

=================  ================================================================================================
module             role
=================  ================================================================================================
``presets``        the sizes of a reproduction (tiny, quick, default, paper)
``selection``      the hyperparameter budget: one learning-rate grid for every method, chosen on a validation split
``cells``          one method × dataset × seed: federated training, the shared evaluation, TSTR; cached on disk
``outputs``        Tables III–IV and the data of Figs. 2–4 as CSV + JSON, and the PNGs
``paper``          the paper's published numbers
``policy_values``  Fig. 2's policy values: a step-wise doubly robust estimate of each target policy
``report``         ``REPORT.md``: ours beside the paper's, cell by cell, and why they differ
``run``            the whole reproduction, resumable
=================  ================================================================================================
"""

from fcd_secure.experiments.reproduction.presets import ABLATIONS, DATASETS, METHODS, PRESETS, ReproPreset, get_preset

__all__ = [
    "ABLATIONS", "DATASETS", "METHODS", "PRESETS", "Cell", "ReproPreset", "get_preset", "plan_cells", "run_cell",
    "run_reproduction",
]


def __getattr__(name: str):
    """The running parts (torch, Flower), loaded on first use (PEP 562): ``fcd reproduce`` checks its preset,
    datasets and methods against ``presets`` before they are imported."""
    if name in ("Cell", "run_cell"):
        from fcd_secure.experiments.reproduction import cells  # noqa: PLC0415

        return getattr(cells, name)
    if name in ("plan_cells", "run_reproduction"):
        from fcd_secure.experiments.reproduction import run  # noqa: PLC0415

        return getattr(run, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
