"""``flwr supernode register`` of several SuperNode keys in one process.

A consortium's SuperLink keeps its state in memory, so every start registers each enrolled site's SuperNode key
again (``engines.deployment.register_node_keys``). Each ``flwr`` process spends about 1.1 s of CPU importing
Flower's CLI and then waits on one Control API request; one process per key made a four-site start pay that four
times on two cores. This entry point runs the ``flwr`` command itself (``flwr.cli.app.app``, the function the
installed ``flwr`` script calls: Typer/Click in standalone mode, so each call ends in ``SystemExit`` with the exit
code the ``flwr`` process would have had) once per key, one after another, in one process: the same arguments, the
same output, the same exit codes, the CLI imported once.

``python -m fcd_secure._flower.register --connection NAME --result FILE NAME=PUBLIC_KEY ...`` appends one JSON line
``{"name": ..., "exit_code": ...}`` to ``FILE`` as each registration ends (a caller that has to kill the process
still reads the ones that ended) and exits 0 when every key was registered, else 1. It runs with the caller's
``FLWR_HOME`` (the connection's config) and working folder (a relative key path is the ``flwr`` command's too).
"""

from __future__ import annotations

import argparse
import json
import sys


def register_one(public_key: str, connection: str, name: str) -> int:
    """``flwr supernode register PUBLIC_KEY CONNECTION --name NAME`` in this process; its exit code."""
    from flwr.cli.app import app  # noqa: PLC0415 - the flwr command's own entry point (bin/flwr)

    try:
        app(args=["supernode", "register", public_key, connection, "--name", name], prog_name="flwr")
    except SystemExit as exc:  # standalone mode always ends in SystemExit, as the flwr process does
        code = exc.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fcd_secure._flower.register", description=__doc__.split("\n")[0])
    parser.add_argument("--connection", required=True, help="the SuperLink connection of $FLWR_HOME/config.toml")
    parser.add_argument("--result", required=True, help="file to append each key's JSON line to")
    parser.add_argument("keys", nargs="+", metavar="NAME=PUBLIC_KEY")
    args = parser.parse_args(argv)
    pairs = [k.split("=", 1) for k in args.keys]
    if any(len(p) != 2 or not p[0] for p in pairs):
        parser.error("each key is NAME=PUBLIC_KEY")
    failed = 0
    for name, key in pairs:
        code = register_one(key, args.connection, name)
        failed += code != 0
        sys.stdout.flush()  # this key's output reaches the log before the next key's
        with open(args.result, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"name": name, "exit_code": code}) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":  # pragma: no cover - process entry point
    sys.exit(main())
