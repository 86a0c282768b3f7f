"""The privacy budget report: per site and for the consortium, from the ledgers on disk.

Contents follow TF-Privacy's ``compute_dp_sgd_privacy_statement`` and Ponomareva et al. 2023 ("How to DP-fy ML",
arXiv 2303.00654) §5.3: the DP setting, the unit of privacy and adjacency, the mechanism (σ, C, q,
steps, rounds), the accountant with its δ and library versions, the ledger's segments, and — as plainly — what
the guarantee does *not* cover.

Everything is recomputed from the ledger segments (never from a cached ε), so the report is exactly as trustworthy
as the write-ahead ledger. Each ledger is also compared with the sites' anchors (:mod:`fcd_secure.privacy.anchor`):
a ledger behind its anchored head, and every reset an operator acknowledged (with the ε that was spent before it
and is carried forward into "ε spent"), are listed with the site. The consortium statement uses parallel composition:
every trajectory belongs to one site's dataset, so the record-level guarantee of the consortium is the worst site's
(max ε, max δ).

ε is stated per record (:mod:`fcd_secure.privacy.spend`): a site's "ε spent" is that of the record of its table that
has spent the most over every ledger of the site (runs on other splits or seeds included) plus the spend carried by
acknowledged resets, and ``records`` gives the per-record spend over every record the ledgers charge (how many, the
largest, the median).
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_bytes, atomic_write_text
from fcd_secure._versions import installed_versions
from fcd_secure.privacy.anchor import ANCHOR_FILE, AnchorEntry, AnchorStore, rollback_reason
from fcd_secure.privacy.ledger import Ledger, PrivacyLedgerError, LedgerState, site_holdings
from fcd_secure.privacy.planner import epsilon, epsilon_curve
from fcd_secure.privacy.spend import groups, site_spend, spend_summary, spend_values, worst_group

UNIT = (
    "one trajectory: one row (X, A_1:L, T_1:L, Y_1:L, M_1:L) of a site's training data. A person with several "
    "trajectories at a site is protected only up to group privacy (about k·ε for k trajectories)."
)
ADJACENCY = "add/remove one trajectory (Opacus' accounting), Poisson subsampling of every batch"
SETTING = (
    "DP-SGD (Opacus) run locally at each site; the site is the trusted curator of its data. The server, the other "
    "sites and every reader of the released parameters are untrusted for record privacy. Secure aggregation adds "
    "confidentiality of each site's update but no ε: aggregation is post-processing."
)
COVERED = [
    "every Θc (shared parameters) a site released, in every round: all checkpoints, not only the final model",
    "the site-local Θs, trained by the same DP optimizer (every parameter that influences a release is DP-trained)",
    "every run on the same dataset: the ledger is keyed by the dataset's fingerprint and composes all of them",
    "every run on any split or seed: each record is charged every ledger of the site that holds it (ε per record)",
    "acknowledged resets: the ε a lost ledger held is carried forward and charged to every record of the site",
]
NOT_COVERED_ALWAYS = [
    "aggregate metrics and counts sent to the server (training losses, num-examples / the site's size N)",
    "preprocessing statistics fitted on the site's data (normalisation, vocabularies, truncation, feature choice)",
    "hyperparameter tuning or model selection on private data (Papernot & Steinke 2022)",
    "site-level facts: that a site takes part, its size, its data distribution relative to other sites",
    "noise drawn from torch's non-cryptographic PRNG: Opacus' secure_mode needs torchcsprng, which has no release "
    "for torch 2.x, so floating-point and RNG-state attacks are not mitigated",
    "off-policy estimates computed on the site from logged propensities, and evaluation on the site's test split",
]


def _versions() -> dict[str, str]:
    """The report's ``libraries``, in the order it lists them (python first)."""
    return installed_versions(("python", "opacus", "torch", "flwr", "fcd_secure"))


