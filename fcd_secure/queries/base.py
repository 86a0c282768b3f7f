"""The answers layer's one shape: a :class:`Query` per answer, the typed seams between site, transport and server.

A query is one estimator of the product (the oracle's effect figures, the factual AUC, the identified one-step effect,
the DR-learner, the truth-free round selection, the simulated policy values and each of their doubly robust, off-policy
and support parts, ...). Like an estimator of obp (Saito et al. 2021, "Open Bandit Dataset and Pipeline", NeurIPS
Datasets and Benchmarks), it is one small class whose docstring carries its formula, and it declares everything the
rest of the product needs to know about it:

* :meth:`Query.names` — the exact names of the additive sums it may send (the egress gate's allow-list is the union
  of these declarations, ``apps.egress``: never spelled a second time) and :meth:`Query.lists` its list-valued sums
  with their caps;
* :meth:`Query.site_sums` — on a site, from a :class:`SiteContext` (the model, the site's rows, the typed request),
  the sums only; per-entity values never leave the site;
* :meth:`Query.merge` — on the server, from the consortium's :class:`Totals` (the same numbers whether they were
  summed in clear or revealed by secure aggregation) and a :class:`MergeContext`, its part of the answer.

The order of :data:`QUERIES` (``queries.registry``) is the order of the merge, so a query may read what an earlier one
put into the answer (the policy parts of ``queries.policy_values`` are ordered the same way). A new estimator is one
module with one :class:`Query` subclass and one line in ``queries.registry``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR

if TYPE_CHECKING:  # pragma: no cover - the run config pulls in torch
    from fcd_secure.config import RunConfig
    from fcd_secure.data.schema import SiteDataset
    from fcd_secure.federation.learner import SiteData
    from fcd_secure.federation.site_policy import QuestionPolicy
    from fcd_secure.queries.request import EvaluationRequest, WhatIfRequest

__all__ = ["MergeContext", "MergeOnly", "Query", "SiteContext", "SiteSums", "Totals"]

#: one site's reply: additive sums, each a float or an equal-length list of floats
SiteSums = dict[str, Any]


class Totals(Mapping[str, Any]):
    """The consortium's totals of the sites' sums: every key's sum over the sites that reported it.

    Attributes:
        sites: how many sites were summed.
        counts: how many sites reported each key (a key missing at a site counts as absent there).
    """

    def __init__(self, values: Mapping[str, Any], sites: int, counts: Mapping[str, int] | None = None) -> None:
        self._values = dict(values)
        self.sites = int(sites)
        self.counts = dict(counts or {})

    @classmethod
    def of_sites(cls, parts: list[SiteSums]) -> "Totals":
        """Element-wise sum of the sites' replies (scalars and equal-length lists), in the order given."""
        total: dict[str, Any] = {}
        counts: dict[str, int] = {}
        for p in parts:
            for k, v in p.items():
                if isinstance(v, (list, tuple, np.ndarray)):
                    arr = np.asarray(v, dtype=np.float64)
                    total[k] = arr if k not in total else total[k] + arr
                else:
                    total[k] = float(v) + float(total.get(k, 0.0))
                counts[k] = counts.get(k, 0) + 1
        return cls(total, len(parts), counts)

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def reported_by(self, key: str) -> int:
        """How many sites sent ``key`` (all of them where the transport does not say)."""
        return int(self.counts.get(key, self.sites))

    def all_sent(self, key: str) -> bool:
        """Whether every site that answered sent ``key``: a truth, a doubly robust sum or a bound summed over part of
        the consortium would describe a partial population."""
        return key in self._values and self.reported_by(key) == self.sites


