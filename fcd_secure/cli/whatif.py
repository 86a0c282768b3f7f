"""`fcd whatif`: ask a finished run what happens under one or more policies (values, effects, 90 % intervals)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import typer
from rich.console import Group
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from fcd_secure.cli.app import emit, say_identifier, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.engines.choice import Engine
from fcd_secure._format import fmt
from fcd_secure.queries.answers import Coverage, EvaluationAnswer
from fcd_secure.queries.policy_answers import NOT_IDENTIFIED, interval_text


def anchors_line(anchors: dict | None) -> str | None:
    """``a_off = 3 (label), a_on = 7 (label)``: the two actions the anchor policies (never, always, ...) use."""
    if not anchors:
        return None
    return ", ".join(f"{k} = {v['id']} ({v['label']})" for k, v in anchors.items())


#: what a renderer is given: the typed answer, or the merged JSON it is read from (``queries.answers``)
AnswerLike = EvaluationAnswer | Mapping[str, Any]


def support_lines(result: AnswerLike) -> list[str]:
    """One line per policy the logs do not support: not identified at all (its interval is the bounds only), or
    not followed at some sites (named where the transport shows them; secure aggregation shows how many)."""
    lines = []
    for name, d in EvaluationAnswer.of(result).policies.items():
        if d.model_only:
            lines.append(f"{name}: {NOT_IDENTIFIED} — no logged step follows it (support 0 %); the interval shown is "
                         "the bounds over the outcome's range only" if d.interval is not None else
                         f"{name}: {NOT_IDENTIFIED} — no logged step follows it (support 0 %); no interval")
        k = d.n_sites_without_support or 0
        if k and not d.model_only:
            who = d.sites_without_support
            lines.append(f"{name}: no logged step follows it at {k} site(s)"
                         + (f": {', '.join(who)}" if who else " (secure aggregation: how many, not which)")
                         + f"; support {d.support or 0:.0%} of steps overall")
    return lines


def coverage_line(cov: Coverage | Mapping[str, Any] | None) -> str | None:
    """``answers cover 4 of 4 sites (site-00, …; 367 test entities)``, or the warning naming the sites left out
    (``queries.evaluation.coverage``); None when the result has no coverage (an older run folder)."""
    cov = cov if isinstance(cov, Coverage) or cov is None else Coverage.from_json(cov)
    if cov is None:
        return None
    if cov.warning:
        return "WARNING: " + cov.warning
    n = cov.n_entities
    return (f"answers cover {cov.n_sites_covered} of {len(cov.sites_asked)} sites "
            f"({', '.join(cov.sites_covered)}" + (f"; {n} test entities)" if n is not None else ")"))


def _cell(v: float | None) -> str:
    return fmt(v, ".3f")


#: what a model-only answer adds to it (no site's propensities reach any number)
MODEL_ONLY = ("model only: no site logged or could estimate propensities, so no number below is checked by the "
              "logs")


def model_only_error(answer: dict) -> CliError:
    """Exit 8: every number of the answer is the simulator's own (no site's propensities reach any of them)."""
    return CliError(
        "the answer is the simulator's alone: no site logged or could estimate propensities, so no value or effect "
        "is checked by the logs (printed under the extrapolation label, not ranked)",
        "MODEL_ONLY_ANSWER", data=answer,
        hint="give the table a propensity column, or let each site estimate its own (evaluation.propensities = auto, "
        "the default); a site whose training rows log one action only cannot",
    )


def whatif_table(result: AnswerLike, title: str | None = None) -> Table:
    """The answer as a table: per policy its simulated value and interval, the contrast to the reference and its
    interval, and the truth beside them when the data has an oracle (``summary.json`` / ``fcd whatif --json``).
    ``title``: by default the answer's own label of the simulator's numbers (``EvaluationAnswer.simulator_title``:
    never a bare table)."""
    ans = EvaluationAnswer.of(result)
    title = title if title is not None else ans.simulator_title
    pols, level, ref = ans.policies, ans.level, ans.reference
    has_truth = any(d.value_true is not None for d in pols.values())
    caption = f"effect = value − value of {ref}; {level:.0%} intervals over entities (normal)" if ref else None
    support = [d.doubly_robust.support for d in ans.doubly_robust.values()]
    if caption and support:  # docs/whatif.md: only supported steps give a DR interval that covers the truth
        caption += (f"; they omit the simulator's own error, which the doubly robust intervals (below) cover "
                    f"on the {min(support):.0%}–{max(support):.0%} of steps the logged data supports")
    silent = [name for name, d in pols.items() if d.never_fires]
    if silent:  # P43: a threshold beyond every site's data (in the table's units) is its 'otherwise' action
        caption = (caption + "; " if caption else "") + (
            f"never fires on any site's data (its threshold lies beyond them): {', '.join(silent)}")
    t = Table(title=title, show_header=True, header_style="bold", caption=caption)
    t.add_column("policy", overflow="fold")
    t.add_column("value", justify="right")
    t.add_column(f"{level:.0%} CI", justify="right")
    if has_truth:
        t.add_column("truth", justify="right")
    t.add_column("effect", justify="right")
    t.add_column(f"{level:.0%} CI", justify="right")
    if has_truth:
        t.add_column("truth", justify="right")
    for name, d in pols.items():
        eff = d.effect
        row = [escape(name), d.value_cell, interval_text(d.interval)]
        if has_truth:
            row.append(_cell(d.value_true))
        eff_cell = NOT_IDENTIFIED if eff is not None and eff.not_identified else _cell(eff and eff.estimate)
        row += ["ref." if name == ref else eff_cell, "" if name == ref else interval_text(eff)]
        if has_truth:
            row.append("" if name == ref else _cell(eff and eff.true))
        t.add_row(*row)
    return t


def one_step_line(result: AnswerLike) -> str | None:
    """The identified one-step effect at every decision step (``queries.targeted``), one line, or None."""
    o = EvaluationAnswer.of(result).one_step
    if o is None:
        return None
    if o.not_identified:
        return (f"one-step effect of a_on vs a_off at every decision step: {o.not_identified}; its bounds under an "
                "unrecorded confounder of strength Γ follow")
    line = ("one-step effect of a_on vs a_off at every decision step (identified, doubly robust): "
            + o.sentence("CI"))
    if o.out_of_range:
        line += f" [raw estimate {o.out_of_range['raw']:+.3f} outside the outcome's range]"
    return line


def pi_k_lines(result: AnswerLike) -> list[str]:
    """For each stochastic policy (``queries.incremental``): where its weights came from, the logged propensities
    alone or, at the steps where an incremental policy needs π_k the log does not hold, the sites' models."""
    out = []
    for name, d in EvaluationAnswer.of(result).identified.items():
        src = d.identified.pi_k
        if src is None:
            continue
        if src.logged_share >= 1.0:  # a share policy, or odds on two-action data: no model in the weights
            out.append(f"{name}: weights from the logged propensities alone at all {src.steps} steps "
                       "(no propensity model)")
        else:
            out.append(f"{name}: incremental; π_k(h) from the logged propensity at {src.logged_share:.0%} of "
                       f"{src.steps} steps, from the sites' own propensity models at the rest")
    return out


