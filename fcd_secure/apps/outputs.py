"""The run folder: everything a run leaves behind.

``<out>/``
  ``config.toml`` and ``config.json``   the resolved run configuration, written when the run starts (``fcd run
                                        --config <out>/config.toml`` re-runs it; ``fcd run --resume <out>``
                                        continues it); ``state_dir`` is kept only when it is not ``<out>/state``
  ``rounds.csv``                        per-round metrics, one line appended as each round ends (watch a long
                                        run with ``tail -f``); columns :data:`ROUND_COLUMNS`
  ``theta_c.npz``                       the final global synchronised parameters, keyed by manifest names
  ``manifest.json``                     the Θc / Θs partition the run used
  ``rounds.json``                       the same per-round metrics as JSON
  ``traffic.csv``                       every message: round, action, site, direction, payload / message bytes
  ``summary.json``                      final metrics, DP settings and ε per site, site errors, bytes, rounds,
                                        wall time, seed, versions
  ``pehe_vs_round.png``                 paper Fig. 3 (oracle PEHE vs round; DKT-Synth only)
  ``utility_vs_uplink.png``             paper Fig. 4 (utility vs cumulative uplink MB)

  ``state/``                            per-site state, server checkpoint and audit ledgers (simulation default)

Each file is written atomically and ``summary.json`` last: a folder without it is an unfinished run.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_bytes, atomic_write_text, jsonable, npz_bytes
from fcd_secure._versions import installed_versions
from fcd_secure.config import RunConfig
from fcd_secure.federation.secure.secure_behaviour import BEHAVIOUR_MODEL_KEY
from fcd_secure.manifest import FULL, THETA_C, THETA_S


def versions() -> dict[str, str]:
    """The versions ``summary.json`` records, in its order (``fcd_secure._versions``: package metadata, one lookup;
    a missing package reads ``"unknown"``, as summary.json always wrote it)."""
    return installed_versions(("fcd_secure", "flwr", "torch", "numpy", "opacus", "python"), missing="unknown")


#: The columns of ``rounds.csv``, in order (a value a round did not compute is empty).
ROUND_COLUMNS = (
    "round", "sites", "participants", "failures", "aborted", "aborted_reason", "site_errors", "dropped", "n_total",
    "train_loss", "uplink_bytes", "downlink_bytes", "uplink_message_bytes", "uplink_formula_bytes",
    "cum_uplink_bytes", "cum_downlink_bytes", "round_s", "pehe", "ate_error", "factual_auc",
    "d1", "d1_se", "d1_alarm", "validation_fit", "dh", "dh_se", "dh_ess", "selected", "nc_max_z", "nc_gap",
)


def _csv_value(v: Any) -> Any:
    v = jsonable(v)
    return "" if v is None else v


def rounds_csv_text(history: list[dict], header: bool = True) -> str:
    """``rounds.csv`` (or its lines without the header) for ``history``, columns :data:`ROUND_COLUMNS`."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    if header:
        w.writerow(ROUND_COLUMNS)
    for row in history:
        w.writerow([_csv_value(row.get(c)) for c in ROUND_COLUMNS])
    return buf.getvalue()


class RoundsLog:
    """``<out>/rounds.csv``, kept current while the run goes: rewritten from the history when a run (re)starts, then
    one line appended as each round ends (flushed, so ``tail -f`` shows it at once)."""

    def __init__(self, out: str | Path) -> None:
        self.path = Path(out) / "rounds.csv"

    def start(self, history: list[dict]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.path, rounds_csv_text(history))

    def append(self, row: dict) -> None:
        with self.path.open("a", encoding="utf-8") as f:
            f.write(rounds_csv_text([row], header=False))
            f.flush()


def config_for_folder(cfg: RunConfig) -> RunConfig:
    """The config as the run folder keeps it: ``state_dir`` is left out when it is the folder's own ``state/``, so
    that ``--resume`` finds the state wherever the folder is, and a ``--config`` re-run starts a new state."""
    if cfg.state_dir and cfg.out and Path(cfg.state_dir).resolve() == (Path(cfg.out) / "state").resolve():
        return cfg.model_copy(update={"state_dir": None})
    return cfg


