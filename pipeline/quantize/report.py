"""The report's INT8 ladder, for every task: what each step scored, and — when the mixed-precision step ran — the
layers kept out of INT8 (FP16 in the graph, or FP32 where the recipe keeps float layers FP32), what each buys back,
what they cost, and the sensitivity of every quantized layer as a plot.
A library: both tasks' reports add :func:`int8_section` and record :func:`quantize_summary` in results.json.
"""

from __future__ import annotations

import base64
from pathlib import Path
from typing import Any, Callable

from pipeline.report.sections import Figure, Section, Table, Text

PLOTTED_LAYERS = 24


def quantize_summary(metrics: dict[str, Any]) -> dict[str, Any]:
    """What results.json records of the quantize stage: the accepted step, its drop, the layers kept out of INT8 and
    their precision (none when everything is INT8) and every step's score."""
    attempts = metrics.get("attempts") or []
    accepted = attempts[-1] if attempts else {}
    return {"quantizer": accepted.get("quantizer"), "method": metrics.get("method"),
            "drop_points": metrics.get("drop_points"),
            "kept_layers": [layer["layer"] for layer in accepted.get("kept_layers", ())],
            "kept_precision": accepted.get("kept_precision"), "kept_macs_fraction": accepted.get("kept_macs_fraction"),
            "attempts": [{"quantizer": a["quantizer"], "method": a["method"], "value": a.get("value"),
                          "drop_points": a.get("drop_points")} for a in attempts]}


def _mmacs(macs: int) -> str:
    return f"{macs / 1e6:.3f}"


def int8_section(metrics: dict[str, Any], metric: str, shown: Callable[[float], str],
                 out_dir: Path | None = None, profiles: list[dict[str, Any]] | None = None) -> list[Section]:
    """The "INT8 ladder" section from the quantize stage's metrics (none for a run without attempts).

    Args:
        metric: The gated score's name (``top-1``, ``mAP``).
        shown: A score as the report shows it.
        out_dir: Where the sensitivity plot is written beside the report (None: no plot, e.g. report.md alone).
        profiles: The INT8 rung's per-layer profiles, one per device (``device``, ``runtime``, ``profile``): what the
            kept layers cost there in time.
    """
    attempts = metrics.get("attempts") or []
    if not attempts:
        return []
    rows = [["step", f"INT8 {metric}", "change vs FP32, points", "layers kept out of INT8", "accepted"]]
    for index, attempt in enumerate(attempts):
        rows.append([f"{attempt['quantizer']}/{attempt['method']}",
                     shown(attempt["value"]) if attempt.get("value") is not None else "—",
                     f"{-attempt['drop_points'] + 0.0:+.2f}", str(len(attempt.get("kept_layers") or [])),
                     "yes" if index == len(attempts) - 1 and metrics.get("method") == attempt["method"] else "no"])
    blocks: list = [Text("Each step the ladder tried, in order, scored against the FP32 student on the test split; "
                         "the first within the budget is the INT8 rung."), Table(rows)]
    mixed = next((a for a in attempts if a["method"] == "mixed"), None)
    if mixed:
        blocks += _mixed_blocks(mixed, metric, shown, out_dir)
        priced = [line for entry in profiles or [] if (line := kept_time_text(
            [layer["layer"] for layer in mixed.get("kept_layers") or []], entry))]
        if priced:
            blocks.append(Text("What the kept layers cost in time, from the INT8 rung's per-layer profile on each "
                               "device (the latency batch): " + "; ".join(priced) + "."))
    return [Section("The INT8 ladder", blocks)]


def kept_time_text(kept: list[str], entry: dict[str, Any]) -> str | None:
    """One device's price of the kept layers: their share of the INT8 rung's profiled time, or why it has none.

    A profile layer is counted when it is one of the kept ONNX nodes or a fusion of them (TensorRT joins fused layers'
    names with `` + ``); a fusion that also holds quantized layers, or a Myelin subgraph (``{ForeignNode[…]}``),
    cannot be split, and is said to be so.
    """
    profile = entry.get("profile")
    if not kept or not profile or not profile.get("batches"):
        return None
    from pipeline.report.profile_report import shown_batch

    batch = shown_batch(profile)
    wanted = set(kept)
    alone, mixed_in, found, priced = 0.0, 0, set(), set()
    for layer in batch["layers"]:
        parts = set(layer["name"].split(" + "))
        if parts & wanted:
            found |= parts & wanted
            if parts <= wanted:
                alone += layer["time_ms"]
                priced |= parts
            else:
                mixed_in += 1
    total = batch.get("total_ms") or 0.0
    where = f"{entry['device']} ({entry.get('runtime')}, batch {batch['batch_size']})"
    if not found:
        return f"{where}: none of the kept layers is named in its profile (fused into subgraphs it cannot split)"
    text = (f"{where}: {alone:.3f} ms of {total:.3f} ms per inference ({100 * alone / total if total else 0:.1f}%) in "
            f"{len(priced)} of the {len(kept)} kept layers")
    return text + (f"; {mixed_in} fusion(s) of kept and INT8 layers not priced" if mixed_in else "")


