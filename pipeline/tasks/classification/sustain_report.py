"""The report's "After N minutes": each device's sustained run (``deploy.sustained``, ``edgefold sustain``; measured by
:mod:`device.sustain`) — the burst figure (the first interval) against the settled one (the last third's median
with its interval), their ratio, the first throttle signal and its cause, the peak temperatures, energy per image
settled against burst — a figure of latency, GPU clock and temperature over time with the throttle moment marked, and
the headline's line when the settled latency is measurably worse. A library of the classification report.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from device.errors import EdgeFoldError
from device.schema import parse_result
from pipeline import stats
from pipeline.results import interval_cell
from pipeline.sections import Figure, Section, Table, Text

SUSTAINED_COLUMNS = ("sustained_minutes", "sustained_burst_p50_ms", "sustained_settled_p50_ms",
                     "sustained_settled_p50_ms_low", "sustained_settled_p50_ms_high", "sustained_ratio",
                     "sustained_ratio_low", "sustained_ratio_high", "sustained_throttle_s", "sustained_throttle_cause",
                     "sustained_burst_energy_mj", "sustained_settled_energy_mj", "sustained_peak_temp_c")
MIN_SETTLED = 3  # settled intervals, at least, before the headline calls the settled latency worse
TEXT = ("One rung run without pause on each device, recorded interval by interval after the ladder's windows. Burst: "
        "the first interval's p50. Settled: the median of the last third's interval p50s, with its 95% interval over "
        "them; the ratio's interval spans the settled one and the burst's own (over its calls). A throttle signal is a thermal "
        "zone at or past a passive trip point (the kernel's thermal_zone*/trip_point_*), NVML's clock-event reasons, or "
        "a GPU clock under 95% of the first interval's.")


def burst_and_settled(intervals: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The burst (first interval) and settled (the last third, rounded up) figures of a run's intervals, and their
    ratio. The ratio's interval spans both figures' intervals (the settled one over the last third's interval p50s,
    the burst's over its own calls): settled low over burst high to settled high over burst low."""
    first = intervals[0]
    burst, burst_low, burst_high = (first["latency_p50_ms"], first.get("latency_p50_low_ms", first["latency_p50_ms"]),
                                    first.get("latency_p50_high_ms", first["latency_p50_ms"]))
    tail = intervals[len(intervals) - math.ceil(len(intervals) / 3):]
    settled, low, high = stats.median_interval([interval["latency_p50_ms"] for interval in tail])
    energies = [interval["energy_mj_per_image"] for interval in tail if interval.get("energy_mj_per_image") is not None]
    temps = [interval[key] for interval in intervals for key in ("gpu_temp_c", "hottest_c")
             if interval.get(key) is not None]
    return {"burst": burst, "settled": settled, "settled_low": low, "settled_high": high, "ratio": settled / burst,
            "ratio_low": low / burst_high, "ratio_high": high / burst_low, "settled_intervals": len(tail),
            "burst_energy": first.get("energy_mj_per_image"),
            "settled_energy": stats.median_interval(energies)[0] if energies else None,
            "peak_temp": max(temps) if temps else None}