def write_config(out: str | Path, cfg: RunConfig) -> None:
    """``config.toml`` and ``config.json`` of the run folder (atomic; see :func:`config_for_folder`)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    kept = config_for_folder(cfg)
    atomic_write_text(out / "config.toml", kept.to_toml())
    atomic_write_text(out / "config.json", kept.model_dump_json(indent=2))


def dp_summary(cfg: RunConfig, site_ids: list[str]) -> dict[str, Any]:
    """The DP settings of a run and the ε each site has spent (from the sites' ledgers, when this process can read
    them: the simulation's shared state folder; a deployed server cannot, and says so)."""
    dp = cfg.dp
    if not dp.enabled:
        return {
            "enabled": False,
            "guarantee": "none: this run has no DP guarantee (dp.enabled = false)",
            "epsilon_spent": None,
            "consortium_epsilon": None,
        }
    from fcd_secure.privacy.errors import PrivacyLedgerError  # noqa: PLC0415
    from fcd_secure.privacy.report import site_budgets  # noqa: PLC0415

    roots = [p for p in (cfg.state_root(), Path(dp.ledger_dir) if dp.ledger_dir else None) if p is not None]
    try:
        budgets = site_budgets(roots)
    except PrivacyLedgerError as exc:  # the run's result stands; the ledger's problem is reported, not hidden
        return {"enabled": True, "epsilon_cap": dp.epsilon, "epsilon_spent": None, "consortium_epsilon": None,
                "guarantee": f"unknown: a privacy ledger cannot be read ({exc}); see `fcd privacy report`"}
    if not budgets:  # a deployed server holds no site's ledger: ε lives with each site (`fcd privacy report` there)
        return {"enabled": True, "epsilon_cap": dp.epsilon, "epsilon_spent": None, "consortium_epsilon": None,
                "guarantee": "record-level (ε, δ)-DP per site; ε is kept in each site's ledger, which this server "
                "cannot read (run `fcd privacy report` at each site)"}
    spent = {sid: float(budgets[sid]["epsilon_spent"]) if sid in budgets else 0.0 for sid in site_ids}
    for sid, b in budgets.items():
        spent.setdefault(sid, float(b["epsilon_spent"]))
    deltas = [b["delta"] for b in budgets.values()]
    return {
        "enabled": True,
        "guarantee": "record-level (ε, δ)-DP per site (DP-SGD, Opacus); consortium: parallel composition (max ε)",
        "epsilon_cap": dp.epsilon,
        "delta": max(deltas) if deltas else dp.delta,
        "delta_rule": "given" if dp.delta is not None else "a power of ten ≤ 1/(10·n_site), per site",
        "clip": dp.clip,
        "accountant": dp.accountant,
        "ledger_dir": dp.ledger_dir,
        "epsilon_spent": spent,
        "consortium_epsilon": max(spent.values()) if spent else None,
        "exhausted": sorted(sid for sid, b in budgets.items() if b["epsilon_remaining"] <= 1e-9),
    }


def build_summary(cfg: RunConfig, result, engine: str) -> dict[str, Any]:
    """``summary.json`` content from a ``FederationResult``."""
    hist = result.history
    up = int(sum(r["uplink_bytes"] for r in hist))
    down = int(sum(r["downlink_bytes"] for r in hist))
    formula = int(sum(r["uplink_formula_bytes"] for r in hist))
    m = result.manifest
    fe = dict(result.final_eval)
    summary = {
        "dataset": cfg.data.dataset,
        "preset": cfg.preset,
        "engine": engine,
        "seed": cfg.seed,
        "rounds": len(hist),
        "rounds_aborted": int(sum(1 for r in hist if r.get("aborted"))),
        "n_sites": cfg.data.n_sites,
        "clients_per_round": cfg.federation.clients_per_round,
        "sync": cfg.federation.sync,
        "secure_aggregation": cfg.federation.secure_aggregation,
        "synchronised_part": result.part,
        # "full" is what full synchronisation sends (the site-bound Θs stays out); "total" counts every parameter
        "params": {**{part: m.size(part) for part in (THETA_C, THETA_S, FULL)},
                   "total": m.size(THETA_C) + m.size(THETA_S)},
        "uplink_bytes": up,
        "downlink_bytes": down,
        "uplink_mb": up / 1e6,
        "uplink_formula_bytes": formula,
        "uplink_formula": "Σ_rounds participating sites × synchronised parameter bytes (paper Table II)",
        "pehe": fe.get("pehe"),
        # PEHE with what it means beside it: PEHE₀, the constant-effect floor sd τ, corr, ATE ratio, skill, flags
        "effect_skill": fe.get("effect_skill"),
        # the anchor regimes' support: the paper's multi-step effect is extrapolation where few entities follow them
        "effect_support": fe.get("effect_support"),
        "ate_error": fe.get("ate_error"),
        # what the logs identify (queries.targeted): the one-step effect at every decision step, doubly robust
        "one_step_effect": fe.get("one_step_effect"),
        # how far an unrecorded confounder could move it (queries.sensitivity)
        "sensitivity": fe.get("sensitivity"),
        # and the policy values and effects at the horizon asked, with the Γ that could change the ranking
        "sensitivity_horizon": fe.get("sensitivity_horizon"),
        # the unrecorded confounding the user declared ([evaluation] / the table spec / the world): not identified
        "unrecorded_confounding": fe.get("unrecorded_confounding"),
        # what kind each answer is and what it rests on (queries.kinds)
        "kinds": fe.get("kinds"),
        # per-entity one-step effects: the federated DR-learner beside the simulator's own contrast (queries.dr_learner)
        "dr_learner": fe.get("dr_learner"),
        "factual_auc": fe.get("factual_auc"),
        "value_error_mean": fe.get("value_error_mean"),
        "policies": fe.get("policies", {}),
        "whatif": fe.get("whatif"),
        "anchors": fe.get("anchors"),
        "contexts": fe.get("contexts"),
        "factual_residual": fe.get("factual_residual"),
        # which sites and how many entities the answers above cover (queries.evaluation.coverage)
        "coverage": fe.get("coverage"),
        # where the weighted answers' propensities came from, their overlap and calibration (queries.propensities)
        "propensities": fe.get("propensities"),
        # every number is the simulator's own: no weighted check reaches any (printed as extrapolation, exit 8)
        "model_only": fe.get("model_only"),
        # the simulator under the logging policy against the logs, per step (queries.natural_course)
        "natural_course": fe.get("natural_course"),
        # the run's policies' values in each late scored round, on the validation rows (queries.round_values)
        "round_values": fe.get("round_values"),
        "failed_sites_final_eval": fe.get("failed_sites", []),
        "declined_sites_final_eval": fe.get("declined_sites", []),
        "final_eval_aborted": fe.get("aborted"),
        "site_ids": [sinfo.site_id for sinfo in result.sites],
        "site_errors": [dict(e) for e in result.site_errors],
        "dp": dp_summary(cfg, [sinfo.site_id for sinfo in result.sites]),
        "wall_s": result.wall_s,
        "resumed_from_round": result.resumed_from,
        "layout_hash": m.layout_hash,
        "standardization": result.extra.get("standardization"),  # consortium-wide, from round 0 (secure_stats)
        # the consortium's shared behaviour model (evaluation.behaviour_model = "shared"; secure_behaviour), which a
        # later question about the run sends its sites again (apps.whatif_app.shared_behaviour)
        **({"behaviour_model": json.loads(result.extra[BEHAVIOUR_MODEL_KEY])}
           if result.extra.get(BEHAVIOUR_MODEL_KEY) else {}),
        # the evaluated round the answers come from, the truth-free rule that chose it and every round's D1
        # (docs/benchmarks.md, "Models are chosen by a causal criterion")
        "selection": {k: v for k, v in (result.extra.get("selection") or {}).items() if k != "scores"} or None,
        "versions": versions(),
    }
    return jsonable(summary)


def write_run_folder(out: str | Path, cfg: RunConfig, result, engine: str = "flower") -> Path:
    """Write the run folder: each file atomically, ``summary.json`` last (its presence means the folder is
    complete; the run's ``state/`` may live in the same folder, so the folder itself is never replaced).

    Args:
        out: the run folder.
        cfg: the resolved run config.
        result: the ``server_app.FederationResult``.
        engine: recorded in ``summary.json``.

    Returns:
        The run folder.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    summary_path = out / "summary.json"
    if summary_path.exists():
        summary_path.unlink()  # the old summary would vouch for a mix of old and new files
    write_config(out, cfg)
    atomic_write_bytes(out / "theta_c.npz", npz_bytes(result.theta))
    atomic_write_text(out / "manifest.json", result.manifest.to_json())
    atomic_write_text(out / "rounds.csv", rounds_csv_text(result.history))
    atomic_write_text(out / "rounds.json", json.dumps(jsonable(result.history), indent=1))
    # pandas at the end of a run, not with the ServerApp's start (0.6 s of CPU; ``apps.server_app.later_imports``)
    import pandas as pd  # noqa: PLC0415

    atomic_write_text(out / "traffic.csv", pd.DataFrame(result.traffic_rows).to_csv(index=False))
    summary = build_summary(cfg, result, engine)
    _plots(out, result.history, summary)
    atomic_write_text(summary_path, json.dumps(summary, indent=2, ensure_ascii=False))
    return out


def _plots(folder: Path, history: list[dict], summary: dict) -> None:
    """Paper Figs. 3 and 4 for this run (one method); skipped quietly when the metric was never evaluated.

    The per-round points are the cheap evaluations during training (``evaluation.quick_*``); the headline number,
    the final federated evaluation of ``summary.json``, is marked apart at the last round / the final uplink.
    """
    from fcd_secure.evaluation.plots import plot_metric_vs_round, plot_utility_vs_uplink  # noqa: PLC0415

    label = f"Fed-CausalDiff ({summary['sync']}), during training"
    final_round = history[-1]["round"] if history else summary.get("rounds")
    pts = [(r["round"], r["pehe"]) for r in history if r.get("pehe") is not None]
    sk = summary.get("effect_skill") or {}
    if pts or summary.get("pehe") is not None:
        plot_metric_vs_round(
            [p[0] for p in pts], {label: [p[1] for p in pts]}, folder / "pehe_vs_round.png",
            ylabel="oracle PEHE (lower is better)", title=f"{summary['dataset']}: PEHE vs round (paper Fig. 3)",
            headline=None if summary.get("pehe") is None else ("final evaluation", final_round, summary["pehe"]),
            references={"zero-effect PEHE₀": sk.get("pehe_zero"), "constant-effect floor sd τ": sk.get("sd_tau")},
        )
    # Fig. 4 plots downstream AUC against cumulative uplink; without an AUC (non-binary outcomes) PEHE stands in
    has_auc = any(r.get("factual_auc") is not None for r in history) or summary.get("factual_auc") is not None
    key, name = ("factual_auc", "factual AUC (higher is better)") if has_auc else ("pehe", "PEHE (lower is better)")
    pts2 = [(r["cum_uplink_bytes"] / 1e6, r.get(key)) for r in history if r.get(key) is not None]
    final_mb = (history[-1]["cum_uplink_bytes"] / 1e6) if history else 0.0
    head = None if summary.get(key) is None else ("final evaluation", final_mb, summary[key])
    if pts2 or head:
        plot_utility_vs_uplink(
            [(label, [p[0] for p in pts2], [p[1] for p in pts2])] if pts2 else [], folder / "utility_vs_uplink.png",
            ylabel=name, title=f"{summary['dataset']}: utility vs uplink (paper Fig. 4)",
            xlabel="cumulative uplink (MB)", chance=0.5 if key == "factual_auc" else None, headline=head,
        )
