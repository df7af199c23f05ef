"""The side-by-side report: the ladder of rungs on every device, edge against data center.

``build_report(run_dir)`` reads the manifest (evaluate and deploy) and writes ``report.md``,
a self-contained ``report.html`` (plots embedded as PNG data URIs), ``results.json`` and
``results.csv``. Nothing is estimated: a measurement that does not exist is "not measured", with why.
"""

from __future__ import annotations

import base64
import json
import shutil
from pathlib import Path
from typing import Any

from device.errors import ManifestError
from pipeline import perclass
from pipeline.core.rungs import DEPLOYED, RUNGS
from pipeline.report.profile_report import (NOT_MEASURED, TIMING_COLUMNS, TIMINGS_TEXT, has_device_timings, time_section,
                                     timing_rows)
from pipeline.report.diverge_report import diverge_section
from pipeline.quantize.report import int8_section
from pipeline.report.results import (detail_columns, figure_cell, figure_label, interval_cell, ladder_columns,
                              write_results)
from pipeline.report.sections import Bullets, Details, Figure, Section, Table, Text, page_title, to_html, to_markdown
from pipeline.report.headline import fmt
from pipeline.tasks.classification.headline import block as headline_block
from pipeline.tasks.classification.headline import text as headline_text
from pipeline.tasks.classification.report_data import BASE_COLUMNS, collect
from pipeline.tasks.classification.report_plots import PLOT_CAPTIONS, plots
from pipeline.deploy import sustain_report
from pipeline.deploy.frame_report import frame_asked, frame_section


def fleet_rows(data: dict[str, Any]) -> list[list[str]]:
    table = [["group", "rung", "devices measured", "p50 ms median", "p50 ms min–max", "images/s median",
              "mJ/image median", "mJ/image min–max"]]
    for g in data["groups"]:
        spread = (f"{g['latency_p50_ms_min']:.3f}–{g['latency_p50_ms_max']:.3f}"
                  if g["latency_p50_ms_min"] is not None else "—")
        energy = (f"{g['energy_mj_per_image_min']:.2f}–{g['energy_mj_per_image_max']:.2f}"
                  if g["energy_mj_per_image_min"] is not None else NOT_MEASURED)
        table.append([g["group"], g["rung"], f"{g['measured']}/{g['devices']}", fmt(g["latency_p50_ms_median"], ".3f"),
                      spread, fmt(g["throughput_images_per_s_median"], ".0f"),
                      fmt(g["energy_mj_per_image_median"], ".2f", NOT_MEASURED), energy])
    return table


def _is_fleet(data: dict[str, Any]) -> bool:
    return any(g["devices"] > 1 for g in data.get("groups", []))


# ----------------------------------------------------------------- rendering
LADDER_CSS = ("", "", "ratio", "ratio")  # the ratio columns: the ones the report exists for, first after the names


def _top1_cell(row: dict[str, Any]) -> str:
    """The host's top-1, marked when FP16 is a CPU emulation there and when the score is no score."""
    return (f"{100 * row['top1']:.2f}%" + (" emulated" if RUNGS[row["rung"]].precision == "fp16" else "")
            + (" " + row["verdict"].split(":")[0] if row.get("verdict") else ""))


# A cell's note: the row's key that explains the figure, and the word that flags it.
CELL_NOTES = {"latency_p50_ms": ("noise", "noisy"), "energy_mj_per_image": ("energy_note", "degraded")}


