"""The classification report's plots (PNG, embedded in report.html): accuracy against latency with the front,
energy per image, the power traces and the power-mode fronts; a plot with nothing measured is a line of text."""

from __future__ import annotations

from typing import Any

from device.errors import require
from pipeline import perclass
from pipeline.report.profile_report import NOT_MEASURED
from pipeline.report.sections import Text, figure_png
from pipeline.tasks.classification.report_data import no_score, pareto_front
from pipeline.deploy.frame_report import frame_plot, framed
from pipeline.deploy.sustain_report import plot as sustain_plot


def accuracy_front(rows: list[dict[str, Any]]) -> set[str]:
    """The rungs on one device's accuracy–latency Pareto front; a rung with no score is never on it."""
    return pareto_front((r["rung"], r["latency_p50_ms"], r["top1"]) for r in rows if not no_score(r))


def plots(data: dict[str, Any]) -> dict[str, str | Text]:
    """Base64 PNGs: accuracy against latency with the Pareto front, energy per rung, power traces; a plot
    with nothing measured is one line of text instead of an empty panel."""
    matplotlib = require("matplotlib", "matplotlib", "pip install 'edgefold[build]'")
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in data["rows"] if r["status"] == "measured" and r.get("latency_p50_ms") is not None]
    devices = list(dict.fromkeys(r["device"] for r in data["rows"]))
    colors = {d: plt.cm.tab10(i % 10) for i, d in enumerate(devices)}
    figures: dict[str, str | Text] = {"accuracy_latency": _accuracy_latency_plot(plt, measured, devices, colors)
                                      if measured else Text(f"Accuracy against latency: {NOT_MEASURED} (no device "
                                                            "measured a rung).")}

    energies = [r for r in data["rows"] if r.get("energy_mj_per_image") is not None]
    figures["energy"] = _energy_plot(plt, data, devices, colors) if energies else Text(
        f"Energy per inference: {NOT_MEASURED} (no device reported power: jtop on a Jetson, NVML on a GPU server).")
    figures["power"] = _power_plot(plt, data["power_traces"]) if data["power_traces"] else Text(
        f"Power over each job's window: {NOT_MEASURED} (no device reported power).")
    if data.get("per_class"):
        figures["per_class"] = figure_png(perclass.plot(data["per_class"]))
    if framed(data["rows"]):
        figures["frame:parts"] = frame_plot(plt, data["rows"])
    drawn = [run for run in data.get("sustained") or [] if run.get("intervals")]
    for device in dict.fromkeys(run["device"] for run in drawn):
        figures[f"sustained:{device}"] = sustain_plot(plt, [run for run in drawn if run["device"] == device])
    for device in dict.fromkeys(f["device"] for f in data.get("power_fronts") or []):
        fronts = [f for f in data["power_fronts"] if f["device"] == device]
        drawable = any(p["energy_mj_per_image"] is not None for f in fronts for p in f["settings"])
        figures[f"power_front:{device}"] = _power_front_plot(plt, fronts) if drawable else Text(
            f"Energy against latency on {device}: {NOT_MEASURED} (no sweep setting reported power).")
    return figures


def _power_front_plot(plt, fronts: list[dict[str, Any]]) -> str:
    """Energy per image against p50 latency (front joined, dominated settings faded, degraded hollow), and
    throughput against mean power beside it, one colour per rung."""
    fig, (ax, side) = plt.subplots(1, 2, figsize=(10, 4.2))
    for index, front in enumerate(fronts):
        color = plt.cm.tab10(index % 10)
        settings = [p for p in front["settings"] if p["energy_mj_per_image"] is not None]
        for p in settings:
            xerr = [[p["latency_p50_ms"] - (p["latency_p50_ms_low"] or p["latency_p50_ms"])],
                    [(p["latency_p50_ms_high"] or p["latency_p50_ms"]) - p["latency_p50_ms"]]]
            yerr = [[p["energy_mj_per_image"] - (p["energy_mj_per_image_low"] or p["energy_mj_per_image"])],
                    [(p["energy_mj_per_image_high"] or p["energy_mj_per_image"]) - p["energy_mj_per_image"]]]
            ax.errorbar(p["latency_p50_ms"], p["energy_mj_per_image"], xerr=xerr, yerr=yerr, fmt="o",
                        color=color, alpha=1.0 if p["on_front"] else 0.3, mfc="none" if p["degraded"] else color,
                        capsize=2, elinewidth=0.8)
            ax.annotate(f"{p['mode'] or 'current'} b{p['batch_size']}", (p["latency_p50_ms"], p["energy_mj_per_image"]),
                        textcoords="offset points", xytext=(4, 3), fontsize=7, alpha=1.0 if p["on_front"] else 0.5)
        line = sorted((p for p in settings if p["on_front"]), key=lambda p: p["latency_p50_ms"])
        ax.plot([p["latency_p50_ms"] for p in line], [p["energy_mj_per_image"] for p in line], color=color,
                linestyle="--", linewidth=1, label=front["rung"])
        watts = [p for p in front["settings"] if p["power_mean_w"] is not None and p["throughput_images_per_s"]]
        side.scatter([p["power_mean_w"] for p in watts], [p["throughput_images_per_s"] for p in watts], color=color,
                     label=front["rung"], s=25)
    ax.set_xlabel("latency p50, ms")
    ax.set_ylabel("energy per image, mJ")
    ax.set_title("The energy–latency front (--- joins it)")
    ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    side.set_xlabel("mean power, W")
    side.set_ylabel("throughput, images/s")
    side.set_title("Throughput against power")
    side.grid(True, alpha=0.3)
    fig.tight_layout()
    return figure_png(fig)


