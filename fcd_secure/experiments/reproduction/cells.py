"""One cell of the reproduction: a method federated on a dataset under one seed, scored, and cached on disk.

A cell is trained by the Flower app (``server_app.run_federation`` with the ClientApp) under paper Table II's protocol
— the same split, seed and engine for every method, ``model.simulator`` naming the method (full synchronisation for a
method without Θs, which DSS then amounts to) — and scored by the same code for every method:

* the final federated evaluation (``queries.evaluation``): PEHE, |ATE error| and |value error| against the
  DKT-Synth oracle, the factual AUC, and per policy the simulated value and IPW/SNIPW/DR on sites that log
  propensities;
* the per-round evaluations (PEHE, factual AUC) and cumulative uplink bytes of the run (Figs. 3 and 4);
* TSTR (:mod:`fcd_secure.evaluation.tstr`): every site's model (global Θc plus the site's own Θs) synthesises its
  training trajectories under the logged actions; the fixed predictor is trained on the pooled synthetic sets and
  tested on the pooled real test sets;
* the step-wise DR of the four policies (:mod:`~.policy_values`), each site's sums from its own model and data.

The result is one JSON file per cell (:func:`cell_path`), written atomically when the cell is complete and carrying the
hash of its configuration and of the code that computes it (:func:`config_hash`): a reproduction that is interrupted
and started again skips every cell whose file exists with the same hash. The cell's federation state (keys, ledgers, checkpoints) is removed once the
file is written.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import resource
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure._io import atomic_write_text
from fcd_secure.config import RunConfig, build_config
from fcd_secure.data.policy import default_policies
from fcd_secure.data.schema import concat
from fcd_secure.evaluation.tstr import synthesize, trtr, tstr
from fcd_secure.experiments.reproduction.policy_values import stepwise_dr_sums
from fcd_secure.experiments.reproduction.presets import ABLATIONS, METHODS, ReproPreset
from fcd_secure.federation import learner
from fcd_secure.engines.inprocess import run_inprocess
from fcd_secure.apps.site import SiteRuntime, default_site_id
from fcd_secure.manifest import THETA_C, THETA_S

__all__ = [
    "ABLATIONS", "METHODS", "Cell", "cell_config", "cell_path", "config_hash", "load_cached", "run_cell", "run_trtr",
]

#: The seed streams (``round_seed`` salts) of the TSTR draws and of the step-wise DR's one-step rollouts.
TSTR_SALT = 0x75E5
DR_SALT = 0xD12


@dataclass(frozen=True)
class Cell:
    """A method (or ablation) on a dataset under one seed."""

    dataset: str
    method: str
    seed: int

    @property
    def simulator(self) -> str:
        """The simulator key the cell trains (the ablations are Fed-CausalDiff)."""
        return "fed_causaldiff" if self.method in ABLATIONS else self.method

    @property
    def label(self) -> str:
        return f"{self.dataset}/{self.method}/seed{self.seed}"


def cell_path(root: Path, cell: Cell) -> Path:
    """Where the cell's result lives under the reproduction folder ``root``."""
    return root / "cells" / cell.dataset / f"{cell.method}-seed{cell.seed}.json"


def cell_config(
    preset: ReproPreset, cell: Cell, lr: float, data_dir: str | None = None, secure: bool = False
) -> RunConfig:
    """The run configuration of ``cell`` (Table II protocol at the preset's size; ``lr`` from the selection).

    ``secure`` turns secure aggregation on for every cell but the "w/o DSS" ablation: it synchronises Θs, which may
    never enter the masked vector (docs/threats.md P15), so it runs with plain FedAvg.
    """
    model: dict[str, Any] = {**preset.model, "simulator": cell.simulator, "lr": float(lr)}
    if cell.method == "no_ldis":
        model["use_dis"] = False
    return build_config(preset.run_preset, {
        "seed": cell.seed,
        "data": {"dataset": cell.dataset, "preset": preset.data_preset(cell.dataset), "n_sites": preset.n_sites,
                 "alpha": 10.0, "data_dir": data_dir},
        "federation": {"rounds": preset.rounds, "clients_per_round": preset.clients_per_round, "local_epochs": 1,
                       "eval_every": preset.eval_every, "sync": "full" if cell.method == "full_sync" else "dss",
                       "secure_aggregation": secure and cell.method != "full_sync"},
        "model": model,
        "evaluation": dict(preset.evaluation),
    })