def ladder_tables(data: dict[str, Any]) -> tuple[Table, Table]:
    """The ladder, narrow enough for a laptop (the ratios first, the declared ladder figures with their intervals),
    and its detail: every other declared measured field (:func:`pipeline.report.results.detail_columns`; trtexec's
    times have the timings table)."""
    notes = reason_notes(data)
    shown, detailed = ladder_columns(), detail_columns(exclude=TIMING_COLUMNS)
    main = [["rung", "device", "latency ×", "energy ×", "top-1 host", "top-1 device", "Δ pts",
             *(figure_label(column, with_interval=True) for column in shown), "status"]]
    detail = [["rung", "device", "runtime", "params M", "GMACs", "MB", "CV", *map(figure_label, detailed)]]
    for r in data["rows"]:
        measured = r["status"] == "measured"
        device_top1 = "—" if r.get("device_top1") is None else (f"{100 * r['device_top1']:.2f}%"
                                                                + (" ≠ host" if r.get("device_deviates") else ""))
        main.append([
            r["rung"], r["device"], _ratio_cell(r, "latency"), _ratio_cell(r, "energy"), _top1_cell(r), device_top1,
            fmt(r["top1_delta_points"], "+.2f"),
            *(figure_cell(r, column, NOT_MEASURED if measured else "—", with_interval=True) + _cell_note(r, column, notes)
              for column in shown),
            ("measured" if measured else NOT_MEASURED) + (f" [{notes[r['reason']]}]" if r.get("reason") else ""),
        ])
        detail.append([
            r["rung"], r["device"],
            (f"{r['runtime']} {r['precision']}" + (f" (fallback) [{notes[r['runtime_fallback']]}]"
                                                   if r.get("runtime_fallback") else "")) if measured else "—",
            f"{r['params_m']:.2f}", f"{r['macs_g']:.3f}", f"{r['size_mb']:.1f}",
            fmt(100 * r["latency_cv_windows"] if r.get("latency_cv_windows") is not None else None, ".0f")
            + ("%" if r.get("latency_cv_windows") is not None else ""),
            *(figure_cell(r, column) for column in detailed),
        ])
    return Table(main, LADDER_CSS, css="ladder"), Table(detail)


def _cell_note(row: dict[str, Any], column: str, notes: dict[str, int]) -> str:
    """`` noisy [2]``: the flag and the numbered note that explains the figure in ``column``, if any."""
    key, word = CELL_NOTES.get(column, (None, None))
    return f" {word} [{notes[row[key]]}]" if key and row.get(key) else ""


DEVICE_ACCURACY_TEXT = ("Every engine the device built and timed ran the evaluation set once after its timed "
                        "windows: TensorRT builds one per measured batch (each may choose other per-layer precisions) "
                        "and a sweep one per accelerator, each scored, the largest batch's first; ONNX Runtime and "
                        "torch run one model at every batch, scored once. Host: ONNX "
                        "Runtime on the build host on the same images (FP16 rungs there are a CPU emulation). "
                        "Agreement: share of images with the same top-1; McNemar's exact test on the images one got "
                        "right and the other wrong.")


def device_accuracy_rows(data: dict[str, Any]) -> list[list[str]]:
    table = [["rung", "device", "runtime", "top-1 device", "top-1 host (same images)", "same top-1", "McNemar p",
              "verdict"]]
    for r in data["rows"]:
        if r.get("device_top1") is None:
            continue
        host = (f"{100 * r['host_top1_same_images']:.2f}% ({r['host_top1_correct_same_images']}/{r['device_images']})"
                if r.get("host_top1_same_images") is not None else "—")
        # Results written before every engine was scored carry the largest batch's only: the row itself.
        for index, e in enumerate(r.get("engines_scored") or [r]):
            table.append([r["rung"] + (f" · {e['label']}" if index else ""), r["device"],
                          f"{r['runtime']} {r['precision']}",
                          f"{100 * e['device_top1']:.2f}% ({e['device_top1_correct']}/{r['device_images']})", host,
                          fmt(100 * e["agreement"] if e.get("agreement") is not None else None, ".1f") + "%",
                          fmt(e.get("mcnemar_p"), ".2g"),
                          "differs by more than noise" if e.get("device_deviates") else "same within noise"])
    return table