def _table(title: str, cols: list[str] | tuple[str, ...], caption: str | None = None) -> Table:
    """A table of one line per policy: the policy column folds, every number stays on one line (80 columns)."""
    t = Table(title=title, show_header=True, header_style="bold", caption=caption)
    for c in cols:
        t.add_column(c, justify="left" if c == "policy" else "right", overflow="fold", no_wrap=c != "policy")
    return t


def identified_table(result: AnswerLike) -> Group | None:
    """The headline answer, as two tables that fit 80 columns: per policy its doubly robust value over the first h
    steps, h the longest horizon the logs support (``queries.targeted``: ESS of the weight products ≥ 20 and their
    mean not significantly below 1), with its interval and ESS; then each effect against the reference on the longest
    horizon both pass. A policy with no supported horizon is "not identified", with the reason where the logs reach
    only part of it. None when no site logs propensities."""
    ans = EvaluationAnswer.of(result)
    pols = ans.identified
    if not pols:
        return None
    level, ref = ans.level, ans.reference
    has_truth = any(r.true is not None for d in pols.values() for r in d.identified.horizons)
    values = _table(f"What the logs identify: doubly robust values over the first h steps (horizon asked: "
                    f"{ans.horizon_asked})",
                    ["policy", "h", "DR value", f"{level:.0%} CI", "ESS"] + (["truth"] if has_truth else []))
    effects = _table(f"Identified effects (vs {escape(str(ref))}, on the longest h both policies pass)",
                     ["policy", "h", "DR effect", f"{level:.0%} CI"] + (["truth"] if has_truth else []),
                     caption="h: the longest horizon with ≥ 20 effective entities following the policy (ESS of the "
                             "weight products) whose mean weight product is not significantly below 1 (the logs "
                             f"reach the whole policy); {level:.0%} intervals. {ans.horizon_caption()}")
    flagged = False
    reasons: list[str] = []
    for name, d in pols.items():
        ident = d.identified
        a = ident.answer
        if a is None:
            values.add_row(escape(name), "–", NOT_IDENTIFIED, "", f"{ident.best_ess:.0f}",
                           *([""] if has_truth else []))
            if ident.reached_in_part and ident.why:
                reasons.append(f"{name}: {NOT_IDENTIFIED} — {ident.why}")
        else:
            flagged |= bool(a.out_of_range)
            values.add_row(escape(name), str(a.horizon), _cell(a.estimate) + ("*" if a.out_of_range else ""),
                           interval_text(a), f"{a.ess:.0f}", *([_cell(a.true)] if has_truth else []))
        if name == ref:
            continue
        eff = ident.effect
        if eff is None:
            effects.add_row(escape(name), "–", NOT_IDENTIFIED, "", *([""] if has_truth else []))
        else:
            flagged |= bool(eff.out_of_range)
            effects.add_row(escape(name), str(eff.horizon),
                            ("same steps" if eff.same_steps else f"{eff.estimate:+.3f}")
                            + ("*" if eff.out_of_range else ""),
                            "" if eff.same_steps else interval_text(eff), *([_cell(eff.true)] if has_truth else []))
    if flagged:
        effects.caption += "; *: the raw estimate left the outcome's range and is shown at the bound"
    notes = [Text(line) for line in reasons]
    if not effects.row_count:
        values.caption = effects.caption
        return Group(values, *notes)
    return Group(values, effects, *notes)


