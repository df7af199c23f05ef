"""The detection report's plots, as base64 PNG :class:`pipeline.report.sections.Figure` blocks (a plot with nothing to draw is
one line of text instead of an empty panel, as in the classification report)."""

from __future__ import annotations

from typing import Any

from device.errors import require
from pipeline.report.sections import Figure, Text, figure_png

CAPTIONS = {
    "map_latency": "Device mAP against end-to-end time per image, per rung and device: the dot is the network plus "
                   "decode + NMS, the line runs back to the network's time alone (what the post-processing adds); "
                   "vertical bars are the mAP's 95% interval over images.",
    "class_changes": "The INT8 fold's change in AP per class (points) with its paired 95% interval; red: beyond noise "
                     "after Holm's correction."}


def plots(ladder: dict[str, Any], deploy: dict[str, Any], quantize: dict[str, Any]) -> dict[str, Figure | Text]:
    """mAP against end-to-end latency per rung, and the INT8 fold's per-class AP changes."""
    matplotlib = require("matplotlib", "matplotlib", "pip install 'edgefold[build]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [(device["name"], rung, entry) for device in deploy["devices"]
                for rung, entry in device["rungs"].items() if entry.get("state") == "succeeded"
                and entry.get("network_ms_per_image") is not None and entry.get("postprocess_ms_per_image") is not None]
    figures: dict[str, Figure | Text] = {
        "map_latency": Figure("map_latency", figure_png(_map_latency(plt, measured)), CAPTIONS["map_latency"])
        if measured else Text("mAP against latency: not measured (no device scored a rung).")}
    changes = quantize.get("class_changes_vs_fp32") or []
    figures["class_changes"] = Figure("class_changes", figure_png(_class_changes(plt, changes)),
                                      CAPTIONS["class_changes"]) if changes else Text(
        "Per-class AP changes: not measured (the quantize stage recorded none).")
    return figures


def _arm(length: float) -> float:
    """An error bar's arm: a bootstrap percentile interval need not hold its point estimate, and a class with no
    resample that drew its boxes has none (NaN); matplotlib refuses negative arms and draws NaN as nothing."""
    return length if length == length and length > 0 else 0.0


def _map_latency(plt, measured: list[tuple[str, str, dict[str, Any]]]):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    devices = list(dict.fromkeys(name for name, _, _ in measured))
    for index, device in enumerate(devices):
        color = plt.cm.tab10(index % 10)
        rows = [(rung, entry) for name, rung, entry in measured if name == device]
        for number, (rung, entry) in enumerate(rows):
            scores = entry["scores"]
            network = entry["network_ms_per_image"]
            total = network + entry["postprocess_ms_per_image"]
            y = 100 * scores["map"]
            ax.plot([network, total], [y, y], color=color, linewidth=1, alpha=0.6)
            ax.errorbar(total, y, yerr=[[_arm(y - 100 * scores.get("map_low", scores["map"]))],
                                        [_arm(100 * scores.get("map_high", scores["map"]) - y)]],
                        fmt="o", color=color, capsize=3, label=device if number == 0 else None)
            ax.annotate(rung, (total, y), textcoords="offset points", xytext=(5, 4 if number % 2 else -11), fontsize=8)
    ax.set_xlabel("time per image, ms (network + decode + NMS; the line starts at the network alone)")
    ax.set_ylabel("device mAP@[.5:.95], points")
    ax.set_title("mAP against end-to-end latency")
    ax.legend(title="device", fontsize=8)
    ax.grid(True, alpha=0.3)
    return fig


def _class_changes(plt, changes: list[dict[str, Any]]):
    fig, ax = plt.subplots(figsize=(7, 3.8))
    x = range(len(changes))
    values = [r["change_points"] for r in changes]
    errors = [[_arm(r["change_points"] - r["change_low"]) for r in changes],
              [_arm(r["change_high"] - r["change_points"]) for r in changes]]
    ax.bar(x, values, yerr=errors, capsize=3, color=["tab:red" if r["significant"] else "tab:grey" for r in changes])
    ax.axhline(0, color="black", linewidth=0.8)
    ax.set_xticks(list(x), [r["class"] for r in changes])
    ax.set_xlabel("class (largest drop first)")
    ax.set_ylabel("AP change INT8 − FP32, points")
    ax.set_title("The INT8 fold, per class")
    ax.grid(True, axis="y", alpha=0.3)
    return fig
