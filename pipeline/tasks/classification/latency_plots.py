"""The report's latency plots, drawn from the prune stage's recorded metrics (the stage records data only).

matplotlib is imported lazily and is optional: without it the report has the tables and no plots.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def _pyplot():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def _finish(plt, fig, ax, xlabel: str, ylabel: str, path: Path) -> Path:
    """Labels, legend and layout, then the PNG written and the figure closed (pyplot keeps every open one)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_plans(plans: list[dict[str, Any]], sweep: list[dict[str, Any]], budget_ms: float, path: Path) -> Path | None:
    """MACs against measured latency of the candidate plans, the chosen one marked (a PNG)."""
    plt = _pyplot()
    if plt is None:
        return None
    fig, ax = plt.subplots(figsize=(6, 4))
    if sweep:
        ax.plot([100 * s["macs_fraction"] for s in sweep], [s["predicted_ms"] for s in sweep], "o:", color="grey",
                label="knapsack plans at other budgets (predicted)")
    for plan in plans:
        m = plan["measured_ms"]
        spread = [[m["p50_ms"] - m["spread_ms"][0]], [m["spread_ms"][1] - m["p50_ms"]]]
        chosen = plan.get("chosen")
        ax.errorbar([100 * plan["macs_fraction"]], [m["p50_ms"]], yerr=spread, fmt="*" if chosen else "o",
                    markersize=12 if chosen else 6, label=f"{plan['plan']} (measured)")
    ax.axhline(budget_ms, color="red", linestyle="--", linewidth=1, label="budget")
    xlabel, ylabel = "MACs (% of the unpruned network)", "latency on the device (ms)"
    return _finish(plt, fig, ax, xlabel, ylabel, path)


def plot_holdout(holdout: list[dict[str, Any]], path: Path) -> Path | None:
    """Predicted against measured latency of the plans the table was not fitted to (a PNG; y = x dashed)."""
    plt = _pyplot()
    if plt is None or not holdout:
        return None
    fig, ax = plt.subplots(figsize=(4.5, 4))
    measured = [h["measured_ms"]["p50_ms"] for h in holdout]
    predicted = [h["predicted_ms"] for h in holdout]
    ax.plot(measured, predicted, "o")
    for h, x, y in zip(holdout, measured, predicted):
        ax.annotate(h["plan"], (x, y), fontsize=6, xytext=(3, 3), textcoords="offset points")
    low, high = min(measured + predicted) * 0.9, max(measured + predicted) * 1.1
    ax.plot([low, high], [low, high], "--", color="grey", linewidth=1, label="prediction = measurement")
    xlabel, ylabel = "measured latency (ms)", "predicted by the table (ms)"
    return _finish(plt, fig, ax, xlabel, ylabel, path)
