"""`fcd run` (the main federated job); `fcd deploy` (the same run on the Deployment Engine) is in ``cli/deploy.py``.

``fcd run`` checks everything before an engine starts (:mod:`fcd_secure.cli.preflight`: bad input is exit 2 and
nothing is written), prints a header with the DP setting, one progress line per round when stderr is not a
terminal (a bar when it is), names every site that fails and why (the sites' closed vocabulary of errors), and ends
with the result table (DP and ε per site included) or one JSON envelope (``--json``).
"""

from __future__ import annotations

import _thread
import json
import os
import signal
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.console import Console
from rich.markup import escape

from fcd_secure.cli.tables import LEFTOVER_WORDS, spec_and_table
from fcd_secure.data import names
from fcd_secure.cli.app import DEBUG_ENV, emit, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import EXIT_OK, CliError, ok
from fcd_secure.cli import options
from fcd_secure.cli.resolve import PRESET_HELP, RunOptions, resolve_config
from fcd_secure.engines.choice import Engine
from fcd_secure._format import fmt
from fcd_secure.queries.answers import Coverage, DRLearner, EffectSkill, EvaluationAnswer

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

    from fcd_secure.config import RunConfig

__all__ = ["PRESET_HELP", "RunOptions", "bad_input_errors", "execute_run", "register", "resolve_config", "summary_table"]

#: seconds a run may take, after a first Ctrl-C or SIGTERM, to stop at its next wait before it is interrupted outright
STOP_GRACE_S = 60.0


def bad_input_errors() -> tuple[type[BaseException], ...]:
    """The errors that mean bad input (exit 2): config, data, state, or a flow that refuses the configuration."""
    from pydantic import ValidationError  # noqa: PLC0415

    from fcd_secure.config import ConfigError  # noqa: PLC0415
    from fcd_secure.data.schema import SchemaError  # noqa: PLC0415
    from fcd_secure.data.spec import DataError  # noqa: PLC0415
    from fcd_secure.federation.secure.setup import SecureAggregationConfigError  # noqa: PLC0415
    from fcd_secure.evaluation.propensity import SharedFitError  # noqa: PLC0415
    from fcd_secure.federation.state import StateError  # noqa: PLC0415

    return (ConfigError, SchemaError, DataError, StateError, SecureAggregationConfigError, ValidationError,
            SharedFitError)


# -- what the run prints -------------------------------------------------------------------------------------------
def dp_line(cfg: "RunConfig") -> str:
    """The DP setting in one phrase (the run header)."""
    dp = cfg.dp
    if not dp.enabled:
        return "DP off (no DP guarantee)"
    delta = f"δ {dp.delta:g}" if dp.delta is not None else "δ ≤ 1/(10·n) per site"
    return f"DP-SGD ε ≤ {dp.epsilon:g} per site ({delta}, clip {dp.clip:g}, {dp.accountant})"


def header(cfg: "RunConfig") -> str:
    mode = "secure aggregation" if cfg.federation.secure_aggregation else "plain FedAvg"
    return (
        f"fcd run {cfg.data.dataset} ({cfg.data.preset}): {cfg.data.n_sites} sites, "
        f"{cfg.federation.clients_per_round}/round, {cfg.federation.rounds} rounds, sync {cfg.federation.sync}, "
        f"{mode}, {dp_line(cfg)}, seed {cfg.seed}"
    )


def skill_rows(sk: EffectSkill | None) -> list[tuple[str, str]]:
    """The rows printed beside PEHE (``EffectStats.skill_figures``): without the zero-effect PEHE₀ and the
    constant-effect floor sd τ a PEHE shows no skill; the flags stand where a rank would mislead."""
    sk = sk or EffectSkill()
    rows = [
        ("  PEHE₀ (no effect for anyone)", fmt(sk.pehe_zero)),
        ("  constant-effect floor sd τ", fmt(sk.sd_tau)),
        ("  corr(τ̂, τ)", fmt(sk.corr, "+.3f")),
        ("  ATE ratio (mean τ̂ / mean τ)", fmt(sk.ate_ratio, "+.3f")),
        ("  skill vs constant true ATE", fmt(sk.skill, "+.3f")),
    ]
    rows += [("  flag", f) for f in sk.flags]
    return rows


