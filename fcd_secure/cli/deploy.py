"""`fcd deploy`: the same run as `fcd run`, on Flower's Deployment Engine on this machine, secure by default.

Like ``fcd run``, everything is checked before any process starts (:func:`fcd_secure.cli.preflight.check_run`,
then :meth:`fcd_secure.engines.deployment.LocalDeployment.prepare` for certificates, node keys and site
policies): bad input is exit 2 naming the file and field, and no process is left running. Results and errors are
printed as ``fcd run`` prints them (one JSON envelope with ``--json``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from fcd_secure.cli.tables import LEFTOVER_WORDS, spec_and_table
from fcd_secure.data import names
from fcd_secure.cli.app import emit, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import EXIT_OK, CliError, ok
from fcd_secure.cli import options
from fcd_secure.cli.resolve import PRESET_HELP, RunOptions, resolve_config
from fcd_secure.cli.run import summary_table

__all__ = ["register"]


def _deploy_input_errors() -> tuple[type[BaseException], ...]:
    """Bad input of a deployment beyond the run's own (exit 2): certificates, node keys, site policies."""
    from fcd_secure.engines.deployment import DeploymentInputError  # noqa: PLC0415
    from fcd_secure.engines.pki import PKIError  # noqa: PLC0415
    from fcd_secure.federation.site_policy import SitePolicyError  # noqa: PLC0415

    return (PKIError, SitePolicyError, DeploymentInputError)


