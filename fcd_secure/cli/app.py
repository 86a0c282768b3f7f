"""The Typer group every ``fcd`` command group is built from, and the one place where results and errors are printed.

* :func:`new_app` builds a command group whose ``main`` catches every error: a :class:`~.envelope.CliError` raised
  by a command, a click usage error, an interrupt, or a bug. With ``--json`` on the command line the error becomes
  the one JSON envelope on stdout (:mod:`fcd_secure.cli.envelope`); without it, ``error: ...`` and ``hint: ...`` on
  stderr. Never a traceback (``FCD_DEBUG=1`` re-raises a bug so its traceback prints).
* :func:`emit` prints a command's JSON envelope; :func:`stdout` / :func:`stderr` are the two consoles;
  :func:`say_identifier` prints a fingerprint or a path whole, never cut to the terminal width.

Only ``typer`` (with ``click`` and ``rich``) is imported here: ``fcd --help`` loads nothing heavier.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from typing import Any

import click
import typer
from rich.console import Console
from rich.markup import escape
from typer.core import TyperCommand, TyperGroup

from fcd_secure._io import jsonable
from fcd_secure.cli.envelope import EXIT_INTERRUPTED, CliError, Envelope, ok
from fcd_secure.cli.renamed import rewrite

#: Set to "1" to let a bug's traceback print instead of the one-line ``INTERNAL`` error.
DEBUG_ENV = "FCD_DEBUG"


def json_requested(args: Sequence[str]) -> bool:
    """Whether the command line asks for JSON output (then errors are JSON envelopes too)."""
    return "--json" in args


def stdout() -> Console:
    """The results console (stdout). Not a terminal: no colour codes, and the width of ``$COLUMNS`` (default 80)."""
    return Console(highlight=False)


def stderr() -> Console:
    """The console for progress, warnings and errors (stderr)."""
    return Console(stderr=True, highlight=False)


def say_identifier(console: Console, label: str, value: str, *, indent: int = 2) -> None:
    """Print ``label value`` with ``value`` whole: an identifier (fingerprint, path) is never folded or cut by rich.

    A line longer than the terminal is wrapped by the terminal itself, so copying it yields the whole identifier.
    """
    console.print(" " * indent + (f"{label} " if label else "") + escape(value), soft_wrap=True)


def done(as_json: bool, data: Any, message: str, identifiers: Sequence[tuple[str, str]] = ()) -> None:
    """A command's success, for machines (one JSON envelope of ``data``) or for people (``ok message`` and each
    ``(label, identifier)`` on a line of its own, never folded: :func:`say_identifier`)."""
    if as_json:
        emit(ok(data, message))
        return
    con = stdout()
    con.print(f"[green]ok[/] {escape(message)}", soft_wrap=True)
    for label, value in identifiers:
        say_identifier(con, label, value)


def say_stopped(as_json: bool, stopped: list) -> None:
    """``fcd server stop`` / ``fcd site stop``: the processes stopped, for machines or people."""
    if as_json:
        emit(ok({"stopped": stopped}, f"stopped {len(stopped)} process(es)"))
        return
    stdout().print(f"stopped {len(stopped)} process(es)")


def say_status(as_json: bool, res: dict) -> None:
    """``fcd server status`` / ``fcd site status``: ``res['processes']`` (name -> ``{pid, running}``) and whether any
    runs, for machines (``res`` with ``running``) or people (one line a process)."""
    running = any(p["running"] for p in res["processes"].values())
    if as_json:
        emit(ok({**res, "running": running}, "running" if running else "stopped"))
        return
    con = stdout()
    for name, p in res["processes"].items():
        con.print(f"{name}: PID {p['pid']} {'running' if p['running'] else 'stopped'}")
    if not res["processes"]:
        con.print("stopped")


def emit(envelope: Envelope) -> None:
    """Print one JSON envelope on stdout."""
    text = json.dumps(jsonable(envelope.to_dict()), ensure_ascii=False)
    click.echo(text)


def report(exc: CliError, as_json: bool) -> int:
    """Print ``exc`` (JSON envelope on stdout, or ``error:``/``hint:`` on stderr) and return its exit code."""
    if as_json:
        emit(exc.envelope())
    else:
        console = stderr()
        console.print(f"[bold red]error:[/] {escape(exc.message)}", soft_wrap=True)
        if exc.hint:
            console.print(f"[dim]hint: {escape(exc.hint)}[/]", soft_wrap=True)
    return exc.exit_code


def _plain_help(text: str) -> str:
    # typer 0.20 escapes "[" for rich markup in option help ("\\[x>=1]") even when help is plain text
    return text.replace("\\[", "[")


def command_path(ctx: click.Context) -> tuple[str, ...]:
    """The path of ``ctx``'s command under ``fcd`` (``("data", "describe")``), whatever the program is called."""
    names: list[str] = []
    while ctx.parent is not None:
        names.insert(0, ctx.info_name or "")
        ctx = ctx.parent
    return tuple(names)


