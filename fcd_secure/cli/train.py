"""`fcd train` (centralised reference training)."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    """Attach ``fcd train`` to the root app."""