def find_ledgers(path: str | Path) -> list[Path]:
    """Ledger files under a run folder, a state root, a site directory, or the ledger file itself.

    A run folder's ``summary.json`` may name the state root it used (``state_root``/``state_dir``); ledgers live
    in the sites' persistent state, not in the run folder, so that a new run cannot start a new budget.
    """
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"{path}: no such run or site directory")
    if path.is_file():
        if not path.name.startswith("ledger-") or path.suffix != ".json":
            raise PrivacyLedgerError(f"{path}: not a privacy ledger (expected privacy/ledger-<fingerprint>.json)")
        return [path]
    roots, flat = _roots(path)
    found: set[Path] = set()
    for root in roots:
        if root.exists():
            found.update(p.resolve() for p in root.rglob("ledger-*.json") if p.parent.name == "privacy")
    for root in flat:
        if root.exists():
            found.update(p.resolve() for p in root.glob("ledger-*.json"))
    if not found and path.name != "privacy":
        found.update(p.resolve() for p in path.glob("ledger-*.json"))  # a ledger_dir given directly
    return sorted(found)


def _anchor_files(path: str | Path) -> list[Path]:
    """The site anchor files under ``path`` (the folders :func:`find_ledgers` searches), or beside a ledger file."""
    path = Path(path)
    if path.is_file():
        return [path.parent.parent / ANCHOR_FILE]
    return sorted({f.resolve() for root in _roots(path)[0] if root.exists() for f in root.rglob(ANCHOR_FILE)})


def find_anchors(path: str | Path) -> dict[str, list[AnchorEntry]]:
    """Every site anchor entry under ``path`` (the same folders :func:`find_ledgers` searches), by the ledger file
    each one anchors (resolved path).

    Raises:
        PrivacyLedgerError: an anchor file cannot be read.
    """
    files = _anchor_files(path)
    out: dict[str, list[AnchorEntry]] = {}
    for f in files:
        if f.exists():
            for e in AnchorStore(f.parent).load().entries:
                out.setdefault(str(Path(e.ledger).resolve()), []).append(e)
    return out


def find_carried(path: str | Path) -> dict[str, float]:
    """The ε acknowledged resets carry forward (``AnchorStore.carried``), by the ledger file each anchor holds.

    Raises:
        PrivacyLedgerError: an anchor file cannot be read.
    """
    files = _anchor_files(path)
    out: dict[str, float] = {}
    for f in files:
        if f.exists():
            store = AnchorStore(f.parent)
            carried = store.carried()
            for e in store.load().entries:
                key = str(Path(e.ledger).resolve())
                out[key] = max(out.get(key, 0.0), carried)
    return out


def _roots(path: Path) -> tuple[list[Path], list[Path]]:
    """The state roots (``path`` and any a run file names) and the flat ledger folders (``dp.ledger_dir``)."""
    roots, flat = [path], []
    for name in ("summary.json", "config.json"):
        f = path / name
        if not f.exists():
            continue
        try:
            data = json.loads(f.read_text())
        except json.JSONDecodeError as exc:
            raise PrivacyLedgerError(f"{f}: unreadable run file ({exc})") from exc
        if not isinstance(data, dict):
            continue
        for key in ("state_root", "state_dir"):
            if isinstance(data.get(key), str):
                roots.append(_resolve(path, data[key]))
        dp = data.get("dp")
        if isinstance(dp, dict) and isinstance(dp.get("ledger_dir"), str):
            flat.append(_resolve(path, dp["ledger_dir"]))
    return roots, flat


def _resolve(base: Path, value: str) -> Path:
    p = Path(value)
    if p.is_absolute() or p.exists():
        return p
    return base / p


def site_label(ledger_file: Path, state: LedgerState | None = None) -> str:
    """The site ids recorded in the ledger, else the site's directory (``<state_root>/<site_id>/privacy/…``)."""
    if state is not None and state.sites:
        return ",".join(state.sites)
    return ledger_file.parent.parent.name


