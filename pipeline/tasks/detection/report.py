"""The detection ladder's report: mAP, AP50 and AP75 per rung on host and device (with intervals), what each box-head
setting costs, the network's and the post-processing's time apart, and the INT8 fold's per-class changes.

Built once as sections (:mod:`pipeline.report.sections`): the same Markdown for report.md and the console, the same
self-contained HTML page (stylesheet, scrolling tables, plots embedded as PNG) for report.html. The figures go to
``results.json`` and ``results.csv`` through :mod:`pipeline.report.results`, the one results document of every task.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from pipeline.report.results import (REPORTED, detail_columns, figure_cell, figure_label, ladder_columns,
                              write_results)
from pipeline.deploy import records
from pipeline.deploy.frame_report import FRAME_COLUMNS, frame_sections
from pipeline.deploy.sustain_report import SUSTAINED_COLUMNS, sustained_part
from pipeline.deploy.records import finished_run, headline_data, layer_profiles, measured_fields, scored_headline
from pipeline.deploy.records import reported_of as _reported
from pipeline.report.sections import Figure, Headline, Section, Table, Text, page_title, to_html, to_markdown
from pipeline.core.ladder import signed

# The ladder as three tables, so that each fits a laptop's window: what the rungs are compared by (with the declared
# ladder figures: network p50, energy), the detail, and every other measured field the result schema declares.
RUNG_COLUMNS = ["rung", "precision", "device mAP [95% CI]",
                *(("network " if c == "latency_p50_ms" else "") + figure_label(c, with_interval=True)  # vs decode + NMS
                  for c in ladder_columns()), "× FP32 student [95% CI]", "decode + NMS ms/img"]
DETAIL_COLUMNS = ["rung", "box head", "host mAP [95% CI]", "device AP50 [95% CI]", "device AP75 [95% CI]", "size MB",
                  "network ms/img (eval)"]
RESULT_COLUMNS = ("rung", "device", "group", "role", "precision", "box_head", "status", "reason", "runtime", "size_mb",
                  "macs_g", "host_map", "host_map_low", "host_map_high", "map", "map_low", "map_high", "ap50", "ap75",
                  "map_vs_student_points", "latency_batch", "rounds", "ratio_vs_student", "ratio_low", "ratio_high",
                  "ratio_significant", "network_ms_per_image", "postprocess_ms_per_image", *FRAME_COLUMNS,
                  *SUSTAINED_COLUMNS)
"""results.csv's own columns, the camera frame's path's as every task's (the declared measured fields,
:data:`pipeline.report.results.REPORTED`, follow)."""
BOX_HEAD_WORDS = {"fp16": "FP16, outside Q/DQ", "float": "FP32, outside Q/DQ", "int8": "INT8, quantized"}
SCORED_TEXT = ("Host mAP: the teacher through torchvision's post-processing, the others through ONNX Runtime and the "
               "device's decode + NMS (device/scoring/detection_post.py); device mAP, AP50 and AP75: the engine that was timed, "
               "decoded on the device. Intervals: 95% bootstrap over images, bias-corrected (mAP's resamples sit "
               "above the point, so the interval is moved down by as much; plain percentile when nearly all sit on "
               "one side). The network's time and the decode + NMS "
               "time are per image over the evaluation pass; p50 is each timed window's median per call, then its "
               "median over the interleaved rounds with a bootstrap interval; the ratio to the FP32 student is "
               "paired by round.")


def scored_text(ladder: dict[str, Any]) -> str:
    """How the rungs were scored; a detector brought as ONNX has no teacher, and every rung is ONNX."""
    if "teacher" in ladder["rungs"]:
        return SCORED_TEXT
    return "Host mAP: ONNX Runtime and the device's decode + NMS" + SCORED_TEXT.split("decode + NMS", 1)[1]


def interval(scores: dict[str, Any] | None, key: str = "map") -> str:
    """``scores[key]`` in points with its ``_low``/``_high`` interval (``17.1 [16.4, 20.8]``); — when absent."""
    if not scores or scores.get(key) is None:
        return "—"
    low, high = scores.get(f"{key}_low"), scores.get(f"{key}_high")
    bounds = f" [{100 * low:.1f}, {100 * high:.1f}]" if low is not None and high is not None else ""
    return f"{100 * scores[key]:.1f}{bounds}"


def _ms(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}"


def _versus(measured: dict[str, Any]) -> str:
    """``×0.81 [0.78, 0.85]``, ending in ``n.s.`` when the interval holds 1 (no measurable difference); — without
    one."""
    ratio = measured.get("vs_student")
    if not ratio:
        return "—"
    text = f"×{ratio['ratio']:.2f} [{ratio['low']:.2f}, {ratio['high']:.2f}]"
    return text if ratio["significant"] else f"{text} n.s."


def timing_text(device: dict[str, Any]) -> str | None:
    """What the p50 column is on this device: the batch and how many interleaved rounds."""
    timed = [r["network_p50"] for r in device["rungs"].values() if r.get("network_p50")]
    if not timed:
        return None
    rounds = sorted({t["rounds"] for t in timed})
    return (f"Network p50 at batch {timed[0]['batch']}, median over {'–'.join(map(str, rounds))} interleaved "
            "round(s) with a 95% bootstrap interval; × FP32 student: that ratio paired by round (n.s.: the interval "
            "holds 1, no measurable difference).")


def rung_rows(ladder: dict[str, Any], device: dict[str, Any]) -> list[list[str]]:
    """The rungs table of one device: header, then one row per rung of the ladder."""
    rows = [list(RUNG_COLUMNS)]
    for rung, row in ladder["rungs"].items():
        measured = device["rungs"].get(rung, {})
        ok = measured.get("state") == "succeeded"
        figures = _reported(measured)
        missing = "not measured" if ok else measured.get("state", "not measured")
        rows.append([rung, row["precision"], interval(measured.get("scores") if ok else None),
                     *(figure_cell(figures, column, missing, with_interval=True) for column in ladder_columns()),
                     _versus(measured), _ms(measured.get("postprocess_ms_per_image"))])
    return rows


def detail_rows(ladder: dict[str, Any], device: dict[str, Any]) -> list[list[str]]:
    """The rungs' detail on one device: host scores, AP50/AP75, size, the network's time in the evaluation pass."""
    rows = [list(DETAIL_COLUMNS)]
    for rung, row in ladder["rungs"].items():
        measured = device["rungs"].get(rung, {})
        scores = measured.get("scores") if measured.get("state") == "succeeded" else None
        rows.append([rung, row.get("box_head") or "—", interval(row), interval(scores, "ap50"),
                     interval(scores, "ap75"), f"{row['size_mb']:.2f}", _ms(measured.get("network_ms_per_image"))])
    return rows


def measured_rows(ladder: dict[str, Any], device: dict[str, Any]) -> list[list[str]]:
    """Every other measured field the result schema declares (:func:`pipeline.report.results.detail_columns`: throughput,
    p99, trtexec's times, power, memory, peak temperature, lowest clock …), per rung on one device."""
    columns = detail_columns()
    rows = [["rung", *map(figure_label, columns)]]
    for rung in ladder["rungs"]:
        figures = _reported(device["rungs"].get(rung, {}))
        rows.append([rung, *(figure_cell(figures, column) for column in columns)])
    return rows


def device_section(ladder: dict[str, Any], device: dict[str, Any]) -> Section:
    """One device's rungs (a sub-section of the ladder's), with why it fell back to another runtime or measured
    nothing."""
    blocks: list = []
    if device.get("runtime_fallback"):
        blocks.append(Text(device["runtime_fallback"]))
    if device.get("error"):
        blocks.append(Text(f"not measured: {device['error']}"))
    if timing_text(device):
        blocks.append(Text(timing_text(device)))
    blocks.append(Table(rung_rows(ladder, device), css="ladder"))
    blocks.append(Table(detail_rows(ladder, device)))
    blocks.append(Table(measured_rows(ladder, device)))
    others = [f"{rung} {entry['label']} {100 * entry['map']:.1f}" for rung, measured in device["rungs"].items()
              for entry in measured.get("other_engines") or []]
    if others:
        blocks.append(Text("Device mAP is the largest batch's engine's; every other engine timed, scored on the same "
                           "images: " + "; ".join(others) + "."))
    return Section(f"{device['name']} ({device.get('runtime') or '—'}; {device['status']})", blocks, level=3)


def box_heads_text(quantize: dict[str, Any]) -> str:
    """What the box-head table compares: the other settings are post-training quantized with one calibration, also
    when the ladder accepted QAT (their rows then compare calibration, not fine-tuning)."""
    compared = {other.get("method") for other in quantize.get("other_box_heads", ())} - {None}
    calibration = ", ".join(sorted(compared)) or quantize["method"]
    if quantize["method"] == "qat":
        return (f"The accepted INT8 student was fine-tuned (QAT); the other box-head settings are quantized after "
                f"training with {calibration} calibration, so their rows compare calibration, not fine-tuning. Each "
                "change is against the FP32 student's host mAP.")
    return (f"The same INT8 student ({calibration} calibration) with its box-regression branch set each way; the "
            "change is against the FP32 student's host mAP.")


def box_head_rows(quantize: dict[str, Any]) -> list[list[str]]:
    """Each box-head setting quantized: the accepted one first, then those ``compare_box_head`` added."""
    accepted = quantize["attempts"][-1]  # the stage stops at the first calibration within the budget
    rows = [["box head", "rung", "host mAP [95% CI]", "change vs FP32, points [paired 95% CI]", "box nodes in FP16",
             "size MB"]]
    for index, entry in enumerate([accepted, *quantize.get("other_box_heads", ())]):
        rung = "student_int8" if index == 0 else f"student_int8_box_{entry['box_head']}"
        change = entry.get("change_vs_fp32")
        paired = "" if not change else f" [{signed(change['low'])}, {signed(change['high'])}]"
        rows.append([f"{entry['box_head']} ({BOX_HEAD_WORDS.get(entry['box_head'], entry['box_head'])})", rung,
                     interval(entry.get("scores")), signed(-entry['drop_points']) + paired,
                     str(entry.get("box_nodes_fp16", 0)),
                     "—" if entry.get("size_mb") is None else f"{entry['size_mb']:.2f}"])
    return rows


def class_rows(changes: list[dict[str, Any]]) -> list[list[str]]:
    """The INT8 fold's per-class AP changes (a class whose Holm-corrected p is below 0.05 is starred)."""
    rows = [["class", "boxes", "AP FP32", "AP INT8", "change", "95% CI", "p (Holm)", "verdict"]]
    for r in changes:
        rows.append([r["class"], str(r["boxes"]), f"{100 * r['ap_before']:.1f}", f"{100 * r['ap_after']:.1f}",
                     f"{r['change_points']:+.2f}" + (" *" if r["significant"] else ""),
                     f"[{r['change_low']:+.2f}, {r['change_high']:+.2f}]", f"{r['p_holm']:.3f}",
                     ("lost beyond noise" if r["change_points"] < 0 else "gained beyond noise") if r["significant"]
                     else "within noise"])
    return rows


def report_sections(ladder: dict[str, Any], deploy: dict[str, Any], quantize: dict[str, Any], lead: dict[str, Any],
                    figures: dict[str, Figure | Text] | None = None) -> list[Section]:
    """Every section of the detection report, in order, as data.

    Args:
        ladder: The evaluate stage's ``ladder.json``.
        deploy: The deploy stage's ``results.json``.
        quantize: The quantize stage's metrics.
        lead: The headline object (:func:`headline`), as results.json records it.
        figures: The plots (:func:`pipeline.tasks.detection.plots.plots`); None leaves them out (report.md).
    """
    sections = [Section("Headline", [headline_block(lead)])]
    # The ladder on each device, under the heading every task's page gives it.
    sections.append(Section("The ladder", [device_section(ladder, device) for device in deploy["devices"]]))
    sections += frame_sections(deploy)
    sections.append(Section("How the rungs were scored", [Text(f"Images scored on the device: {deploy['images']}. "
                                                               + scored_text(ladder))]))
    if quantize.get("other_box_heads"):
        sections.append(Section("What each box-head setting costs", [
            Text(box_heads_text(quantize)), Table(box_head_rows(quantize))]))
    changes = quantize.get("class_changes_vs_fp32") or []
    if changes:
        sections.append(Section("INT8 fold, per class (AP change in points, paired bootstrap 95% CI, "
                                "Holm-corrected)", [Table(class_rows(changes))]))
    profiles = layer_profiles(deploy)
    if profiles:
        from pipeline.report.profile_report import time_section

        sections.append(time_section({"layer_profiles": profiles}))
    if figures is not None:
        sections.append(Section("Plots", list(figures.values())))
    return sections


def result_rows(ladder: dict[str, Any], deploy: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per rung × device (:data:`RESULT_COLUMNS` and the declared measured fields): results.csv."""
    reference = (ladder["rungs"].get("student") or {}).get("map")
    rows = []
    for device in deploy.get("devices", []):
        for rung, row in ladder["rungs"].items():
            measured = device.get("rungs", {}).get(rung, {})
            ok = measured.get("state") == "succeeded"
            scores = measured.get("scores") or {}
            p50, ratio = measured.get("network_p50") or {}, measured.get("vs_student") or {}
            figures = _reported(measured)
            rows.append({
                "rung": rung, "device": device["name"], "group": device.get("group", device["name"]),
                "role": device.get("role"), "precision": row["precision"], "box_head": row.get("box_head"),
                "status": "measured" if ok else measured.get("state", "not measured"),
                "reason": None if ok else measured.get("error") or device.get("error"),
                "runtime": measured.get("runtime"), "size_mb": row.get("size_mb"), "macs_g": row.get("macs_g"),
                "host_map": row.get("map"), "host_map_low": row.get("map_low"), "host_map_high": row.get("map_high"),
                "map": scores.get("map"), "map_low": scores.get("map_low"), "map_high": scores.get("map_high"),
                "ap50": scores.get("ap50"), "ap75": scores.get("ap75"),
                "map_vs_student_points": (None if scores.get("map") is None or reference is None
                                          else round(100 * (scores["map"] - reference), 3)),
                "latency_batch": p50.get("batch"), "rounds": p50.get("rounds"), "ratio_vs_student": ratio.get("ratio"),
                "ratio_low": ratio.get("low"), "ratio_high": ratio.get("high"),
                "ratio_significant": ratio.get("significant"),
                "network_ms_per_image": measured.get("network_ms_per_image"),
                "postprocess_ms_per_image": measured.get("postprocess_ms_per_image"),
                **{key: (measured.get("frame") or {}).get(key) for key in FRAME_COLUMNS},
                **measured_fields(figures),
                "not_recorded": figures["not_recorded"]})
    return rows




def headline(rows: list[dict[str, Any]], quantize: dict[str, Any],
             profiles: list[dict[str, Any]] = (), sustained: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """What the run comes to, as data (:func:`pipeline.deploy.records.headline_data`): the INT8 student on the edge
    against the teacher on the data-center device, as every task's headline compares them; its mAP on the device and
    its network time against the FP32 student's, its decode + NMS; where the INT8 rung's own profile shows
    no compute layer in INT8 (ONNX Runtime's CPU provider), the FP32 student measured there, with why and how to
    measure INT8 (``int8_not_measured``)."""
    return headline_data(rows, profiles, "map", sustained, method=quantize.get("method"),
                         box_head=quantize.get("box_head"))


def headline_block(h: dict[str, Any]) -> Headline:
    """The headline's title and findings, labelled as every task's (the report's first table)."""
    return scored_headline(h, "map", "mAP", "decode + NMS", ".2f",
                           f"by {h['method']}, box head {h['box_head']}" if h.get("method") else None)


def headline_line(h: dict[str, Any]) -> str:
    """The headline in one console line (the report stage's summary): what leads, its mAP and its latency."""
    return records.headline_line(headline_block(h), "mAP")


def headline_text(h: dict[str, Any]) -> str:
    """The headline as aligned lines (what ``edgefold run`` and ``edgefold report`` print)."""
    return headline_block(h).lines()


def render(title: str, ladder: dict[str, Any], deploy: dict[str, Any], quantize: dict[str, Any],
           lead: dict[str, Any], extra: list[Section] = ()) -> str:
    """report.md (also what ``edgefold run`` prints)."""
    return to_markdown(title, report_sections(ladder, deploy, quantize, lead) + list(extra))


def render_html(title: str, ladder: dict[str, Any], deploy: dict[str, Any], quantize: dict[str, Any],
                lead: dict[str, Any], figures: dict[str, Figure | Text], extra: list[Section] = ()) -> str:
    """The self-contained report.html: the same page, stylesheet and figure embedding as every task's."""
    return to_html(title, report_sections(ladder, deploy, quantize, lead, figures) + list(extra))


QUANTIZE_KEYS = ("box_head", "drop_points", "method", "kept_layers", "kept_precision", "attempts",
                 "other_box_heads", "class_changes_vs_fp32")
"""The quantize stage's metrics the report shows (results.json keeps them beside the ladder and the deploy results)."""


def write_report(name: str, run: str, ladder: dict[str, Any], deploy: dict[str, Any],
                 quantize_metrics: dict[str, Any], out: Path, found: Sequence[Section] = ()) -> dict[str, Path]:
    """Writes report.md, report.html (plots inline), results.json and results.csv into ``out``; returns their paths.
    ``found``: what was found on the run after it (``edgefold diverge``'s answers), last on the page."""
    from pipeline.quantize.report import int8_section
    from pipeline.tasks.detection.plots import plots

    quantize = {key: quantize_metrics[key] for key in QUANTIZE_KEYS if key in quantize_metrics}
    rows = result_rows(ladder, deploy)
    runs, sustained = sustained_part(deploy, rows)
    lead = headline(rows, quantize, layer_profiles(deploy), runs)  # one object: the page, report.md, results.json
    paths = {"md": out / "report.md", "html": out / "report.html"}
    extra = sustained + int8_section(quantize_metrics, "mAP", lambda value: f"{100 * value:.2f}", out) + list(found)
    paths["md"].write_text(render(page_title(name, run), ladder, deploy, quantize, lead, extra))
    paths["html"].write_text(render_html(page_title(name, run), ladder, deploy, quantize, lead, plots(ladder, deploy, quantize),
                                         extra))
    document = {"model": name, "run": run, "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
                "headline": lead, "rows": rows, "ladder": ladder, "deploy": deploy,
                "quantize": quantize}
    paths.update(write_results(out, document, "detection", RESULT_COLUMNS))
    return paths


def build_from_run(run_dir: Path, out: Path) -> dict[str, Path]:
    """The report of a finished detection run rebuilt from what its stages recorded (``edgefold report RUN``).

    Raises:
        ManifestError: The run has not reached its deploy stage.
    """
    from pipeline.report.diverge_report import diverge_section

    name, run, ladder, deploy, quantize = finished_run(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_report(name, run, ladder, deploy, quantize, out, diverge_section(run_dir))
