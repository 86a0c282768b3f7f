"""A built ``SiteDataset`` on disk as one ``.npz`` file (``fcd data validate --out``), written atomically.

Layout: the arrays ``X, A, T, Y, M`` (and ``P`` when logged), every array-valued meta entry as ``meta__<key>``, and
``_meta``: a JSON string with the name, ``n_actions`` and the rest of ``meta``. Nothing is pickled.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np

from fcd_secure._io import atomic_write_bytes, read_npz
from fcd_secure.data.schema import SiteDataset

__all__ = ["load_npz", "save_npz"]


def save_npz(ds: SiteDataset, path: str | Path) -> Path:
    """Write ``ds`` to ``path`` atomically (:func:`fcd_secure._io.atomic_write_bytes`): a failure leaves nothing.

    Args:
        ds: The dataset.
        path: The ``.npz`` file to write.

    Returns:
        ``path``.

    Raises:
        OSError: The folder does not exist or is not writable.
    """
    path = Path(path)
    if not path.parent.is_dir():  # atomic_write_bytes would create it; a mistyped --out folder should fail instead
        raise FileNotFoundError(2, "No such file or directory", str(path.parent))
    arrays = {"X": ds.X, "A": ds.A, "T": ds.T, "Y": ds.Y, "M": ds.M}
    if ds.P is not None:
        arrays["P"] = ds.P
    meta = {}
    for k, v in ds.meta.items():
        if isinstance(v, np.ndarray):
            arrays[f"meta__{k}"] = v
        else:
            meta[k] = v
    head = json.dumps({"name": ds.name, "n_actions": ds.n_actions, "meta": meta}, default=str)
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays, _meta=np.array(head))
    return atomic_write_bytes(path, buf.getvalue())


def load_npz(path: str | Path) -> SiteDataset:
    """Read a dataset written by :func:`save_npz`.

    Raises:
        OSError: The file cannot be read.
        ValueError: It is not an ``.npz`` file (or holds pickles).
    """
    z = read_npz(path)
    head = json.loads(str(z.pop("_meta")))
    meta = head["meta"]
    for k in list(z):
        if k.startswith("meta__"):
            meta[k[6:]] = z.pop(k)
    return SiteDataset(
        X=z["X"], A=z["A"], T=z["T"], Y=z["Y"], M=z["M"], P=z.get("P"),
        n_actions=int(head["n_actions"]), name=head["name"], meta=meta,
    )