#: The code a cell's numbers come from (package-relative folders and files): a change to any of it invalidates the
#: cache, as a change of configuration does (a preset's numbers enter through the configuration). Tables, figures
#: and the report are rebuilt from the cache on every run.
CODE_PATHS = ("data", "model", "evaluation", "federation", "aggregation", "audit", "config.py", "manifest.py",
              "experiments/centralised.py", "experiments/reproduction/cells.py",
              "experiments/reproduction/policy_values.py", "experiments/reproduction/selection.py")


@functools.lru_cache(maxsize=1)
def code_fingerprint() -> str:
    """SHA-256 over the sources under :data:`CODE_PATHS` (path and content of every ``.py`` file, sorted)."""
    pkg = Path(__file__).resolve().parents[2]
    h = hashlib.sha256()
    for rel in CODE_PATHS:
        p = pkg / rel
        for f in sorted([p] if p.is_file() else p.rglob("*.py")):
            h.update(str(f.relative_to(pkg)).encode())
            h.update(f.read_bytes())
    return h.hexdigest()


def config_hash(cfg: RunConfig, preset: ReproPreset) -> str:
    """Hash of everything that determines a cell's numbers: the config without paths, the TSTR size and the code
    (:func:`code_fingerprint`)."""
    d = cfg.model_dump(mode="json")
    for k in ("out", "state_dir"):
        d.pop(k, None)
    d["data"].pop("data_dir", None)
    d["tstr_max_rows"] = preset.tstr_max_rows
    d["code"] = code_fingerprint()
    return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


def load_cached(path: Path, want_hash: str) -> dict[str, Any] | None:
    """The cached result at ``path`` if it exists and was made with ``want_hash``, else None."""
    if not path.exists():
        return None
    try:
        res = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return None
    return res if res.get("config_hash") == want_hash else None


def _finite(v: Any) -> Any:
    """JSON-safe: NaN and inf become None, recursively."""
    if isinstance(v, dict):
        return {str(k): _finite(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_finite(x) for x in v]
    if isinstance(v, (np.floating, float)):
        return float(v) if math.isfinite(float(v)) else None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.ndarray):
        return _finite(v.tolist())
    return v


def _cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _rows(n: int, cap: int | None) -> np.ndarray:
    return np.arange(n if cap is None else min(n, cap))


def _tstr_training_sets(cfg: RunConfig, preset: ReproPreset):
    fd = learner.load_federated(cfg)
    return [d.subset(_rows(d.n, preset.tstr_max_rows)) for d in fd.train], concat(list(fd.test), name="real-test")


def _site_side_scores(cfg: RunConfig, preset: ReproPreset, theta: dict[str, np.ndarray], part: str) -> dict[str, Any]:
    """TSTR and Fig. 2's step-wise DR of the federated model, each site with its own model (Θc + its Θs).

    TSTR: every site synthesises its training set; the fixed predictor learns on the pooled synthetic sets and is
    tested on the pooled real test sets. Step-wise DR: every site sums over its test split
    (:func:`~.policy_values.stepwise_dr_sums`); the sums are pooled.
    """
    fd = learner.load_federated(cfg)
    trains, test = _tstr_training_sets(cfg, preset)
    synth, sums = [], []
    policies = default_policies()
    for i, d in enumerate(trains):
        rt = SiteRuntime(cfg, default_site_id(i), i, str(cfg.state_dir))
        sim = rt.load_for_eval(theta, part)
        synth.append(synthesize(sim.simulate, d, learner.round_seed(cfg.seed, 0, i, TSTR_SALT)))
        site_test = fd.test[i]
        sums.append(stepwise_dr_sums(sim.simulate, sim.factual_probs(site_test), fd.train[i], site_test, policies,
                                     tuple(fd.anchors), cfg.evaluation.n_samples,
                                     learner.round_seed(cfg.seed, 0, i, DR_SALT)))
    steps = sum(s["steps"] for s in sums)
    sdr = {p.name: {"value": sum(s[p.name]["sum"] for s in sums) / max(steps, 1.0),
                    "matched": sum(s[p.name]["matched"] for s in sums)} for p in policies}
    return {"tstr": tstr(concat(synth, name="synthetic"), test), "stepwise_dr": sdr, "dr_steps": steps,
            "logged_propensities": all(s["logged_propensities"] for s in sums)}


