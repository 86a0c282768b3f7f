"""`fcd train`: the centralised reference (Fed-CausalDiff and two baselines on the pooled DKT-Synth training data),
scored against the oracle's ground truth. Thin: parse, call ``fcd_secure.experiments.centralised``, print.

Federated training is ``fcd run``; the old ``--centralised`` flag is still accepted and does nothing
(:mod:`fcd_secure.cli.renamed`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Optional

import typer
from rich.markup import escape

from fcd_secure.cli.app import emit, stderr, stdout
from fcd_secure.cli.envelope import CliError, ok
from fcd_secure.cli.resolve import PRESET_HELP, SET_HELP, RunOptions, resolve_config
from fcd_secure._format import fmt

if TYPE_CHECKING:  # pragma: no cover
    from rich.table import Table

#: the methods of the reference, in the order they are trained and shown
DEFAULT_METHODS = ("fed_causaldiff", "gformula", "naive")
METHODS_HELP = f"A method to train: {', '.join(DEFAULT_METHODS)}; repeat for several (default: all three)."


def _seed_tables(res: dict) -> list["Table"]:
    from rich.table import Table  # noqa: PLC0415

    t = Table(
        title=(
            f"Centralised reference, DKT-Synth '{res['preset']}' (seed {res['seed']}, {res['epochs']} epochs, "
            f"{res['n_train']} train / {res['n_test']} test)"
        ),
        caption="PEHE = √mean(τ̂−τ)²; errors are absolute, lower is better.",
    )
    for col, just in (("method", "left"), ("PEHE", "right"), ("skill", "right"), ("|ATE err|", "right"),
                      ("ATE est.", "right"), ("mean |V err|", "right"), ("AUC", "right"), ("train s", "right")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    ate_true = None
    for name, m in res["methods"].items():
        ate_true = m.get("ate_true", ate_true)
        sk = m.get("effect_skill") or {}
        skill = fmt(sk.get("skill"), "+.3f") + ("" if not sk.get("flags") else " (" + "; ".join(sk["flags"]) + ")")
        t.add_row(name, fmt(m.get("pehe")), skill, fmt(m.get("ate_error")), fmt(m.get("ate_hat"), "+.4f"),
                  fmt(m.get("value_error_mean")), fmt(m.get("factual_auc"), ".3f"), f"{m['train_seconds']:.0f}")
    sk0 = next((m.get("effect_skill") for m in res["methods"].values() if m.get("effect_skill")), None) or {}
    t.add_row("oracle", "", "", "", fmt(ate_true, "+.4f"), "", "", "")
    t.caption = (f"{t.caption} Beside PEHE: PEHE₀ (no effect for anyone) {fmt(sk0.get('pehe_zero'))}, constant-effect "
                 f"floor sd τ {fmt(sk0.get('sd_tau'))}; skill = 1 − PEHE²/sd²τ (> 0: better than the true ATE for all).")
    names = sorted({p for m in res["methods"].values() for p in (m.get("policies") or {})})
    v = Table(title="Policy values from t = 0 (estimate / |error|)")
    v.add_column("method")
    for n in names:
        v.add_column(escape(n), justify="right")
    first = next(iter(res["methods"].values()))
    v.add_row("oracle", *[fmt((first.get("policies") or {}).get(n, {}).get("value_true"), ".3f") for n in names])
    for name, m in res["methods"].items():
        pol = m.get("policies") or {}
        v.add_row(name, *[f"{fmt(pol.get(n, {}).get('value_sim'), '.3f')} / {fmt(pol.get(n, {}).get('value_error'), '.3f')}"
                          for n in names])
    return [t, v]


def _summary_table(summary: list[dict], seeds: list[int], epochs: int) -> "Table":
    from rich.table import Table  # noqa: PLC0415

    t = Table(title=f"Centralised reference over seeds {seeds} ({epochs} epochs): mean ± s.d.")
    for col in ("method", "PEHE↓", "ATE↓", "Value↓", "AUC↑"):
        t.add_column(col, justify="left" if col == "method" else "right")
    for r in summary:
        t.add_row(r["method"], r["pehe_fmt"], r["ate_fmt"], r["value_fmt"], r["auc_fmt"])
    return t


def train(
    preset: str = typer.Option("default", "--preset", help=PRESET_HELP),
    seed: int = typer.Option(0, "--seed", help="Seed of the data, the initialisation and training."),
    seeds: int = typer.Option(1, "--seeds", min=1, help="Number of seeds from --seed on; mean ± s.d. over them."),
    epochs: Optional[int] = typer.Option(
        None, "--epochs", "-e", min=1,
        help="Passes over the pooled data (default: a federated site's average, rounds × clients per round / sites).",
    ),
    rounds: Optional[int] = typer.Option(None, "--rounds", min=1, help="Rounds of the federated run to match (preset default)."),
    sites: Optional[int] = typer.Option(None, "--sites", min=1, help="Number of DKT-Synth sites (pooled here)."),
    samples: Optional[int] = typer.Option(None, "--samples", min=1, help="Simulated futures per test trajectory (preset default)."),
    sampler: Optional[str] = typer.Option(None, "--sampler", help="Reverse sampler for do-simulation: ddim or ddpm."),
    steps: Optional[int] = typer.Option(None, "--steps", min=1, help="DDIM steps per transition (DDPM uses all N)."),
    methods: Optional[list[str]] = typer.Option(None, "--method", help=METHODS_HELP),
    settings: Optional[list[str]] = typer.Option(None, "--set", metavar="KEY=VALUE", help=SET_HELP),
    as_json: bool = typer.Option(False, "--json", help="Print one JSON envelope on stdout (progress to stderr)."),
) -> None:
    """The centralised reference: Fed-CausalDiff trained with every site's training data pooled in this one
    process, scored against DKT-Synth's ground truth (PEHE, |ATE error|, |policy value error| for the four default
    policies, factual AUC), next to a deterministic GRU g-formula and a naive observational model trained on the same
    split with the same seed.

    Federated training is `fcd run`; this command is its centralised yardstick, the same reference as the
    `centralised` row of `fcd ablate` (same epochs and seed, same numbers). Exit codes: 0 done, 2 bad input.
    """
    from pydantic import ValidationError  # noqa: PLC0415

    from fcd_secure.cli.run import bad_input_errors  # noqa: PLC0415
    from fcd_secure.config import RunConfig  # noqa: PLC0415
    from fcd_secure.model.config import SIMULATOR_KEYS  # noqa: PLC0415

    chosen = tuple(dict.fromkeys(methods or DEFAULT_METHODS))
    bad = [m for m in chosen if m not in SIMULATOR_KEYS]
    if bad:
        raise CliError(f"unknown method(s) {bad}; choose from {', '.join(SIMULATOR_KEYS)}", "USAGE",
                       hint="one method per --method, repeated for several")
    cfg = resolve_config(RunOptions(preset=preset, rounds=rounds, sites=sites, seed=seed, secure=False, eval_every=0,
                                    out=Path("runs") / "centralised", settings=settings or []))
    raw = cfg.model_dump(mode="json")
    raw["model"].update({k: v for k, v in (("sampler", sampler), ("sampler_steps", steps)) if v is not None})
    if samples is not None:
        raw["evaluation"]["n_samples"] = samples
    try:
        cfg = RunConfig.model_validate(raw)
    except ValidationError as exc:
        e = exc.errors()[0]
        raise CliError(f"field {'.'.join(map(str, e['loc']))}: {e['msg']}") from None
    import torch  # noqa: PLC0415 (after the arguments are checked: a typo is refused before torch loads)

    from fcd_secure.experiments.centralised import run_centralised_seeds  # noqa: PLC0415

    torch.set_num_threads(1)

    def progress(msg: str) -> None:
        (stderr() if as_json else stdout()).print(f"[dim]{escape(msg)}[/]", soft_wrap=True)

    seed_list = list(range(seed, seed + seeds))
    try:
        res = run_centralised_seeds(cfg, seed_list, chosen, epochs, progress=progress)
    except bad_input_errors() as exc:
        raise CliError(str(exc)) from None
    n_epochs = res["runs"][0]["epochs"]
    if as_json:
        emit(ok({"preset": preset, "epochs": n_epochs, "seeds": seed_list, **res},
                f"centralised reference over seeds {seed_list}"))
        return
    _out = stdout()
    if len(seed_list) == 1:
        for tab in _seed_tables(res["runs"][0]):
            _out.print(tab)
    else:
        _out.print(_summary_table(res["summary"], seed_list, n_epochs))


def register(app: typer.Typer) -> None:
    """Attach ``fcd train`` to the root app."""
    app.command("train", short_help="The centralised reference (sites pooled) and two baselines.")(train)