def dr_table(result: AnswerLike, bounds_only: bool = False) -> Group | None:
    """The doubly robust answer (sites with logged propensities) as two tables, or None: per policy the DR value, its
    interval, the interval with the unseen-mass bounds (the share of π the logged sample did not reach times the
    outcome's range; ``fcd_secure.evaluation.intervals``) and the share of supported steps; then the same for each
    effect. Two tables, so that every interval stays on one line in 80 columns.

    ``bounds_only``: the identified answers are printed above, so over whole trajectories only the bounded interval
    and the support are shown (one DR value per policy per output: the identified one)."""
    ans = EvaluationAnswer.of(result)
    pols = ans.doubly_robust
    if not pols:
        return None
    level, ref = ans.level, ans.reference
    # the effects' doubly robust contrasts, of every policy but the reference
    effs = {name: d.effect for name, d in pols.items()
            if name != ref and d.effect is not None and d.effect.doubly_robust is not None}
    if bounds_only:
        values = _table("Whole trajectories: what the logs bound (the simulator corrected where they reach, the "
                        "outcome's range where they do not)", ("policy", "bounded interval", "support"))
        for name, d in pols.items():
            values.add_row(escape(name), interval_text(d.doubly_robust.bounded), f"{d.doubly_robust.support:.0%}")
        effects = _table(f"Whole-trajectory effects (vs {escape(str(ref))}): bounded", ("policy", "bounded interval"),
                         caption="bounded: the doubly robust interval widened by the share of the policy the logged "
                         "sample did not reach times the outcome's range there; support: share of steps the logged "
                         "data follows")
        for name, eff in effs.items():
            effects.add_row(escape(name), interval_text(eff.doubly_robust.bounded))
    else:
        values = _table("Doubly robust values (the model corrected by its weighted error on the logged steps)",
                        ("policy", "DR value", f"{level:.0%} CI", "with bounds", "support"))
        for name, d in pols.items():
            dr = d.doubly_robust
            est = NOT_IDENTIFIED if d.model_only else _cell(dr.estimate)
            values.add_row(escape(name), est, interval_text(dr), interval_text(dr.bounded), f"{dr.support:.0%}")
        effects = _table(f"Doubly robust effects (vs {escape(str(ref))})", ("policy", "DR effect", f"{level:.0%} CI",
                         "with bounds"), caption="with bounds: the interval widened where the logged sample did not "
                         "reach the policy (it then says so rather than repeat the model); support: share of steps "
                         "the logged data follows")
        for name, eff in effs.items():
            dr = eff.doubly_robust
            est = NOT_IDENTIFIED if eff.not_identified else _cell(dr.estimate)
            effects.add_row(escape(name), est, interval_text(dr), interval_text(dr.bounded))
    if not effects.row_count:
        values.caption = effects.caption
        return Group(values)
    return Group(values, effects)


