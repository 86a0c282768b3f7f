"""The privacy statement of a run folder: from the sites' privacy ledgers where the folder holds them, else from the
sites' signed privacy records in the audit evidence (``fcd privacy report`` and ``fcd report`` both read this).

Three cases, by what the folder holds (docs/privacy.md, "How the sites' privacy records reach the report"):

* **the ledgers** (a simulation, one machine): :func:`fcd_secure.privacy.report.build_report` recomputes ε per
  site and per record from every segment (the full statement);
* **no ledger, DP off** in the run's settings: no DP guarantee (:func:`fcd_secure.privacy.report.no_dp_report`);
* **no ledger, DP on** (a deployment or a consortium: each ledger stays on its site): the heads the sites signed
  into their audit chains (:func:`fcd_secure.audit.verify.privacy_records.signed_privacy_records`), checked as
  ``fcd audit verify`` checks them. Each upload's heads give the site's ε after that round, against the run's cap.
  A site with no intact signed record is **unverified**, never "no DP guarantee": the settings say DP was on and
  nothing here can say what it spent.

A head is one ledger's composition (Opacus' accountant over its segments): it bounds every record that ledger
charges. A record charged by several of one site's ledgers (runs on other splits) composes over them; the sum of the
heads is that bound (basic composition, Dwork & Roth 2014, "The Algorithmic Foundations of Differential Privacy",
Thm 3.16), and the site's own ``fcd privacy report`` gives the exact figure per record.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from fcd_secure.audit.verify.privacy_records import SitePrivacyRecords, signed_privacy_records
from fcd_secure.privacy.report import build_report, find_ledgers, no_dp_report

__all__ = ["SIGNED_BASIS", "run_privacy_report", "signed_records_report"]

#: ``basis`` of a report built from the signed records (a report recomputed from ledgers has none)
SIGNED_BASIS = "signed records"


def _run_dp(path: Path) -> tuple[bool | None, float | None, list[str]]:
    """Whether the run's settings say DP was on, its ε cap, and its site ids (``summary.json``, ``config.json``)."""
    enabled: bool | None = None
    cap: float | None = None
    sites: list[str] = []
    for name, cap_key in (("summary.json", "epsilon_cap"), ("config.json", "epsilon")):
        f = path / name
        try:
            data = json.loads(f.read_text()) if f.is_file() else {}
        except (OSError, json.JSONDecodeError):
            continue
        if not isinstance(data, dict):
            continue
        dp = data.get("dp")
        if isinstance(dp, dict) and isinstance(dp.get("enabled"), bool) and enabled is None:
            enabled = dp["enabled"]
            cap = dp.get(cap_key) if isinstance(dp.get(cap_key), (int, float)) else None
        ids = data.get("site_ids")
        if not sites and isinstance(ids, list):
            sites = [str(x) for x in ids]
    return enabled, cap, sites


def _site_entry(sid: str, rec: SitePrivacyRecords | None, cap: float | None) -> dict[str, Any]:
    base = {"site": sid, "ledger": None, "epsilon_cap": cap, "evidence": rec.ledger if rec else None,
            "key_fingerprint": rec.key_fingerprint if rec else None}
    if rec is None or not rec.intact or rec.last is None:
        why = ("no signed audit chain of this site in the run folder or its evidence" if rec is None else
               "its audit chain fails its checks: " + "; ".join(rec.problems[:3]) if not rec.intact else
               "its audit chain records no privacy-ledger head (no upload after a DP round)")
        return base | {"status": "unverified", "why": why, "epsilon_spent": None, "epsilon_remaining": None,
                       "epsilon_any_record": None, "heads": [], "segments": []}
    last = rec.last
    spent, any_record = last.epsilon, sum(h.epsilon for h in last.heads)
    status = "signed, key pinned" if rec.key_pinned else "signed, key not pinned"
    return base | {
        "status": status,
        "why": None if rec.key_pinned else "the chain checks, but no pinned key says whose it is (give the pins)",
        "epsilon_spent": spent,
        "epsilon_any_record": any_record,
        "epsilon_remaining": None if cap is None else max(0.0, cap - spent),
        "over_cap": cap is not None and any_record > cap + 1e-9,
        "resets": sum(h.resets for h in last.heads),
        "heads": [{"ledger_key": h.key[:16], "segments": h.segments, "steps": h.steps, "epsilon": h.epsilon,
                   "resets": h.resets} for h in last.heads],
        # one point per signed upload: the plot's ε over rounds (privacy.report.epsilon_by_round reads these)
        "segments": [{"seq": r.seq, "round": r.round, "epsilon_after": r.epsilon} for r in rec.records],
    }


def signed_records_report(path: str | Path, *, site_keys: list[str] | None = None, cap: float | None = None,
                          sites: list[str] | None = None) -> dict[str, Any]:
    """The privacy report of a DP run whose ledgers stay on the sites, from the sites' signed records under ``path``.

    Args:
        path: the run folder (its ``evidence/`` holds the sites' audit ledgers).
        site_keys: pinned site fingerprints; without them a record is "signed, key not pinned".
        cap: the run's ε cap per site (``dp.epsilon``).
        sites: every site of the run (a site without a record is listed as unverified).
    """
    records = signed_privacy_records(path, site_keys)
    ids = list(dict.fromkeys([*(sites or []), *records]))
    entries = [_site_entry(sid, records.get(sid), cap) for sid in ids]
    known = [s for s in entries if s["epsilon_spent"] is not None]
    worst = max(known, key=lambda s: s["epsilon_spent"], default=None)
    return {
        "source": str(Path(path)),
        "dp": True,
        "basis": SIGNED_BASIS,
        "basis_note": "ε as each site signed it into its audit chain (the head of every DP ledger at each upload), "
                      "checked as `fcd audit verify` checks the chain; the ledgers stay on the sites",
        "unit_of_privacy": "one record (trajectory); each head bounds every record its ledger charges, the sum over "
                           "a site's ledgers bounds a record charged by several",
        "epsilon_cap": cap,
        "sites": entries,
        "unverified": [s["site"] for s in entries if s["status"] == "unverified"],
        "consortium": {"sites": len(entries), "epsilon": worst["epsilon_spent"] if worst else None,
                       "worst_site": worst["site"] if worst else None,
                       "complete": not any(s["status"] == "unverified" for s in entries)},
    }


def run_privacy_report(path: str | Path, *, site_keys: list[str] | None = None) -> dict[str, Any]:
    """The privacy report of ``path`` (a run folder, a state root, a site directory or a ledger file): the
    ledgers' where ``path`` holds any, else the signed records' when the run's settings say DP was on (module
    docstring).

    Raises:
        FileNotFoundError: ``path`` does not exist.
        PrivacyLedgerError: no ledger and no site's signed audit chain (or nothing says DP was on), or a ledger
            cannot be trusted.
        ValueError: a malformed fingerprint in ``site_keys``.
    """
    path = Path(path)
    if find_ledgers(path) or not path.is_dir():
        return build_report(path)
    enabled, cap, sites = _run_dp(path)
    if enabled is False:
        return no_dp_report(path, sites)
    if enabled is True and signed_privacy_records(path, site_keys):
        return signed_records_report(path, site_keys=site_keys, cap=cap, sites=sites)
    return build_report(path)  # says why there is nothing to report (no ledger, no site's signed chain)
