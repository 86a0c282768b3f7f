"""Unrecorded confounding the user declares: the weighted and g-computation answers are then **not identified**.

Every answer checked by weighting (the one-step effect, the identified values and effects, the sequential doubly
robust values) and every g-computation by the simulator rests on sequential exchangeability given the recorded
history (Robins 1986; Hernán & Robins 2020, "Causal Inference: What If", §3.2 and ch. 19): nothing in the logs can
test it. Where the user knows of a confounder the logs do not record — the tutor reads a student's readiness, the
clinician what she sees at the bedside — that assumption is known to fail, and these answers are not identified
from the logs at all (issue 42 item 4: "not identified" where positivity fails step by step *or the user declares
unrecorded confounding*). What the logs still say is how far such a confounder could move them: the Γ-bounds of
``queries.sensitivity`` (Tan 2006, the marginal sensitivity model), which are then the answer shown.

The declaration is read once, on the server (:func:`declared_confounding`), from, first to last:

1. the run's ``[evaluation] unrecorded_confounding`` (``""`` declares none and overrides the others);
2. the table spec's ``unrecorded_confounding`` (a user's table, ``data.dataset = "spec"``);
3. the generated world's own (``data.sources``: DKT-Synth's hidden readiness), unless the run sets γ = 0 (the
   logging policy then ignores what γ weighs).

:class:`DeclaredConfounding` has no sums: its merge (registered after every weighted answer, before the kinds)
marks each of them ``not_identified`` with the declaration, and writes ``answer["unrecorded_confounding"]``. The
numbers stay in the JSON beside the mark (they are the bounds' Γ = 1 ends); every renderer prints the mark and the
bounds, never the number as an answer, and never ranks (``queries.answers``).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from fcd_secure.queries.base import MergeContext, MergeOnly, Totals

if TYPE_CHECKING:  # pragma: no cover - the run config pulls in torch
    from fcd_secure.config import RunConfig

__all__ = ["DeclaredConfounding", "declared_confounding", "not_identified_text"]


def not_identified_text(declared: str) -> str:
    """``not identified (declared unrecorded confounding: …)``: the mark every weighted answer carries."""
    return f"not identified (declared unrecorded confounding: {declared})"


def declared_confounding(cfg: "RunConfig") -> dict[str, str] | None:
    """The declared unrecorded confounding of a run (module docstring): ``{"declared": words, "by": where}``, or None.

    Raises:
        DataError: the run's table spec cannot be read.
    """
    from fcd_secure.data import names  # noqa: PLC0415
    from fcd_secure.data.registry import get_source  # noqa: PLC0415 - the sources import the worlds
    from fcd_secure.data.sources.base import GeneratedSource  # noqa: PLC0415
    from fcd_secure.data.inputs import load_dataset_spec  # noqa: PLC0415

    own = cfg.evaluation.unrecorded_confounding
    if own is not None:
        return {"declared": own, "by": "the run's [evaluation] unrecorded_confounding"} if own.strip() else None
    data = cfg.data
    if data.dataset == names.SPEC:
        if data.spec is None or not Path(data.spec).is_file():
            return None  # a deployed server without the sites' spec: the run's own setting is the declaration
        # a dataset spec, or the spec an OMOP cohort spec implies (data.inputs: the one reader of either)
        words = load_dataset_spec(data.spec).unrecorded_confounding
        return {"declared": words, "by": "the table spec"} if words else None
    src = get_source(data.dataset)
    if isinstance(src, GeneratedSource) and src.unrecorded_confounding and data.gamma != 0:
        return {"declared": src.unrecorded_confounding, "by": f"the {src.name} world"}
    return None


class DeclaredConfounding(MergeOnly):
    """Marks every weighted and g-computation answer not identified under a declared unrecorded confounder (module
    docstring): ``answer["unrecorded_confounding"]`` and ``not_identified`` on each answer."""

    name = "declared"

    def merge(self, totals: Totals, ctx: MergeContext, answer: dict[str, Any]) -> None:
        decl = ctx.unrecorded_confounding
        if not decl:
            return
        mark = not_identified_text(decl["declared"])
        answer["unrecorded_confounding"] = {**decl, "not_identified": mark,
                                            "shown": "the bounds under the marginal sensitivity model"}
        if answer.get("one_step_effect"):
            answer["one_step_effect"]["not_identified"] = mark
        for d in (answer.get("policies") or {}).values():
            for key in ("identified", "sequential_dr"):
                if d.get(key):
                    d[key]["not_identified"] = mark
