"""The datasets the registry knows, one module each (paper §IV-A, Table I).

Every module declares one ``SOURCE`` (:class:`~fcd_secure.data.sources.base.PooledSource` for data read from files,
:class:`~fcd_secure.data.sources.base.GeneratedSource` for a generator) with its name, its row of paper Table I, its
loader and its presets. To add a dataset, write one module like :mod:`.statics2011` and list its ``SOURCE`` in
:data:`SOURCES` below (a plain import: a broken source is an import error at start, never a silently missing
dataset).

- :mod:`.base`: what a source declares, and how a pooled dataset becomes federated sites
- :mod:`.dkt_synth`: DKT-Synth, the semi-synthetic tutoring world with ground truth
- :mod:`.tumour`: the tumour world (Geng et al. 2017), a PK-PD oracle with ground truth
- :mod:`.carryover`: the carry-over world (issue 42), an oracle whose regimens change order with the horizon
- :mod:`.statics2011`, :mod:`.assistments2009`: answer logs, through :mod:`.knowledge_tracing`
- :mod:`.diabetes130`: Diabetes-130 US hospitals (UCI), readmission
- :mod:`.obd`: the Open Bandit Dataset, with logged propensities
"""

from __future__ import annotations

from fcd_secure.data.sources import assistments2009, carryover, diabetes130, dkt_synth, obd, statics2011, tumour
from fcd_secure.data.sources.base import DatasetSource, GeneratedSource, PooledSource

__all__ = ["SOURCES", "DatasetSource", "GeneratedSource", "PooledSource"]

#: In the order ``fcd data describe`` lists them.
SOURCES: tuple[DatasetSource, ...] = (
    dkt_synth.SOURCE,
    statics2011.SOURCE,
    assistments2009.SOURCE,
    diabetes130.SOURCE,
    obd.SOURCE,
    tumour.SOURCE,
    carryover.SOURCE,
)
