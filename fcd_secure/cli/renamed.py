"""The options that were renamed, per command, and the one place their old spellings are still read.

Each concept has one option name in every command (``--sites`` for a number of sites, ``--dp-epsilon`` for an ε
cap, ``--seed`` for the first seed, a repeated singular option for a list such as ``--method a --method b``). An
old spelling keeps working, so no script or document breaks: before click parses a command line,
:func:`rewrite` puts the new name in the old one's place and prints one ``note: --old is deprecated; use --new``
line on stderr. The old names are not declared on the commands, so ``--help`` and shell completion show only the
new ones (click's ``hidden=True`` would hide them from the help but still list them in completion, and each would
need its own parameter merged by hand in every command).

A comma list (``--methods a,b``) becomes the repeated option (``--method a --method b``); an option that no longer
does anything (``fcd train --centralised``: the command is the centralised reference) is dropped.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import click

__all__ = ["RENAMED", "Renamed", "rewrite"]


@dataclass(frozen=True)
class Renamed:
    """One old spelling of a command's option.

    Attributes:
        old: the old option name (``--n-sites``).
        new: the name to use (``--sites``); ``None`` for a flag that no longer does anything (dropped).
        split: the old option took a comma-separated list; each item becomes one ``new`` option.
        note: what the deprecation note says instead of ``use NEW`` (for a dropped flag).
    """

    old: str
    new: str | None
    split: bool = False
    note: str = ""

    def message(self) -> str:
        advice = self.note or f"use {self.new}" + (" once per value" if self.split else "")
        return f"note: {self.old} is deprecated; {advice}"


#: per command (its path under ``fcd``), the old spellings it still reads
RENAMED: dict[tuple[str, ...], tuple[Renamed, ...]] = {
    ("train",): (
        Renamed("--centralised", None,
                note="leave it out (fcd train always runs the centralised reference; federated training is fcd run)"),
        Renamed("--methods", "--method", split=True),
    ),
    ("ablate",): (
        Renamed("--first-seed", "--seed"),
        Renamed("--variants", "--variant", split=True),
    ),
    ("reproduce",): (
        Renamed("--datasets", "--dataset", split=True),
        Renamed("--methods", "--method", split=True),
    ),
    ("data", "describe"): (Renamed("--n-sites", "--sites"),),
    ("privacy", "plan"): (
        Renamed("--n-site", "--trajectories"),
        Renamed("--epsilon", "--dp-epsilon"),
        Renamed("--delta", "--dp-delta"),
    ),
}


def _value_options(params: Iterable[click.Parameter]) -> set[str]:
    """The option names of ``params`` that take a value (the word after them is that value, never an option)."""
    return {name for p in params if isinstance(p, click.Option) and not p.is_flag and not p.count
            for name in (*p.opts, *p.secondary_opts)}


def rewrite(path: tuple[str, ...], args: Sequence[str], params: Iterable[click.Parameter],
            warn: Callable[[str], None] | None = None) -> list[str]:
    """``args`` of the command at ``path`` with every old spelling replaced by its new one (module docstring).

    Args:
        path: the command's path under ``fcd`` (``("data", "describe")``).
        args: its command line, as click would parse it.
        params: its declared parameters: the value of an option is passed through untouched, whatever it reads.
        warn: prints one deprecation note (once per old option used); default: a line on stderr.

    Returns:
        the command line to parse.
    """
    table = {r.old: r for r in RENAMED.get(path, ())}
    if not table:
        return list(args)
    warn = warn or (lambda text: click.echo(text, err=True))
    takes_value = _value_options(params)
    out: list[str] = []
    noted: set[str] = set()
    words = list(args)
    i = 0
    while i < len(words):
        word = words[i]
        i += 1
        if word == "--":  # everything after it is an argument
            out += words[i - 1:]
            break
        name, eq, inline = word.partition("=")
        r = table.get(name) if name.startswith("--") else None
        if r is None:
            out.append(word)
            if word in takes_value and i < len(words):  # its value, passed as it is
                out.append(words[i])
                i += 1
            continue
        if r.old not in noted:
            noted.add(r.old)
            warn(r.message())
        if r.new is None:  # a flag that does nothing now
            continue
        if eq:
            value: str | None = inline
        elif r.new in takes_value and i < len(words):
            value, i = words[i], i + 1
        else:  # a flag, or a value missing at the end: click names the new option in its error
            out.append(r.new)
            continue
        items = [v.strip() for v in value.split(",") if v.strip()] if r.split else [value]
        for item in items or [value]:
            out += [r.new, item]
    return out
