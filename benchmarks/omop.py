"""Reading a site's cohort from its OMOP CDM database against reading the same long table from CSV (issue 46).

For each size, a synthetic cohort of N persons over 50 daily steps, each step with two measurements (so ~100
measurement rows per person), a drug given on about a third of the days, a condition outcome, one static from an
observation and one from a condition before the index. The same rows are written as a CSV long table, a DuckDB CDM
file and (where the PostgreSQL server binaries are installed) a CDM schema of a PostgreSQL server this script starts
in a temporary folder (``tests/pg_server.py``). Each read runs in a fresh process, which reports its wall time and
its peak resident memory (``VmHWM``) beside the memory it held before reading (the imports):

- ``csv``: :func:`fcd_secure.data.preprocess.read_table` of the CSV;
- ``duckdb`` / ``postgresql``: :func:`fcd_secure.data.inputs.read_input`, i.e. the checks of the tables, columns,
  concept ids and units, then the extraction (SQLAlchemy Core for both engines, numpy for the time grid).

    .venv/bin/python benchmarks/omop.py [--sizes 10000 100000] [--quick] [--json]

``--quick`` (about 20 s on an idle machine): 100 and 300 persons, to check that the script works, not to quote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

STEPS = 50


def cohort_table(n: int, seed: int = 0):
    """The long table of ``n`` persons (entity, t, site, two statics, two contexts, action, outcome)."""
    import numpy as np  # noqa: PLC0415
    import pandas as pd  # noqa: PLC0415

    rng = np.random.default_rng(seed)
    e = np.repeat(np.arange(n), STEPS)
    x_cond = rng.integers(0, 2, n).astype(float)
    x_obs = np.round(rng.normal(size=n), 6)
    return pd.DataFrame({
        "entity": np.char.add("p", np.char.zfill(e.astype(str), 7)), "t": np.tile(np.arange(STEPS), n),
        "site": "bench", "x_cond": x_cond[e], "x_obs": x_obs[e],
        "lab_a": np.round(rng.normal(size=n * STEPS), 6), "lab_b": np.round(rng.gamma(2.0, size=n * STEPS), 6),
        "action": (rng.random(n * STEPS) < 1 / 3).astype(int), "outcome": (rng.random(n * STEPS) < 0.2).astype(float),
    })


def build(n: int, folder: Path, pg_url: str | None) -> dict[str, str]:
    """Write the three forms of one cohort; ``{form: (spec, table)}`` as argument strings."""
    from fcd_secure.data.omop.synth import Vocabulary, cdm_instance, cohort_text, write_duckdb, write_postgres  # noqa: PLC0415
    from fcd_secure.data.spec import DatasetSpec  # noqa: PLC0415

    table = cohort_table(n)
    spec = DatasetSpec(entity="entity", time="t", action="action", outcome="outcome", site="site", n_actions=2,
                       max_len=STEPS, static=[{"name": "x_cond", "kind": "binary"}, {"name": "x_obs"}],
                       context=[{"name": "lab_a"}, {"name": "lab_b"}])
    labels = ["none", "drug"]
    table.to_csv(folder / f"cohort{n}.csv", index=False)
    voc = Vocabulary()
    inst = cdm_instance(table, spec, labels, voc)
    write_duckdb(inst, folder / f"cohort{n}.duckdb")
    (folder / "cohort.toml").write_text(cohort_text(spec, labels, voc.ids, "bench"))
    forms = {"csv": str(folder / f"cohort{n}.csv"), "duckdb": str(folder / f"cohort{n}.duckdb")}
    if pg_url is not None:
        write_postgres(inst, pg_url, f"bench{n}")
        forms["postgresql"] = pg_url.replace("/cdm", f"/cdm?options=-csearch_path%3Dbench{n}")
    return forms


def peak_mb() -> float:
    """This process's peak resident memory (``VmHWM``, https://man7.org/linux/man-pages/man5/proc_pid_status.5.html).
    Not ``ru_maxrss``: Linux carries the parent's peak into a child across fork and exec."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # no /proc (not Linux): the best there is


def child(form: str, cohort: str, table: str) -> None:
    """One read in this process: print ``{seconds, rows, peak_mb, base_mb}``."""
    from fcd_secure.data.inputs import read_input  # noqa: PLC0415
    from fcd_secure.data.preprocess import read_table  # noqa: PLC0415

    import fcd_secure.data.omop.extract  # noqa: F401, PLC0415 - imported before the baseline, as read_table's pandas

    base = peak_mb()
    t0 = time.perf_counter()
    df = read_table(table) if form == "csv" else read_input(cohort, table)[1]
    secs = time.perf_counter() - t0
    peak = peak_mb()
    print(json.dumps({"seconds": secs, "rows": len(df), "peak_mb": peak, "base_mb": base}))


def measure(form: str, cohort: Path, table: str, env: dict[str, str]) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", form, str(cohort), table], capture_output=True,
                         text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(f"{form}: {out.stderr[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000])
    ap.add_argument("--quick", action="store_true", help="100 and 300 persons (seconds): the script works")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    ap.add_argument("--child", nargs=3, metavar=("FORM", "COHORT", "TABLE"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        child(*args.child)
        return
    sizes = [100, 300] if args.quick else args.sizes
    from pg_server import postgres_bin, start, stop  # noqa: PLC0415

    bin_dir = postgres_bin()
    srv = start(bin_dir) if bin_dir is not None else None
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FLWR_TELEMETRY_ENABLED": "0"}
    if srv is not None:
        srv.psql("grant connect on database cdm to fcd_reader")
        os.environ["PGPASSWORD"] = env["PGPASSWORD"] = srv.admin_password  # the loader here, the readers below
    rows: list[dict] = []
    note = None if srv else "PostgreSQL server binaries not found: postgresql not measured"
    if not args.json:  # each figure as soon as it is measured: the 100,000-person size takes a while
        print(f"{len(sizes)} size(s), {STEPS} daily steps, ~{2 * STEPS} measurement rows per person; "
              f"load average {os.getloadavg()[0]:.1f}, {os.cpu_count()} CPUs")
        print(f"{'persons':>9} {'form':<11} {'rows':>10} {'seconds':>9} {'peak MB':>9} {'+MB':>7}", flush=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for n in sizes:
                folder = Path(tmp)
                forms = build(n, folder, srv.url("fcd_admin") if srv else None)
                for form, table in forms.items():
                    r = {"persons": n, "form": form, **measure(form, folder / "cohort.toml", table, env)}
                    rows.append(r)
                    if not args.json:
                        print(f"{r['persons']:>9} {r['form']:<11} {r['rows']:>10} {r['seconds']:>9.2f} "
                              f"{r['peak_mb']:>9.0f} {r['peak_mb'] - r['base_mb']:>7.0f}", flush=True)
    finally:
        if srv is not None:
            stop(srv)
    if args.json:
        print(json.dumps({"rows": rows, "note": note, "load": os.getloadavg()[0]}))
    elif note:
        print(note)


if __name__ == "__main__":
    main()