def device_class_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per-class accuracy of each rung's device predictions (columns: rung@device)."""
    summary = data["evaluation"]
    columns = sorted(summary["per_class_device"])
    table = [["class", *columns]]
    for index, name in enumerate(summary["classes"]):
        table.append([str(name)] + [fmt(100 * acc if (acc := summary["per_class_device"][c][index]) is not None
                                         else None, ".1f") for c in columns])
    return table


def _evaluation_note(data: dict[str, Any]) -> str:
    summary = data["evaluation"]
    sample = (f"a stratified sample of {summary['images']} of the {summary['of_images']} test images"
              if summary.get("stratified") else f"all {summary['images']} test images")
    took = f"; the passes took {summary['seconds_total']:.1f} s in all" if summary.get("seconds_total") else ""
    return f"{DEVICE_ACCURACY_TEXT} The set: {sample}{took}."


def _ratio_cell(row: dict[str, Any], name: str) -> str:
    """A ratio with its interval, or "≈1 (n.s.)" when the interval holds 1: no measurable difference."""
    value = row.get(f"{name}_ratio_vs_dc_teacher")
    if value is None:
        return "—"
    if row.get(f"{name}_ratio_significant") is None and row.get(f"{name}_ratio_low") is None:
        return "1 (reference)" if value == 1.0 else format(value, ".2f")
    text = interval_cell(value, row.get(f"{name}_ratio_low"), row.get(f"{name}_ratio_high"), ".2f")
    return text if row.get(f"{name}_ratio_significant") is not False else f"{text} n.s."


def reason_notes(data: dict[str, Any]) -> dict[str, int]:
    """Each distinct reason for a missing number or a degraded energy figure, numbered for footnotes."""
    notes: dict[str, int] = {}
    for row in data["rows"]:
        for reason in (row.get("runtime_fallback"), row.get("reason"), row.get("energy_note"), row.get("noise")):
            if reason and reason not in notes:
                notes[reason] = len(notes) + 1
    return notes


def _batch_note(data) -> str:
    measured = [r for r in data["rows"] if r["status"] == "measured"]
    if not measured:
        return ""
    headline = data.get("headline") or {}
    label = headline.get("baseline_label", "teacher")
    if headline.get("dc_device") and not headline.get("note"):
        against = f"the {label} on the data-center device ({headline['dc_device']})"
    elif headline.get("dc_device"):
        against = f"the {label} on {headline['dc_device']} (no data-center device configured)"
    else:
        against = f"the {label} on the first device measured"
    return (f"Latency at batch {measured[0]['latency_batch']} (p50: the wall time of the whole call, as an "
            f"application sees it); throughput, power and energy at batch "
            f"{measured[0]['throughput_batch']}. Ratios are against {against}.")


def provenance_lines(data: dict[str, Any]) -> list[tuple[str, str]]:
    """(who, what) per device and for the build host: versions, power mode, peak temperatures."""
    lines = []
    for device in data["provenance"]["devices"]:
        facts = ", ".join(f"{k} {v}" for k, v in device.items() if k not in ("name", "role", "url", "status", "error",
                                                                               "peak_temperatures_c") and v is not None)
        temps = ", ".join(f"{zone} {t:.1f} °C" for zone, t in device["peak_temperatures_c"].items())
        lines.append((device["name"], f" ({device['role']}, {device['url']}): {device['status']}"
                      + (f" — {device['error']}" if device["error"] else "") + (f"; {facts}" if facts else "")
                      + (f"; peak temperatures {temps}" if temps else "")))
    pipeline_env = data["provenance"]["pipeline"]
    if pipeline_env:
        lines.append(("build host", ": " + ", ".join(f"{k} {v}" for k, v in pipeline_env.items())))
    return lines