def site_report(
    ledger_file: str | Path, anchors: list[AnchorEntry] | None = None, carried: float = 0.0
) -> dict[str, Any]:
    """The JSON report of one site's ledger. ε is recomputed from the segments with the ledger's accountant.

    Args:
        ledger_file: the ledger.
        anchors: the sites' anchor entries of this ledger (:func:`find_anchors`); a ledger behind one of them and
            every acknowledged reset are reported.
        carried: the ε the site's acknowledged resets carry forward (:func:`find_carried`).

    ``epsilon_spent`` is the most any record of this ledger has spent over every ledger of its folder, plus
    ``carried``; ``epsilon_ledger`` is this ledger's own composition.
    """
    ledger_file = Path(ledger_file)
    ledger = Ledger(ledger_file)
    state: LedgerState = ledger.load()
    view = state.view(ledger.key)
    behind = [why for e in anchors or [] if (why := rollback_reason(e.head, view)) is not None]
    resets = [r.model_dump() for e in anchors or [] for r in e.resets]
    history = state.history()
    own = epsilon(history, state.delta, state.accountant)
    eps, records = ledger_spend(ledger_file, state, carried)
    eps_rdp = epsilon(history, state.delta, "rdp") if state.accountant != "rdp" else eps
    curve = epsilon_curve(history, state.delta, state.accountant)
    segments = []
    for seg, eps_after in zip(state.segments, curve):
        segments.append(
            {
                "seq": seg.seq,
                "round": seg.round,
                "run_id": seg.run_id,
                "plan_id": seg.plan_id,
                "sigma": seg.sigma,
                "q": seg.q,
                "steps": seg.steps if seg.status == "committed" else seg.reserved_steps,
                "reserved_steps": seg.reserved_steps,
                "status": seg.status,
                "epsilon_after": eps_after,
            }
        )
    open_res = [s["seq"] for s in segments if s["status"] == "reserved"]
    align = state.align_under_dp
    disabled = []
    if align == "off":
        disabled.append("the batch-coupled MMD balancing term L_align was OFF under DP (it couples records of a batch)")
    elif align == "reference":
        disabled.append(
            "the batch-coupled MMD term L_align was REPLACED by a per-sample kernel distance to a fixed, data-free "
            "reference set (not the paper's distributional MMD)"
        )
    if ledger_file.parent.name == "privacy":
        disabled.append(
            "runs that used another state folder: this ledger lives in a site's state directory (dp.ledger_dir unset), "
            "so a run started with a different --state-dir kept a separate budget for the same data"
        )
    if state.noise_seed == "run_seed":
        disabled.append(
            "NO GUARANTEE against anyone who knows the run seed: noise and Poisson draws were seeded from it "
            "(dp.noise_seed = 'run_seed', meant for tests and benchmarks), so the noise can be regenerated"
        )
    if carried:
        disabled.append(
            f"the exact composition over ledgers lost to acknowledged resets: their ε ({carried:.3f} in all) is added to "
            "every record's ε by basic composition (a bound, not the accountant's tighter figure), and so is their δ: "
            "the stated ε holds at δ times (1 + the number of resets)"
        )
    if behind:
        disabled.append("THIS LEDGER IS BEHIND ITS ANCHOR (deleted segments or an older copy): " + "; ".join(behind))
    batch = max(1, round(state.n_site * (state.plans[-1].q if state.plans else 0)))
    return {
        "site": site_label(ledger_file, state),
        "ledger": str(ledger_file),
        "dataset_fingerprint": state.fingerprint[:16],
        "setting": SETTING,
        "unit_of_privacy": UNIT,
        "adjacency": ADJACENCY,
        "n_site": state.n_site,
        "delta": state.delta,
        "epsilon_spent": eps,
        "epsilon_ledger": own,
        "epsilon_carried": carried,
        "records": records,
        "epsilon_cap": state.epsilon_cap,
        "epsilon_remaining": max(0.0, state.epsilon_cap - eps),
        "epsilon_rdp_bound": eps_rdp,
        "accountant": state.accountant,
        "accountant_note": (
            "PRV (Gopi et al. 2021), upper end of the ε interval, eps_error 0.01"
            if state.accountant == "prv"
            else "RDP (Mironov 2017), Opacus' default orders"
        ),
        "libraries": _versions(),
        "mechanism": {
            "algorithm": "DP-SGD / DP-Adam with flat per-sample clipping, Opacus grad_sample_mode='hooks'",
            "clip_C": state.clip,
            "noise_multipliers": sorted({s["sigma"] for s in segments}) or [p.sigma for p in state.plans[-1:]],
            "poisson_sampling": True,
            "sample_rate_q": sorted({s["q"] for s in segments}) or [p.q for p in state.plans[-1:]],
            "expected_batch_size": batch,
            "steps_per_round": state.plans[-1].steps_per_round if state.plans else None,
            "rounds": len([s for s in segments if s["steps"] > 0]),
            "total_steps": sum(s["steps"] for s in segments),
            "noise_seed": state.noise_seed,
        },
        "plans": [p.model_dump() for p in state.plans],
        "segments": segments,
        "open_reservations": open_res,
        "anchor": {"anchored": bool(anchors), "behind": behind},
        "resets": resets,
        "covered": COVERED,
        "not_covered": NOT_COVERED_ALWAYS + disabled,
        "batch_terms_under_dp": align,
    }