def dr_learner_rows(d: DRLearner | None) -> list[tuple[str, str]]:
    """The per-entity one-step effect of the federated DR-learner beside the simulator's own contrast
    (``queries.dr_learner``): corr and skill against the oracle's truth, or what stands in their place."""
    if d is None:
        return []
    label = "one-step τ per entity: DR-learner"
    if not d.fitted:
        return [(label, "unavailable (no data)")]
    rows = []
    for f, lab, partial in ((d.dr_learner, label, d.coverage == "partial"),
                            (d.simulator, "  the simulator's own contrast", False)):
        notes = ["partial"] if partial else []
        if f is None:
            continue
        if f.has_truth:
            value = f"corr {fmt(f.corr, '+.3f')} · skill {fmt(f.skill, '+.3f')}"
        else:
            value, notes = f"mean τ̂ {fmt(f.mean_tau_hat, '+.4f')}", ["no truth", *notes]
        rows.append((lab, value + (f" ({', '.join(notes)})" if notes else "")))
        if f.heldout is not None:  # truth-free: do these per-entity effects beat one constant on held-out rows?
            rows.append(("    held-out gain vs a constant", f.heldout.cell(d.steps)))
    dr, sim = d.dr_learner, d.simulator
    if dr is not None and sim is not None and dr.pehe is not None and sim.pehe is not None:
        rows.append(("  PEHE: DR-learner / simulator / sd τ", f"{dr.pehe:.4f} / {sim.pehe:.4f} / {fmt(dr.sd_tau)}"))
    return rows


def summary_table(summary: dict, title: str = "Fed-CausalDiff") -> list["Table"]:
    """The result tables (each fits 80 columns): metrics, DP and ε, policy values. The answers are read typed
    (``queries.answers``); the run's own figures (rounds, DP, bytes, wall time) from ``summary.json``."""
    from rich import box  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    ans = EvaluationAnswer.from_json(summary)
    sup = ans.effect_support
    t = Table(title=title, show_header=True, header_style="bold", box=box.SIMPLE_HEAD)
    t.add_column("metric", no_wrap=True)  # the labels are short and read as one; a long value wraps instead
    t.add_column("value", justify="right")
    for value, label, anchored, skill_after in (
        (ans.pehe, "PEHE (oracle)", True, True),
        (ans.ate_error, "|ATE error| (oracle)", True, False),
        (ans.value_error_mean, "|value error|, mean over policies", False, False),
        (ans.factual_auc, "factual AUC", False, False),
    ):
        if value is not None:
            if anchored and sup is not None and sup.extrapolation:
                # the paper's anchor figures: printed, labelled, never a ranking (issue 29 item 6)
                label += " [extrapolation]"
            t.add_row(label, fmt(value))
        if skill_after and ans.effect_skill is not None:
            for row in skill_rows(ans.effect_skill):
                t.add_row(*row)
    for row in dr_learner_rows(ans.dr_learner):
        t.add_row(*row)
    if sup is not None:
        t.add_row("anchor regimes followed (a_off / a_on)", f"{sup.a_off} / {sup.a_on} of {sup.n}: {sup.label}")
    t.add_row("rounds", fmt(summary.get("rounds")))
    sel = ans.selection
    if sel is not None:
        t.add_row("answers from round", f"{sel.round} ({sel.rule}, criterion {sel.coverage})")
    if ans.natural_course is not None:  # the simulator under the logging policy against the logs
        t.add_row("natural course: |gap|, max |z|", ans.natural_course.short())
    dp = summary.get("dp") or {}
    if dp.get("enabled"):
        t.add_row("DP", f"DP-SGD, ε cap {dp['epsilon_cap']:g} per site, δ {fmt(dp.get('delta'), '.3g')}")
        if dp.get("consortium_epsilon") is not None:
            t.add_row("ε spent, consortium (max over sites)", f"{dp['consortium_epsilon']:.3f}")
        for sid, eps in sorted((dp.get("epsilon_spent") or {}).items()):
            t.add_row(f"ε spent, {sid}", f"{eps:.3f}" + (" (never sampled)" if eps == 0 else ""))
    elif dp:
        t.add_row("DP", "off: no DP guarantee")
    t.add_row("uplink MB (measured, serialized)", f"{summary['uplink_bytes'] / 1e6:.3f}")
    t.add_row("uplink MB (paper: sites × sync params)", f"{summary['uplink_formula_bytes'] / 1e6:.3f}")
    t.add_row("downlink MB (measured)", f"{summary['downlink_bytes'] / 1e6:.3f}")
    t.add_row("wall time s", f"{summary['wall_s']:.1f}")
    tables = [t]
    return tables


