"""The segmentation ladder's report: mIoU per rung on host and device (with intervals), the network's and the
argmax's time apart, and the INT8 fold's per-class IoU changes; the same page as every task's
(:mod:`pipeline.report.sections`), its figures in ``results.json`` and ``results.csv`` (:mod:`pipeline.report.results`)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Sequence

from pipeline.deploy import records
from pipeline.deploy.frame_report import FRAME_COLUMNS, frame_sections
from pipeline.deploy.sustain_report import SUSTAINED_COLUMNS, sustained_part
from pipeline.deploy.records import (finished_run, headline_data, layer_profiles, measured_fields, reported_of,
                                     scored_headline)
from pipeline.report.results import interval_cell, write_results
from pipeline.report.sections import Headline, Section, Table, Text, page_title, to_html, to_markdown

RESULT_COLUMNS = ("rung", "device", "group", "role", "precision", "status", "reason", "runtime", "size_mb", "macs_g",
                  "host_miou", "host_miou_low", "host_miou_high", "miou", "miou_low", "miou_high", "pixel_accuracy",
                  "miou_vs_student_points", "latency_batch", "rounds", "ratio_vs_student", "ratio_low", "ratio_high",
                  "ratio_significant", "network_ms_per_image", "postprocess_ms_per_image", *FRAME_COLUMNS,
                  *SUSTAINED_COLUMNS)
"""results.csv's own columns, the camera frame's path's as every task's (the declared measured fields,
:data:`pipeline.report.results.REPORTED`, follow)."""
SCORED_TEXT = ("Host mIoU: teacher and student in torch, the INT8 student under ONNX Runtime; device mIoU: the engine "
               "that was timed, its masks taken by the argmax on the device. IoU per class over every pixel of the "
               "test canvases, mIoU its mean; intervals: 95% bootstrap over images. p50 is each timed window's median "
               "per call, then its median over the interleaved rounds with a bootstrap interval; the ratio to the FP32 "
               "student is paired by round. The argmax's time is per image over the evaluation pass.")


def result_rows(ladder: dict[str, Any], deploy: dict[str, Any]) -> list[dict[str, Any]]:
    """One flat row per rung × device (:data:`RESULT_COLUMNS` and the declared measured fields): results.csv."""
    reference = (ladder["rungs"].get("student") or {}).get("miou")
    rows = []
    for device in deploy.get("devices", []):
        for rung, row in ladder["rungs"].items():
            measured = device.get("rungs", {}).get(rung, {})
            ok = measured.get("state") == "succeeded"
            scores, figures = measured.get("scores") or {}, reported_of(measured)
            p50, ratio = measured.get("network_p50") or {}, measured.get("vs_student") or {}
            rows.append({
                "rung": rung, "device": device["name"], "group": device.get("group", device["name"]),
                "role": device.get("role"), "precision": row["precision"],
                "status": "measured" if ok else measured.get("state", "not measured"),
                "reason": None if ok else measured.get("error") or device.get("error"),
                "runtime": measured.get("runtime"), "size_mb": row["size_mb"], "macs_g": row["macs_g"],
                "host_miou": row["miou"], "host_miou_low": row["miou_low"], "host_miou_high": row["miou_high"],
                "miou": scores.get("miou"), "miou_low": scores.get("miou_low"), "miou_high": scores.get("miou_high"),
                "pixel_accuracy": scores.get("pixel_accuracy"),
                "miou_vs_student_points": (None if scores.get("miou") is None or reference is None
                                      else round(100 * (scores["miou"] - reference), 3)),
                "latency_batch": p50.get("batch"), "rounds": p50.get("rounds"), "ratio_vs_student": ratio.get("ratio"),
                "ratio_low": ratio.get("low"), "ratio_high": ratio.get("high"),
                "ratio_significant": ratio.get("significant"),
                "network_ms_per_image": measured.get("network_ms_per_image"),
                "postprocess_ms_per_image": measured.get("postprocess_ms_per_image"),
                **{key: (measured.get("frame") or {}).get(key) for key in FRAME_COLUMNS},
                **measured_fields(figures),
                "not_recorded": figures["not_recorded"]})
    return rows


def headline(rows: list[dict[str, Any]], quantize: dict[str, Any], profiles: list[dict[str, Any]] = (),
             sustained: list[dict[str, Any]] = ()) -> dict[str, Any]:
    """What the run comes to, as data (:func:`pipeline.deploy.records.headline_data`): the INT8 student on the edge
    against the teacher on the data-center device, as every task's headline compares them; its mIoU on the device
    against the FP32 student's on the host, its network time against the FP32 student's, the argmax's time."""
    return headline_data(rows, profiles, "miou", sustained, method=quantize.get("method"))


def headline_block(h: dict[str, Any]) -> Headline:
    """The headline's title and findings, labelled as every task's (the report's first table)."""
    return scored_headline(h, "miou", "mIoU", "argmax", ".3f",
                           f"calibrated by {h['method']}" if h.get("method") else None)