def sensitivity_lines(result: AnswerLike) -> list[str]:
    """How far an unrecorded confounder could move the one-step effect (``queries.sensitivity``): the verdict, then
    the bounds at each reported Γ."""
    sens = EvaluationAnswer.of(result).sensitivity
    if sens is None:
        return []
    return [f"sensitivity of the one-step effect to an unrecorded confounder: {sens.verdict()}; {sens.model}"] + [
        "  " + line for line in sens.lines()]
def sequential_dr_table(result: AnswerLike) -> Group | None:
    """The sequential doubly robust values (``queries.sequential_dr``: the simulator's Q̂ rolled out from every logged
    history, corrected step by step with the propensities), or None where no site sent them; a value whose weight
    products have too little support is withheld, with the reason under the table."""
    ans = EvaluationAnswer.of(result)
    pols = {k: p for k, p in ans.policies.items() if p.sequential_dr is not None}
    if not pols:
        return None
    has_truth = any(p.value_true is not None for p in pols.values())
    t = _table("Sequential doubly robust values (Q̂ from each logged history, whole trajectories)",
               ["policy", "SDR value", f"{ans.level:.0%} CI", "ESS", "support"] + (["truth"] if has_truth else []),
               caption="covers the value if either the simulator's Q̂ or the propensities are right; shown only where "
                       "at least 20 effective entities (Kish ESS of the weight products) follow the policy through "
                       "the horizon and the mean weight product is not significantly below 1")
    notes = []
    for name, d in pols.items():
        sdr = d.sequential_dr
        est = (NOT_IDENTIFIED if d.model_only or sdr.not_identified else "withheld" if sdr.withheld
               else _cell(sdr.estimate))
        t.add_row(escape(name), est, "" if sdr.withheld else interval_text(sdr), fmt(sdr.ess, ".0f"),
                  fmt(d.support, ".0%"),
                  *([_cell(d.value_true)] if has_truth else []))
        if sdr.withheld and sdr.why and not d.model_only and not sdr.not_identified:
            notes.append(Text(f"{name}: sequential DR withheld — {sdr.why}"))
    return Group(t, *notes)


def horizon_sensitivity_table(result: AnswerLike) -> Group | None:
    """The values' and effects' bounds at the horizon asked under an unrecorded confounder of strength Γ at every step
    (``queries.sensitivity.HorizonSensitivity``), with each effect's and the ranking's verdict; None without them."""
    hb = EvaluationAnswer.of(result).sensitivity_horizon
    if hb is None:
        return None
    if not hb.gammas:  # every value withheld: nothing to bound
        return Group(Text(f"sensitivity over {hb.horizon_text}: {hb.ranking_verdict()}"))
    t = _table(f"Sensitivity over {hb.horizon_text}: bounds with sampling error at each Γ",
               ["policy"] + [f"Γ = {g:g}" for g in hb.gammas],
               caption=f"{hb.model}; Γ = 1: no unrecorded confounder (the sequential DR value)")
    for label, cells, _verdict in hb.rows():
        t.add_row(escape(label), *cells)
    notes = [Text(f"{name} − {e.get('reference')}: {hb.effect_verdict(name)}") for name, e in hb.effects.items()]
    return Group(t, *notes, Text(f"ranking over {hb.horizon_text}: {hb.ranking_verdict()}"))


