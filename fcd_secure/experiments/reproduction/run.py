"""The reproduction as one call (``fcd reproduce``): select each method's learning rate, run every cell, write the
tables, figures and ``REPORT.md``.

Work is a list of *tasks* — learning-rate selections (dataset × method), cells (dataset × method × seed, plus Table
III's ablations on DKT-Synth) and TRTR ceilings (dataset × seed) — each cached on disk as it finishes, so an
interrupted reproduction started again with the same arguments resumes where it stopped. ``progress`` is called
before and after every task (the CLI draws a progress bar from it).

Selections and cells are independent of each other, so ``workers`` > 1 runs them in that many worker processes
(spawned, one torch thread each); every number is the same as with one worker, since each task seeds everything it
draws.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor, as_completed
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_text
from fcd_secure.data import registry
from fcd_secure.experiments.reproduction.cells import (
    ABLATIONS,
    METHODS,
    Cell,
    cell_config,
    cell_path,
    code_fingerprint,
    config_hash,
    load_cached,
    run_cell,
    run_trtr,
)
from fcd_secure.experiments.reproduction.outputs import build_outputs
from fcd_secure.experiments.reproduction.presets import DATASETS, ReproPreset
from fcd_secure.experiments.reproduction.report import write_report
from fcd_secure.experiments.reproduction.selection import select_lr

__all__ = ["Progress", "plan_cells", "run_reproduction"]

#: ``progress(done, total, label)``: ``done`` tasks finished of ``total``; ``label`` names the task starting next
#: (empty when all are done).
Progress = Callable[[int, int, str], None]


def _check(datasets: Sequence[str], methods: Sequence[str], seeds: Sequence[int]) -> None:
    bad = [d for d in datasets if d not in DATASETS]
    if bad or not datasets:
        raise ValueError(f"unknown dataset(s) {bad}; choose from {list(DATASETS)}")
    badm = [m for m in methods if m not in METHODS]
    if badm or not methods:
        raise ValueError(f"unknown method(s) {badm}; choose from {list(METHODS)}")
    if not seeds:
        raise ValueError("at least one seed is needed")


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the worker processes)."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _init_worker() -> None:
    import torch  # noqa: PLC0415 - each spawned worker sets its own threads

    torch.set_num_threads(1)


def _run_all(jobs: Sequence[tuple[Callable, tuple, str]], workers: int, starting: Callable[[str], None]) -> Iterator[Any]:
    """The results of ``fn(*args)`` for each job, in job order; ``starting(label)`` names work as it begins."""
    if workers == 1 or len(jobs) <= 1:
        for fn, args, label in jobs:
            starting(label)
            yield fn(*args)
        return
    ctx = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker) as pool:
        futures = {pool.submit(fn, *args): i for i, (fn, args, _) in enumerate(jobs)}
        starting(", ".join(label for _, _, label in jobs[:workers]))
        results: dict[int, Any] = {}
        nxt = 0
        for fut in as_completed(futures):
            results[futures[fut]] = fut.result()
            while nxt in results:
                yield results.pop(nxt)
                nxt += 1


def plan_cells(datasets: Sequence[str], methods: Sequence[str], seeds: Sequence[int], ablations: bool) -> list[Cell]:
    """Every cell of the reproduction, seed-major (a partial run covers all methods of the first seeds)."""
    out = []
    for seed in seeds:
        for ds in datasets:
            ms = list(methods) + (list(ABLATIONS) if ablations and ds == "dkt-synth" and "fed_causaldiff" in methods else [])
            out += [Cell(ds, m, int(seed)) for m in ms]
    return out


def run_reproduction(
    preset: ReproPreset,
    seeds: Sequence[int],
    datasets: Sequence[str],
    methods: Sequence[str],
    out: Path,
    data_dir: str | None = None,
    secure: bool = False,
    ablations: bool = True,
    progress: Progress | None = None,
    workers: int = 1,
) -> dict[str, Any]:
    """Run (or resume) the reproduction and write its report into ``out``.

    Args:
        preset: the sizes (:mod:`~.presets`).
        seeds: the seeds (data split, initialisation, sampling, training); mean ± s.d. over them.
        datasets: keys of :data:`~.presets.DATASETS`.
        methods: keys of :data:`~.cells.METHODS`.
        out: the output folder (tables, figures, ``REPORT.md``, ``cells/``, ``selection/``).
        data_dir: the real datasets' folder (None: the data layer's default).
        secure: train every cell with secure aggregation.
        ablations: add Table III's ablations (DKT-Synth, with Fed-CausalDiff).
        progress: see :data:`Progress`.
        workers: worker processes for selections and cells (1: this process).

    Returns:
        ``{"tables": ..., "report": path, "meta": ...}``.

    Raises:
        ValueError: an unknown dataset or method, or no seed.
        DataError: a dataset whose files are missing (before anything runs).
    """
    _check(datasets, methods, seeds)
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    for ds in datasets:
        registry.check_available(ds, data_dir)
    t0, cpu0 = time.perf_counter(), _cpu_s()
    started = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M")
    load_start = os.getloadavg()[0]
    out.mkdir(parents=True, exist_ok=True)
    cells = plan_cells(datasets, methods, seeds, ablations)
    total = len(datasets) * len(methods) + len(cells) + len(datasets) * len(seeds)
    done = 0
    say = progress or (lambda _d, _t, _l: None)

    lrs: dict[tuple[str, str], float] = {}
    sel_jobs = [(select_lr, (preset, ds, m, int(seeds[0]), out, data_dir), f"select lr {ds}/{m}")
                for ds in datasets for m in methods]
    selections = []
    for (_, args, _), s in zip(sel_jobs, _run_all(sel_jobs, workers, lambda label: say(done, total, label))):
        selections.append(s)
        lrs[(args[1], args[2])] = float(s["lr"])
        done += 1
        say(done, total, "")
    cached = 0
    cell_jobs = []
    for cell in cells:
        lr = lrs[(cell.dataset, cell.simulator if cell.method in ABLATIONS else cell.method)]
        hit = load_cached(cell_path(out, cell), config_hash(cell_config(preset, cell, lr, data_dir, secure), preset))
        cached += int(hit is not None)
        cell_jobs.append((run_cell, (preset, cell, lr, out, data_dir, secure),
                          f"{cell.label}{' (cached)' if hit is not None else ''}"))
    results = []
    for res in _run_all(cell_jobs, workers, lambda label: say(done, total, label)):
        results.append(res)
        done += 1
        say(done, total, "")
    trtr = []
    for seed in seeds:
        for ds in datasets:
            say(done, total, f"TRTR {ds}/seed{seed}")
            trtr.append(run_trtr(preset, ds, int(seed), out, data_dir))
            done += 1
    say(done, total, "")
    ope_h = cell_config(preset, cells[0], preset.lr_grid[0], data_dir).evaluation.ope_horizon
    tables = build_outputs(out, results, trtr, selections, datasets, methods, preset.name, ope_h)
    meta = {
        "preset": preset.model_dump(mode="json"), "seeds": [int(s) for s in seeds], "datasets": list(datasets),
        "methods": list(methods), "ablations": bool(ablations), "workers": int(workers), "engine": "Flower app in process "
        "(engines.inprocess: ServerApp round loop + ClientApp, no Ray)", "secure": bool(secure),
        "wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - cpu0, "code": code_fingerprint()[:16],
        "cells": len(cells), "cached": cached, "cpus": os.cpu_count(),
        "load_start": load_start, "load_end": os.getloadavg()[0], "started": started,
        "finished": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"),
        "cell_wall_s": {c["cell"]["dataset"] + "/" + c["cell"]["method"] + f"/seed{c['cell']['seed']}": c["wall_s"]
                        for c in results},
        "cell_cpu_s": {c["cell"]["dataset"] + "/" + c["cell"]["method"] + f"/seed{c['cell']['seed']}": c.get("cpu_s")
                       for c in results},
    }
    report = write_report(out, tables, meta, datasets, methods)
    atomic_write_text(out / "reproduction.json", json.dumps(meta, indent=1))
    return {"tables": tables, "report": str(report), "meta": meta}