class RunProgress:
    """The ServerApp's progress events, for people: a bar on a terminal, one line per round when piped (no carriage
    returns), and always a line for what an operator must see (resuming, a site's error)."""

    def __init__(self, console: Console, cfg: "RunConfig") -> None:
        self.console = console
        self.cfg = cfg
        self.tty = console.is_terminal
        self.rounds = cfg.federation.rounds
        self.last_round = 0
        self.resumed_from: int | None = None
        self.reported: set[tuple[str, str]] = set()
        self.bar = None
        if self.tty:
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn  # noqa: PLC0415

            self.bar = Progress(
                TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                TextColumn("{task.fields[info]}"), console=console, transient=False,
            )
            self.task = self.bar.add_task("starting sites", total=self.rounds, info="")

    def __enter__(self) -> "RunProgress":
        if self.bar is not None:
            self.bar.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.bar is not None:
            self.bar.__exit__(*exc)

    def line(self, text: str) -> None:
        self.console.print(text, soft_wrap=True, markup=False)

    def __call__(self, event: str, info: dict) -> None:
        if event == "connected":
            if self.bar is not None:
                self.bar.update(self.task, description="rounds", info=f"{len(info['sites'])} sites")
            else:
                self.line(f"{len(info['sites'])} sites connected")
        elif event == "resumed":
            self.resumed_from = self.last_round = int(info["round"])
            self.line(f"resuming from round {info['round']} (state: {self.cfg.state_root()})")
            if self.bar is not None:
                self.bar.update(self.task, completed=info["round"])
        elif event == "site_error":
            key = (info["site_id"], info["error"])
            if key not in self.reported:  # once per site and reason (a spent budget refuses every later round)
                self.reported.add(key)
                self.line(f"{site_error_message(info['site_id'], info['error'], self.cfg)} (round {info['round']})")
        elif event == "round":
            self.last_round = int(info["round"])
            bits = [f"{info['participants']} sites", f"up {info['cum_uplink_bytes'] / 1e6:.2f} MB"]
            if info.get("train_loss") is not None:
                bits.append(f"loss {info['train_loss']:.3f}")
            if info.get("pehe") is not None:
                bits.append(f"PEHE {info['pehe']:.4f}")
            if info.get("d1") is not None:  # the truth-free "learned confounding" alarm beside the loss
                se = info.get("d1_se")
                bits.append(f"D1 {info['d1']:.3f}" + (f" ± {se:.3f}" if se is not None else "")
                            + (" ALARM" if info.get("d1_alarm") else ""))
            if info.get("nc_max_z") is not None:  # the natural-course check of the candidate round
                bits.append(f"NC |z| {info['nc_max_z']:.2f}")
            if info.get("aborted"):
                bits.append(f"ABORTED: {info.get('aborted_reason')}")
            if self.bar is not None:
                self.bar.update(self.task, completed=info["round"], info=" · ".join(bits))
            else:
                self.line(f"round {info['round']}/{self.rounds} · " + " · ".join(bits))
        elif event == "behaviour_model":
            self.line(f"shared behaviour model: {info['coefficients']} coefficients, {info['newton_steps']} Newton "
                      "steps on the sites' secure sums")
        elif event == "selected":
            self.line(selection_line(info, self.rounds))
        elif event == "evaluating":
            if self.bar is not None:
                self.bar.update(self.task, description="federated evaluation", info="")
            else:
                self.line("federated evaluation")


def selection_line(sel: dict, rounds: int | None = None) -> str:
    """``answers from round 20 of 40 (rule …): D1 … within one SE …`` (``queries.selection``)."""
    of = f" of {rounds}" if rounds else ""
    cov = sel.get("coverage")
    note = {"partial": " [partial: some sites could not score]", "unavailable": ""}.get(cov, "")
    return f"answers from round {sel['round']}{of} ({sel['rule']}): {sel['reason']}{note}"