def register(app: typer.Typer) -> None:
    """Attach ``fcd deploy`` to the root app."""

    @app.command("deploy", short_help="The same run on Flower's Deployment Engine (127.0.0.1), secure by default.",
                 context_settings=LEFTOVER_WORDS)
    def deploy(
        ctx: typer.Context,
        preset: Optional[str] = typer.Option(None, "--preset", help=f"{PRESET_HELP}. Default: tiny, or the --config file's."),
        sites: Optional[int] = typer.Option(None, "--sites", min=1, help="SuperNodes (one per site) on 127.0.0.1 (default 4: secure aggregation's minimum; a table's site column decides)."),
        rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Rounds (preset default)."),
        clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", min=1, help="Sites per round (default all)."),
        seed: Optional[int] = options.RUN_SEED,
        dataset: Optional[str] = typer.Option(None, "--dataset", help=names.choices(default=names.DEFAULT) + "."),
        spec: Optional[Path] = options.SPEC,
        table: Optional[list[str]] = options.TABLE,
        data_dir: Optional[Path] = options.DATA_DIR,
        config_file: Optional[Path] = typer.Option(None, "--config", exists=True, dir_okay=False, help="A run config (TOML/JSON, e.g. a run folder's config.toml); options given override only what they name."),
        eval_every: Optional[int] = typer.Option(None, "--eval-every", min=0, help="Federated PEHE every N rounds (0: only at the end)."),
        secure: Optional[bool] = typer.Option(None, "--secure-aggregation/--no-secure-aggregation", help="Secure aggregation (default on; off only with --insecure-dev).", show_default=False),
        dp_epsilon: Optional[float] = typer.Option(None, "--dp-epsilon", min=0.01, help="DP-SGD on every site with this lifetime ε cap per site dataset."),
        dp_delta: Optional[float] = options.DP_DELTA,
        dp_clip: Optional[float] = options.DP_CLIP,
        dp_ledger_dir: Optional[Path] = typer.Option(None, "--dp-ledger-dir", help="Persistent privacy-ledger folder of the sites."),
        port: int = typer.Option(0, "--port", help="SuperLink port (Fleet + Control APIs; keep it private); 0 picks a free one."),
        workdir: Optional[Path] = typer.Option(None, "--workdir", help="Folder of the coordinator's and the sites' folders, logs and the app (default: a temp dir)."),
        out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (the audit evidence goes to <out>/evidence/); must not hold another run."),
        tls_dir: Optional[Path] = typer.Option(None, "--tls-dir", help="Your ca.crt, server.pem, server.key (default: made here for 127.0.0.1/localhost)."),
        node_keys_dir: Optional[Path] = typer.Option(None, "--node-keys-dir", help="Your <site-id>.key SuperNode keys, EC P-384 (default: made per site)."),
        site_policies: Optional[Path] = typer.Option(None, "--site-policies", help="The hospitals' own <site-id>.toml policies (default: from this run's options)."),
        insecure_dev: bool = typer.Option(False, "--insecure-dev", help="Development only: no TLS, no SuperNode authentication, any submitted app runs on the sites. Marks the run folder."),
        keep: bool = typer.Option(False, "--keep", help="Leave the SuperLink and SuperNodes running after the run."),
        settings: Optional[list[str]] = options.SETTINGS,
        timeout_s: float = typer.Option(1800, "--timeout", help="Give up after this many seconds."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (summary.json in data) on stdout; progress on stderr."),
    ) -> None:
        """Run Fed-CausalDiff under Flower's Deployment Engine on this machine, secure by default: a SuperLink with
        TLS and SuperNode authentication (each site's EC key registered), per site a SuperNode whose own executor
        runs only the consortium's pinned app, secure aggregation, each site's own policy and state folder (0700).
        The audit evidence (ledgers, receipts, fingerprints, public keys) is collected into <out>/evidence/.

        \b
        Exit codes:
          0    done
          1    the deployment or the run failed (the message names the log)
          2    bad input (config, data, certificates, keys, policies): nothing started
        """
        from fcd_secure.cli.preflight import check_run  # noqa: PLC0415

        spec = spec_and_table(spec, table, ctx.args)
        own = config_file is None  # without a config file, deploy's own defaults: tiny, 4 sites, PEHE at the end
        opts = RunOptions(
            preset=preset or ("tiny" if own else None), config_file=config_file, rounds=rounds,
            sites=sites if sites is not None else (4 if own and spec is None else None),
            clients_per_round=clients_per_round, seed=seed, dataset=dataset, spec=spec, data_dir=data_dir,
            secure=secure, eval_every=eval_every if eval_every is not None else (0 if own else None), out=out_dir,
            dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_clip=dp_clip, dp_ledger_dir=dp_ledger_dir,
            settings=settings or [],
        )
        cfg = check_run(resolve_config(opts), opts)
        # Flower and the deployment engine load after the arguments are checked: a typo is refused before them
        from fcd_secure.engines.deployment import DeploymentError, LocalDeployment  # noqa: PLC0415

        if clients_per_round is None:  # a deployment samples every site it started, unless told otherwise
            cfg = cfg.model_copy(update={"federation": cfg.federation.model_copy(update={"clients_per_round": cfg.data.n_sites})})
        cfg = cfg.model_copy(update={"out": str(Path(str(cfg.out)).resolve())})
        console = stderr()
        dep = LocalDeployment(
            cfg, workdir=workdir, port=port, insecure_dev=insecure_dev, tls_dir=tls_dir, node_keys_dir=node_keys_dir,
            site_policies_dir=site_policies, keep=keep, log=lambda s: console.print(escape(s), soft_wrap=True),
        )
        try:
            dep.prepare()  # certificates, node keys and site policies are checked here, before any process starts
        except _deploy_input_errors() as exc:
            raise CliError(str(exc), hint="the message names the file and field") from None
        if insecure_dev:
            console.print("[bold red]WARNING: --insecure-dev[/bold red]: no TLS, no SuperNode authentication, no app "
                          "pinning; the run folder is marked INSECURE-DEV. Never use it with patient data.")
        try:
            with dep:
                dep.start()
                summary = dep.run(timeout_s=timeout_s)
        except DeploymentError as exc:
            raise CliError(str(exc), "RUN_FAILED", hint="every process was stopped; the logs are in " + str(dep.workdir)) from None
        evidence = str(Path(str(cfg.out)) / "evidence")
        if as_json:
            emit(ok(summary, f"deployment run finished: {cfg.out}; audit evidence: {evidence}"))
            raise typer.Exit(EXIT_OK)
        con = stdout()
        for table in summary_table(summary, title="Fed-CausalDiff (deployment engine)"):
            con.print(table)
        from fcd_secure.cli.whatif import coverage_line  # noqa: PLC0415

        if (cov := coverage_line(summary.get("coverage"))) is not None:
            con.print(escape(cov))
        say_identifier(con, "run folder:", str(cfg.out), indent=0)
        say_identifier(con, "audit evidence:", evidence, indent=0)