def print_answers(con, res: AnswerLike, dataset: str) -> None:
    """The answer of ``fcd run`` and ``fcd whatif``: first what the logs identify (the headline), then the simulator's
    whole-trajectory numbers labelled by their kind (g-computation, ranked; or extrapolation, not ranked), with the
    doubly robust values and their bounded intervals."""
    ans = EvaluationAnswer.of(res)
    ident = identified_table(ans)
    if ans.unrecorded_confounding is not None:
        con.print(escape(ans.unrecorded_confounding.line()))  # the identified table would rank what is not identified
    elif ident is not None:
        con.print(ident)
    for line in pi_k_lines(ans):
        con.print(escape(line))
    if (line := one_step_line(ans)) is not None:
        con.print(escape(line))  # wrapped to the terminal: the line is long
    for line in sensitivity_lines(ans):
        con.print(escape(line))
    if ans.propensities is not None:
        con.print(escape(ans.propensities.line()))
    for line in ans.kind_lines():
        con.print(escape("kind of answer: " + line))
    title = ans.simulator_title.replace(":", f" ({dataset}):", 1)
    if ans.model_only:
        title += f" — {MODEL_ONLY}"
    con.print(whatif_table(ans, title=title))
    if (line := ans.simulated_ranking_line()) is not None:
        con.print(escape(line))
    if (drt := dr_table(ans, bounds_only=ident is not None)) is not None:
        con.print(drt)
    if (sdr := sequential_dr_table(ans)) is not None:
        con.print(sdr)
    if (hs := horizon_sensitivity_table(ans)) is not None:
        con.print(hs)
    if ans.natural_course is not None:
        con.print(escape("natural course (the simulator under the logging policy vs the logs): "
                         + ans.natural_course.cell()))