def _mixed_blocks(mixed: dict[str, Any], metric: str, shown: Callable[[float], str],
                  out_dir: Path | None) -> list:
    kept = mixed.get("kept_layers") or []
    precision = (mixed.get("kept_precision") or "fp16").upper()
    distortion = mixed.get("candidate_distortion") or 0.0
    source = mixed.get("held_out_source") or "the calibration split"
    held = (f"{mixed['held_out_images']} images held apart from calibration ({source}; the candidates were "
            f"calibrated on the other {mixed['calibration_images']}; the FP32 student scores "
            f"{shown(mixed['held_out_fp32'])} there)")
    found = ("the fewest that met the budget there" if mixed.get("met_on_held_out")
             else "the most the recipe allows (quantize.mixed_precision.max_layers); even these missed the budget there")
    text = (f"Mixed precision on {mixed['base_method']} calibration (of those tried, the candidate closest to the FP32 "
            f"student on the held-out images): each quantized layer was returned to float alone and the student run on "
            f"{held}. A layer's figure is how much of the INT8 candidate's distortion ({distortion:.3g}) disappears "
            f"when only that layer is float; the figures do not add up. The {len(kept)} most sensitive are kept in "
            f"{precision} — {found} — costing {100 * (mixed.get('kept_macs_fraction') or 0):.2f}% of the student's "
            f"MACs in {precision} instead of INT8.")
    layers = [["layer", "op", "distortion removed when only it is float", f"MMACs per image in {precision}"]]
    for layer in kept:
        share = layer["bought_back"] / distortion if distortion else 0.0
        layers.append([layer["layer"], layer["op_type"], f"{100 * share:.1f}%", _mmacs(layer["macs"])])
    probes = [[f"layers kept in {precision} (k)", f"held-out {metric}", "change vs FP32, points", "within the budget"]]
    for probe in mixed.get("probes") or []:
        probes.append([str(probe["k"]), shown(probe["value"]), f"{-probe['drop_points'] + 0.0:+.2f}",
                       "yes" if probe["within"] else "no"])
    blocks: list = [Text(text), Table(layers), Text("k was found by bisection on the held-out images (never the test "
                                                    "split); each k tried:"), Table(probes)]
    plot = sensitivity_plot(mixed.get("sensitivity") or [], len(kept), distortion, out_dir / "int8_sensitivity.png") \
        if out_dir is not None else None
    if plot is not None:
        blocks.append(Figure("int8 sensitivity", base64.b64encode(plot.read_bytes()).decode("ascii"),
                             "The distortion removed when only that quantized layer is float, most sensitive first; "
                             "the layers kept out of INT8 in orange.", file=plot.name))
    return blocks


def sensitivity_plot(ranking: list[dict[str, Any]], kept: int, distortion: float, path: Path) -> Path | None:
    """A bar per quantized layer (the most sensitive PLOTTED_LAYERS), its share of the distortion bought back."""
    if not ranking:
        return None
    from device.errors import require

    matplotlib = require("matplotlib", "matplotlib", "pip install 'edgefold[build]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = ranking[:PLOTTED_LAYERS]
    shares = [100 * layer["bought_back"] / distortion if distortion else 0.0 for layer in shown]
    fig, ax = plt.subplots(figsize=(7, 0.6 + 0.22 * len(shown)))
    ax.barh(range(len(shown)), shares, color=["tab:orange" if i < kept else "tab:blue" for i in range(len(shown))])
    ax.set_yticks(range(len(shown)), [layer["layer"][-40:] for layer in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("INT8 distortion removed when only this layer is float, % of the candidate's")
    ax.set_title(f"Per-layer INT8 sensitivity ({len(ranking)} quantized layers"
                 + (f", the first {len(shown)} shown)" if len(ranking) > len(shown) else ")"))
    ax.grid(True, axis="x", alpha=0.3)
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)
    return path
