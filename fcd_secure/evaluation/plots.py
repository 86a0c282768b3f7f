"""The paper's figures (matplotlib, Agg backend: no display needed). The one plotter of the project: the run folder
(``federation/outputs.py``) and the experiments (``fcd_secure.experiments``) both draw through it.

* :func:`plot_metric_vs_round` — Fig. 3 (oracle PEHE on DKT-Synth vs global communication round, one line per
  method);
* :func:`plot_utility_vs_uplink` — Fig. 4 (downstream utility vs uplink volume in MB, one point per method, or one
  curve per method over cumulative uplink; uplink = selected clients × synchronised parameter size, summed over
  rounds);
* :func:`plot_policy_values` — Fig. 2 (policy value estimates of the four target policies, one panel per dataset,
  one bar per method; a value that is not a number — no logged support — is marked "n/a", never drawn as 0).

Figures a reader can trust: rounds are integers on the axis; the y-axis starts at 0 for errors and spans [0, 1]
for an AUC, never a zoom that makes a small change look large; an AUC plot carries the chance line (0.5); the
headline number (the final evaluation a table reports) is marked and labelled with its value, apart from the
cheaper evaluations made during training. Each writes a PNG atomically (``fcd_secure._io.atomic_write_bytes``), so a
failed call never leaves half a figure.
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
from matplotlib.ticker import MaxNLocator  # noqa: E402

from fcd_secure._io import atomic_write_bytes  # noqa: E402

__all__ = ["metric_vs_round_figure", "plot_metric_vs_round", "plot_policy_values", "plot_utility_vs_uplink"]

#: ``(label, uplink_mb, utility)``: scalars give one point, equal-length sequences give a curve.
UplinkPoint = tuple[str, float | Sequence[float], float | Sequence[float]]
#: ``(label, x, value)``: the headline number, marked apart (e.g. the final evaluation at the last round).
Headline = tuple[str, float, float]
#: ``"auto"``: the chance line 0.5 when the y label names an AUC; a number: that line; ``None``: none.
Chance = float | str | None

CHANCE_AUC = 0.5


def _is_auc(ylabel: str) -> bool:
    return "auc" in ylabel.lower()


def _honest_axes(ax, ylabel: str, values: list[float], chance: Chance) -> None:
    """An AUC on [0, 1] with its chance line; an error from 0 up (never a zoom that exaggerates a change)."""
    line = CHANCE_AUC if chance == "auto" and _is_auc(ylabel) else (None if chance == "auto" else chance)
    finite = [v for v in values if math.isfinite(v)]
    if _is_auc(ylabel):
        ax.set_ylim(0.0, 1.0)
    elif finite and min(finite) >= 0:
        ax.set_ylim(bottom=0.0, top=max(finite) * 1.12 if max(finite) > 0 else 1.0)
    if line is not None:
        ax.axhline(float(line), color="0.4", linestyle=":", linewidth=1.0, label=f"chance ({float(line):g})")


def _mark_headline(ax, headline: Headline | None) -> None:
    if headline is None:
        return
    label, x, y = headline
    ax.plot([x], [y], marker="*", markersize=12, color="black", linestyle="none", label=f"{label}: {y:.4g}", zorder=5)
    ax.annotate(f"{y:.4g}", (x, y), textcoords="offset points", xytext=(6, 6), fontsize=9, fontweight="bold")


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
    *,
    chance: Chance = "auto",
    headline: Headline | None = None,
    references: Mapping[str, float] | None = None,
) -> Path:
    """Line plot of a metric against the federated round (paper Fig. 3), integer round ticks, honest y-axis.

    Args:
        rounds: the x values (global rounds); may be empty when only ``headline`` is drawn.
        series: one line per label, one value per entry of ``rounds``; NaN leaves a gap (a round not evaluated).
        path: the PNG to write.
        ylabel: y-axis label (an "AUC" label gets the [0, 1] axis and, by default, the chance line).
        title: figure title.
        chance: the chance line (module docstring of :data:`Chance`).
        headline: ``(label, round, value)`` marked with a star and its value (the final evaluation).
        references: ``{label: value}`` drawn as labelled dashed horizontal lines (for PEHE: the zero-effect PEHE₀
            and the constant-effect floor sd τ, without which a PEHE curve shows no skill); NaN ones are skipped.

    Returns:
        The written path.

    Raises:
        ValueError: nothing to draw, a series of the wrong length, or a path that is not a ``.png``.
    """
    if len(rounds) == 0 and headline is None:
        raise ValueError("plot_metric_vs_round: rounds is empty")
    if not series and headline is None:
        raise ValueError("plot_metric_vs_round: series is empty")
    for label, ys in series.items():
        if len(ys) != len(rounds):
            raise ValueError(f"plot_metric_vs_round: series {label!r} has {len(ys)} values for {len(rounds)} rounds")
    out = _check_png(path)
    return _save(metric_vs_round_figure(rounds, series, ylabel, title, chance=chance, headline=headline,
                                        references=references), out)


def metric_vs_round_figure(
    rounds: Sequence[int],
    series: Mapping[str, Sequence[float]],
    ylabel: str = "PEHE",
    title: str | None = None,
    *,
    chance: Chance = "auto",
    headline: Headline | None = None,
    references: Mapping[str, float] | None = None,
) -> "plt.Figure":
    """The figure of :func:`plot_metric_vs_round`, unsaved (for callers that add to it, and for tests)."""
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    values: list[float] = []
    for label, ys in series.items():
        if len(ys):
            ax.plot(list(rounds), [float(v) for v in ys], marker="o", markersize=3, linewidth=1.5, label=label)
            values += [float(v) for v in ys]
    styles = iter([(0, (5, 3)), (0, (1, 2)), (0, (3, 1, 1, 1))])
    for label, v in (references or {}).items():
        if v is not None and math.isfinite(float(v)):
            ax.axhline(float(v), color="0.35", linewidth=1.0, linestyle=next(styles, "--"), label=label)
            values.append(float(v))
    if headline is not None:
        values.append(float(headline[2]))
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    _honest_axes(ax, ylabel, values, chance)
    _mark_headline(ax, headline)
    ax.set_xlabel("global communication round")
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(frameon=False, fontsize=8)
    return fig


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
    *,
    chance: Chance = "auto",
    headline: Headline | None = None,
) -> Path:
    """Utility against uplink volume per method, labelled (paper Fig. 4), honest y-axis.

    Args:
        points: ``[(label, uplink_mb, utility)]``. Scalars draw one point per method; equal-length sequences draw
            the method's curve (e.g. per round over cumulative uplink), labelled at its last point. May be empty
            when only ``headline`` is drawn.
        path: the PNG to write.
        ylabel: y-axis label (an "AUC" label gets the [0, 1] axis and, by default, the chance line).
        title: figure title.
        xlabel: x-axis label.
        chance: the chance line (:data:`Chance`).
        headline: ``(label, uplink_mb, value)`` marked with a star and its value (the final evaluation).

    Returns:
        The written path.

    Raises:
        ValueError: nothing to draw, a malformed point, an uplink that is negative or not finite, or a path that is
            not a ``.png``.
    """
    if len(points) == 0 and headline is None:
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
    return _save(_uplink_figure(curves, ylabel, title, xlabel, chance, headline), out)


def _uplink_figure(
    curves: list[tuple[str, list[float], list[float]]],
    ylabel: str,
    title: str | None,
    xlabel: str,
    chance: Chance,
    headline: Headline | None,
) -> "plt.Figure":
    fig, ax = plt.subplots(figsize=(5.5, 3.6))
    values: list[float] = []
    for label, xs, ys in curves:
        if len(xs) == 1:
            ax.scatter(xs, ys, s=36, label=label)
        else:
            ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.5, label=label)
        if headline is None:  # points named in place (paper Fig. 4); with a headline the legend names them
            ax.annotate(label, (xs[-1], ys[-1]), textcoords="offset points", xytext=(4, 4), fontsize=8)
        values += ys
    if headline is not None:
        values.append(float(headline[2]))
    _honest_axes(ax, ylabel, values, chance)
    _mark_headline(ax, headline)
    ax.set_xlim(left=0.0)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    if title:
        ax.set_title(title)
    ax.grid(alpha=0.3)
    if headline is not None or any(ax.get_legend_handles_labels()[1]):
        ax.legend(frameon=False, fontsize=8)
    return fig


def plot_policy_values(
    panels: Mapping[str, Mapping[str, Mapping[str, float]]],
    policies: Sequence[str],
    path: str | os.PathLike[str],
    ylabel: str = "policy value",
    title: str | None = None,
) -> Path:
    """Grouped bars of policy values: one panel per dataset, policies on the x-axis, one bar per method (paper Fig. 2).

    Args:
        panels: ``{panel title: {method: {policy: value}}}``; a missing or non-finite value is marked "n/a".
        policies: the x-axis order.
        path: the PNG to write.
        ylabel: y-axis label.
        title: figure title.

    Returns:
        The written path.

    Raises:
        ValueError: no panels, no policies, a panel without methods, or a path that is not a ``.png``.
    """
    if not panels:
        raise ValueError("plot_policy_values: panels is empty")
    if not policies:
        raise ValueError("plot_policy_values: policies is empty")
    for name, methods in panels.items():
        if not methods:
            raise ValueError(f"plot_policy_values: panel {name!r} has no methods")
    out = _check_png(path)
    n = len(panels)
    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, 3.6), squeeze=False)
    for ax, (name, methods) in zip(axes[0], panels.items()):
        width = 0.8 / len(methods)
        for j, (method, vals) in enumerate(methods.items()):
            for i, pol in enumerate(policies):
                x = i - 0.4 + width * (j + 0.5)
                v = vals.get(pol)
                if v is None or not math.isfinite(float(v)):
                    ax.text(x, 0.0, "n/a", rotation=90, ha="center", va="bottom", fontsize=6)
                    continue
                ax.bar(x, float(v), width, color=f"C{j}", label=method if i == 0 else None)
        ax.set_xticks(range(len(policies)), list(policies), fontsize=8)
        ax.set_title(name, fontsize=9)
        ax.grid(alpha=0.3, axis="y")
    axes[0][0].set_ylabel(ylabel)
    handles, labels = [], []
    for ax in axes[0]:
        for h, lab in zip(*ax.get_legend_handles_labels()):
            if lab not in labels:
                handles.append(h)
                labels.append(lab)
    if handles:
        fig.legend(handles, labels, loc="lower center", ncol=min(len(labels), 7), frameon=False, fontsize=8,
                   bbox_to_anchor=(0.5, -0.08))
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, out)