def consortium_report(sites: list[dict[str, Any]], n_sites: int | None = None) -> dict[str, Any]:
    """Parallel composition across disjoint site datasets: the consortium's record-level (ε, δ) is the worst site's.

    Args:
        sites: the site reports with a ledger.
        n_sites: every site of the run (those that never trained under DP add ε = 0); default ``len(sites)``.
    """
    if not sites:
        return {"sites": n_sites or 0}
    worst = max(sites, key=lambda s: s["epsilon_spent"])
    return {
        "sites": len(sites) if n_sites is None else n_sites,
        "epsilon": worst["epsilon_spent"],
        "delta": max(s["delta"] for s in sites),
        "worst_site": worst["site"],
        "composition": (
            "parallel: each trajectory is in exactly one site's dataset, so the consortium's record-level guarantee "
            "is (max ε, max δ) over sites. A person with trajectories at k sites composes sequentially (up to the "
            "sum of those sites' ε)."
        ),
        "epsilon_sum_over_sites": sum(s["epsilon_spent"] for s in sites),
    }


def ledger_spend(ledger_file: Path, state: LedgerState, carried: float = 0.0) -> tuple[float, dict[str, Any]]:
    """The most any record of this ledger has spent over every ledger of its folder, plus ``carried``, and the
    per-record summary of its records (:func:`fcd_secure.privacy.spend.spend_summary`); a ledger that lists no
    records (opened by a bare fingerprint) is its own composition plus ``carried``."""
    if not state.records:
        return epsilon(state.history(), state.delta, state.accountant) + carried, spend_summary([], carried)
    gs = groups(state.records, site_holdings(ledger_file.parent, exclude=ledger_file), base=state.history(),
                base_delta=state.delta)
    eps = worst_group(gs, state.accountant)[0] + carried
    return eps, spend_summary(spend_values(gs, state.accountant, carried), carried)


def site_budgets(roots: list[str | Path]) -> dict[str, dict[str, float]]:
    """ε spent, cap, remaining and δ per site id, from every ledger under ``roots`` (state roots or ledger folders).

    ε spent is per record (:func:`ledger_spend`: the site's most-spent record over all its ledgers, resets carried
    forward); a site with several ledgers reports the largest. A ledger shared by several site ids (one dataset
    trained at two sites) counts for each of them. Roots that do not exist are skipped.
    """
    out: dict[str, dict[str, float]] = {}
    files: set[Path] = set()
    carried: dict[str, float] = {}
    for root in map(Path, roots):
        if root.is_dir():
            files.update(p.resolve() for p in root.rglob("ledger-*.json") if p.parent.name == "privacy")
            files.update(p.resolve() for p in root.glob("ledger-*.json"))
            carried |= find_carried(root)
    for f in sorted(files):
        state = Ledger(f).load()
        eps, _ = ledger_spend(f, state, carried.get(str(f), 0.0))
        for sid in state.sites or [site_label(f)]:
            if sid in out and out[sid]["epsilon_spent"] >= eps:
                continue
            out[sid] = {
                "epsilon_spent": eps,
                "epsilon_cap": state.epsilon_cap,
                "epsilon_remaining": max(0.0, state.epsilon_cap - eps),
                "delta": state.delta,
            }
    return out


def _run_files(path: Path) -> dict[str, Any]:
    """``summary.json`` and ``config.json`` of a run folder (empty dicts when absent or unreadable)."""
    out: dict[str, Any] = {}
    for name in ("summary.json", "config.json"):
        f = path / name
        try:
            data = json.loads(f.read_text()) if f.is_file() else {}
        except (OSError, json.JSONDecodeError):
            data = {}
        out[name] = data if isinstance(data, dict) else {}
    return out