def register(app: typer.Typer) -> None:
    """Attach ``fcd whatif`` to the root app."""

    @app.command("whatif", short_help="Ask a finished run what happens under policies (values, effects, intervals).")
    def whatif(
        run_dir: Path = typer.Argument(..., help="A finished run folder of `fcd run` (with config.toml, theta_c.npz and its state/)."),
        policy: Optional[list[str]] = typer.Option(None, "--policy", "-p", help="A policy file (.toml) or the name of a shipped policy (never, always, early_on, late_on, incremental_on_x2, share_on_20); repeat for several. Default: the run's [evaluation] policies."),
        reference: Optional[str] = typer.Option(None, "--reference", "-r", help="The policy every other one is contrasted with: a file or shipped name (added if not among --policy), or the name of a given policy. Default: the first policy."),
        horizon: Optional[int] = typer.Option(None, "--horizon", min=1, help="Average each value over the first H steps from t = 0 (default: the run's setting, else whole trajectories)."),
        level: Optional[float] = typer.Option(None, "--level", min=0.5, max=0.999, help="Nominal coverage of the intervals (default: the run's, 0.9)."),
        as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope (the result in data) on stdout."),
        home: Optional[Path] = typer.Option(None, "--home", help="A run of `fcd server run`: the coordinator's folder it is asked through (default: the one whose server state the run names). The server must be running."),
        timeout: float = typer.Option(1800.0, "--timeout", min=1.0, help="A run of `fcd server run`: seconds to wait for the sites' answer."),
        engine: Optional[Engine] = typer.Option(None, "--engine", case_sensitive=False, help="A run of `fcd run`: the engine of the evaluation round (simulation: Flower's, with Ray; inprocess: the same apps and messages in this process, the same answer). Default: the run's own (summary.json's engine)."),
    ) -> None:
        """Simulate each POLICY on the run's trained model (Θc from theta_c.npz, each site's own Θs from its state)
        in one evaluation-only round on the run's engine (--engine): its value with an interval, the difference to the
        reference policy with an interval, and the truth beside them on an oracle (dkt-synth, tumour, carryover).
        Each answer says its kind and its horizon: checked by weighting (doubly robust, over the steps the logs
        reach), g-computation by the simulator (its natural course matches the logs; ranked at the horizon asked
        only) or extrapolation (never ranked). Per-entity effects are written on each site, into that site's own
        state folder (whatif/<query id>.csv); only consortium sums reach the server.
        The result is also written to RUN_DIR/whatif/<query id>.json.

        A run of `fcd server run` is asked through the coordinator's SuperLink as a new run the coordinator signs:
        each site answers with the Θs it recorded when it answered that run, under its own question budget, through
        secure aggregation; a site that declines is named with its rule.

        Exit codes: 0 done, 2 bad input (run folder, policy files, labels the data does not have), 1 the run failed,
        7 the answers cover fewer sites than the run (the sites left out are named on stdout and in the JSON), 8 the
        answer is the simulator's alone (no site's propensities: printed as extrapolation, not ranked).
        """
        from fcd_secure.data.policy import load_policy_refs  # noqa: PLC0415
        from fcd_secure.data.spec import DataError  # noqa: PLC0415

        hint = "the message names the run folder, policy file or field"
        try:  # the policy files first: a typo in one is refused before torch and Flower load
            given = load_policy_refs(policy) if policy else None
        except DataError as exc:
            raise CliError(str(exc), hint=hint) from None
        import torch  # noqa: PLC0415

        from fcd_secure.config import ConfigError, RunConfig  # noqa: PLC0415
        from fcd_secure._io import jsonable  # noqa: PLC0415
        from fcd_secure.queries.request import WhatIfRequest  # noqa: PLC0415
        from fcd_secure.queries.vocabulary import bind_policies  # noqa: PLC0415
        from fcd_secure.apps.whatif_app import WhatIfError  # noqa: PLC0415
        from fcd_secure.engines.whatif_run import open_run, recorded_engine, run_whatif  # noqa: PLC0415
        from fcd_secure.provisioning.consortium import ProvisioningError  # noqa: PLC0415
        from fcd_secure.provisioning.server import ask_deployed, question_coordinator  # noqa: PLC0415

        console = stderr()
        try:  # a run of `fcd server run` is asked through its coordinator: refused here if it cannot be
            co = question_coordinator(run_dir, home)
        except ProvisioningError as exc:
            raise CliError(str(exc), hint="the coordinator's folder (--home) and a finished run folder of `fcd server "
                           "run`; fcd server start --home HOME first") from None
        if co is not None and engine is not None:
            raise CliError(f"--engine {engine.value}: {run_dir} is a run of `fcd server run`, asked on its sites "
                           "through the coordinator's SuperLink; --engine chooses only where a run of `fcd run` is "
                           "asked", hint="leave out --engine")
        try:
            if co is not None:  # the data is on the sites: they bind the policies' labels and check the horizon
                cfg = RunConfig.load(Path(run_dir) / "config.toml")
            else:
                cfg, _theta = open_run(run_dir)
                engine = engine or recorded_engine(run_dir)
            pols = given if given is not None else load_policy_refs(cfg.evaluation.policies)
            ref_name = None
            if reference is not None:
                by_name = {p.name: p for p in pols}
                if reference in by_name:
                    ref_name = reference
                else:
                    ref = load_policy_refs([reference])[0]
                    if ref.name not in by_name:
                        pols = [ref, *pols]
                    ref_name = ref.name
            ev = cfg.evaluation
            request = WhatIfRequest(
                policies=pols, reference=ref_name or ev.reference or pols[0].name,
                horizon=horizon if horizon is not None else ev.horizon,
                level=level or ev.level,
            )
            if co is None and request.horizon is not None and request.horizon > cfg_len(cfg):
                raise DataError(f"--horizon {request.horizon} is longer than the data's trajectories ({cfg_len(cfg)} steps)")
            if co is None:
                bind_policies(cfg, pols)
        except (WhatIfError, ConfigError, DataError, ValueError) as exc:
            raise CliError(str(exc), hint=hint) from None
        torch.set_num_threads(1)
        console.print(f"[bold]fcd whatif[/bold] {escape(str(run_dir))}: {len(request.policies)} policies, reference "
                      f"{escape(request.reference)}, query {request.query_id}", soft_wrap=True)
        try:
            if co is not None:
                res = ask_deployed(co, run_dir, request.to_json(), request.query_id, timeout_s=timeout)
            else:
                res = run_whatif(run_dir, request, engine)
        except ProvisioningError as exc:  # before anything was submitted (the server is not running, ...)
            raise CliError(str(exc), hint="fcd server start --home HOME, then ask again") from None
        except (WhatIfError, DataError, RuntimeError) as exc:
            raise CliError(str(exc), "RUN_FAILED") from None
        result_file = Path(run_dir) / "whatif" / (request.query_id + ".json")
        if not res.get("policies"):  # every site declined: say who and under which rule instead of an empty table
            raise unanswered_error(jsonable(res), request)
        ans = EvaluationAnswer.from_json(res)
        cov = ans.coverage
        partial = None if cov is None or cov.complete is not False else CliError(
            cov.warning, "INCOMPLETE_ANSWER", data=jsonable(res),
            hint="the sites left out declined under their evaluation cohort rules or failed; the answers describe "
            "the other sites' entities only",
        )
        if partial is None and ans.model_only:
            partial = model_only_error(jsonable(res))
        if as_json:
            emit(partial.envelope() if partial else ok(jsonable(res), f"answered: {result_file}"))
            if partial:
                raise typer.Exit(partial.exit_code)
            return
        con = stdout()
        line = anchors_line(res.get("anchors"))
        if line:
            con.print(f"anchors: {escape(line)}", soft_wrap=True)
        print_answers(con, ans, cfg.data.dataset)
        if res.get("contexts"):
            c = res["contexts"]
            con.print(f"contexts in the rollouts: {c['generated']} generated (endogenous), {c['replayed']} replayed")
        con.print(f"per-entity effects: on each site, in <state>/<site>/whatif/{request.query_id}.csv", soft_wrap=True)
        for line in support_lines(ans):
            con.print(escape(line))
        if (line := coverage_line(cov)) is not None:
            con.print(escape(line))
        say_identifier(con, "result:", str(result_file), indent=0)
        if partial:
            raise partial


