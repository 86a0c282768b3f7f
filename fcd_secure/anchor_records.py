"""The privacy-anchor record, typed once: where a site's DP ledger stood, and every acknowledged reset of it.

The privacy layer writes it (``privacy.anchor``: the anchor file beside the ledgers, ``read_anchors``); the audit layer
records it in every upload line (``audit.entries.UploadLine.privacy_anchors``) and checks the history of heads
offline (``audit.verify.privacy_history``). Privacy and audit are sibling layers that never import each other, so the
one type both use lives here at the bottom (torch-free, pydantic only).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["LedgerHead", "PrivacyAnchor", "ResetRecord"]


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class LedgerHead(_Model):
    """Where one privacy ledger stood: its key, segment count, chain over the segments, accounted steps, ε."""

    key: str = Field(description="the ledger's file key (ledger-<key>.json)")
    segments: int = Field(ge=0)
    chain: str = Field(description="hash chain over the segments' reservations (GENESIS for none)")
    steps: int = Field(ge=0, description="accounted steps (committed steps, open reservations in full)")
    epsilon: float = Field(ge=0, description="ε of the history at the last reservation (an upper bound)")


class ResetRecord(_Model):
    """An operator's acknowledgement that a ledger was lost or rolled back (the head that was lost is kept)."""

    time: str
    reason: str
    operator: str
    previous: LedgerHead
    current: LedgerHead | None = Field(description="the ledger as found at the acknowledgement; None if missing")


class PrivacyAnchor(LedgerHead):
    """One ledger's anchored head as an audit upload line records it, with its acknowledged resets."""

    resets: int = Field(ge=0, description="acknowledged resets of this ledger so far")
    last_reset: ResetRecord | None = None

    @classmethod
    def of(cls, entry: Any) -> "PrivacyAnchor":
        """The record of an anchor file's entry (``privacy.anchor.AnchorEntry``: its ``head`` and ``resets``)."""
        return cls(**entry.head.model_dump(), resets=len(entry.resets),
                   last_reset=entry.resets[-1] if entry.resets else None)