class FcdCommand(TyperCommand):
    """A command whose plain help reads as written (see :func:`_plain_help`) and whose old option spellings still
    work, each with a deprecation note (:mod:`fcd_secure.cli.renamed`)."""

    def get_help(self, ctx: click.Context) -> str:
        return _plain_help(super().get_help(ctx))

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        return super().parse_args(ctx, rewrite(command_path(ctx), args, self.params))


class FcdGroup(TyperGroup):
    """A Typer group whose ``main`` turns every error into a JSON envelope or a one-line message (module docstring)."""

    def get_help(self, ctx: click.Context) -> str:
        return _plain_help(super().get_help(ctx))

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        cmd = super().get_command(ctx, cmd_name)
        if type(cmd) is TyperCommand:  # every command of every group, whoever registered it
            cmd.__class__ = FcdCommand
        return cmd

    def main(  # type: ignore[override]
        self,
        args: Sequence[str] | None = None,
        prog_name: str | None = None,
        complete_var: str | None = None,
        standalone_mode: bool = True,
        **extra: Any,
    ) -> Any:
        argv = list(sys.argv[1:] if args is None else args)
        as_json = json_requested(argv)
        try:
            rv = super().main(
                args=argv, prog_name=prog_name, complete_var=complete_var, standalone_mode=False, **extra
            )
            code = rv if isinstance(rv, int) else 0
        except CliError as exc:
            code = report(exc, as_json)
        except click.ClickException as exc:
            if as_json:
                code = report(CliError(exc.format_message(), "USAGE", hint="see --help", exit_code=exc.exit_code), True)
            else:
                exc.show()  # click's own usage message, on stderr
                code = exc.exit_code
        except (click.Abort, KeyboardInterrupt):
            code = report(CliError("interrupted", "INTERRUPTED", exit_code=EXIT_INTERRUPTED), as_json)
        except Exception as exc:  # noqa: BLE001 - a bug: one line, not a traceback, unless FCD_DEBUG=1
            if os.environ.get(DEBUG_ENV) == "1":
                raise
            code = report(
                CliError(
                    f"{type(exc).__name__}: {exc}", "INTERNAL",
                    hint=f"this is a bug; {DEBUG_ENV}=1 prints the traceback",
                ),
                as_json,
            )
        if standalone_mode:
            sys.exit(code)
        return code


def new_app(help: str | None = None, **kwargs: Any) -> typer.Typer:
    """A command group of ``fcd`` (errors handled by :class:`FcdGroup`).

    Help is click's plain formatter (``rich_markup_mode=None``): it wraps at any terminal width and never cuts an
    option name, where rich's help panels put ``--clients-per-ro…`` at 80 columns.
    """
    kwargs.setdefault("no_args_is_help", True)
    kwargs.setdefault("add_completion", False)
    kwargs.setdefault("rich_markup_mode", None)
    return typer.Typer(cls=FcdGroup, help=help, pretty_exceptions_enable=False, **kwargs)
