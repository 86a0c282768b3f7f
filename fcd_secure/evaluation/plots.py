"""The paper's figures (matplotlib, Agg backend: no display needed). The one plotter of the project: the run folder
(``federation/outputs.py``) and the experiments (``fcd_secure.experiments``) both draw through it.

* :func:`plot_metric_vs_round` — Fig. 3 (oracle PEHE on DKT-Synth vs global communication round, one line per
  method);
* :func:`plot_utility_vs_uplink` — Fig. 4 (downstream utility vs uplink volume in MB, one point per method, or one
  curve per method over cumulative uplink; uplink = selected clients × synchronised parameter size, summed over
  rounds).

Both write a PNG atomically (``fcd_secure._io.atomic_write_bytes``), so a failed call never leaves half a figure.
"""

from __future__ import annotations

import io
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: figures are files, never windows (servers and CI have no display)
import matplotlib.pyplot as plt  # noqa: E402

from fcd_secure._io import atomic_write_bytes  # noqa: E402

__all__ = ["plot_metric_vs_round", "plot_utility_vs_uplink"]

#: ``(label, uplink_mb, utility)``: scalars give one point, equal-length sequences give a curve.
UplinkPoint = tuple[str, float | Sequence[float], float | Sequence[float]]


def _check_png(path: str | os.PathLike[str]) -> Path:
    out = Path(path)
    if out.suffix.lower() != ".png":
        raise ValueError(f"plot path must end in .png, got {out}")
    return out


def _save(fig: "plt.Figure", out: Path) -> Path:
    buf = io.BytesIO()
    try:
        fig.savefig(buf, dpi=120, bbox_inches="tight", format="png")
    finally:
        plt.close(fig)
    return atomic_write_bytes(out, buf.getvalue())


def plot_metric_vs_round(
    rounds: Sequence[int],
    series: Mapping[str, Sequence[float]],
    path: str | os.PathLike[str],
    ylabel: str = "PEHE",
    title: str | None = None,
) -> Path:
    """Line plot of a metric against the federated round (paper Fig. 3).

    Args:
        rounds: the x values (global rounds).
        series: one line per label, one value per entry of ``rounds``; NaN leaves a gap (a round not evaluated).
        path: the PNG to write.
        ylabel: y-axis label.
        title: figure title.

    Returns:
        The written path.

    Raises:
        ValueError: empty input, a series of the wrong length, or a path that is not a ``.png``.
    """
    if len(rounds) == 0:
        raise ValueError("plot_metric_vs_round: rounds is empty")
    if not series:
        raise ValueError("plot_metric_vs_round: series is empty")
    for label, ys in series.items():
        if len(ys) != len(rounds):
            raise ValueError(f"plot_metric_vs_round: series {label!r} has {len(ys)} values for {len(rounds)} rounds")
    out = _check_png(path)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, ys in series.items():
        ax.plot(list(rounds), [float(v) for v in ys], marker="o", markersize=3, linewidth=1.5, label=label)
    ax.set_xlabel("global communication round")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False)
    return _save(fig, out)


def _as_list(name: str, i: int, label: str, v: float | Sequence[float]) -> list[float]:
    vals = [float(x) for x in v] if hasattr(v, "__iter__") else [float(v)]
    if not vals:
        raise ValueError(f"plot_utility_vs_uplink: point {i} ({label!r}) has no {name}")
    return vals


def plot_utility_vs_uplink(
    points: Sequence[UplinkPoint],
    path: str | os.PathLike[str],
    ylabel: str = "utility",
    title: str | None = None,
    xlabel: str = "total uplink (MB)",
) -> Path:
    """Utility against uplink volume per method, labelled (paper Fig. 4).

    Args:
        points: ``[(label, uplink_mb, utility)]``. Scalars draw one point per method; equal-length sequences draw
            the method's curve (e.g. per round over cumulative uplink), labelled at its last point.
        path: the PNG to write.
        ylabel: y-axis label.
        title: figure title.
        xlabel: x-axis label.

    Returns:
        The written path.

    Raises:
        ValueError: empty input, a malformed point, an uplink that is negative or not finite, or a path that is not
            a ``.png``.
    """
    if len(points) == 0:
        raise ValueError("plot_utility_vs_uplink: points is empty")
    curves: list[tuple[str, list[float], list[float]]] = []
    for i, pt in enumerate(points):
        if len(pt) != 3:
            raise ValueError(f"plot_utility_vs_uplink: point {i} must be (label, uplink_mb, utility), got {pt!r}")
        label, mb, util = str(pt[0]), pt[1], pt[2]
        xs, ys = _as_list("uplink_mb", i, label, mb), _as_list("utility", i, label, util)
        if len(xs) != len(ys):
            raise ValueError(f"plot_utility_vs_uplink: point {i} ({label!r}) has {len(xs)} uplinks for {len(ys)} values")
        if any(not math.isfinite(x) or x < 0 for x in xs):
            raise ValueError(f"plot_utility_vs_uplink: point {i} ({label!r}) has invalid uplink_mb {mb!r}")
        curves.append((label, xs, ys))
    out = _check_png(path)
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    for label, xs, ys in curves:
        if len(xs) == 1:
            ax.scatter(xs, ys, s=36, label=label)
        else:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=label)
        ax.annotate(label, (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(fig, out)