def report_sections(data: dict[str, Any], figures: dict[str, str | Figure | Text] | None = None,
                    extra: list[Section] = ()) -> list[Section]:
    """Every section of the report, in order, as data (:mod:`pipeline.report.sections` renders both formats).

    Args:
        data: :func:`collect`'s result.
        figures: The plots (:func:`plots`); a plot with nothing to draw is a line of text. None: no plots
            section (report.md, which never embedded them).
        extra: Stage-specific sections placed before the fleet (the latency-budget plan).
    """
    sections = [Section("Headline", [Text(f"Generated {data['generated']}."), headline_block(data["headline"])])]
    absent = data.get("absent_rungs") or {}
    said_absent = [Text(f"Not in this ladder: {', '.join(absent)} — {why}.")
                   for why in dict.fromkeys(absent.values())]
    if data["rows"]:
        main, detail = ladder_tables(data)
        notes = [("", reason) for reason in reason_notes(data)]
        sections.append(Section("The ladder", [Text(_batch_note(data)), *said_absent, main,
                                               *([Bullets(notes, numbered=True, css="notes")] if notes else []),
                                               Details("Ladder detail: runtime, size, p99, spread, throughput, "
                                                       "memory, power, GPU temperature and clock", [detail])]))
    else:
        sections.append(Section("The ladder", [
            Text(f"Devices: {NOT_MEASURED} (the run has no deploy stage). Accuracy and size only:"), *said_absent,
            Table([["rung", "top-1", "params M", "GMACs", "MB"]] + [
                [name, f"{100 * r['top1']:.2f}%", f"{r['params_m']:.2f}", f"{r['macs_g']:.3f}",
                 f"{r.get('onnx_mb', r['size_mb']):.1f}"] for name, r in data["rungs"].items()])]))
    if data.get("per_class"):
        sections.append(perclass.section(data["per_class"]))
    if data.get("evaluation") and len(device_accuracy_rows(data)) > 1:
        sections.append(Section("Accuracy on the device", [
            Text(_evaluation_note(data)), Table(device_accuracy_rows(data)), Text("Per class, on the device (top-1 %):"),
            Table(device_class_rows(data))]))
    if has_device_timings(data):
        sections.append(Section("Latency as trtexec reports it", [Text(TIMINGS_TEXT), Table(timing_rows(data))]))
    if data.get("layer_profiles"):
        sections.append(time_section(data))
    if frame_asked(data["rows"]):
        sections.append(frame_section(data, figures))
    if data.get("sustained"):
        sections.append(sustain_report.section(data["sustained"], figures))
    if data.get("power_fronts"):
        sections.append(power_section(data, figures))
    sections += list(extra)
    if _is_fleet(data):
        sections.append(Section("Fleet", [Text("Per group of devices of the same kind: the median and the spread "
                                               "across them."), Table(fleet_rows(data))]))
    if figures is not None:
        sections.append(Section("Plots", [figure if isinstance(figure, (Figure, Text)) else
                                          Figure(key, figure, PLOT_CAPTIONS[key]) for key, figure in figures.items()
                                          if not key.startswith(("power_front:", "frame:", "sustained:"))]))
    sections.append(Section("Provenance", [Bullets(provenance_lines(data))]))
    return sections


POWER_TEXT = ("Each setting is a power mode × jetson_clocks × batch size the device ran, measured in every round: "
              "p50 latency and energy per image are medians over the windows with their 95% intervals. The front "
              "(★) holds the settings no other beats on both; a setting whose energy is degraded is shown, never on it. "
              "A mode's watts in its name are nominal: the caps it set are in results.json (power_setting).")


