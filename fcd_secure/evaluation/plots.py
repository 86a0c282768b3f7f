"""Figures of the federated run (matplotlib, Agg backend: no display needed).

* :func:`plot_metric_vs_round` — the paper's Fig. 3 (oracle PEHE on DKT-Synth vs global communication round, one
  line per method);
* :func:`plot_utility_vs_uplink` — the paper's Fig. 4 (downstream utility vs total uplink volume in MB, one point per
  method; uplink = selected clients × synchronised parameter size, summed over rounds).

Both write a PNG atomically (temporary file, then rename), so a failed call never leaves half a figure behind.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: figures are files, never windows (servers and CI have no display)
import matplotlib.pyplot as plt  # noqa: E402

__all__ = ["plot_metric_vs_round", "plot_utility_vs_uplink"]


def _save(fig: "plt.Figure", path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".png":
        plt.close(fig)
        raise ValueError(f"plot path must end in .png, got {out}")
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".plot-", suffix=".png", dir=out.parent)
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight", format="png")
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    finally:
        plt.close(fig)
    return out


def plot_metric_vs_round(
    rounds: Sequence[int],
    series: Mapping[str, Sequence[float]],
    path: str | os.PathLike[str],
    ylabel: str = "PEHE",
    title: str | None = None,
) -> Path:
    """Line plot of a metric against the federated round (paper Fig. 3). Each ``series[label]`` has one value per
    entry of ``rounds``; NaN values leave a gap (e.g. a round that was not evaluated). Returns the written path."""
    if len(rounds) == 0:
        raise ValueError("plot_metric_vs_round: rounds is empty")
    if not series:
        raise ValueError("plot_metric_vs_round: series is empty")
    for label, ys in series.items():
        if len(ys) != len(rounds):
            raise ValueError(f"plot_metric_vs_round: series {label!r} has {len(ys)} values for {len(rounds)} rounds")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, ys in series.items():
        ax.plot(list(rounds), [float(v) for v in ys], marker="o", markersize=3, linewidth=1.5, label=label)
    ax.set_xlabel("global communication round")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return _save(fig, path)


def plot_utility_vs_uplink(
    points: Sequence[tuple[str, float, float]],
    path: str | os.PathLike[str],
    ylabel: str = "utility",
    title: str | None = None,
) -> Path:
    """Scatter of (uplink MB, utility) per method, labelled (paper Fig. 4). ``points`` = [(label, uplink_mb, utility)].
    Uplink must be finite and >= 0. Returns the written path."""
    if len(points) == 0:
        raise ValueError("plot_utility_vs_uplink: points is empty")
    for i, pt in enumerate(points):
        if len(pt) != 3:
            raise ValueError(f"plot_utility_vs_uplink: point {i} must be (label, uplink_mb, utility), got {pt!r}")
        label, mb, _ = pt
        if not math.isfinite(float(mb)) or float(mb) < 0:
            raise ValueError(f"plot_utility_vs_uplink: point {i} ({label!r}) has invalid uplink_mb {mb!r}")
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, mb, util in points:
        ax.scatter([float(mb)], [float(util)], s=36, label=str(label))
        ax.annotate(str(label), (float(mb), float(util)), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel("total uplink (MB)")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, path)