def run_cell(
    preset: ReproPreset, cell: Cell, lr: float, root: Path, data_dir: str | None = None, secure: bool = False
) -> dict[str, Any]:
    """Train, score and cache one cell (module docstring); a cached result with the same hash is returned as is.

    Returns:
        The cell's JSON-able result: ``cell``, ``config_hash``, ``lr``, ``final`` (the merged final evaluation),
        ``history`` (per round), ``tstr``, ``stepwise_dr`` (per policy), ``params`` (Θc/Θs sizes), ``uplink_mb``,
        ``wall_s`` and ``cpu_s`` (this process's CPU seconds for the cell).
    """
    cfg = cell_config(preset, cell, lr, data_dir, secure)
    h = config_hash(cfg, preset)
    path = cell_path(root, cell)
    cached = load_cached(path, h)
    if cached is not None:
        return cached
    state = path.with_suffix(".state")
    if state.exists():
        shutil.rmtree(state)  # an interrupted cell starts again from round 1
    cfg = cfg.model_copy(update={"state_dir": str(state)})
    t0, cpu0 = time.perf_counter(), _cpu_s()
    res = run_inprocess(cfg)
    t_train = time.perf_counter() - t0
    scores = _site_side_scores(cfg, preset, res.theta, res.part)
    m = res.manifest
    out = {
        "cell": {"dataset": cell.dataset, "method": cell.method, "seed": cell.seed, "simulator": cell.simulator},
        "config_hash": h,
        "lr": float(lr),
        "final": res.final_eval,
        "history": [
            {k: r.get(k) for k in ("round", "pehe", "ate_error", "factual_auc", "uplink_bytes", "cum_uplink_bytes",
                                    "train_loss", "aborted")}
            for r in res.history
        ],
        **scores,
        "params": {"theta_c": sum(e.size for e in m.entries if e.part == THETA_C),
                   "theta_s": sum(e.size for e in m.entries if e.part == THETA_S)},
        "uplink_mb": sum(r["uplink_bytes"] for r in res.history) / 1e6,
        "train_s": t_train,
        "wall_s": time.perf_counter() - t0,
        "cpu_s": _cpu_s() - cpu0,
    }
    out = _finite(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out, indent=1))
    shutil.rmtree(state, ignore_errors=True)
    return out


def run_trtr(preset: ReproPreset, dataset: str, seed: int, root: Path, data_dir: str | None = None) -> dict[str, Any]:
    """The TRTR ceiling of ``dataset`` under ``seed`` (the fixed predictor on the real training sets TSTR
    synthesises), cached like a cell."""
    cfg = cell_config(preset, Cell(dataset, "fed_causaldiff", seed), preset.lr_grid[0], data_dir)
    h = config_hash(cfg, preset)
    path = root / "cells" / dataset / f"trtr-seed{seed}.json"
    cached = load_cached(path, h)
    if cached is not None:
        return cached
    trains, test = _tstr_training_sets(cfg, preset)
    out = _finite({"dataset": dataset, "seed": seed, "config_hash": h, "trtr": trtr(concat(trains), test)})
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(out, indent=1))
    return out
