"""Which engine a simulated federation runs on (``fcd run --engine``, ``fcd whatif --engine``); ``engines.local``
starts either.

===============  ================================================================================================
``simulation``   Flower's simulation engine (``engines.simulation.run_simulated``): a Ray cluster and one actor
                 that runs the ClientApp, as in Flower's documentation of ``flwr.simulation.run_simulation``; a
                 fixed 20–50 s start per run on a 2-core machine. ``fcd run``'s default.
``inprocess``    ``engines.inprocess.run_inprocess``: the same ServerApp loop, ClientApp and Message API in this
                 process, without Ray; bit-identical global parameters and answers (``tests/test_federation_inprocess
                 .py``). For studies of many small runs and for CI.
===============  ================================================================================================

The engine is how a run is executed, not what it computes, so it is not a run-config field (as ``fcd deploy`` is
a command, not a field): ``summary.json`` records it (``engine``: :attr:`Engine.summary_name`), and ``fcd whatif``
asks a run on the engine recorded there unless told otherwise. Only :mod:`enum` is imported at module level: the
CLI declares its flags with :class:`Engine` before torch or Flower load.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Engine"]


class Engine(str, Enum):
    """A local engine of a simulated federation (module docstring)."""

    SIMULATION = "simulation"
    INPROCESS = "inprocess"

    @property
    def summary_name(self) -> str:
        """The ``engine`` that ``summary.json`` of a run on this engine records."""
        return _SUMMARY_NAMES[self]

    @classmethod
    def of_summary(cls, name: str) -> "Engine":
        """The engine a run folder's ``summary.json`` names (``"flower"``: the default of the ServerApp's own folder
        writer, ``apps.outputs.write_run_folder``, which Flower's simulation and Deployment engines share).

        Raises:
            ValueError: a name no local engine records.
        """
        for engine, recorded in _SUMMARY_NAMES.items():
            if recorded == name:
                return engine
        raise ValueError(f"summary.json names the engine {name!r}, which is neither of "
                         f"{', '.join(sorted(_SUMMARY_NAMES.values()))}")


_SUMMARY_NAMES = {Engine.SIMULATION: "flower", Engine.INPROCESS: "flower-inprocess"}