def power_section(data: dict[str, Any], figures: dict[str, Any] | None) -> Section:
    """"Power modes: the energy–latency front": per device × rung, every setting, the front and the choice."""
    blocks: list = [Text(POWER_TEXT)]
    for key in [k for k in (figures or {}) if k.startswith("power_front:")]:
        blocks.append(figures[key] if isinstance(figures[key], (Figure, Text)) else
                      Figure(key, figures[key], f"Energy per image against p50 latency on {key.split(':', 1)[1]}, "
                                                "every rung's sweep settings (the front joined, dominated settings "
                                                "faded); throughput against mean power beside it."))
    for front in data["power_fronts"]:
        rows = [["setting", "p50 ms [95% CI]", "mJ/image [95% CI]", "images/s", "W", "windows", "front"]]
        for p in sorted(front["settings"], key=lambda p: (p["latency_p50_ms"] is None, p["latency_p50_ms"] or 0)):
            rows.append([p["label"], interval_cell(p["latency_p50_ms"], p["latency_p50_ms_low"], p["latency_p50_ms_high"],
                                               ".3f"),
                         interval_cell(p["energy_mj_per_image"], p["energy_mj_per_image_low"],
                                   p["energy_mj_per_image_high"], ".3f") if p["energy_mj_per_image"] is not None
                         else NOT_MEASURED, fmt(p["throughput_images_per_s"], ".0f"), fmt(p["power_mean_w"], ".2f"),
                         str(p["windows"]), "★" if p["on_front"] else ("degraded energy" if p["degraded"] else "")])
        blocks_of = [Text(("Chosen" + (f" within {front['budget_ms']:g} ms" if front["budget_ms"] else "")
                           + f": {front['choice']['text']}.") if front["choice"]["chosen"] else
                          f"No setting chosen: {front['choice']['text']}."), Table(rows)]
        if not front["controlled"]:
            blocks_of.insert(0, Text(f"Only the current mode was measured: {front['note']}"))
        if front["not_measured"]:
            blocks_of.append(Bullets([(f"{n['nvpmodel_name']}" + (f" on {n['accelerator'].upper()}"
                                                                   if n.get("accelerator") else "")
                                       + f" ({n['kind']})", f": {n['reason']}") for n in front["not_measured"]]))
        blocks.append(Section(f"{front['rung']} on {front['device']}", blocks_of, level=3))
    return Section("Power modes: the energy–latency front", blocks)


def report_title(data: dict[str, Any]) -> str:
    return page_title(data["model"], data["run"])


def render_markdown(data: dict[str, Any], extra: list[Section] = ()) -> str:
    """report.md."""
    return to_markdown(report_title(data), report_sections(data, None, extra))


def render_html(data: dict[str, Any], figures: dict[str, Any], extra: list[Section] = ()) -> str:
    """The self-contained report.html (plots embedded as PNG data URIs)."""
    return to_html(report_title(data), report_sections(data, figures, extra))


def build_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Writes report.md, report.html, results.json and results.csv; returns their paths."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ManifestError(f"no manifest in {run_dir}", fix="pass a run directory (edgefold runs lists them)")
    data = collect(json.loads(manifest_path.read_text()), run_dir)
    out = Path(out_dir or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "report.md", "html": out / "report.html",
             **write_results(out, data, "classification", BASE_COLUMNS)}
    # The prune stage's latency plan, when the run pruned to a latency budget: its own section.
    manifest = json.loads(manifest_path.read_text())
    extra = latency_section(manifest, run_dir, out) + int8_section(
        (manifest["stages"].get("quantize") or {}).get("metrics") or {}, "top-1", lambda value: f"{100 * value:.2f}%",
        out, [p for p in data.get("layer_profiles") or [] if p["rung"] == DEPLOYED]) + diverge_section(run_dir)
    paths["md"].write_text(render_markdown(data, extra))
    paths["html"].write_text(render_html(data, plots(data), extra))
    return paths