def _accuracy_latency_plot(plt, measured: list[dict[str, Any]], devices: list[str], colors: dict) -> str:
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for device in devices:
        device_rungs = [r for r in measured if r["device"] == device]
        if not device_rungs:
            continue
        front = accuracy_front(device_rungs)
        # The latency's 95% interval over the interleaved windows, as horizontal error bars.
        lows = [r["latency_p50_ms"] - (r.get("latency_p50_low_ms") or r["latency_p50_ms"]) for r in device_rungs]
        highs = [(r.get("latency_p50_high_ms") or r["latency_p50_ms"]) - r["latency_p50_ms"] for r in device_rungs]
        ax.errorbar([r["latency_p50_ms"] for r in device_rungs], [100 * r["top1"] for r in device_rungs], xerr=[lows, highs],
                    fmt="none", ecolor=colors[device], elinewidth=1, capsize=3, zorder=2)
        ax.scatter([r["latency_p50_ms"] for r in device_rungs], [100 * r["top1"] for r in device_rungs], color=colors[device],
                   label=device, s=40, zorder=3)
        on_front = sorted((r for r in device_rungs if r["rung"] in front), key=lambda r: r["latency_p50_ms"])
        ax.plot([r["latency_p50_ms"] for r in on_front], [100 * r["top1"] for r in on_front], color=colors[device],
                linestyle="--", linewidth=1, zorder=2)
        for index, r in enumerate(device_rungs):  # alternate label offsets: neighbouring rungs often sit close
            ax.annotate(r["rung"] + (" ★" if r["rung"] in front else " (no score)" if no_score(r) else ""),
                        (r["latency_p50_ms"], 100 * r["top1"]),
                        textcoords="offset points", xytext=(5, 4 if index % 2 else -11), fontsize=8)
    latencies = [r["latency_p50_ms"] for r in measured]
    log_scale = max(latencies) / max(min(latencies), 1e-9) >= 10  # a log axis only when the range needs one
    if log_scale:
        ax.set_xscale("log")
    ax.legend(title="device (--- Pareto front, ★ on it)", fontsize=8)
    ax.set_xlabel(f"latency p50, ms (batch {measured[0]['latency_batch']}{', log scale' if log_scale else ''})")
    ax.set_ylabel("top-1 accuracy, %")
    ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # never "1e-7+2e1" when rungs score alike
    ax.set_title("Accuracy against latency")
    ax.grid(True, alpha=0.3)
    return figure_png(fig)


def _energy_plot(plt, data: dict[str, Any], devices: list[str], colors: dict) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    rungs = list(data["rungs"])
    width = 0.8 / max(1, len(devices))
    for i, device in enumerate(devices):
        for j, rung in enumerate(rungs):
            row = next((r for r in data["rows"] if r["device"] == device and r["rung"] == rung), None)
            x = j + (i - (len(devices) - 1) / 2) * width
            value = row.get("energy_mj_per_image") if row else None
            if value is None:
                ax.text(x, 0, "n/m", ha="center", va="bottom", fontsize=7, rotation=90, color="grey")
                continue
            ax.bar(x, value, width=width, color=colors[device], label=device if j == 0 else None)
    ax.set_xticks(range(len(rungs)), rungs)
    ax.set_ylabel("energy per image, mJ")
    ax.set_title("Energy per inference")
    ax.legend(fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    return figure_png(fig)


def _power_plot(plt, traces: list[dict[str, Any]]) -> str:
    fig, ax = plt.subplots(figsize=(7, 3.8))
    for trace in traces:
        line, = ax.plot(trace["t_s"], [v / 1e3 for v in trace["mw"]], linewidth=1,
                        label=f"{trace['device']} {trace['rung']} b{trace['batch_size']}")
        if trace.get("idle_mw") is not None:
            ax.axhline(trace["idle_mw"] / 1e3, color=line.get_color(), linestyle=":", linewidth=0.8)
    ax.legend(fontsize=7, ncol=2, title="dotted: idle baseline", title_fontsize=7)
    ax.set_xlabel("time in the timed window, s")
    ax.set_ylabel("power, W")
    ax.set_title("Power over each job's window")
    ax.grid(True, alpha=0.3)
    return figure_png(fig)


PLOT_CAPTIONS = {
    "accuracy_latency": "Accuracy against latency per device, with the latency's 95% interval over the interleaved "
                        "windows; the dashed line joins the Pareto front (collapsed or chance-level rungs are "
                        "never on it).",
    "energy": "Energy per image per rung and device (n/m: not measured).",
    "power": "Power over each job's timed window; dotted lines are the idle baselines.",
    "per_class": "Accuracy on each class's test images, per rung: where the fold cost most."}
