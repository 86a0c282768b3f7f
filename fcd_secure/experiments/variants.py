"""The variants of the paper's Table III ablation (``fcd ablate``) and their row labels.

Torch-free, so that ``fcd ablate --variant`` is checked before the experiment (torch, Flower) is imported.
"""

from __future__ import annotations

__all__ = ["ALL_VARIANTS", "LABELS"]

ALL_VARIANTS = ("dss", "full_sync", "no_ldis", "local_only", "centralised")
LABELS = {
    "dss": "Fed-CausalDiff (DSS)",
    "full_sync": "w/o DSS (full sync)",
    "no_ldis": "w/o L_dis",
    "local_only": "local only",
    "centralised": "centralised (pooled)",
}