def sustained_runs(devices: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Each device's sustained run as the report shows it (or why it has none)."""
    runs = []
    for device in devices:
        record = device.get("sustained")
        if record is None:
            continue
        run = {"device": device["name"], "rung": record["rung"], "state": record["state"], "error": record.get("error")}
        if record["state"] == "succeeded":
            try:
                sustained = parse_result(record["result"], f"{device['name']}'s sustained run").sustained
            except EdgeFoldError as err:
                runs.append({**run, "state": "failed", "error": err.message})
                continue
            data = sustained.model_dump()
            run.update(minutes=sustained.spec.minutes, started_at=sustained.started_at, intervals=data["intervals"],
                       trip_points=data["trip_points"],
                       first_throttle_s=sustained.first_throttle_s, throttle_cause=sustained.throttle_cause,
                       throttle_text=sustained.throttle_text, stopped_early=sustained.stopped_early,
                       not_measured=sustained.not_measured,
                       **(burst_and_settled(data["intervals"]) if data["intervals"] else {}))
        runs.append(run)
    return runs


def join_rows(runs: Sequence[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Each run's figures on its rung's row of its device (results.json and results.csv)."""
    for run in runs:
        row = next((r for r in rows if r["rung"] == run["rung"] and r["device"] == run["device"]), None)
        if row is None or "burst" not in run:
            continue
        row.update(sustained_minutes=run["minutes"], sustained_burst_p50_ms=run["burst"],
                   sustained_settled_p50_ms=run["settled"], sustained_settled_p50_ms_low=run["settled_low"],
                   sustained_settled_p50_ms_high=run["settled_high"], sustained_ratio=run["ratio"],
                   sustained_ratio_low=run["ratio_low"], sustained_ratio_high=run["ratio_high"],
                   sustained_throttle_s=run["first_throttle_s"], sustained_throttle_cause=run["throttle_cause"],
                   sustained_burst_energy_mj=run["burst_energy"], sustained_settled_energy_mj=run["settled_energy"],
                   sustained_peak_temp_c=run["peak_temp"])


def headline_text(runs: Sequence[dict[str, Any]]) -> str | None:
    """The headline's line for the first run whose settled latency is measurably above its burst (its ratio's
    interval above 1, over at least :data:`MIN_SETTLED` settled intervals), else None."""
    for run in runs:
        if "burst" in run and run["ratio_low"] > 1 and run["settled_intervals"] >= MIN_SETTLED:
            when = (f"after {run['first_throttle_s'] / 60:.1f} min the {run['throttle_cause']} throttled it"
                    if run["first_throttle_s"] is not None else "with no throttle signal")
            return (f"{run['rung']} on {run['device']}: {when}; p50 settled {run['ratio']:.2f}× "
                    f"[{run['ratio_low']:.2f}, {run['ratio_high']:.2f}] above the first interval "
                    f"({run['settled']:.3f} vs {run['burst']:.3f} ms)")
    return None


def _mj(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def section(runs: Sequence[dict[str, Any]], figures: dict[str, Any] | None) -> Section:
    """The section: what is measured, one row per device, each device's figure, and what was not measured."""
    measured = [run for run in runs if "burst" in run]
    minutes = max((run["minutes"] for run in measured), default=None)
    table = [["rung", "device", "minutes", "burst p50 ms", "settled p50 ms [95% CI]", "settled ÷ burst [95% CI]",
              "first throttle", "peak °C", "mJ/image burst → settled"]] + [
        [run["rung"], run["device"], f"{run['minutes']:g}", f"{run['burst']:.3f}",
         interval_cell(run["settled"], run["settled_low"], run["settled_high"], ".3f"),
         interval_cell(run["ratio"], run["ratio_low"], run["ratio_high"], ".2f"), run["throttle_text"],
         "—" if run["peak_temp"] is None else f"{run['peak_temp']:.1f}",
         f"{_mj(run['burst_energy'])} → {_mj(run['settled_energy'])}"]
        for run in measured]
    blocks: list = [Text(TEXT), *([Table(table)] if measured else [])]
    for run in measured:
        shown = (figures or {}).get(f"sustained:{run['device']}")
        if shown is not None:
            blocks.append(shown if isinstance(shown, (Figure, Text)) else Figure(
                f"sustained:{run['device']}", shown, f"{run['rung']} on {run['device']}: p50 latency, GPU clock and "
                                                     "the hottest zone per interval; the first throttle signal marked."))
        for note in run["not_measured"]:
            blocks.append(Text(f"Not measured on {run['device']}: {note}."))
        if run["stopped_early"]:
            blocks.append(Text(f"{run['device']}: {run['stopped_early']}."))
    blocks += [Text(f"No sustained run on {run['device']}: {run['error']}.") for run in runs if "burst" not in run]
    return Section(f"After {minutes:g} minutes" if minutes else "After minutes without pause", blocks)


def plot(plt, run: dict[str, Any]) -> str:
    """Latency, GPU clock and the hottest zone over the run, one panel each on one time axis; the first throttle
    signal marked on all three."""
    from pipeline.sections import figure_png

    intervals = run["intervals"]
    minutes = [interval["end_s"] / 60 for interval in intervals]
    panels = [(key, label, color) for key, label, color in (
        ("latency_p50_ms", "p50 ms", "tab:blue"), ("gpu_clock_mhz", "GPU MHz", "tab:green"),
        ("hottest_c", "hottest °C", "tab:red")) if any(i.get(key) is not None for i in intervals)]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(8, 1.3 + 1.2 * len(panels)), squeeze=False)
    for ax, (key, label, color) in zip(axes[:, 0], panels):
        ax.plot(minutes, [float("nan") if i.get(key) is None else i[key] for i in intervals], color=color, marker=".")
        ax.set_ylabel(label, fontsize=8)
        if run["first_throttle_s"] is not None:
            ax.axvline(run["first_throttle_s"] / 60, color="black", linestyle="--", linewidth=1)
    axes[0, 0].set_title("first throttle signal: dashed" if run["first_throttle_s"] is not None
                         else "no throttle signal", fontsize=8)
    axes[-1, 0].set_xlabel("minutes")
    fig.tight_layout()
    return figure_png(fig)
