"""``fcd consortium``: the coordinator provisions a consortium and enrols its sites.

``init`` makes the consortium's folder (CA, SuperLink certificate, coordinator key, ``consortium.toml``);
``add-site`` checks a site's enrolment request against the fingerprint its operator gave out of band, registers its
keys and writes the signed bundle the site joins with (``fcd_secure.provisioning``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from fcd_secure.cli._provisioning import bad_input
from fcd_secure.cli.app import done, emit, new_app, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok

app = new_app(help="Provision a consortium (coordinator side): init, add-site.")

_HOME = typer.Option(..., "--home", help="The coordinator's folder.")


def _pins(pins: list[str]) -> dict[str, str]:
    out = {}
    for p in pins:
        name, sep, version = p.partition("=")
        if not sep or not name or not version:
            raise CliError(f"--pin {p!r}: expected PACKAGE=VERSION", "USAGE", hint="e.g. --pin flwr=1.42.0")
        out[name] = version
    return out


@app.command("init", short_help="Create a consortium: CA, SuperLink certificate, signing key, consortium.toml.")
def init(
    home: Path = _HOME,
    consortium_id: str = typer.Option(..., "--id", help="The consortium's name ([A-Za-z0-9._-])."),
    spec: Path = typer.Option(..., "--spec", exists=True, dir_okay=False, help="The data spec every site's table must match."),
    host: list[str] = typer.Option(["127.0.0.1", "localhost"], "--host", help="Host names of the SuperLink (certificate SANs); the first is the address sites use."),
    port: int = typer.Option(9092, "--port", min=1, max=65535, help="The SuperLink's Fleet API port."),
    cert_days: int = typer.Option(365, "--cert-days", min=1, help="Validity of the CA and SuperLink certificate."),
    min_trajectories: int = typer.Option(50, "--min-trajectories", min=1, help="Fewest trajectories a site may bring."),
    pin: list[str] = typer.Option([], "--pin", help="PACKAGE=VERSION to pin instead of this environment's (repeatable)."),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Create a consortium in HOME. Prints the coordinator's key fingerprint: give it to every site's operator out
    of band (they type it into `fcd site join`)."""
    from fcd_secure.provisioning.consortium import PreflightTerms, init_consortium  # noqa: PLC0415

    with bad_input("fcd consortium init --help"):
        co = init_consortium(home, consortium_id, spec, hosts=tuple(host), port=port, cert_days=cert_days,
                             preflight=PreflightTerms(min_trajectories=min_trajectories), version_pins=_pins(pin))
        cfg = co.config()
    data = {"home": str(co.home), "consortium_id": cfg.consortium_id, "coordinator_fingerprint": cfg.coordinator_fingerprint,
            "ca_fingerprint": cfg.ca_fingerprint, "superlink": cfg.superlink, "spec_sha256": cfg.data.spec_sha256,
            "app_fab_sha256": cfg.app_fab_sha256, "versions": cfg.versions}
    if as_json:
        emit(ok(data, f"consortium {cfg.consortium_id} created in {co.home}"))
        return
    con = stdout()
    con.print(f"[green]ok[/] consortium {cfg.consortium_id} created", soft_wrap=True)
    say_identifier(con, "home", str(co.home))
    say_identifier(con, "coordinator fingerprint (give to every site out of band)", cfg.coordinator_fingerprint)
    say_identifier(con, "CA fingerprint", cfg.ca_fingerprint)
    stderr().print(f"the CA's private key is {co.pki / 'ca.key'}: move it offline once the consortium is provisioned")


@app.command("add-site", short_help="Enrol a site from its request; write its signed bundle.")
def add_site(
    request: Path = typer.Argument(..., exists=True, dir_okay=False, help="The site's enrolment_request.json."),
    home: Path = _HOME,
    fingerprint: Optional[str] = typer.Option(
        None, "--fingerprint", help="The site's identity fingerprint, as its operator gave it out of band."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope."),
) -> None:
    """Check REQUEST (self-signature, the fingerprint given out of band, the consortium's data spec, a P-384
    SuperNode key), enrol the site, re-sign the roster and write every enrolled site's bundle."""
    from fcd_secure.provisioning.bundle import add_site as enrol  # noqa: PLC0415
    from fcd_secure.provisioning.consortium import Coordinator  # noqa: PLC0415

    if fingerprint is None:
        stderr().print("[yellow]warning:[/] no --fingerprint: the request's key was not checked against one given out "
                       "of band; anyone could have written this request")
    with bad_input("the site's operator reads the identity fingerprint from `fcd site init`"):
        res = enrol(Coordinator(home), request, fingerprint)
    done(as_json, res, f"site {res['site_id']} enrolled",
         [("identity", res["identity_fingerprint"]), ("SuperNode key", res["node_fingerprint"]),
          *(("bundle", b) for b in res["bundles"])])