def headline_line(h: dict[str, Any]) -> str:
    """The headline in one console line (the report stage's summary): what leads, its mIoU and its latency."""
    return records.headline_line(headline_block(h), "mIoU")


def headline_text(h: dict[str, Any]) -> str:
    """The headline as aligned lines (what ``edgefold run`` and ``edgefold report`` print)."""
    return headline_block(h).lines()


def _percent(value: float | None, low: float | None = None, high: float | None = None) -> str:
    return interval_cell(None if value is None else 100 * value, None if low is None else 100 * low,
                         None if high is None else 100 * high, ".1f")


def sections(rows: list[dict[str, Any]], lead: dict[str, Any], quantize: dict[str, Any]) -> list[Section]:
    """The page: the headline first, then the ladder on every device, the per-class changes of the INT8 fold."""
    ladder = [["rung", "device", "precision", "host mIoU [95% CI]", "device mIoU [95% CI]", "network p50 ms [95% CI]",
               "× FP32 student [95% CI]", "argmax ms/img", "MB", "GMACs"]]
    for r in rows:
        ratio = ("—" if r["ratio_vs_student"] is None else
                 interval_cell(r["ratio_vs_student"], r["ratio_low"], r["ratio_high"], ".2f"))
        ladder.append([r["rung"], r["device"], r["precision"], _percent(r["host_miou"], r["host_miou_low"],
                                                                         r["host_miou_high"]),
                       _percent(r["miou"], r["miou_low"], r["miou_high"]) if r["status"] == "measured"
                       else f"{r['status']}: {r['reason']}",
                       interval_cell(r.get("latency_p50_ms"), r.get("latency_p50_low_ms"),
                                     r.get("latency_p50_high_ms"), ".3f"), ratio,
                       "—" if r["postprocess_ms_per_image"] is None else f"{r['postprocess_ms_per_image']:.3f}",
                       f"{r['size_mb']:.2f}", f"{r['macs_g']:.4f}"])
    out = [Section("Headline", [headline_block(lead)]),
           Section("The ladder", [Table(ladder, css="ladder"), Text(SCORED_TEXT)])]
    changes = quantize.get("class_changes_vs_fp32") or []
    if changes:
        table = [["class", "IoU FP32", "IoU INT8", "change, points [95% CI]", "beyond noise"]]
        table += [[c["class"], f"{100 * c['iou_before']:.1f}", f"{100 * c['iou_after']:.1f}",
                   interval_cell(c["change_points"], c["change_low"], c["change_high"], "+.2f"),
                   "yes" if c["significant"] else "no"] for c in changes]
        out.append(Section("INT8 fold, per class (IoU change, paired bootstrap over images)", [Table(table)]))
    return out


def write_report(name: str, run: str, ladder: dict[str, Any], deploy: dict[str, Any],
                 quantize_metrics: dict[str, Any], out: Path, found: Sequence[Section] = ()) -> dict[str, Path]:
    """Writes report.md, report.html, results.json and results.csv into ``out``; returns their paths. ``found``: what
    was found on the run after it (``edgefold diverge``'s answers), last on the page."""
    from pipeline.quantize.report import int8_section
    from pipeline.report.profile_report import time_section

    quantize = {key: quantize_metrics.get(key) for key in ("method", "drop_points", "kept_layers",
                                                            "class_changes_vs_fp32", "attempts")}
    rows = result_rows(ladder, deploy)
    runs, sustained = sustained_part(deploy, rows)
    profiles = layer_profiles(deploy)
    lead = headline(rows, quantize, profiles, runs)
    # Every task's device sections: the frame's path, where each engine's time goes, the sustained run.
    timed = [time_section({"layer_profiles": profiles})] if profiles else []
    page = (sections(rows, lead, quantize) + frame_sections(deploy) + timed + sustained
            + int8_section(quantize_metrics, "mIoU", lambda v: f"{100 * v:.2f}", out) + list(found))
    paths = {"md": out / "report.md", "html": out / "report.html"}
    paths["md"].write_text(to_markdown(page_title(name, run), page))
    paths["html"].write_text(to_html(page_title(name, run), page))
    document = {"model": name, "run": run, "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "headline": lead,
                "rows": rows, "ladder": ladder, "deploy": deploy, "quantize": quantize}
    paths.update(write_results(out, document, "segmentation", RESULT_COLUMNS))
    return paths


def build_from_run(run_dir: Path, out: Path) -> dict[str, Path]:
    """The report of a finished segmentation run rebuilt from what its stages recorded (``edgefold report RUN``).

    Raises:
        ManifestError: The run has not reached its deploy stage.
    """
    from pipeline.report.diverge_report import diverge_section

    name, run, ladder, deploy, quantize = finished_run(run_dir)
    out.mkdir(parents=True, exist_ok=True)
    return write_report(name, run, ladder, deploy, quantize, out, diverge_section(run_dir))