def site_error_message(site_id: str, error: str, cfg: "RunConfig", budgets: dict | None = None) -> str:
    """``site-02 stopped: DP budget exhausted (ε 7.98 of 8.0)``, ``site-03: data does not match the spec``."""
    from fcd_secure.audit import SITE_ERRORS  # noqa: PLC0415

    reason = SITE_ERRORS.get(error, SITE_ERRORS["internal"])[1]
    if error == "budget_exhausted":
        b = (budgets or {}).get(site_id)
        spent = f"ε {b['epsilon_spent']:.2f} of {b['epsilon_cap']:g}" if b else f"cap ε {cfg.dp.epsilon:g}"
        return f"{site_id} stopped: {reason} ({spent})"
    return f"{site_id}: {reason}"


def _budgets(cfg: "RunConfig") -> dict:
    from fcd_secure.privacy.report import site_budgets  # noqa: PLC0415

    if not cfg.dp.enabled:
        return {}
    roots = [p for p in (cfg.state_root(), Path(cfg.dp.ledger_dir) if cfg.dp.ledger_dir else None) if p]
    return site_budgets(roots)


def outcome(summary: dict, cfg: "RunConfig") -> CliError | None:
    """What a finished run's exit code must say: a spent DP budget (exit 5), a site that failed its final evaluation
    or a run with no evaluation at all (exit 1), answers over fewer sites than the run because some declined under
    their cohort rules (exit 7, the sites named), or nothing (exit 0)."""
    errors = summary.get("site_errors") or []
    budgets = {sid: {"epsilon_spent": eps, "epsilon_cap": (summary.get("dp") or {}).get("epsilon_cap")}
               for sid, eps in ((summary.get("dp") or {}).get("epsilon_spent") or {}).items()}
    exhausted = sorted({e["site_id"] for e in errors if e["error"] == "budget_exhausted"})
    if exhausted:
        return CliError(
            "; ".join(site_error_message(s, "budget_exhausted", cfg, budgets) for s in exhausted),
            "DP_BUDGET_EXHAUSTED",
            hint="a site's lifetime ε cap is spent: its data cannot train further (raise the cap only by a new "
            "decision of that site; the ledger refuses a higher cap)",
            data=summary,
        )
    from fcd_secure.federation.site_policy import MIN_COHORT_FLOOR  # noqa: PLC0415

    failed = summary.get("failed_sites_final_eval") or []
    declined = summary.get("declined_sites_final_eval") or []
    evaluated = summary.get("policies") or summary.get("factual_auc") is not None or summary.get("pehe") is not None
    aborted = summary.get("final_eval_aborted")
    if not failed and not evaluated:
        return CliError(
            "the run trained but could not evaluate: "
            + (f"{', '.join(map(str, declined))} declined under their evaluation cohort rules (a test split below "
               f"{MIN_COHORT_FLOOR} rows, a cohort too close to one evaluated before, or policies that act "
               "differently on fewer of a site's patients than its [questions] min_difference)" if declined
               else "no site's evaluation reached the server")
            + (f", and the secure sum of the others did not run ({aborted})" if aborted and declined else "")
            + "; no result is reported",
            "RUN_FAILED",
            hint="give each site more test rows (more data, fewer sites or a larger data.test_fraction), or ask "
            "well-separated policies",
            data=summary,
        )
    if not failed and declined:
        cov = Coverage.from_json(summary.get("coverage"))
        return CliError(
            (cov and cov.warning) or f"the answers leave out {len(declined)} site(s) that declined under their evaluation "
            f"cohort rules: {', '.join(declined)}",
            "INCOMPLETE_ANSWER",
            hint=f"a site declines with a test split below {MIN_COHORT_FLOOR} rows (or a cohort too close to one "
            "evaluated before): give it more test rows (data.test_fraction) or fewer sites",
            data=summary,
        )
    if failed:
        why = {e["site_id"]: e["error"] for e in errors if e["action"].startswith("query.evaluate")}
        named = "; ".join(site_error_message(s, why.get(s, "internal"), cfg) for s in failed)
        return CliError(
            f"{len(failed)} site(s) failed the final evaluation, so the result leaves them out: {named}",
            "SITE_FAILED",
            hint="the site's own log says more (FCD_SITE_DEBUG=1 for a site-local traceback)",
            data=summary,
        )
    if summary.get("model_only"):
        from fcd_secure.cli.whatif import model_only_error  # noqa: PLC0415

        return model_only_error(summary)
    return None


