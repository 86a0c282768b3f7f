"""`fcd run` (the main federated job) and `fcd ablate`."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach ``fcd run`` and ``fcd ablate`` to the root app."""