def _run_sites(path: Path, files: dict[str, Any]) -> list[str]:
    """The site ids of a run: ``summary.json``'s ``site_ids``, else the site folders of its state root."""
    ids = files["summary.json"].get("site_ids")
    if isinstance(ids, list) and ids:
        return [str(x) for x in ids]
    cfg = files["config.json"]
    roots = [path / "state"] + ([_resolve(path, cfg["state_dir"])] if isinstance(cfg.get("state_dir"), str) else [])
    found: set[str] = set()
    for root in roots:
        if root.is_dir():
            found.update(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(("_", ".")))
    return sorted(found)


def no_dp_report(source: str | Path, sites: list[str]) -> dict[str, Any]:
    """The report of a run trained without DP: it states that there is no DP guarantee, for every site."""
    return {
        "source": str(Path(source)),
        "dp": False,
        "guarantee": "none",
        "message": (
            "this run has no DP guarantee: it was trained without DP-SGD (dp.enabled = false), so the released "
            "parameters carry no record-level privacy bound; rerun with --dp-epsilon to get one"
        ),
        "sites": [{"site": sid, "epsilon_spent": None, "dp": False} for sid in sites],
        "consortium": {"sites": len(sites), "epsilon": None, "delta": None},
    }


def _unsampled_site(sid: str, cap: float | None) -> dict[str, Any]:
    return {
        "site": sid,
        "ledger": None,
        "epsilon_spent": 0.0,
        "epsilon_cap": cap,
        "epsilon_remaining": cap,
        "delta": None,
        "mechanism": None,
        "segments": [],
        "note": "never trained under DP in this run (never sampled): nothing spent",
    }


def build_report(path: str | Path) -> dict[str, Any]:
    """The whole report for a run folder, state root, site directory or ledger file.

    A run folder's report lists every site of the run: a site that never trained under DP has ε = 0. A run trained
    without DP gets :func:`no_dp_report` (no DP guarantee), not an error.

    Raises:
        FileNotFoundError: ``path`` does not exist.
        PrivacyLedgerError: no ledger under ``path`` (and it is not a run without DP), or a ledger cannot be trusted.
    """
    path = Path(path)
    ledgers = find_ledgers(path)
    files = _run_files(path) if path.is_dir() else {"summary.json": {}, "config.json": {}}
    run_dp = files["config.json"].get("dp")
    run_sites = _run_sites(path, files) if path.is_dir() else []
    if not ledgers and isinstance(run_dp, dict) and run_dp.get("enabled") is False:
        return no_dp_report(path, run_sites)
    if not ledgers and (path / "evidence" / "fingerprints.json").is_file():
        # a run of `fcd server run`: each hospital's ledger stays on its own machine, never with the coordinator
        raise PrivacyLedgerError(f"{path}: a consortium's run folder holds no privacy ledger: each site keeps its own; "
                                 "run `fcd privacy report SITE_HOME/state` on each site")
    if not ledgers:
        raise PrivacyLedgerError(f"{path}: no privacy ledger found (expected <site>/privacy/ledger-<fingerprint>.json)")
    anchors = find_anchors(path)
    carried = find_carried(path)
    sites = [site_report(p, anchors.get(str(Path(p).resolve())), carried.get(str(Path(p).resolve()), 0.0))
             for p in ledgers]
    covered = {lbl for s in sites for lbl in s["site"].split(",")}
    cap = run_dp.get("epsilon") if isinstance(run_dp, dict) else None
    sites += [_unsampled_site(sid, cap) for sid in run_sites if sid not in covered]
    sites.sort(key=lambda s: s["site"])
    with_ledger = [s for s in sites if s.get("ledger")]
    return {
        "source": str(path),
        "dp": True,
        "sites": sites,
        "records": records_report(ledgers, carried),
        "common": _common(with_ledger),
        "consortium": consortium_report(with_ledger, len(sites)),
    }


