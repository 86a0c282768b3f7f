"""The command-line options that several ``fcd`` commands declare alike (``fcd run``, ``fcd deploy``, ``fcd data
validate``, ``fcd ablate``, ``fcd config show``): one declaration each, so that a flag's name, metavar, bounds and
help cannot drift between the commands that accept it.

Each constant is a ``typer.Option`` used as a parameter's default (Typer reads it when it builds the click command,
https://typer.tiangolo.com/tutorial/options/); a command whose flag means something else (``fcd data export
--seed``, ``fcd consortium --spec``) declares its own. Only ``typer`` is imported here: ``fcd --help`` stays cheap.
"""

from __future__ import annotations

import typer

from fcd_secure.cli.resolve import SET_HELP
from fcd_secure.cli.tables import SPEC_HELP, TABLE_HELP

__all__ = ["DATA_DIR", "DP_CLIP", "DP_DELTA", "RUN_SEED", "SETTINGS", "SPEC", "TABLE"]

#: ``--spec`` of a command that reads the user's own data (with :data:`TABLE`; :func:`.tables.spec_and_table`)
SPEC = typer.Option(None, "--spec", metavar="SPEC", dir_okay=False, help=SPEC_HELP)
#: ``--table``, repeatable: the user's own long-format table(s) that ``--spec`` describes
TABLE = typer.Option(None, "--table", metavar="TABLE", help=TABLE_HELP)
#: ``--set KEY=VALUE``, repeatable: any run-config key (:mod:`fcd_secure.cli.resolve`, layer 4)
SETTINGS = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP)
#: ``--seed`` of one federated run (unset: the preset's or the config file's)
RUN_SEED = typer.Option(None, "--seed", help="Seed of split, initialisation, sampling and training.")
#: ``--data-dir`` of a run: where the real datasets are
DATA_DIR = typer.Option(
    None, "--data-dir", help="Real datasets root (default $FCD_DATA_DIR, then ../shared/data of a source checkout)."
)
#: ``--dp-delta`` of a run (the default rule is :class:`fcd_secure.privacy.config.DPConfig`'s)
DP_DELTA = typer.Option(None, "--dp-delta", help="DP δ (default: a power of ten ≤ 1/(10·n_site)).")
#: ``--dp-clip`` of a run
DP_CLIP = typer.Option(None, "--dp-clip", min=1e-6, help="DP-SGD per-sample clipping norm C (default 1.0).")