def execute_run(cfg: "RunConfig", as_json: bool, engine: Engine = Engine.SIMULATION) -> int:
    """Run ``cfg`` on ``engine`` (``engines.choice``) and print the outcome; returns the exit code.

    Raises:
        CliError: the run could not start or finish (exit 1/2/5/130; the message says why).
    """
    import torch  # noqa: PLC0415

    from fcd_secure.apps.server_loop import FederationError  # noqa: PLC0415
    from fcd_secure.engines.local import run_on  # noqa: PLC0415

    torch.set_num_threads(1)  # the sites share the machine's cores through one Ray actor (or this one process)
    if os.environ.get(DEBUG_ENV) != "1":
        # every site error and failure is reported by this command, by name; Flower's own error logs (tracebacks of
        # its worker threads, e.g. when a signal stops the engine) are for debugging: FCD_DEBUG=1 shows them
        os.environ.setdefault("FLWR_LOG_LEVEL", "CRITICAL")
    console = stderr()
    console.print(escape(header(cfg)), soft_wrap=True)
    say_identifier(console, "run folder:", str(cfg.out), indent=0)
    resume_hint = f"continue it with `fcd run --resume {cfg.out}`"
    prog = RunProgress(console, cfg)
    stop = threading.Event()
    grace: list[threading.Timer] = []

    def interrupt(signum: int, frame: object) -> None:
        # A first signal only asks the ServerApp's thread to stop at its next wait: Flower then lets its workers
        # finish the task in hand and shuts Ray down with nothing calling it. Interrupting the engine here instead
        # tears Ray down under those threads, and Ray's native worker then ends the process with 1, not 130.
        if stop.is_set():  # a second signal, or a run that did not stop within the grace period: now
            raise KeyboardInterrupt(f"signal {signum}")
        stop.set()
        console.print(f"stopping after the tasks in hand (within {STOP_GRACE_S:.0f} s; signal again to stop now)")
        timer = threading.Timer(STOP_GRACE_S, _thread.interrupt_main)
        timer.daemon = True
        timer.start()
        grace.append(timer)

    def reclaim(signum: int, frame: object) -> None:
        signal.signal(signal.SIGTERM, interrupt)  # runs in the main thread, where handlers are set

    def progress(event: str, info: dict) -> None:
        prog(event, info)
        if event == "connected" and engine is Engine.SIMULATION and hasattr(signal, "SIGUSR1"):
            # ray.init, in the engine's start-up, replaced our SIGTERM handler with its own exit: the sites are
            # connected, so Ray is up; have the main thread take SIGTERM back
            os.kill(os.getpid(), signal.SIGUSR1)

    def interrupted() -> CliError:
        stop.set()  # the ServerApp's thread ends at its next wait: the process can exit
        return CliError(
            f"interrupted after round {prog.last_round} of {cfg.federation.rounds}; the state is kept in "
            f"{cfg.state_root()}", "INTERRUPTED", hint=resume_hint,
        )

    # `kill PID` and Ctrl-C stop the run at the next wait, state kept
    previous = {sig: signal.signal(sig, handler) for sig, handler in (
        (signal.SIGTERM, interrupt), (signal.SIGINT, interrupt),
        *(((signal.SIGUSR1, reclaim),) if hasattr(signal, "SIGUSR1") else ()),
    )}
    try:
        with prog:
            run_on(engine, cfg, progress=progress, stop=stop)
    except (KeyboardInterrupt, SystemExit):  # Ctrl-C; SIGTERM (ours, or Ray's handler once Ray has started: exit)
        raise interrupted() from None
    except bad_input_errors() as exc:
        raise CliError(str(exc), hint="the message names the file or field") from None
    except FederationError as exc:
        if stop.is_set():  # a site's reply lost to the signal's teardown: the run was interrupted, not broken
            raise interrupted() from None
        errs = exc.site_errors
        budgets = _budgets(cfg)
        exhausted = sorted({e["site_id"] for e in errs if e["error"] == "budget_exhausted"})
        if exhausted:
            raise CliError(
                "; ".join(site_error_message(s, "budget_exhausted", cfg, budgets) for s in exhausted)
                + f" (the run could not go on: {exc})",
                "DP_BUDGET_EXHAUSTED", data={"site_errors": errs},
            ) from None
        code = "SITE_FAILED" if errs else "RUN_FAILED"
        raise CliError(str(exc), code, hint=resume_hint if prog.last_round else None,
                       data={"site_errors": errs}) from None
    except Exception as exc:  # noqa: BLE001 - a run that broke: say where, keep the state, no traceback
        if stop.is_set():  # e.g. the ServerApp's RunStopped, re-raised by the engine after the signal
            raise interrupted() from None
        if os.environ.get(DEBUG_ENV) == "1":
            raise
        raise CliError(
            f"the run failed after round {prog.last_round}: {type(exc).__name__}: {exc}", "RUN_FAILED",
            hint=f"{resume_hint}; FCD_DEBUG=1 prints the traceback",
        ) from None
    finally:
        for timer in grace:
            timer.cancel()
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    summary = json.loads((Path(str(cfg.out)) / "summary.json").read_text())
    bad = outcome(summary, cfg)
    if as_json:
        emit(bad.envelope() if bad else ok(summary, f"run finished: {cfg.out}"))
        return bad.exit_code if bad else EXIT_OK
    from fcd_secure.cli.whatif import anchors_line, coverage_line, print_answers, support_lines  # noqa: PLC0415

    con = stdout()
    for table in summary_table(summary, title=f"Fed-CausalDiff on {cfg.data.dataset}"):
        con.print(table)
    ans = EvaluationAnswer.from_json(summary)
    if (cov := coverage_line(ans.coverage)) is not None:
        con.print(escape(cov))  # plain words: wrapped at the terminal width
    if anchors_line(summary.get("anchors")):
        con.print(f"anchors of the paper's policies: {escape(anchors_line(summary['anchors']))}", soft_wrap=True)
    if ans.policies:
        print_answers(con, ans, cfg.data.dataset)
        for line in support_lines(ans):
            con.print(escape(line))
    say_identifier(con, "run folder:", str(cfg.out), indent=0)
    if bad:
        raise CliError(bad.message, bad.error_code, hint=bad.hint)
    return EXIT_OK