def records_report(ledgers: list[Path], carried: dict[str, float]) -> dict[str, Any]:
    """Per-record spend over every record the ``ledgers`` charge, each site's ledger folder accounted on its own
    (:func:`fcd_secure.privacy.spend.site_spend`): how many records, the largest and the median ε across runs."""
    values: list[tuple[float, int]] = []
    most_carried = 0.0
    for folder in sorted({Path(p).resolve().parent for p in ledgers}):
        here = max((c for k, c in carried.items() if Path(k).parent == folder), default=0.0)
        most_carried = max(most_carried, here)
        holdings = site_holdings(folder)
        if not holdings:
            continue
        accountants = {Ledger(p).load().accountant for p in folder.glob("ledger-*.json")}
        values += site_spend(holdings, accountants.pop() if len(accountants) == 1 else "rdp", here)
    return spend_summary(values, most_carried) | {
        "unit": "one record (trajectory), over every run and ledger of its site, resets carried forward"
    }


def _common(sites: list[dict[str, Any]]) -> dict[str, Any]:
    """What every site's statement shares (stated once in the Markdown report)."""
    first = sites[0]
    shared_not_covered = [x for x in first["not_covered"] if all(x in s["not_covered"] for s in sites)]
    return {
        "setting": first["setting"],
        "unit_of_privacy": first["unit_of_privacy"],
        "adjacency": first["adjacency"],
        "accountants": sorted({f"{s['accountant']}: {s['accountant_note']}" for s in sites}),
        "libraries": first["libraries"],
        "algorithm": first["mechanism"]["algorithm"],
        "covered": first["covered"],
        "not_covered": shared_not_covered,
    }


#: Line styles cycled per site, so that sites whose curves coincide stay distinguishable.
_STYLES = (("o", "-"), ("s", "--"), ("^", "-."), ("D", ":"), ("v", "-"), ("P", "--"), ("X", "-."), ("*", ":"))


def epsilon_by_round(site: dict[str, Any]) -> tuple[list[float], list[float]]:
    """``(rounds, ε after each)`` of one site: the ledger's segments by the round they were reserved for (the
    segment number where a round was not recorded), starting at (0, 0)."""
    xs, ys = [0.0], [0.0]
    for seg in site.get("segments") or []:
        xs.append(float(seg["round"] if seg.get("round") is not None else seg["seq"]))
        ys.append(float(seg["epsilon_after"]))
    return xs, ys


def consortium_curve(report: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The consortium's ε after each round: the worst site's at that round (parallel composition)."""
    curves = [epsilon_by_round(s) for s in report["sites"]]
    grid = sorted({x for xs, _ in curves for x in xs})

    def at(xs: list[float], ys: list[float], x: float) -> float:
        return max([y for xx, y in zip(xs, ys) if xx <= x] or [0.0])

    return grid, [max(at(xs, ys, x) for xs, ys in curves) for x in grid]


def plot_epsilon(report: dict[str, Any]) -> bytes:
    """PNG of ε against rounds: one step line per site (markers and dashes cycled, a small offset each, so lines
    that coincide stay visible), the consortium's ε (:func:`consortium_curve`) and the cap."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(6.8, 4.0))
    sites = report["sites"]
    curves = [(s, *epsilon_by_round(s)) for s in sites]
    grid, consortium = consortium_curve(report)
    last = max(grid + [1.0])
    offset = 0.12 / max(1, len(curves))
    for i, (s, xs, ys) in enumerate(curves):
        marker, dash = _STYLES[i % len(_STYLES)]
        shifted = [x + (i - (len(curves) - 1) / 2) * offset for x in xs + [last]]
        ax.step(shifted, ys + [ys[-1]], where="post", marker=marker, markevery=list(range(1, len(xs))) or None,
                ms=4, linestyle=dash, linewidth=1.2, label=f"{s['site']} (ε {s['epsilon_spent']:.2f})")
    ax.step(grid + [last], consortium + [consortium[-1]], where="post", color="black", linewidth=2.4, alpha=0.35,
            label=f"consortium (max over sites, ε {report['consortium'].get('epsilon') or 0:.2f})")
    caps = sorted({s["epsilon_cap"] for s in sites if s.get("epsilon_cap") is not None})
    for cap in caps:
        ax.axhline(cap, color="firebrick", linestyle="--", linewidth=0.9, label=f"cap ε = {cap:g}")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_xlim(left=0)
    ax.set_ylim(bottom=0, top=max(caps + consortium + [1e-3]) * 1.1)
    acct = ", ".join(sorted({s["accountant"] for s in sites if s.get("accountant")}))
    ax.set_xlabel("round")
    ax.set_ylabel(f"ε spent (at each site's δ; {acct})")
    ax.set_title("Privacy budget over rounds")
    ax.legend(fontsize=7, ncol=2 if len(sites) > 6 else 1, frameon=False)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=120)
    plt.close(fig)
    return buf.getvalue()


