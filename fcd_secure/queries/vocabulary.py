"""The run's data vocabulary as the server may know it without any site's data: action labels, context columns, and
the check that every policy of a question binds to them before anything starts."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fcd_secure.data.policy import Policy, bind_policy

if TYPE_CHECKING:  # pragma: no cover - the run config pulls in torch
    from fcd_secure.config import RunConfig

__all__ = ["action_labels", "bind_policies", "context_columns"]


def action_labels(cfg: "RunConfig") -> list[str] | None:
    """The action labels of the run's data as the server may know them without any site's data: a spec's labels
    (``actions`` / ``action_labels``), DKT-Synth's item names, the tumour world's four actions, the carry-over
    world's two; None otherwise (anchors are then shown by id)."""
    from fcd_secure.data.inputs import load_dataset_spec  # noqa: PLC0415

    d = cfg.data
    if d.dataset == "spec" and d.spec:
        spec = load_dataset_spec(d.spec)
        return list(spec.actions or spec.action_labels or []) or None
    if d.dataset == "dkt-synth":
        from fcd_secure.data.dkt_synth.generation import ITEM_LABELS  # noqa: PLC0415

        return list(ITEM_LABELS)
    if d.dataset == "tumour":
        from fcd_secure.data.tumour import ACTION_LABELS  # noqa: PLC0415

        return list(ACTION_LABELS)
    if d.dataset == "carryover":
        from fcd_secure.data.carryover import ACTION_LABELS as CARRYOVER_ACTIONS  # noqa: PLC0415

        return list(CARRYOVER_ACTIONS)
    return None


def context_columns(cfg: "RunConfig") -> dict[str, list[str]]:
    """The context columns by how a rollout treats them, as the server may know them without any site's data: a
    spec's ``[[context]]`` columns by ``dynamics``, DKT-Synth's clock, the tumour's volume and diameter, the
    carry-over world's severity and toxicity; empty otherwise (the counts remain)."""
    from fcd_secure.data.inputs import load_dataset_spec  # noqa: PLC0415

    d = cfg.data
    if d.dataset == "spec" and d.spec:
        spec = load_dataset_spec(d.spec)
        gen = [c.name for c in spec.context if c.dynamics == "endogenous"] if cfg.model.use_context else []
        return {"generated_columns": gen, "replayed_columns": [c.name for c in spec.context if c.name not in gen]}
    if d.dataset == "dkt-synth":
        from fcd_secure.data.dkt_synth.generation import CONTEXT_NAMES  # noqa: PLC0415

        return {"generated_columns": [], "replayed_columns": list(CONTEXT_NAMES)}
    if d.dataset == "tumour":
        from fcd_secure.data.tumour import CONTEXT_NAMES as TUMOUR_CONTEXTS  # noqa: PLC0415

        gen = list(TUMOUR_CONTEXTS) if cfg.model.use_context else []  # both endogenous (data/tumour/pkpd.py)
        return {"generated_columns": gen, "replayed_columns": [c for c in TUMOUR_CONTEXTS if c not in gen]}
    if d.dataset == "carryover":
        from fcd_secure.data.carryover import CONTEXT_NAMES as CARRYOVER_CONTEXTS  # noqa: PLC0415

        gen = list(CARRYOVER_CONTEXTS) if cfg.model.use_context else []  # both endogenous (data/carryover/model.py)
        return {"generated_columns": gen, "replayed_columns": [c for c in CARRYOVER_CONTEXTS if c not in gen]}
    return {}


def bind_policies(cfg: "RunConfig", policies: list[Policy]) -> None:
    """Bind every policy to the run's action labels and context columns before anything starts (exit 2 early).

    Raises:
        DataError: a label or context column the data does not have (the message names the policy file and field).
    """
    from fcd_secure.federation import learner  # noqa: PLC0415

    if not any(p.labels or p.needs_context for p in policies):
        return  # ids and anchors are checked by the rollouts; only labels and columns need the data's vocabulary
    site = learner.load_site_data(cfg, 0).test
    for p in policies:
        bind_policy(p, site)
