"""The one registry of dataset names: what ``--dataset`` accepts, how tables label each, which carry ground truth.

Torch-free and import-light (the CLI builds its help texts from it before anything heavy loads). The loaders behind
the names are the sources of :mod:`fcd_secure.data.sources`; :mod:`fcd_secure.data.registry` checks at import that
its ``SOURCES`` are exactly these names, in this order, so a dataset can be neither listed without a loader nor
loadable without being listed.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["DATASETS", "DEFAULT", "GENERATED", "LABELS", "PAPER_DATASETS", "SPEC", "choices"]

#: every dataset, in the order ``fcd data describe`` lists them, with the label tables and figures print
LABELS = MappingProxyType({
    "dkt-synth": "DKT-Synth",
    "statics2011": "Statics2011",
    "assistments2009": "ASSISTments 2009",
    "diabetes130": "Diabetes-130",
    "obd": "OpenBandit",
    "tumour": "Tumour growth",
    "carryover": "Carry-over",
})
DATASETS: tuple[str, ...] = tuple(LABELS)
#: the dataset a run uses when none is named (``config.DEFAULT_DATASET``)
DEFAULT = "dkt-synth"
#: generated worlds with ground truth for any treatment sequence (oracle PEHE, true policy values): the sources that
#: are a ``GeneratedSource`` (``data.registry`` checks it)
GENERATED: tuple[str, ...] = ("dkt-synth", "tumour", "carryover")
#: the four datasets of the paper's Table I that ``fcd reproduce`` runs, in the order its report lists them: the
#: sources with a Table I row (``data.registry`` checks it; the paper has no tumour or carry-over world, and reports ASSISTments
#: 2009 only as the DKT oracle's training data). A literal, not a filter, because this module may not import the
#: sources (torch) and because the order is the paper's, not the registry's
PAPER_DATASETS: tuple[str, ...] = ("dkt-synth", "diabetes130", "obd", "statics2011")
#: the name a run's config carries for a user's own table (``--spec``/``--table``)
SPEC = "spec"


def choices(sep: str = " | ", *, notes: dict[str, str] | None = None, default: str | None = None) -> str:
    """The names joined for a help text, ``notes`` appended in parentheses to the names they key and ``default``
    marked, e.g. ``dkt-synth (default) | tumour | ...``."""
    notes = dict(notes or {})
    if default is not None:
        notes[default] = "default" + (f"; {notes[default]}" if default in notes else "")
    return sep.join(f"{n} ({notes[n]})" if n in notes else n for n in DATASETS)