# The prune stage's latency-budget section.
def _report_parts(lat: dict[str, Any]) -> tuple[str, list[list[str]], str]:
    """The section's opening sentence, its plan table (header first) and the table check, for either format."""
    m = lat["measured_ms"]
    intro = (f"Budget {lat['budget_ms']:.4f} ms on {lat['device']} (agent: {lat['agent']}); the unpruned network "
             f"measured {lat['unpruned_ms']['p50_ms']:.4f} ms there. The student's plan: predicted by the latency "
             f"table {lat['predicted_ms']:.4f} ms, measured {m['p50_ms']:.4f} ms (windows {m['spread_ms'][0]:.4f}–"
             f"{m['spread_ms'][1]:.4f}; error {100 * lat['prediction_error']:+.1f}%), after {lat['rounds']} "
             f"round(s) of the table ({lat['jobs']} jobs measured, {lat['reused']} reused).")
    rows = [["plan", "MACs vs unpruned", "predicted ms", "measured ms [window spread]"]]
    for plan in lat["plans"]:
        pm = plan["measured_ms"]
        rows.append([f"{plan['plan']}{' (chosen)' if plan.get('chosen') else ''}", f"{100 * plan['macs_fraction']:.1f}%",
                     f"{plan['predicted_ms']:.4f}" if plan.get("predicted_ms") is not None else "—",
                     f"{pm['p50_ms']:.4f} [{pm['spread_ms'][0]:.4f}–{pm['spread_ms'][1]:.4f}]"])
    check = ("The table checked against measured full runs: " + "; ".join(
        f"{name.replace('_', ' ')} {100 * c['error']:+.1f}%"
        + ({True: " (in the fit)", False: " (out of sample)"}.get(c.get("in_fit"), ""))
        for name, c in lat["check"].items()) + ".") \
        if lat.get("check") else ""
    return intro, rows, check


def _holdout_text(holdout: list[dict[str, Any]]) -> str:
    """One sentence on the table's error out of sample (plans measured but never fitted)."""
    errors = [h["error"] for h in holdout]
    return (f"Out of sample (the table was not fitted to these {len(errors)} plans): prediction errors "
            + ", ".join(f"{100 * e:+.1f}%" for e in errors)
            + f"; mean absolute error {100 * sum(abs(e) for e in errors) / len(errors):.1f}%.")


def _latency_metrics(manifest: dict[str, Any]) -> dict[str, Any] | None:
    return ((manifest.get("stages", {}).get("prune") or {}).get("metrics") or {}).get("latency")


def latency_section(manifest: dict[str, Any], run_dir: Path, out_dir: Path) -> list[Section]:
    """The report's "Pruned to a latency budget" section (none when the run pruned to MACs).

    Why the plan was chosen: the MACs against measured latency of the candidate plans (the plot, copied
    beside the report for report.md, embedded in report.html), the student's predicted against
    measured latency, and the table's check.
    """
    from pipeline.tasks.classification.latency_plots import plot_holdout, plot_plans

    lat = _latency_metrics(manifest)
    if not lat:
        return []
    intro, rows, check = _report_parts(lat)
    blocks: list = [Text(intro), Table(rows)] + ([Text(check)] if check else [])
    holdout = lat.get("holdout") or []
    if holdout:
        blocks.append(Text(_holdout_text(holdout)))
    out_dir = Path(out_dir)
    # Drawn here from the recorded data (the stage records no pictures); a run recorded before that kept its PNG.
    plot = plot_plans(lat["plans"], lat.get("sweep", []), lat["budget_ms"], out_dir / "latency_plans.png")
    if plot is None and lat.get("plot") and (run_dir / lat["plot"]).is_file():
        plot = Path(shutil.copy(run_dir / lat["plot"], out_dir / "latency_plans.png"))
    if plot is not None:
        blocks.append(Figure("latency plans", base64.b64encode(plot.read_bytes()).decode("ascii"),
                             "MACs against measured latency of the candidate plans; the chosen one starred, the "
                             "budget dashed.", file=plot.name))
    plot = plot_holdout(holdout, out_dir / "latency_holdout.png")
    if plot is not None:
        blocks.append(Figure("latency table out of sample", base64.b64encode(plot.read_bytes()).decode("ascii"),
                             "Predicted against measured latency of plans the table was not fitted to; dashed: "
                             "prediction = measurement.", file=plot.name))
    return [Section("Pruned to a latency budget", blocks)]
