"""The per-entity file of a what-if question: the only place a per-entity value is written, on the site's own disk.

``<site state>/whatif/<query id>.csv`` holds one row per entity (its value under each policy, each contrast, the
factual residual and, with logged propensities, each policy's doubly robust value and the per-step pieces of its
unseen-mass bounds), with the request beside it; in deployment it never leaves the site.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from fcd_secure._io import atomic_write_text
from fcd_secure.data.cohorts import row_ids
from fcd_secure.data.schema import SiteDataset
from fcd_secure.queries.request import WhatIfRequest

__all__ = ["WHATIF_DIR", "write_per_entity"]

#: folder of the per-entity files inside a site's state folder
WHATIF_DIR = "whatif"


def write_per_entity(site_dir: Path, request: WhatIfRequest, sub: SiteDataset, values: dict[str, np.ndarray],
                      residual: np.ndarray, contexts: dict[str, list[str]], drs: dict[str, np.ndarray],
                      dr_steps: dict[str, dict[str, np.ndarray]],
                      grid_notes: dict[str, dict[str, Any]] | None = None) -> Path:
    """``<site_dir>/whatif/<query id>.csv``: one row per entity, its value under each policy, each contrast, the
    factual residual (the model's value of the logged actions minus the observed one) and, with logged
    propensities, each policy's doubly robust value and, for binary outcomes, the per-step pieces of its unseen-mass
    bounds (``dr_scale[t]``, ``dr_w[π][t]``, ``dr_vhat[π][t]``: a cohort's bounds can be rebuilt from them)."""
    import pandas as pd  # noqa: PLC0415

    folder = site_dir / WHATIF_DIR
    folder.mkdir(parents=True, exist_ok=True)
    cols: dict[str, Any] = {"entity": row_ids(sub)}
    ref = values[request.reference]
    for name, v in values.items():
        cols[f"value[{name}]"] = v
    for name, v in values.items():
        if name != request.reference:
            cols[f"effect[{name} - {request.reference}]"] = v - ref
    cols["factual_residual"] = residual
    for name, d in drs.items():
        cols[f"dr[{name}]"] = d
    for i, (name, st) in enumerate(dr_steps.items()):
        if i == 0:  # the steps' shares of the value do not depend on the policy
            cols.update({f"dr_scale[{t}]": st["scale"][:, t] for t in range(st["scale"].shape[1])})
        cols.update({f"dr_w[{name}][{t}]": st["w"][:, t] for t in range(st["w"].shape[1])})
        cols.update({f"dr_vhat[{name}][{t}]": st["v_hat"][:, t] for t in range(st["v_hat"].shape[1])})
    path = folder / f"{request.query_id}.csv"
    atomic_write_text(path, pd.DataFrame(cols).to_csv(index=False, float_format="%.6f"))
    meta = {"request": json.loads(request.to_json()), "rows": sub.n, "contexts": contexts,
            # each threshold as this site read it: asked value, its grid rank, the site's cut point (±inf: beyond it)
            "thresholds": {k: {f: (str(v) if isinstance(v, float) and not math.isfinite(v) else v)
                               for f, v in note.items()} for k, note in (grid_notes or {}).items()}}
    atomic_write_text(folder / f"{request.query_id}.json", json.dumps(meta, indent=1))
    return path