def unanswered_error(res: dict, request) -> CliError:
    """A question no site answered (exit 1), naming each site that declined it and the rule it declined under.

    A declining site replies with the rule's name only (``audit.gate.POLICY_REASON_PREFIX``: by design the server
    learns nothing else, P41), so which of the rule's checks fired is named by the site's own ledger, not here. The
    hint names only the changes that can help this question: separating its policies needs two of them, and
    thresholds a decile apart only applies to threshold policies.
    """
    from fcd_secure.audit import REFUSAL_RULES  # noqa: PLC0415
    from fcd_secure.queries.cohort import RULE  # noqa: PLC0415

    declined = [str(s) for s in res.get("declined_sites") or []]
    failed = [str(s) for s in res.get("failed_sites") or [] if s not in declined]
    if not declined:
        return CliError("no site answered the question" + (f": {', '.join(failed)} failed" if failed else ""),
                        "RUN_FAILED", hint="the sites' own logs say more (FCD_SITE_DEBUG=1)", data=res)
    rules = {str(k): str(v) for k, v in (res.get("declined_rules") or {}).items() if v}
    by_rule: dict[str, list[str]] = {}
    for site in declined:
        by_rule.setdefault(rules.get(site, RULE), []).append(site)
    msg = "no site answered the question: " + "; ".join(
        f"{', '.join(sites)} declined it under rule '{rule}' ({REFUSAL_RULES.get(rule, '')})"
        for rule, sites in by_rule.items()) + (f"; {', '.join(failed)} failed" if failed else "")
    others = [s for s in (res.get("coverage") or {}).get("sites_asked") or [] if s not in declined and s not in failed]
    if others:  # they answered, but secure aggregation reveals no sum of fewer sites than its minimum
        msg += f"; the {len(others)} other site(s) were too few for secure aggregation to reveal a sum"
    fix = ""
    if RULE not in by_rule:  # a question about a run the sites do not hold as asked: no other question helps
        return CliError(msg, "RUN_FAILED", data=res, hint="ask about a run the sites answered, with its own "
                        "theta_c.npz; each declining site's ledger names which check fired")
    if len(request.policies) > 1:
        thresholds = any(p.rule.kind == "threshold" for p in request.policies)
        fix = ("if two of its policies act alike on most patients, ask policies that differ on more of them"
               + (" (thresholds a decile or more apart)" if thresholds else "") + "; ")
    return CliError(msg, "RUN_FAILED", hint=fix + "which of the rule's checks fired is recorded only in each "
                    "declining site's own ledger: ask its operator (the server learns the rule's name, nothing more)",
                    data=res)


def cfg_len(cfg) -> int:
    """The trajectories' length L of a run's data (the horizon's upper bound)."""
    from fcd_secure.federation import learner  # noqa: PLC0415

    return learner.load_site_data(cfg, 0).test.L
