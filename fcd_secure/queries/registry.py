"""The registered queries, in the order a site computes them and the server merges them (``queries.base``).

A new estimator is one :class:`~fcd_secure.queries.base.Query` (or, for a part of the what-if answer, one
:class:`~fcd_secure.queries.policy_values.PolicyPart`) and one line here. Everything else follows from the
registration: the site computes its sums in :func:`site_sums`, the server merges them in :func:`merge`, and the egress
gate allows exactly :func:`metric_names` and :func:`metric_lists` (``apps.egress``).

The site order is the order of the computations on a site (the simulator's rollouts share seeded streams, so the
order is part of the answer); the merge order lets a query read what an earlier one put into the answer.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from fcd_secure.queries.base import MergeContext, Query, SiteContext, SiteSums, Totals
from fcd_secure.queries.declared import DeclaredConfounding
from fcd_secure.queries.doubly_robust import DoublyRobust
from fcd_secure.queries.dr_learner import DRLearnerEffects, DRLearnerFit
from fcd_secure.queries.effects import FactualAUC, OracleEffects
from fcd_secure.queries.kinds import AnswerKinds
from fcd_secure.queries.natural_course import NaturalCourse
from fcd_secure.queries.off_policy import OffPolicy
from fcd_secure.queries.pi_source import PiSource
from fcd_secure.queries.policy_values import LoggedSupport, PolicyValues, SimulatedValues
from fcd_secure.queries.propensities import PropensitySource
from fcd_secure.queries.round_values import RoundValues
from fcd_secure.queries.selection import Selection
from fcd_secure.queries.sensitivity import HorizonSensitivity, Sensitivity
from fcd_secure.queries.sequential_dr import SequentialDR
from fcd_secure.queries.targeted import Identified, OneStep

__all__ = ["POLICY_VALUES", "QUERIES", "merge", "metric_lists", "metric_names", "site_sums"]

#: the what-if answer and its parts, in merge order (``queries.policy_values``)
POLICY_VALUES = PolicyValues(parts=(SimulatedValues(), DoublyRobust(), OffPolicy(), LoggedSupport(), Identified(),
                                    PiSource(), SequentialDR()))
#: every answer of an evaluation (module docstring)
QUERIES: tuple[Query, ...] = (
    OracleEffects(),
    FactualAUC(),
    OneStep(),
    Sensitivity(),
    DRLearnerEffects(),
    POLICY_VALUES,
    HorizonSensitivity(),  # reads the sequential DR's Q̂ of the policy values: after them
    PropensitySource(),
    NaturalCourse(),  # before the selection: a scored round's natural-course gap takes part in its rule
    Selection(),
    RoundValues(),  # after the selection and the natural course: its rollouts leave theirs as they were
    DRLearnerFit(),
    DeclaredConfounding(),  # marks the weighted answers above: after them, before the kinds
    AnswerKinds(),
)


def site_sums(ctx: SiteContext, queries: Iterable[Query] = QUERIES) -> SiteSums:
    """Every applicable query's sums of one site (additive; nothing per entity)."""
    out: SiteSums = {}
    for q in queries:
        if q.applies(ctx):
            out.update(q.site_sums(ctx))
    return out


def merge(totals: Totals, ctx: MergeContext, queries: Iterable[Query] = QUERIES) -> dict[str, Any]:
    """The consortium's answer from its totals: each query adds its part, in order."""
    answer: dict[str, Any] = {}
    for q in queries:
        q.merge(totals, ctx, answer)
    return answer


def metric_names(policy_names: Iterable[str], ope_horizon: int | None,
                 queries: Iterable[Query] = QUERIES) -> list[str]:
    """Every scalar sum any registered query may send for a question about ``policy_names`` (the egress allow-list)."""
    pols = list(policy_names)
    return list(dict.fromkeys(n for q in queries for n in q.names(pols, ope_horizon)))


def metric_lists(queries: Iterable[Query] = QUERIES) -> dict[str, int]:
    """Every list-valued sum any registered query may send, with its length cap."""
    return {k: v for q in queries for k, v in q.lists().items()}
