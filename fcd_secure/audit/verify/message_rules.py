"""The egress policy as verify applies it to one recorded message, whichever side recorded it.

A message that left a site breaks the policy (a **violation**: the evidence is intact and records a breach) if it
names a Θs parameter or a propensity, carries a tensor that is not a Θc tensor of the manifest in force (or has
another shape/dtype), or weighs more than its Θc layout and declared protocol fields plus a bounded serialisation
overhead (undeclared content). The same rules run on the site's ``upload`` lines and on the server's ``received``
lines, so a breach the server recorded is a violation even when the site's own ledger was edited to hide it.
"""

from __future__ import annotations

from collections.abc import Callable

from fcd_secure.audit.entries import ManifestLine, MessageLine
from fcd_secure.audit.rules import PROPENSITY_NAME, SECAGG_PREFIX
from fcd_secure.manifest import THETA_C, THETA_S, Manifest

__all__ = ["check_message", "overhead_bound"]


def overhead_bound(e: MessageLine) -> int:
    """Upper bound on the serialisation overhead of a payload (headers, names, ids), from what the line names.

    Measured in the pinned Flower (``fcd_secure._flower.pins``): ~16 B for an empty RecordDict, ~170 B per record, ~480-650 B per array (npy header
    128 B plus object headers and the name twice), ~100 B extra per 5 MiB chunk. The bound is generous by a
    factor of ~1.5 and linear in what the line declares, so a hidden payload of any size breaks it.
    """
    b = 256 + 256 * len(e.records)
    for t in e.tensors:
        chunks = max(1, -(-t.nbytes // (5 * 1024 * 1024)))
        b += 512 + 2 * len(t.name) + 16 * len(t.shape) + 256 * chunks
    for m in e.metrics:
        b += 64 + len(m)
    for n in e.metric_lists.values():
        b += 8 * n  # list metrics: up to 8 bytes per number
    for c in e.config_fields:
        b += 64 + len(c.key) + 2 * c.len
    return b


def _names_in(e: MessageLine) -> list[tuple[str, str]]:
    """(where, name) of every key a message names: records, tensors, metrics, config fields."""
    out = [("record", r) for r in e.records]
    out += [("tensor", f"{t.record}/{t.name}") for t in e.tensors]
    out += [("metric", m) for m in e.metrics]
    out += [("config field", f"{c.record}/{c.key}") for c in e.config_fields]
    return out


def check_message(
    e: MessageLine, in_force: tuple[ManifestLine, Manifest] | None, viol: Callable[[str], None], *, layout_hash: bool
) -> None:
    """Report every way a message that left a site breaks the egress policy.

    Args:
        e: the site's upload line or the server's received line (not an error reply).
        in_force: the manifest line in force where ``e`` was recorded, and its manifest.
        viol: called with each violation's message.
        layout_hash: whether ``e`` records the layout hash it was sent under (site lines do).
    """
    manifest = in_force[1] if in_force is not None else None
    theta_c = {m.name: m for m in manifest.select(THETA_C)} if manifest is not None else {}
    theta_s = set(manifest.names(THETA_S)) if manifest is not None else set()
    bound = {m.name for m in manifest.entries if m.site_bound} if manifest is not None else set()
    if in_force is None and e.tensors:
        viol("tensors left before any manifest was recorded")
    if layout_hash and in_force is not None and getattr(e, "layout_hash", None) != in_force[0].layout_hash:
        viol(f"layout hash {str(getattr(e, 'layout_hash', None))[:12]} is not the manifest in force")
    for kind, name in _names_in(e):
        leaf = name.split("/")[-1]
        if leaf in bound or name in bound:
            viol(f"{kind} {name!r} names a site-bound parameter (never sent, not even under full synchronisation)")
        elif leaf in theta_s or name in theta_s:
            viol(f"{kind} {name!r} names a Θs parameter")
        if PROPENSITY_NAME.search(leaf):
            viol(f"{kind} {name!r} names a propensity")
    data = 0
    for t in e.tensors:
        spec = theta_c.get(t.name)
        if spec is None:
            if t.name not in theta_s:
                viol(f"tensor {t.name!r} is not a Θc tensor of the manifest")
            continue
        if t.shape != spec.shape or t.dtype != spec.dtype:
            viol(f"tensor {t.name!r} has shape {list(t.shape)} {t.dtype}, the manifest says {list(spec.shape)} {spec.dtype}")
            continue
        if t.nbytes != spec.nbytes:
            viol(f"tensor {t.name!r} declares {t.nbytes} bytes, its layout is {spec.nbytes}")
        data += spec.nbytes
    declared = data + sum(c.len for c in e.config_fields)
    if e.payload_bytes < data:
        viol(f"payload of {e.payload_bytes} bytes is smaller than its declared tensors ({data} bytes)")
    elif e.payload_bytes - declared > overhead_bound(e):
        viol(
            f"payload of {e.payload_bytes} bytes exceeds the Θc layout ({data} bytes) and declared protocol fields plus "
            f"the overhead bound ({overhead_bound(e)} bytes): undeclared content"
        )
    if e.action.startswith(SECAGG_PREFIX) and theta_c:
        n_c = manifest.size(THETA_C)  # type: ignore[union-attr]
        # a masked vector is one word per Θc element plus the weight; 8 bytes per element bounds every encoding used
        largest = max((c.len for c in e.config_fields), default=0)
        if largest > 8 * (n_c + 64) + 4096:
            viol(f"a secure-aggregation field of {largest} bytes is larger than any encoding of the Θc vector ({n_c} elements)")
