"""The sites' signed privacy records: the heads of each site's DP ledgers that its signed audit chain carries.

A site's privacy ledger never leaves the site (it lists the records each round charged). What does leave is its
**head** (:class:`~fcd_secure.anchor_records.PrivacyAnchor`: segments, hash chain, accounted steps, ε at the last
reservation, acknowledged resets), which the egress gate writes into every upload line of the site's signed,
hash-chained audit ledger (``site_ledger.jsonl``), the file the evidence collection copies into
``<run>/evidence/sites/<site>/``. Read back here with the chain and signature checks of ``fcd audit verify``
(:func:`~fcd_secure.audit.verify.chain.read_chain`), each upload gives the site's ε after that round, signed by the
site's key: what a report states when the ledgers themselves are not in the run folder (a deployment, a consortium
of hospitals).

What a head proves is bounded by who signed it (Schneier & Kelsey 1999, "Secure audit logs to support computer
forensics", ACM TISSEC 2(2)): a chain that fails its checks is not read at all, and a chain signed by a key nobody
pinned is reported as such (``key_pinned``), so the reader says "unverified" rather than vouching for it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fcd_secure.anchor_records import PrivacyAnchor
from fcd_secure.audit.entries import UploadLine
from fcd_secure.audit.ledger import SITE_LEDGER_FILE
from fcd_secure.audit.verify.chain import EXPECTED_ROLE, discover, read_chain
from fcd_secure.audit.verify.result import VerifyResult
from fcd_secure.fingerprints import normalise_fingerprint

__all__ = ["SignedHeads", "SitePrivacyRecords", "signed_privacy_records"]


@dataclass(frozen=True)
class SignedHeads:
    """The privacy-ledger heads one signed upload line records: where the site's budget stood when it left."""

    seq: int
    round: int | None
    action: str
    heads: tuple[PrivacyAnchor, ...]

    @property
    def epsilon(self) -> float:
        """The most any of the site's ledgers had spent at this upload (each head: its ledger's composition)."""
        return max((h.epsilon for h in self.heads), default=0.0)


@dataclass(frozen=True)
class SitePrivacyRecords:
    """One site's signed privacy records, read from its audit ledger, and what vouches for them.

    ``intact``: the chain's hashes, signatures and checkpoints all checked (a chain that does not check is listed
    with ``intact`` false and no records). ``key_pinned``: its key is among the fingerprints the reader pinned.
    """

    site_id: str
    ledger: str
    intact: bool
    key_fingerprint: str | None
    key_pinned: bool
    problems: tuple[str, ...]
    records: tuple[SignedHeads, ...]

    @property
    def last(self) -> SignedHeads | None:
        """The latest upload that recorded heads (the site's ε at the end of the run), or ``None``."""
        return self.records[-1] if self.records else None


def _read(path: Path, label: str, pinned: set[str] | None) -> SitePrivacyRecords | None:
    scratch = VerifyResult(root=str(path))
    chain = read_chain(path, label, pinned, EXPECTED_ROLE[SITE_LEDGER_FILE], scratch)
    problems = tuple(f.message for f in scratch.findings if f.severity == "tampered")
    uploads = [loc.entry for loc in chain.of_kind(UploadLine)]
    site = chain.writer_id or next((u.site_id for u in uploads), None)
    if site is None:
        return None
    records = () if problems else tuple(
        SignedHeads(u.seq, u.round, u.action, tuple(u.privacy_anchors)) for u in uploads if u.privacy_anchors)
    fp = chain.key_fingerprint
    return SitePrivacyRecords(site, label, not problems, fp, pinned is not None and fp is not None and fp in pinned,
                              problems, records)


def signed_privacy_records(path: str | Path, site_keys: list[str] | None = None) -> dict[str, SitePrivacyRecords]:
    """Every site's signed privacy records under ``path`` (a run folder, its ``evidence/``, a site ledger), by site.

    Args:
        path: where to look for ``site_ledger.jsonl`` files (recursively).
        site_keys: the pinned site fingerprints (``SHA256:<hex>``), or ``None``.

    Returns:
        One entry per site id; where several ledgers of one site are found (the site's state and its copy in the
        evidence), the intact one with the most records.

    Raises:
        ValueError: a malformed fingerprint in ``site_keys``.
    """
    root = Path(path)
    if not root.exists():
        return {}
    pinned = {normalise_fingerprint(k) for k in site_keys} if site_keys else None
    base = root if root.is_dir() else root.parent
    out: dict[str, SitePrivacyRecords] = {}
    for p in discover(root)[0]:
        rec = _read(p, str(p.relative_to(base)) if p.is_relative_to(base) else str(p), pinned)
        if rec is None:
            continue
        have = out.get(rec.site_id)
        if have is None or (rec.intact, len(rec.records)) > (have.intact, len(have.records)):
            out[rec.site_id] = rec
    return dict(sorted(out.items()))
