"""The figure helpers write real PNG files (Agg backend) and refuse bad input without writing anything."""

from __future__ import annotations

import math

import pytest

from fcd_secure.evaluation.plots import plot_metric_vs_round, plot_utility_vs_uplink

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_metric_vs_round_writes_png(tmp_path):
    out = plot_metric_vs_round(
        [1, 2, 3, 4],
        {"Fed-CausalDiff": [0.2, 0.12, 0.08, 0.06], "w/o DSS": [0.25, 0.2, math.nan, 0.09]},
        tmp_path / "fig" / "pehe.png",
        ylabel="PEHE",
    )
    assert out == tmp_path / "fig" / "pehe.png"
    data = out.read_bytes()
    assert data.startswith(PNG_MAGIC) and len(data) > 2000


def test_utility_vs_uplink_writes_png(tmp_path):
    out = plot_utility_vs_uplink([("Fed-CausalDiff", 12.5, 0.61), ("full sync", 30.0, 0.6)], tmp_path / "uplink.png")
    assert out.read_bytes().startswith(PNG_MAGIC)


def test_bad_input_writes_nothing(tmp_path):
    with pytest.raises(ValueError, match="'a' has 2 values for 3 rounds"):
        plot_metric_vs_round([1, 2, 3], {"a": [0.1, 0.2]}, tmp_path / "x.png")
    with pytest.raises(ValueError, match=r"\.png"):
        plot_metric_vs_round([1], {"a": [0.1]}, tmp_path / "x.pdf")
    with pytest.raises(ValueError, match="invalid uplink_mb"):
        plot_utility_vs_uplink([("a", -1.0, 0.5)], tmp_path / "y.png")
    assert list(tmp_path.iterdir()) == []


def test_utility_vs_uplink_draws_curves_and_checks_them(tmp_path):
    out = plot_utility_vs_uplink(
        [("Fed-CausalDiff (dss)", [0.5, 1.0, 1.5], [0.55, 0.6, 0.62]), ("centralised", 0.0, 0.64)],
        tmp_path / "curve.png", ylabel="factual AUC", xlabel="cumulative uplink (MB)",
    )
    assert out.read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="3 uplinks for 2 values"):
        plot_utility_vs_uplink([("a", [0.1, 0.2, 0.3], [0.5, 0.6])], tmp_path / "z.png")
    with pytest.raises(ValueError, match="invalid uplink_mb"):
        plot_utility_vs_uplink([("a", [0.1, math.inf], [0.5, 0.6])], tmp_path / "z.png")
    with pytest.raises(ValueError, match="no uplink_mb"):
        plot_utility_vs_uplink([("a", [], [])], tmp_path / "z.png")
    assert not (tmp_path / "z.png").exists()


def test_a_figure_a_reader_can_trust():
    """Integer round ticks, an error axis from 0 (no zoom), the chance line and [0, 1] for an AUC, and the headline
    number (the final evaluation) marked with its value."""
    import matplotlib.pyplot as plt

    from fcd_secure.evaluation.plots import metric_vs_round_figure

    fig = metric_vs_round_figure([2, 4, 5], {"Fed-CausalDiff": [0.0857, 0.0801, 0.0798]}, ylabel="oracle PEHE",
                                 headline=("final evaluation", 5, 0.0960))
    ax = fig.axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert ax.get_ylim()[0] == 0.0 and ax.get_ylim()[1] >= 0.0960
    labels = ax.get_legend_handles_labels()[1]
    assert "final evaluation: 0.096" in labels and not any("chance" in lbl for lbl in labels)
    assert any(t.get_text() == "0.096" for t in ax.texts)
    plt.close(fig)
    fig = metric_vs_round_figure([1, 2, 3], {"m": [0.58, 0.59, 0.6]}, ylabel="factual AUC")
    ax = fig.axes[0]
    assert ax.get_ylim() == (0.0, 1.0)
    assert any(line.get_label() == "chance (0.5)" and set(line.get_ydata()) == {0.5} for line in ax.get_lines())
    plt.close(fig)


def test_headline_alone_and_chance_on_the_uplink_figure(tmp_path):
    out = plot_utility_vs_uplink([], tmp_path / "u.png", ylabel="factual AUC", headline=("final evaluation", 0.17, 0.59))
    assert out.read_bytes().startswith(PNG_MAGIC)
    out = plot_metric_vs_round([], {}, tmp_path / "m.png", headline=("final evaluation", 1, 0.1))
    assert out.read_bytes().startswith(PNG_MAGIC)
