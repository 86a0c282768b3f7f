"""``fcd audit collect``: each hospital's current audit evidence, gathered into a run's evidence folder.

``fcd server run`` writes the coordinator's half of the evidence (``<out>/evidence/``: server ledger, roster, CA,
fingerprints). The other half lives on the sites: each site's ledger (``state/<site-id>/slots/site_ledger.jsonl``)
and its DP privacy records (``state/<site-id>/privacy/ledger-*.json`` and the anchor of their heads,
``privacy_anchor.json``; ``fcd_secure.privacy.ledger`` and ``.anchor``). The auditor verifies both halves together
(``fcd audit verify``): a site ledger copied after one run and not again after the next is *stale*, older than the
server's records of it, and reads as partial evidence.

Every collect replaces a site's folder under ``evidence/sites/<site-id>/`` as a whole with what the site holds now
(a file left from an earlier copy would mix two moments), and records what it copied, with the SHA-256 of every
file and the time, in ``evidence/collected.json``. Only evidence is copied: the site's keys, tables and training
state stay where they are (the identity key signs the ledger; only its public half, inside the ledger's ``open``
line, travels).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from fcd_secure._io import atomic_write_bytes, atomic_write_text, file_sha256
from fcd_secure.audit import SITE_LEDGER_FILE
from fcd_secure.audit.signing import utc_now
from fcd_secure.privacy.anchor import ANCHOR_FILE
from fcd_secure.provisioning.consortium import ProvisioningError
from fcd_secure.provisioning.site_install.home import SiteHome

#: the record of what each collect copied, beside the evidence
COLLECTED_FILE = "collected.json"
#: where a site's evidence goes inside the evidence folder (``engines.deployment.LocalDeployment.collect_evidence``
#: uses the same layout)
SITES_DIR = "sites"


def site_evidence_files(home: SiteHome) -> dict[str, Path]:
    """The evidence a site holds now, by its name inside the site's evidence folder: the site ledger, the DP
    ledgers and the anchor of their heads (whichever exist)."""
    state = home.state().dir
    files: dict[str, Path] = {}
    ledger = state / "slots" / SITE_LEDGER_FILE
    if ledger.is_file():
        files[SITE_LEDGER_FILE] = ledger
    for p in sorted((state / "privacy").glob("ledger-*.json")):
        files[f"privacy/{p.name}"] = p
    for p in sorted(state.rglob(ANCHOR_FILE)):
        files[str(p.relative_to(state))] = p
    return files


def collect_site_evidence(evidence: str | Path, homes: list[str | Path]) -> list[dict[str, Any]]:
    """Copy each site's current evidence into ``<evidence>/sites/<site-id>/`` (replacing what an earlier collect
    left there) and record it in ``<evidence>/collected.json``.

    Args:
        evidence: a run's evidence folder (``fcd server run`` wrote it: ``<out>/evidence``).
        homes: the sites' home folders (``fcd site init --home``).

    Returns:
        Per site: ``{"site_id", "files": {name: sha256}, "collected_at"}``.

    Raises:
        ProvisioningError: ``evidence`` is not a run's evidence folder, a home is not a site's, two homes are one
            site, or a site holds no ledger yet.
    """
    ev = Path(evidence)
    if not (ev / "fingerprints.json").is_file():
        raise ProvisioningError(f"{ev}: not a run's evidence folder (field: fingerprints.json missing); give "
                                "<run folder>/evidence as fcd server run wrote it")
    sites = [SiteHome.at(h) for h in homes]
    ids = [h.site_id for h in sites]
    if len(set(ids)) != len(ids):
        raise ProvisioningError(f"--site-home: site(s) {sorted({i for i in ids if ids.count(i) > 1})} given twice")
    plans = []
    for home, sid in zip(sites, ids):
        files = site_evidence_files(home)
        if SITE_LEDGER_FILE not in files:
            raise ProvisioningError(f"{home.state().dir / 'slots' / SITE_LEDGER_FILE}: missing (field: file): site "
                                    f"{sid} has no ledger yet (it has taken part in no run)")
        plans.append((sid, files))
    record_path = ev / COLLECTED_FILE
    record = json.loads(record_path.read_text()) if record_path.is_file() else {}
    out = []
    for sid, files in plans:
        target = ev / SITES_DIR / sid
        if target.exists():
            shutil.rmtree(target)
        digests = {}
        for name, src in files.items():
            data = src.read_bytes()
            atomic_write_bytes(target / name, data)
            digests[name] = file_sha256(target / name)
        row = {"site_id": sid, "files": digests, "collected_at": utc_now()}
        record[sid] = row
        out.append(row)
    atomic_write_text(record_path, json.dumps(record, indent=2, sort_keys=True))
    return out