def register(app: typer.Typer) -> None:
    """Attach ``fcd run`` to the root app."""

    @app.command("run", short_help="Train across sites (simulation or in-process engine); write a run folder.",
                 context_settings=LEFTOVER_WORDS)
    def run(
        ctx: typer.Context,
        preset: Optional[str] = typer.Option(None, "--preset", help=f"{PRESET_HELP}. Default: default, or the --config file's."),
        rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Global communication rounds (preset default)."),
        sites: Optional[int] = typer.Option(None, "--sites", min=1, help="Number of sites N (paper: 10; a table's site column decides)."),
        clients_per_round: Optional[int] = typer.Option(None, "--clients-per-round", min=1, help="Sites sampled per round (default N/2, at least the secure minimum)."),
        seed: Optional[int] = options.RUN_SEED,
        dataset: Optional[str] = typer.Option(None, "--dataset", help=names.choices(default=names.DEFAULT, notes={"tumour": "oracles: truth beside estimates", "obd": "real data: OPE estimates, factual AUC"}) + "."),
        spec: Optional[Path] = options.SPEC,
        table: Optional[list[str]] = options.TABLE,
        data_dir: Optional[Path] = options.DATA_DIR,
        gamma: Optional[float] = typer.Option(None, "--gamma", help=f"Generated worlds ({', '.join(names.GENERATED)}): confounding strength γ of the logging policy (data.gamma; default DKT-Synth 1.5, tumour 2; 0: the logging policy ignores what γ weighs: a student's readiness, a tumour's diameter)."),
        site_spread: Optional[float] = typer.Option(None, "--site-spread", min=0, max=20, help=f"Generated worlds ({', '.join(names.GENERATED)}): how much the sites differ (data.site_spread; multiplies the spread of every site-level parameter: case mix, logging practice; default 1; 0: sites differ in size only)."),
        secure: Optional[bool] = typer.Option(None, "--secure-aggregation/--no-secure-aggregation", help="Pairwise-masked secure aggregation of Θc (default: on) or plain FedAvg.", show_default=False),
        sync: Optional[str] = typer.Option(None, "--sync", help="dss (only Θc leaves a site; the paper's method) | full (every parameter but the site-bound behaviour head; w/o-DSS ablation)."),
        eval_every: Optional[int] = typer.Option(None, "--eval-every", min=0, help="Cheap federated PEHE every N rounds (0: only at the end)."),
        config_file: Optional[Path] = typer.Option(None, "--config", exists=True, dir_okay=False, help="A run config (TOML/JSON, e.g. a run folder's config.toml): re-runs it exactly in a new folder; options given override only what they name."),
        resume: Optional[Path] = typer.Option(None, "--resume", metavar="RUN_DIR", help="Continue the run in RUN_DIR (its config.toml and state) from its last finished round; options given override (e.g. --rounds)."),
        state_dir: Optional[Path] = typer.Option(None, "--state-dir", help="Per-site state, server checkpoint, audit ledgers (default <out>/state). Pointing it at a run's state continues that run."),
        out_dir: Optional[Path] = typer.Option(None, "--out", help="Run folder (default runs/<timestamp>-<dataset>-seed<seed>/); must not hold another run."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (summary.json in data) on stdout; progress on stderr."),
        dp_epsilon: Optional[float] = typer.Option(None, "--dp-epsilon", min=0.01, help="DP-SGD (Opacus) on every site, with this lifetime ε cap per site dataset; a round that would exceed it is refused."),
        dp_delta: Optional[float] = options.DP_DELTA,
        dp_clip: Optional[float] = options.DP_CLIP,
        dp_ledger_dir: Optional[Path] = typer.Option(None, "--dp-ledger-dir", help="Persistent privacy-ledger folder, so a new run on the same data cannot reset the budget (default: inside --state-dir)."),
        policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="A policy to simulate at the end (a .toml file or a shipped name: never, always, early_on, late_on, incremental_on_x2, share_on_20); repeat for several. Default: [evaluation] policies, else the paper's four."),
        reference: Optional[str] = typer.Option(None, "--reference", help="The name of the policy the others are contrasted with (default: the first)."),
        settings: Optional[list[str]] = options.SETTINGS,
        engine: Engine = typer.Option(Engine.SIMULATION, "--engine", case_sensitive=False, help="simulation: Flower's simulation engine (Ray; a fixed 20-50 s start). inprocess: the same ServerApp, ClientApp and messages in this one process without Ray, bit-identical answers; for studies of many small runs and for CI. Recorded in summary.json (engine); `fcd whatif` asks the run on it."),
    ) -> None:
        """Train Fed-CausalDiff across N sites with decoupled synchronisation (only Θc leaves a site) on Flower's
        simulation engine (or in this process: --engine inprocess), evaluate it federatedly, and write a run folder
        (config, rounds.csv appended per round, theta_c.npz, summary.json with DP and ε per site, Figs. 3–4).

        Everything is checked before the engine starts: the dataset or your spec and table (as `fcd data validate`
        does), the sites, the policies, the folders; bad input writes nothing.

        \b
        Exit codes:
          0    done
          1    the run failed, or a site failed (its reason is named)
          2    bad input (config, data, folders, state): nothing written
          5    a site's DP budget is exhausted (ε is named)
          7    the answers cover fewer sites than the run: the sites left
               out are named (stdout, and coverage in summary.json)
          8    the answer is the simulator's alone: no site logged or could
               estimate propensities (printed as extrapolation, not ranked)
          130  interrupted: continue with --resume RUN_DIR (Ctrl-C or SIGTERM
               stop the run at its next wait; a second one stops it now)
        """
        from fcd_secure.cli.preflight import check_run  # noqa: PLC0415

        opts = RunOptions(
            preset=preset, config_file=config_file, resume=resume, rounds=rounds, sites=sites,
            clients_per_round=clients_per_round, seed=seed, dataset=dataset, spec=spec_and_table(spec, table, ctx.args),
            data_dir=data_dir, gamma=gamma,
            site_spread=site_spread,
            secure=secure, sync=sync, eval_every=eval_every, state_dir=state_dir, out=out_dir,
            dp_epsilon=dp_epsilon, dp_delta=dp_delta, dp_clip=dp_clip, dp_ledger_dir=dp_ledger_dir,
            policies=policy, reference=reference, settings=settings or [],
        )
        cfg = check_run(resolve_config(opts), opts)
        raise typer.Exit(execute_run(cfg, as_json, engine))
