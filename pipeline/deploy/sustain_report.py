"""The report's "After N minutes": each device's sustained run (``deploy.sustained``, ``edgefold sustain``; measured by
:mod:`device.jobs.sustain`) — the burst figure (the first interval) against the settled one (the last third's median
with its interval), their ratio, the first throttle signal and its cause, the peak temperatures, energy per image
settled against burst — a figure of latency, GPU clock and temperature over time with the throttle moment marked, and
the headline's line when the settled latency is measurably worse. Every task's report shows it the same way.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from device.errors import EdgeFoldError
from device.schema import parse_result
from pipeline import stats
from pipeline.report.results import interval_cell
from pipeline.report.sections import Figure, Section, Table, Text

SUSTAINED_COLUMNS = ("sustained_minutes", "sustained_burst_p50_ms", "sustained_settled_p50_ms",
                     "sustained_settled_p50_ms_low", "sustained_settled_p50_ms_high", "sustained_ratio",
                     "sustained_ratio_low", "sustained_ratio_high", "sustained_throttle_s", "sustained_throttle_cause",
                     "sustained_burst_energy_mj", "sustained_settled_energy_mj", "sustained_peak_temp_c",
                     "sustained_setting")
MIN_SETTLED = 3  # settled intervals, at least, before the headline calls the settled latency worse
TEXT = ("One rung run without pause on each device (under each sweep setting, when swept: one row each, in the order "
        "run, the mode found restored after), recorded interval by interval after the ladder's windows. Burst: the "
        "first interval's p50. Settled: the median of the last third's interval p50s, with its 95% interval over them; "
        "the ratio's interval spans the settled one and the burst's own (over its calls). A throttle signal is a "
        "thermal zone at or past a passive trip point (the kernel's thermal_zone*/trip_point_*), NVML's clock-event "
        "reasons, or a GPU clock under 95% of the first interval's. Start → peak °C: the hottest zone when the run "
        "started (a setting run after another starts on its heat unless cool_below_c waited) and the peak in it.")


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
    """Each device's sustained runs as the report shows them, one per swept setting (``setting``: its label, None
    under the mode found), or why it has none."""
    runs = []
    for device in devices:
        record = device.get("sustained")
        if record is None:
            continue
        run = {"device": device["name"], "rung": record["rung"], "state": record["state"], "error": record.get("error")}
        if record["state"] != "succeeded":
            runs.append(run)
            continue
        try:
            result = parse_result(record["result"], f"{device['name']}'s sustained run")
        except EdgeFoldError as err:
            runs.append({**run, "state": "failed", "error": err.message})
            continue
        sweep = result.sweep
        sweep_notes = ([sweep.note] if sweep and sweep.note else []) + [
            f"{item.nvpmodel_name}{_clocks(item.jetson_clocks)} not run: {item.reason}"
            for item in (sweep.not_measured if sweep else [])]
        for index, sustained in enumerate([result.sustained, *result.more_sustained]):
            data, setting = sustained.model_dump(), sustained.power_setting
            runs.append({**run, "minutes": sustained.spec.minutes, "started_at": sustained.started_at,
                         "setting": None if setting is None else setting.label() + _clocks(setting.jetson_clocks),
                         "intervals": data["intervals"], "trip_points": data["trip_points"],
                         "first_throttle_s": sustained.first_throttle_s, "throttle_cause": sustained.throttle_cause,
                         "throttle_text": sustained.throttle_text, "stopped_early": sustained.stopped_early,
                         "not_measured": sustained.not_measured if index == 0 else [],
                         "start_hottest_c": sustained.start_hottest_c, "cooling": sustained.cooling,
                         "sweep_notes": sweep_notes if index == 0 else [],
                         **(burst_and_settled(data["intervals"]) if data["intervals"] else {})})
    return runs


def _clocks(jetson_clocks: bool | None) -> str:
    return "" if jetson_clocks is None else f", jetson_clocks {'on' if jetson_clocks else 'off'}"


def join_rows(runs: Sequence[dict[str, Any]], rows: list[dict[str, Any]]) -> None:
    """Each device's first measured run's figures on its rung's row (results.json and results.csv; a sustained
    sweep's first setting, named in ``sustained_setting``; results.json's ``sustained`` has every setting)."""
    for run in runs:
        row = next((r for r in rows if r["rung"] == run["rung"] and r["device"] == run["device"]), None)
        if row is None or "burst" not in run or "sustained_minutes" in row:
            continue
        row.update(sustained_minutes=run["minutes"], sustained_burst_p50_ms=run["burst"],
                   sustained_settled_p50_ms=run["settled"], sustained_settled_p50_ms_low=run["settled_low"],
                   sustained_settled_p50_ms_high=run["settled_high"], sustained_ratio=run["ratio"],
                   sustained_ratio_low=run["ratio_low"], sustained_ratio_high=run["ratio_high"],
                   sustained_throttle_s=run["first_throttle_s"], sustained_throttle_cause=run["throttle_cause"],
                   sustained_burst_energy_mj=run["burst_energy"], sustained_settled_energy_mj=run["settled_energy"],
                   sustained_peak_temp_c=run["peak_temp"], sustained_setting=run["setting"])


def headline_text(runs: Sequence[dict[str, Any]]) -> str | None:
    """The headline's line for the first run whose settled latency is measurably above its burst (its ratio's
    interval above 1, over at least :data:`MIN_SETTLED` settled intervals), else None."""
    for run in runs:
        if "burst" in run and run["ratio_low"] > 1 and run["settled_intervals"] >= MIN_SETTLED:
            when = (f"after {run['first_throttle_s'] / 60:.1f} min the {run['throttle_cause']} throttled it"
                    if run["first_throttle_s"] is not None else "with no throttle signal")
            where = f" ({run['setting']})" if run.get("setting") else ""
            return (f"{run['rung']} on {run['device']}{where}: {when}; p50 settled {run['ratio']:.2f}× "
                    f"[{run['ratio_low']:.2f}, {run['ratio_high']:.2f}] above the first interval "
                    f"({run['settled']:.3f} vs {run['burst']:.3f} ms)")
    return None


def _mj(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def section(runs: Sequence[dict[str, Any]], figures: dict[str, Any] | None) -> Section:
    """The section: what is measured, one row per device and setting, each device's figure, and what was not
    measured."""
    measured = [run for run in runs if "burst" in run]
    minutes = max((run["minutes"] for run in measured), default=None)
    swept = any(run["setting"] for run in measured)
    table = [["rung", "device", *(["setting"] if swept else []), "minutes", "burst p50 ms", "settled p50 ms [95% CI]",
              "settled ÷ burst [95% CI]", "first throttle", "start → peak °C", "mJ/image burst → settled"]] + [
        [run["rung"], run["device"], *([run["setting"] or "as found"] if swept else []), f"{run['minutes']:g}",
         f"{run['burst']:.3f}", interval_cell(run["settled"], run["settled_low"], run["settled_high"], ".3f"),
         interval_cell(run["ratio"], run["ratio_low"], run["ratio_high"], ".2f"), run["throttle_text"],
         f"{_temp(run['start_hottest_c'])} → {_temp(run['peak_temp'])}",
         f"{_mj(run['burst_energy'])} → {_mj(run['settled_energy'])}"]
        for run in measured]
    blocks: list = [Text(TEXT), *([Table(table)] if measured else [])]
    for device in dict.fromkeys(run["device"] for run in measured):
        shown = (figures or {}).get(f"sustained:{device}")
        rung = next(run["rung"] for run in measured if run["device"] == device)
        if shown is not None:
            blocks.append(shown if isinstance(shown, (Figure, Text)) else Figure(
                f"sustained:{device}", shown, f"{rung} on {device}: p50 latency, GPU clock and the hottest zone per "
                                              "interval (one line per setting); the first throttle signal marked."))
    for run in runs:  # what each run says, measured or not
        on = run["device"] + (f" ({run['setting']})" if run.get("setting") else "")
        blocks += [Text(f"Not measured on {run['device']}: {note}.") for note in run.get("not_measured", [])]
        blocks += [Text(f"Sweep on {run['device']}: {note}.") for note in run.get("sweep_notes", [])]
        if "burst" not in run:
            why = run.get("error") or run.get("stopped_early") or "no interval recorded"
            blocks.append(Text(f"No sustained run on {on}: {why}."))
            continue
        blocks += [Text(f"{on}: {said}.") for said in (run["cooling"], run["stopped_early"]) if said]
    return Section(f"After {minutes:g} minutes" if minutes else "After minutes without pause", blocks)


def _temp(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def plot(plt, runs: Sequence[dict[str, Any]]) -> str:
    """One device's runs: latency, GPU clock and the hottest zone over each run, one panel each on one time axis, one
    line per setting; each run's first throttle signal marked on all three in its colour."""
    from pipeline.report.sections import figure_png

    panels = [(key, label) for key, label in (("latency_p50_ms", "p50 ms"), ("gpu_clock_mhz", "GPU MHz"),
                                              ("hottest_c", "hottest °C"))
              if any(i.get(key) is not None for run in runs for i in run["intervals"])]
    fig, axes = plt.subplots(len(panels), 1, sharex=True, figsize=(8, 1.3 + 1.2 * len(panels)), squeeze=False)
    for index, run in enumerate(runs):
        color = f"C{index}"
        minutes = [interval["end_s"] / 60 for interval in run["intervals"]]
        for ax, (key, label) in zip(axes[:, 0], panels):
            ax.plot(minutes, [float("nan") if i.get(key) is None else i[key] for i in run["intervals"]], color=color,
                    marker=".", label=run.get("setting") or "as found")
            ax.set_ylabel(label, fontsize=8)
            if run["first_throttle_s"] is not None:
                ax.axvline(run["first_throttle_s"] / 60, color=color, linestyle="--", linewidth=1)
    if len(runs) > 1:
        axes[0, 0].legend(fontsize=7)
    throttled = any(run["first_throttle_s"] is not None for run in runs)
    axes[0, 0].set_title("first throttle signal: dashed" if throttled else "no throttle signal", fontsize=8)
    axes[-1, 0].set_xlabel("minutes")
    fig.tight_layout()
    return figure_png(fig)


def sustained_part(deploy: dict[str, Any], rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[Section]]:
    """A scored task's sustained runs (:func:`sustained_runs`, each one's figures joined to its rung's row) and its
    "After N minutes" section; nothing without ``deploy.sustained``."""
    runs = sustained_runs(deploy.get("devices", []))
    join_rows(runs, rows)
    return runs, ([section(runs, None)] if runs else [])