@dataclass
class SiteContext:
    """What a query reads on a site: the model being evaluated, the site's data and rows, the typed request.

    Attributes:
        model: the simulator (global Θc with the site's own Θs).
        data: the site's ``SiteData`` (splits, anchors, oracle).
        cfg: the run configuration.
        request: the evaluation request, validated on the site.
        rows: the test rows evaluated (the site's own cohort, ``queries.cohort``).
        sub: those rows of the test split.
        seed: the site's evaluation seed (every rollout shares it: common random numbers across policies).
        site_dir: the site's own state folder (per-entity files), None outside a site.
        questions: the site's question budget, None outside a site.
        floor: the site's cohort floor for its validation rows (fewer entities send n = 0, P22).
        cache: values several queries read, computed once per evaluation (the one-step pair, the rollouts).
    """

    model: Any
    data: "SiteData"
    cfg: "RunConfig"
    request: "EvaluationRequest"
    rows: np.ndarray
    sub: "SiteDataset"
    seed: int
    site_dir: Path | None = None
    questions: "QuestionPolicy | None" = None
    floor: int = MIN_COHORT_FLOOR
    cache: dict[str, Any] = field(default_factory=dict)

    @property
    def all_rows(self) -> bool:
        """Whether the rows are the site's whole test split (an oracle's per-site truth needs it)."""
        return len(self.rows) == self.data.test.n

    @property
    def n_samples(self) -> int:
        return self.request.n_samples if self.request.n_samples is not None else (
            self.cfg.evaluation.quick_n_samples if self.request.quick else self.cfg.evaluation.n_samples)

    def once(self, key: str, make) -> Any:
        """``make()`` computed once per evaluation and shared by every query that asks for ``key``."""
        if key not in self.cache:
            self.cache[key] = make()
        return self.cache[key]


@dataclass(frozen=True)
class MergeContext:
    """What a query's merge reads besides the totals.

    Attributes:
        question: the what-if question asked (its policies' order, reference, level), None in a quick evaluation.
        action_names: the run's action labels as the server knows them (for the anchors), or None.
        binary: the outcome is binary (estimates are kept in its range).
        dr_fit_steps: the validation steps the DR-learner's β was fitted on (its intercept's re-fit).
        round_id: the evaluated round (a scored round's selection row).
        unrecorded_confounding: the run's declared unrecorded confounding (``queries.declared``:
            ``{"declared", "by"}``), None where none is declared.
        behaviour_model: where the sites' estimated propensities come from (``evaluation.behaviour_model``:
            ``site``, each site's own model; ``shared``, the consortium's, fitted through secure sums;
            ``shared_slopes``, the consortium's slopes with each site's own intercepts).
    """

    question: "WhatIfRequest | None" = None
    action_names: list[str] | None = None
    binary: bool = True
    dr_fit_steps: int = 0
    round_id: int = 0
    unrecorded_confounding: Mapping[str, str] | None = None
    behaviour_model: str = "site"

    @property
    def level(self) -> float:
        return self.question.level if self.question is not None else 0.9


class Query(ABC):
    """One answer of the product: its site-side sums, the names it sends, its merge (module docstring).

    Attributes:
        name: the query's name (its sums' key prefix where it has one).
        quick: whether it runs in the cheap evaluations during training too (else only in a full evaluation).
    """

    name: ClassVar[str]
    quick: ClassVar[bool] = False

    @abstractmethod
    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        """Every scalar sum this query may send for a question about ``policy_names`` (exact names)."""

    def lists(self) -> dict[str, int]:
        """Its list-valued sums and their caps (most queries send scalars only)."""
        return {}

    def applies(self, ctx: SiteContext) -> bool:
        """Whether it answers this request on this site (default: full evaluations, and quick ones if ``quick``)."""
        return self.quick or not ctx.request.quick

    @abstractmethod
    def site_sums(self, ctx: SiteContext) -> SiteSums:
        """The sums one site sends (additive over entities; nothing that could be solved for one entity)."""

    @abstractmethod
    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        """Add this query's part of the answer, from the consortium's totals, to ``answer``."""


class MergeOnly(Query):
    """A query with no sums of its own: its merge reads what the earlier queries put into the answer (the kinds, the
    declared confounding). It sends nothing and never runs on a site."""

    def names(self, policy_names: Iterable[str], ope_horizon: int | None) -> list[str]:
        return []

    def applies(self, ctx: SiteContext) -> bool:
        return False

    def site_sums(self, ctx: SiteContext) -> SiteSums:
        return {}