def render_markdown(report: dict[str, Any], plot_name: str | None) -> str:
    """The report for people: the consortium statement, what every site shares (once), then per site its own
    guarantee, mechanism, segments and the coverage notes that are its own."""
    if not report.get("dp", True):
        lines = ["# Privacy budget report", "", f"Source: `{report['source']}`", "",
                 f"**No DP guarantee.** {report['message']}.", "", "| site | ε |", "|---|---|"]
        lines += [f"| {s['site']} | none (no DP) |" for s in report["sites"]]
        return "\n".join(lines) + "\n"
    if report.get("basis"):
        return _render_signed(report, plot_name)
    c, common = report["consortium"], report["common"]
    lines = [
        "# Privacy budget report",
        "",
        f"Source: `{report['source']}`",
        "",
        "## Consortium",
        "",
        f"- Record-level guarantee: **(ε = {c['epsilon']:.3f}, δ = {c['delta']:.3g})** over {c['sites']} site(s); "
        f"worst site `{c['worst_site']}`.",
        f"- Composition: {c['composition']}",
    ]
    r = report.get("records") or {}
    if r.get("records"):
        lines.append(
            f"- Per record, across runs: {r['records']} records; ε max **{r['max']:.3f}**, median {r['median']:.3f}"
            + (f" (of which {r['carried_from_resets']:.3f} carried by acknowledged resets)" if r["carried_from_resets"] else "")
            + "."
        )
    lines += [
        "",
    ]
    if plot_name:
        lines += [f"![ε over rounds]({plot_name})", ""]
    lines += [
        "| site | ε spent | cap | remaining | δ | rounds | steps |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in report["sites"]:
        if s.get("ledger") is None:
            cap = "" if s.get("epsilon_cap") is None else f"{s['epsilon_cap']:g}"
            lines.append(f"| {s['site']} | 0 (never sampled) | {cap} | {cap} | | 0 | 0 |")
            continue
        m = s["mechanism"]
        lines.append(
            f"| {s['site']} | {s['epsilon_spent']:.3f} | {s['epsilon_cap']:g} | {s['epsilon_remaining']:.3f} | "
            f"{s['delta']:.3g} | {m['rounds']} | {m['total_steps']} |"
        )
    lines += [
        "",
        "## What every site's guarantee shares",
        "",
        f"- Setting: {common['setting']}",
        f"- Unit of privacy: {common['unit_of_privacy']}",
        f"- Adjacency: {common['adjacency']}.",
        f"- Mechanism: {common['algorithm']}.",
        "- Accountant: " + "; ".join(common["accountants"]) + ".",
        "- Libraries: " + ", ".join(f"{k} {v}" for k, v in common["libraries"].items()) + ".",
        "",
        "Covered:",
        "",
    ]
    lines += [f"- {x}" for x in common["covered"]]
    lines += ["", "**Not covered:**", ""] + [f"- {x}" for x in common["not_covered"]] + [""]
    for s in report["sites"]:
        if s.get("ledger") is None:
            continue
        m = s["mechanism"]
        lines += [
            f"## Site `{s['site']}` (dataset {s['dataset_fingerprint']})",
            "",
            f"- **ε spent {s['epsilon_spent']:.3f}** of cap {s['epsilon_cap']:g} (remaining "
            f"{s['epsilon_remaining']:.3f}) at **δ = {s['delta']:.3g}**; RDP bound {s['epsilon_rdp_bound']:.3f}.",
            f"- Mechanism: clip C = {m['clip_C']:g}; σ = "
            + ", ".join(f"{x:.4g}" for x in m["noise_multipliers"])
            + "; Poisson q = "
            + ", ".join(f"{x:.4g}" for x in m["sample_rate_q"])
            + f" (expected batch {m['expected_batch_size']} of N = {s['n_site']}); {m['steps_per_round']} steps per "
            f"round; {m['rounds']} rounds; {m['total_steps']} steps in all; noise seed: {m['noise_seed']}.",
        ]
        for r in s["resets"]:
            lines.append(
                f"- **Acknowledged reset** {r['time']} by {r['operator']}: \"{r['reason']}\"; the ledger had held "
                f"{r['previous']['segments']} segment(s), ε ≈ {r['previous']['epsilon']:.3f}, carried forward above."
            )
        if s["anchor"]["behind"]:
            lines.append("- **Ledger behind its anchor**: " + "; ".join(s["anchor"]["behind"]) + ".")
        if s["open_reservations"]:
            lines.append(
                f"- Open reservations (charged in full; a round that never closed): {s['open_reservations']}."
            )
        own = [x for x in s["not_covered"] if x not in common["not_covered"]]
        if own:
            lines += ["- **Not covered at this site** (besides the common list):"] + [f"  - {x}" for x in own]
        lines += [
            "",
            "| seq | round | run | plan | σ | q | steps | status | ε after |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for seg in s["segments"]:
            lines.append(
                f"| {seg['seq']} | {seg['round']} | {seg['run_id'] or ''} | {seg['plan_id']} | {seg['sigma']:.4g} | "
                f"{seg['q']:.4g} | {seg['steps']} | {seg['status']} | {seg['epsilon_after']:.3f} |"
            )
        lines.append("")
    return "\n".join(lines) + "\n"


def _render_signed(report: dict[str, Any], plot_name: str | None) -> str:
    """The Markdown of a report built from the sites' signed records (``experiments.privacy_evidence``)."""
    def num(x: float | None, spec: str = ".3f") -> str:
        return "–" if x is None else format(x, spec)

    lines = ["# Privacy budget report", "", f"Source: `{report['source']}`", "",
             f"DP-SGD was on. Basis: {report['basis_note']}.", "", f"Unit of privacy: {report['unit_of_privacy']}.", ""]
    if plot_name:
        lines += [f"![ε over rounds]({plot_name})", ""]
    lines += ["| site | ε spent | any record ≤ | cap | remaining | record |", "|---|---|---|---|---|---|"]
    for s in report["sites"]:
        lines.append(f"| {s['site']} | {num(s['epsilon_spent'])} | {num(s['epsilon_any_record'])} | "
                     f"{num(s['epsilon_cap'], 'g')} | {num(s['epsilon_remaining'])} | {s['status']}"
                     + (f": {s['why']}" if s.get("why") else "") + " |")
    if report["unverified"]:
        lines += ["", f"**Unverified**: {', '.join(report['unverified'])}: no intact signed privacy record; run "
                  "`fcd privacy report SITE_STATE` at each of them."]
    return "\n".join(lines) + "\n"


def write_report(report: dict[str, Any], out_dir: str | Path) -> dict[str, Path]:
    """Write ``privacy_report.json``, ``privacy_report.md`` and ``privacy_epsilon.png`` into ``out_dir``.

    All three are rendered before any is written (a failure leaves the folder as it was), then each file is replaced
    atomically (:func:`fcd_secure._io.atomic_write_bytes`): a reader sees a previous report file or the new one.

    Returns:
        The path of each file, keyed ``json``, ``markdown`` and ``plot``.
    """
    out_dir = Path(out_dir)
    names = {"json": "privacy_report.json", "markdown": "privacy_report.md", "plot": "privacy_epsilon.png"}
    known = [s for s in report.get("sites") or [] if s.get("epsilon_spent") is not None]
    has_dp = report.get("dp", True) and bool(known)
    png = plot_epsilon({**report, "sites": known}) if has_dp else None
    texts = {
        "json": json.dumps(report, indent=2) + "\n",
        "markdown": render_markdown(report, names["plot"] if has_dp else None),
    }
    for kind, text in texts.items():
        atomic_write_text(out_dir / names[kind], text, mode=0o644)
    if png is not None:
        atomic_write_bytes(out_dir / names["plot"], png, mode=0o644)
    return {k: out_dir / v for k, v in names.items() if k != "plot" or png is not None}
