"""Secure aggregation of Θc, side by side on the same vectors (DESIGN.md "Numbers that say where the work stands").

For each vector size d and number of sites n, one round of

* **plain**: sample-size-weighted FedAvg in clear (``fcd_secure.aggregation.fedavg``): the client serialises
  its float32 update, the server deserialises and averages;
* **ours**: the double-masking protocol of ``fcd_secure.aggregation.secagg`` (all five stages, in memory);
* **flower**: Flower 1.42's legacy SecAgg (SecAgg+ with every site a neighbour, the configuration the research
  note measured): the *real* client stage functions of ``flwr.client.mod.secure_aggregation.secaggplus_mod``
  (``_setup``, ``_share_keys``, ``_collect_masked_vectors``, ``_unmask``) and the server arithmetic of
  ``SecAggPlusWorkflow.unmask_stage`` with Flower's own primitives, without the transport.

Reported per method: client seconds (mean per site, all stages, encoding included), server seconds (all stages),
uplink bytes per shared parameter (everything one site sends in the round, divided by d), and the max error of
the aggregate against float64 weighted FedAvg. For ours, two more columns give the part of those seconds spent in
the active-adversary checks (DESIGN P19, P26): per site, the input-bound check of its vector and the commitments
to its secrets and shares (made in stage 0, checked in stage 2); on the server, the check of every revealed share
and every rebuilt secret against its commitment (not the Shamir reconstruction itself) and the bound check of the
unmasked sum. Ours runs with the default threshold t = floor(2n/3) + 1 (7 of 10), Flower with its n/2 + 1 (6 of
10). Then a protocol-only run up to n = 100 sites shows how our cost grows.

Seconds are CPU time of the benchmark process (``time.process_time``, every thread counted: Flower's Shamir
sharing runs on a thread pool, so the CPU time of one thread would miss part of its work) by default. On a shared
machine (2 cores here, other jobs running) wall-clock time also counts the slices other processes hold, which moved
single cells by 3-4x between runs, plain FedAvg included; the work measured is computation only, so on an idle
machine the two clocks agree. ``--clock wall`` measures wall-clock time instead.

    python benchmarks/secagg.py            # d in {1e4, 1e5, 1e6}, n in {5, 10, 20}, scaling to n = 100
    python benchmarks/secagg.py --quick    # d in {1e4, 1e5}, n in {5, 10}, scaling to n = 40
    python benchmarks/secagg.py --json out.json --clock wall
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time

import numpy as np

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
logging.getLogger("flwr").setLevel(logging.ERROR)
from fcd_secure.aggregation.fedavg import fedavg  # noqa: E402
from fcd_secure.aggregation.secagg import SecAggPolicy, SecAggServer, VectorLayout, encode  # noqa: E402
from fcd_secure.aggregation.secagg.client import SecAggClient  # noqa: E402
from fcd_secure.aggregation.secagg.keys import ed25519_keypair  # noqa: E402
from fcd_secure.aggregation.secagg.server import STAGES  # noqa: E402
from fcd_secure.manifest import THETA_C, Manifest, ManifestEntry  # noqa: E402

#: the clock every timing below reads (``--clock``): CPU time of this process, or wall-clock time
CLOCK = time.process_time


def make_inputs(d: int, n: int, seed: int) -> tuple[list[np.ndarray], list[int]]:
    rng = np.random.default_rng([seed, d, n])
    vecs = [(0.05 * rng.standard_normal(d)).astype(np.float32) for _ in range(n)]
    counts = [int(c) for c in rng.integers(50, 5000, size=n)]
    return vecs, counts


def reference(vecs: list[np.ndarray], counts: list[int]) -> np.ndarray:
    w = np.asarray(counts, np.float64)
    return sum(wi * v.astype(np.float64) for wi, v in zip(w, vecs)) / w.sum()


# -- plain FedAvg ---------------------------------------------------------------------------------------------------
def run_plain(vecs, counts) -> dict:
    t = CLOCK()
    payloads = [v.tobytes() for v in vecs]  # what a site uploads: its float32 update (+ a count)
    client_s = (CLOCK() - t) / len(vecs)
    t = CLOCK()
    updates = [{"theta": np.frombuffer(p, dtype=np.float32)} for p in payloads]
    avg, _ = fedavg(updates, [float(c) for c in counts])
    server_s = CLOCK() - t
    up = (len(payloads[0]) + 8) / vecs[0].size
    return {"client_s": client_s, "server_s": server_s, "uplink_B_per_param": up, "result": avg["theta"]}


# -- ours -----------------------------------------------------------------------------------------------------------
def run_ours(vecs, counts, policy: SecAggPolicy | None = None, drop_at_masking: int = 0) -> dict:
    d, n = vecs[0].size, len(vecs)
    policy = policy or SecAggPolicy(max_weight=8192, max_sites=max(31, n))
    layout = VectorLayout.from_manifest(Manifest.from_entries([ManifestEntry(name="theta", shape=(d,), dtype="float32", part=THETA_C)]))
    sites = [f"site-{i:03d}" for i in range(n)]
    ids = {s: ed25519_keypair() for s in sites}
    roster = {s: pk for s, (_, pk) in ids.items()}
    clients, encode_s = {}, {}
    for s, v, c in zip(sites, vecs, counts):
        cl = SecAggClient(s, ids[s][0], roster, policy, layout)
        t = CLOCK()
        x = encode(layout, policy, {"theta": v}, c)
        cl.set_input(x, bytes(32))  # includes the site's input-bound check
        encode_s[s] = CLOCK() - t
        clients[s] = cl
    server = SecAggServer(policy, layout, sites, round_id=1, roster=roster)
    dropped = set(sites[n - drop_at_masking :]) if drop_at_masking else set()
    agg, client_s, server_s, uplink = drive(server, clients, {"masked_input": dropped})
    return {"client_s": float(np.mean([client_s[s] + encode_s[s] for s in sites])), "server_s": server_s,
            "uplink_B_per_param": float(np.mean(list(uplink.values()))) / d, "result": agg.theta_c["theta"],
            "bound": agg.quantisation_bound, "client_check_s": float(np.mean([clients[s].check_seconds for s in sites])),
            "server_check_s": server.report.check_seconds}


def drive(server: SecAggServer, clients: dict, drop: dict[str, set[str]]):
    """All five stages in memory, every party timed with ``CLOCK``; ``drop[stage]``: sites silent from then on."""
    client_s, uplink = dict.fromkeys(clients, 0.0), dict.fromkeys(clients, 0)
    t = CLOCK()
    requests = server.start()
    server_s = CLOCK() - t
    gone: set[str] = set()
    for stage in STAGES:
        gone |= drop.get(stage, set())
        for site, req in requests.items():
            if site in gone:
                continue
            t = CLOCK()
            reply = clients[site].handle(req)
            client_s[site] += CLOCK() - t
            uplink[site] += len(reply)
            t = CLOCK()
            server.collect(site, reply)
            server_s += CLOCK() - t
        t = CLOCK()
        requests = server.advance()
        server_s += CLOCK() - t
    t = CLOCK()
    agg = server.finish()
    server_s += CLOCK() - t
    return agg, client_s, server_s, uplink


# -- Flower 1.42 legacy SecAgg ----------------------------------------------------------------------------------------
def run_flower(vecs, counts) -> dict:
    import importlib

    from flwr.app import ConfigRecord
    from flwr.common import bytes_to_ndarray, ndarrays_to_parameters
    from flwr.common.secure_aggregation.crypto.shamir import combine_shares
    from flwr.common.secure_aggregation.crypto.symmetric_encryption import generate_shared_key
    from flwr.common.secure_aggregation.ndarrays_arithmetic import (
        factor_extract,
        get_parameters_shape,
        parameters_addition,
        parameters_mod,
        parameters_subtraction,
    )
    from flwr.common.secure_aggregation.quantization import dequantize
    from flwr.common.secure_aggregation.secaggplus_constants import Key
    from flwr.common.secure_aggregation.secaggplus_utils import pseudo_rand_gen
    from flwr.supercore.primitives.asymmetric import bytes_to_private_key, bytes_to_public_key

    # the package re-exports the mod function under the module's name, so import the module itself
    fm = importlib.import_module("flwr.client.mod.secure_aggregation.secaggplus_mod")
    n, d = len(vecs), vecs[0].size
    # SecAggPlusWorkflow defaults (clipping 8, 2**22 levels, mod 2**32), every site a neighbour, t = n/2 + 1
    clip, target, mod, max_weight = 8.0, 1 << 22, 1 << 32, 8192.0
    threshold = n // 2 + 1
    nids = list(range(1, n + 1))
    states = {nid: fm.SecAggPlusState(nid=nid) for nid in nids}
    client_s = dict.fromkeys(nids, 0.0)
    up_bytes = dict.fromkeys(nids, 0)
    server_s = 0.0

    def timed(nid, fn, *args):
        t = CLOCK()
        out = fn(*args)
        client_s[nid] += CLOCK() - t
        return out

    setup_cfg = ConfigRecord({Key.SAMPLE_NUMBER: n, Key.SHARE_NUMBER: n, Key.THRESHOLD: threshold, Key.CLIPPING_RANGE: clip,
                              Key.TARGET_RANGE: target, Key.MOD_RANGE: mod, Key.MAX_WEIGHT: max_weight})
    pks = {}
    for nid in nids:
        res = timed(nid, fm._setup, states[nid], setup_cfg)
        pks[nid] = (res[Key.PUBLIC_KEY_1], res[Key.PUBLIC_KEY_2])
        up_bytes[nid] += len(pks[nid][0]) + len(pks[nid][1])
    key_cfg = ConfigRecord({str(k): list(v) for k, v in pks.items()})
    fwd: dict[int, tuple[list[int], list[bytes]]] = {nid: ([], []) for nid in nids}
    for nid in nids:
        res = timed(nid, fm._share_keys, states[nid], key_cfg)
        t = CLOCK()
        for dst, ct in zip(res[Key.DESTINATION_LIST], res[Key.CIPHERTEXT_LIST]):
            fwd[dst][0].append(nid)
            fwd[dst][1].append(ct)
            up_bytes[nid] += len(ct) + 8
        server_s += CLOCK() - t
    masked = None
    for nid, v, c in zip(nids, vecs, counts):
        cfg = ConfigRecord({Key.CIPHERTEXT_LIST: fwd[nid][1], Key.SOURCE_LIST: fwd[nid][0]})
        res = timed(nid, fm._collect_masked_vectors, states[nid], cfg, c, ndarrays_to_parameters([v]))
        blobs = res[Key.MASKED_PARAMETERS]
        up_bytes[nid] += sum(len(b) for b in blobs)
        t = CLOCK()
        vec = [bytes_to_ndarray(b) for b in blobs]
        masked = vec if masked is None else parameters_addition(masked, vec)
        server_s += CLOCK() - t
    t = CLOCK()
    masked = parameters_mod(masked, mod)
    server_s += CLOCK() - t
    unmask_cfg = ConfigRecord({Key.ACTIVE_NODE_ID_LIST: nids, Key.DEAD_NODE_ID_LIST: []})
    shares: dict[int, list[bytes]] = {nid: [] for nid in nids}
    for nid in nids:
        res = timed(nid, fm._unmask, states[nid], unmask_cfg)
        for owner, share in zip(res[Key.NODE_ID_LIST], res[Key.SHARE_LIST]):
            shares[owner].append(share)
            up_bytes[nid] += len(share) + 8
    t = CLOCK()
    for nid in nids:  # the unmask_stage arithmetic (no dropouts)
        secret = combine_shares(shares[nid])
        masked = parameters_subtraction(masked, pseudo_rand_gen(secret, mod, get_parameters_shape(masked)))
    recon = parameters_mod(masked, mod)
    q_total, recon = factor_extract(recon)
    agg = dequantize(recon, clip, target)[0]
    agg = (agg - (n - 1) * clip) * (target / q_total)
    server_s += CLOCK() - t
    del generate_shared_key, bytes_to_private_key, bytes_to_public_key
    return {"client_s": float(np.mean(list(client_s.values()))), "server_s": server_s,
            "uplink_B_per_param": float(np.mean(list(up_bytes.values()))) / d, "result": agg}


def best_of(fn, vecs, counts, repeats: int) -> dict:
    """The run with the smallest client + server time (the machine is shared: the minimum is the cost)."""
    runs = [fn(vecs, counts) for _ in range(repeats)]
    return min(runs, key=lambda r: r["client_s"] + r["server_s"])


def fmt_row(d, n, name, r, ref) -> dict:
    err = float(np.abs(np.asarray(r["result"], np.float64) - ref).max())
    return {"d": d, "n": n, "method": name, "client_s": r["client_s"], "server_s": r["server_s"],
            "uplink_B_per_param": r["uplink_B_per_param"], "max_abs_err": err,
            "client_check_s": r.get("client_check_s"), "server_check_s": r.get("server_check_s")}


def _chk(v: float | None) -> str:
    return f"{v:>9.4f}" if v is not None else f"{'-':>9}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="smaller grid (d <= 1e5, n <= 10; scaling to 40 sites)")
    ap.add_argument("--no-flower", action="store_true", help="skip Flower's SecAgg (the slowest column)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--repeats", type=int, default=3, help="best of this many runs per cell (default 3)")
    ap.add_argument("--json", type=str, default=None, help="also write the rows to this JSON file")
    ap.add_argument("--clock", choices=["cpu", "wall"], default="cpu",
                    help="CPU time of this process (default; robust on a shared machine) or wall-clock time")
    args = ap.parse_args(argv)
    global CLOCK
    CLOCK = time.process_time if args.clock == "cpu" else time.perf_counter
    try:
        import torch

        torch.set_num_threads(1)
    except ImportError:  # pragma: no cover
        pass

    ds = [10_000, 100_000] if args.quick else [10_000, 100_000, 1_000_000]
    ns = [5, 10] if args.quick else [5, 10, 20]
    rows = []
    print(f"seconds: {'CPU time of the benchmark process (all threads)' if args.clock == 'cpu' else 'wall clock'}; "
          f"best of {args.repeats} runs per cell")
    print(f"{'d':>9} {'n':>3} {'method':<7} {'client s':>9} {'server s':>9} {'B/param':>8} {'max err':>9} "
          f"{'chk cli s':>9} {'chk srv s':>9}")
    for d in ds:
        for n in ns:
            vecs, counts = make_inputs(d, n, args.seed)
            ref = reference(vecs, counts)
            runs = [("plain", run_plain), ("ours", run_ours)] + ([] if args.no_flower else [("flower", run_flower)])
            for name, fn in runs:
                row = fmt_row(d, n, name, best_of(fn, vecs, counts, args.repeats), ref)
                rows.append(row)
                print(f"{d:>9} {n:>3} {name:<7} {row['client_s']:>9.4f} {row['server_s']:>9.4f} "
                      f"{row['uplink_B_per_param']:>8.3f} {row['max_abs_err']:>9.2e} "
                      f"{_chk(row['client_check_s'])} {_chk(row['server_check_s'])}", flush=True)
    by = {(r["d"], r["n"], r["method"]): r for r in rows}
    if not args.no_flower:
        print("\nratios (Flower / ours, ours / plain):")
        for d in ds:
            for n in ns:
                o, f, p = by[(d, n, "ours")], by[(d, n, "flower")], by[(d, n, "plain")]
                print(f"  d={d:>8} n={n:>2}: client {f['client_s'] / o['client_s']:6.1f}x faster than Flower, "
                      f"server {f['server_s'] / o['server_s']:6.1f}x; vs plain: client {o['client_s'] / p['client_s']:7.1f}x, "
                      f"server {o['server_s'] / p['server_s']:5.2f}x")

    d_scale = 10_000
    n_scale = [5, 10, 20, 40] if args.quick else [5, 10, 20, 40, 70, 100]
    print(f"\nprotocol only, d = {d_scale}: how our cost grows with the number of sites")
    print(f"{'n':>4} {'client s':>9} {'server s':>9} {'B/param':>8} {'chk cli s':>9} {'chk srv s':>9}")
    policy = SecAggPolicy(clip=1.0, scale_bits=23, max_weight=8192, max_sites=128)
    for n in n_scale:
        vecs, counts = make_inputs(d_scale, n, args.seed)
        r = best_of(lambda v, c: run_ours(v, c, policy), vecs, counts, args.repeats)
        rows.append(fmt_row(d_scale, n, "ours-scaling", r, reference(vecs, counts)))
        print(f"{n:>4} {r['client_s']:>9.4f} {r['server_s']:>9.4f} {r['uplink_B_per_param']:>8.3f} "
              f"{_chk(r['client_check_s'])} {_chk(r['server_check_s'])}", flush=True)
    d_drop, n_drop = (100_000, 10)
    print(f"\ndropout recovery, d = {d_drop}, n = {n_drop}: sites silent at the masked-input stage")
    print(f"{'dropped':>7} {'client s':>9} {'server s':>9} {'max err':>9} {'chk cli s':>9} {'chk srv s':>9}")
    vecs, counts = make_inputs(d_drop, n_drop, args.seed)
    for k in (0, 1, 3):
        ref = reference(vecs[: n_drop - k], counts[: n_drop - k])
        r = best_of(lambda v, c, k=k: run_ours(v, c, drop_at_masking=k), vecs, counts, args.repeats)
        err = float(np.abs(r["result"] - ref).max())
        rows.append({"d": d_drop, "n": n_drop, "method": f"ours-drop{k}", "client_s": r["client_s"], "server_s": r["server_s"],
                     "uplink_B_per_param": r["uplink_B_per_param"], "max_abs_err": err,
                     "client_check_s": r["client_check_s"], "server_check_s": r["server_check_s"]})
        print(f"{k:>7} {r['client_s']:>9.4f} {r['server_s']:>9.4f} {err:>9.2e} "
              f"{_chk(r['client_check_s'])} {_chk(r['server_check_s'])}", flush=True)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(rows, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
