"""Federation figures: wall time per round and uplink bytes of DSS (plain and secure) against full sync.

Prints, per configuration, the median seconds per round (rounds 2..R; round 1 includes Ray and data start-up), the
whole run's wall time, the uplink MB measured from the serialized Flower messages and the paper's formula
(participating sites × synchronised parameter bytes, Table II) beside it.

    .venv/bin/python benchmarks/federation.py --quick          # tiny preset, 3 rounds (about a minute)
    .venv/bin/python benchmarks/federation.py --preset default # the README run's sizes
    .venv/bin/python benchmarks/federation.py --json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time

os.environ["FLWR_TELEMETRY_ENABLED"] = "0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--rounds", type=int, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="tiny preset, 3 rounds")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(1)
    from fcd_secure.config import build_config
    from fcd_secure.federation.simulation import run_simulated

    preset = "tiny" if args.quick else args.preset
    rounds = 3 if args.quick else args.rounds
    configs = [("DSS plain FedAvg", {"sync": "dss", "secure_aggregation": False}),
               ("DSS secure aggregation", {"sync": "dss", "secure_aggregation": True}),
               ("full sync (w/o DSS)", {"sync": "full", "secure_aggregation": False})]
    rows = []
    for label, fed in configs:
        over = {"seed": args.seed, "federation": {**fed, "eval_every": 0, **({"rounds": rounds} if rounds else {})}}
        cfg = build_config(preset, over).model_copy(update={"out": tempfile.mkdtemp(prefix="fcd-bench-")})
        t0 = time.perf_counter()
        res = run_simulated(cfg)
        wall = time.perf_counter() - t0
        per_round = [h["round_s"] for h in res.history]
        rows.append({
            "config": label,
            "rounds": len(per_round),
            "seconds / round (median, rounds ≥ 2)": statistics.median(per_round[1:] or per_round),
            "run wall s": wall,
            "MB uplink (measured)": sum(h["uplink_bytes"] for h in res.history) / 1e6,
            "MB uplink (paper formula)": sum(h["uplink_formula_bytes"] for h in res.history) / 1e6,
            "MB downlink (measured)": sum(h["downlink_bytes"] for h in res.history) / 1e6,
        })
    machine = f"{platform.node()} · {os.cpu_count()} CPUs · load {os.getloadavg()[0]:.1f} · preset {preset}"
    if args.json:
        print(json.dumps({"machine": machine, "rows": rows}))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"federation ({machine})")
    for k in rows[0]:
        t.add_column(k, justify="left" if k == "config" else "right")
    for r in rows:
        t.add_row(*(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()))
    Console().print(t)


if __name__ == "__main__":
    main()
