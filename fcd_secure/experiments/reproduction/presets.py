"""Presets of ``fcd reproduce``: how big each cell of the reproduction is.

Every preset keeps paper Table II's protocol where it can (Dirichlet α = 10, one local epoch, sample-size weighted
FedAvg, uplink = selected clients × synchronised parameter size, measured) and scales the rest:

=========  =======================================================================================================
preset     what it is for
=========  =======================================================================================================
``tiny``   tests: tiny data, 3 sites (2 per round), 2 rounds, one learning rate (no selection), 1 seed
``quick``  the committed report (``docs/reproduction/``): 10 sites, 5 per round, 8 rounds, 2 seeds, the ``small``
           data presets (DKT-Synth 1,500 students; Diabetes-130 2,000 trajectories; Open Bandit and Statics2011 cut
           into chunks of 20 and 50 steps, ~1,300 and 1,500 trajectories), the ``tiny`` model widths, 2 rollouts per
           trajectory in the final evaluation. ``small`` is the smallest data size at which (nearly) every site's
           test split reaches the evaluation's cohort floor (20 rows; below it a site declines to be evaluated).
           Measured cost per cell and in all: ``docs/reproduction/REPORT.md``
``default`` the README scale: DKT-Synth ``default`` (3,000 students), the ``small`` preset of each real dataset
``paper``  Table I/II sizes: every trajectory, 100 rounds, 5 seeds
=========  =======================================================================================================

Every preset evaluates the whole test split of every site (``max_rows`` None): the oracle's true policy values, and
so the value errors of Table III, are defined on whole test splits only.

The hyperparameter budget is the same for every method (item 4 of the reproduction): each candidate learning rate of
``lr_grid`` is trained for ``selection_epochs`` passes on 80 % of the pooled training data and scored on the other
20 % by the truth-free D1 rule (:mod:`~fcd_secure.experiments.reproduction.selection`); the architecture sizes come from the run preset's
``ModelConfig`` for every method alike.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fcd_secure.data.names import PAPER_DATASETS

__all__ = ["ABLATIONS", "DATASETS", "METHODS", "PRESETS", "ReproPreset", "get_preset"]

#: The four datasets of paper Table I, in the order the report lists them (``data.names.PAPER_DATASETS``).
DATASETS: tuple[str, ...] = PAPER_DATASETS
#: The compared methods (paper §IV-B), in the order of the report.
METHODS: tuple[str, ...] = ("fed_causaldiff", "crn", "rcgan", "timegan", "fedcm")
#: Table III's ablations of Fed-CausalDiff (DKT-Synth only): "w/o DSS" (full sync) and "w/o L_dis".
ABLATIONS: tuple[str, ...] = ("full_sync", "no_ldis")


class ReproPreset(BaseModel):
    """The size of every cell of a reproduction (module docstring)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    run_preset: str = Field(description="the fcd run preset whose model sizes and evaluation settings every cell uses")
    dkt_preset: str = Field(description="DKT-Synth world preset")
    real_preset: str = Field(description="subsample preset of the real datasets (tiny 300, small 2,000, default all)")
    n_sites: int = 10
    clients_per_round: int = 5
    rounds: int
    eval_every: int = Field(description="rounds between the per-round evaluations behind Figs. 3 and 4")
    seeds: int = Field(description="default number of seeds")
    lr_grid: tuple[float, ...] = Field(description="candidate learning rates, the same for every method")
    selection_epochs: int = Field(description="passes over the selection split per candidate")
    model: dict[str, Any] = Field(
        default_factory=lambda: {"ipw": "off"},
        description="ModelConfig overrides of every method (by default the paper's unweighted objective: the "
        "reproduction runs the paper's recipe, not our inverse-propensity default)",
    )
    evaluation: dict[str, Any] = Field(default_factory=dict, description="EvaluationSection overrides")
    tstr_max_rows: int | None = Field(None, description="training trajectories per site synthesised for TSTR")

    def data_preset(self, dataset: str) -> str:
        """The data preset of ``dataset`` in this reproduction."""
        return self.dkt_preset if dataset == "dkt-synth" else self.real_preset


PRESETS: dict[str, ReproPreset] = {
    p.name: p
    for p in (
        ReproPreset(
            name="tiny", run_preset="tiny", dkt_preset="tiny", real_preset="tiny", n_sites=3, clients_per_round=2,
            rounds=2, eval_every=1, seeds=1, lr_grid=(2e-3,), selection_epochs=1,
            evaluation={"n_samples": 2, "quick_n_samples": 1, "max_rows": None, "quick_max_rows": 8},
            tstr_max_rows=16,
        ),
        ReproPreset(
            name="quick", run_preset="tiny", dkt_preset="small", real_preset="small", rounds=8, eval_every=2,
            seeds=2, lr_grid=(3e-4, 1e-3, 3e-3), selection_epochs=1,
            evaluation={"n_samples": 2, "quick_n_samples": 1, "max_rows": None, "quick_max_rows": 16},
            tstr_max_rows=32,
        ),
        ReproPreset(
            name="default", run_preset="default", dkt_preset="default", real_preset="small", rounds=40,
            eval_every=5, seeds=3, lr_grid=(3e-4, 1e-3, 3e-3), selection_epochs=10,
            evaluation={"n_samples": 8, "quick_n_samples": 2, "max_rows": None, "quick_max_rows": 64},
            tstr_max_rows=None,
        ),
        ReproPreset(
            name="paper", run_preset="paper", dkt_preset="paper", real_preset="paper", rounds=100, eval_every=10,
            seeds=5, lr_grid=(3e-4, 1e-3, 3e-3), selection_epochs=25,
            evaluation={"n_samples": 16, "quick_n_samples": 4, "max_rows": None, "quick_max_rows": 128},
            tstr_max_rows=None,
        ),
    )
}


def get_preset(name: str) -> ReproPreset:
    """The reproduction preset ``name``.

    Raises:
        ValueError: naming the presets.
    """
    if name not in PRESETS:
        raise ValueError(f"unknown reproduction preset {name!r}; choose one of {list(PRESETS)}")
    return PRESETS[name]
