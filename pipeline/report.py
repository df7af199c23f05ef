"""The side-by-side report: the ladder of rungs on every device, edge against data center.

``build_report(run_dir)`` reads the manifest (evaluate and deploy) and writes ``report.md``,
a self-contained ``report.html`` (plots embedded as PNG data URIs), ``results.json`` and
``results.csv``. Nothing is estimated: a measurement that does not exist is "not measured", with why.
"""

from __future__ import annotations

import base64
import csv
import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Iterable

from device.errors import ManifestError, SchemaVersionError, require
from device.schema import JobResult, RunSummary, parse_result, reported_fields
from pipeline.devices import DEPLOY_SCHEMA
from device.files import sha256_file
from pipeline.manifest import Manifest
from pipeline.device_accuracy import device_scores, paired_top1_change, per_class_device
from pipeline.rungs import DEPLOYED, RUNGS, TEACHER, fp16_form
from device import contention
from pipeline import perclass, stats
from pipeline.front import choose, energy_front, settings_from_windows
from pipeline.headline import accuracy_evidence, fmt
from pipeline.headline import text as headline_text
from pipeline.scores import points as _points
from pipeline.scores import verdict
from pipeline.sections import (Bullets, Details, Figure, Pre, Section, Table, Text, figure_png, to_html,
                               to_markdown)

SCHEMA = "edgefold.report/2"
NOT_MEASURED = "not measured"
# The row's derived figures (intervals, ratios, accuracy on the device); the measured fields declared on the
# result schema (device.schema.reported) follow them, so a new measured field needs no edit here.
BASE_COLUMNS = ("rung", "device", "group", "role", "top1", "top1_delta_points", "params_m", "macs_g", "size_mb", "runtime",
           "precision", "latency_batch", "latency_p50_ms", "latency_p50_low_ms", "latency_p50_high_ms",
           "latency_p99_ms", "latency_p99_low_ms", "latency_p99_high_ms", "latency_cv_windows", "windows",
           "throughput_batch", "throughput_images_per_s", "throughput_low", "throughput_high", "peak_memory_mb",
           "power_mean_w", "energy_mj_per_image", "power_source", "energy_degraded", "energy_note",
           "latency_ratio_vs_dc_teacher", "latency_ratio_low", "latency_ratio_high", "latency_ratio_significant",
           "throughput_ratio_vs_dc_teacher", "throughput_ratio_low", "throughput_ratio_high",
           "throughput_ratio_significant", "energy_ratio_vs_dc_teacher", "energy_ratio_low", "energy_ratio_high",
           "energy_ratio_significant", "noisy", "noise_flags", "noise", "status", "reason",
           "trt_latency_p50_ms", "trt_latency_p50_low_ms", "trt_latency_p50_high_ms", "gpu_compute_p50_ms",
           "gpu_compute_p50_low_ms", "gpu_compute_p50_high_ms", "runtime_fallback", "device_top1", "device_top1_correct",
           "device_images", "host_top1_same_images", "agreement", "mcnemar_p", "device_deviates")
REPORTED = reported_fields(RunSummary)
COLUMNS = BASE_COLUMNS + tuple(REPORTED) + ("not_recorded",)
NOT_RECORDED = "not recorded"


def pareto_front(candidates: Iterable[tuple[Any, float, float]]) -> set:
    """Keys of the candidates no other beats: lower-or-equal latency and higher-or-equal accuracy, one strictly.

    Args:
        candidates: (key, latency, accuracy) triples.
    """
    candidates = list(candidates)
    front = set()
    for key, latency, accuracy in candidates:
        dominated = any(other_latency <= latency and other_accuracy >= accuracy
                        and (other_latency < latency or other_accuracy > accuracy)
                        for _, other_latency, other_accuracy in candidates)
        if not dominated:
            front.add(key)
    return front


def load_deploy_results(path: Path) -> dict[str, Any]:
    """The deploy stage's ``results.json`` with every succeeded rung's result typed (:class:`JobResult`).

    Raises:
        SchemaVersionError: A file of another EdgeFold version, named with the fix.
    """
    deploy = json.loads(path.read_text())
    if deploy.get("schema") != DEPLOY_SCHEMA:
        raise SchemaVersionError(f"{path} is schema {deploy.get('schema')!r}; this EdgeFold reads {DEPLOY_SCHEMA!r}",
                                 fix="measure again with this version: edgefold run MODEL --force deploy")
    for device in deploy["devices"]:
        for rung, entry in device["rungs"].items():
            if entry.get("state") == "succeeded":
                entry["result"] = parse_result(entry["result"], f"{path}: {device['name']}/{rung}")
                entry["rounds"] = [parse_result(r, f"{path}: {device['name']}/{rung} round {i + 1}")
                                   for i, r in enumerate(entry.get("rounds") or [])] or [entry["result"]]
        for name, road in (device.get("roads") or {}).items():
            for rung, entry in road.get("rungs", {}).items():
                if entry.get("state") == "succeeded":
                    where = f"{path}: {device['name']}/{rung}@{name}"
                    entry["result"] = parse_result(entry["result"], where)
                    entry["rounds"] = [parse_result(r, f"{where} round {i + 1}")
                                       for i, r in enumerate(entry.get("rounds") or [])] or [entry["result"]]
    return deploy


def collect(manifest: dict[str, Any], run_dir: Path) -> dict[str, Any]:
    """The report's data (``results.json``) from a run's manifest."""
    stages = manifest.get("stages", {})
    if "evaluate" not in stages:
        raise ManifestError(f"run {run_dir} has no evaluate stage", fix="run the pipeline through evaluate first")
    rungs = stages["evaluate"]["metrics"]["rungs"]
    deploy = None
    if "deploy" in stages:
        deploy = load_deploy_results(run_dir / stages["deploy"]["outputs"]["results"])
    rows: list[dict[str, Any]] = []
    devices = deploy["devices"] if deploy else []
    evaluation = (deploy or {}).get("evaluation")
    device_predictions: dict[tuple[str, str], list[list[int]]] = {}
    for device in devices:
        for rung, facts in rungs.items():
            row = {"rung": rung, "device": device["name"], "group": device.get("group", device["name"]),
                   "role": device["role"], "top1": facts["top1"], "verdict": verdict(rung, facts),
                   "params_m": facts["params_m"], "macs_g": facts["macs_g"],
                   "size_mb": facts.get("onnx_mb", facts["size_mb"]), "status": "measured", "reason": None,
                   "runtime_fallback": device.get("runtime_fallback")}
            entry = device["rungs"].get(rung)
            if device["status"] == "unreachable":
                row.update(status=NOT_MEASURED, reason=f"device unreachable: {device['error']}")
            elif entry is None:
                row.update(status=NOT_MEASURED, reason="rung not deployed (deploy.rungs)")
            elif entry["state"] != "succeeded":
                row.update(status=NOT_MEASURED, reason=f"job {entry['state']}: {(entry.get('error') or '').splitlines()[0] if entry.get('error') else ''}")
            else:
                result: JobResult = entry["result"]
                batches = sorted(run.batch_size for run in result.runs)
                large = result.run(batches[-1])
                summary = large.summary
                peak = max((run.summary.peak_memory_mb or 0) for run in result.runs) or None
                row.update(runtime=result.runtime.name, precision=result.runtime.precision,
                           latency_batch=batches[0], throughput_batch=batches[-1], peak_memory_mb=peak,
                           power_mean_w=summary.power_mean_mw / 1e3 if summary.power_mean_mw else None,
                           energy_mj_per_image=summary.energy_mj_per_image,
                           power_source=summary.power_source, **_energy_quality(summary.model_dump()),
                           **_window_statistics(entry["rounds"], batches[0], batches[-1]),
                           **reported_figures(entry["rounds"]))
                if result.evaluation is not None and evaluation:
                    # The accuracy of the engine that was timed, beside the host's on the same images.
                    scores = device_scores(evaluation, rung, result.evaluation.predictions)
                    row.update(scores, evaluation_seconds=result.evaluation.seconds,
                               engines_scored=engines_scored(evaluation, rung, result, scores),
                               evaluation_note=result.evaluation_note)
                    device_predictions[(device["name"], rung)] = result.evaluation.predictions
                if summary.power_mean_mw is None:
                    notes = result.telemetry_notes
                    row["reason"] = "no power telemetry on this device" + (f" ({'; '.join(notes)})" if notes else "")
            rows.append(row)
    dc = [d for d in devices if d["role"] == "dc" and d["status"] != "unreachable"]
    edge = [d for d in devices if d["role"] == "edge" and d["status"] != "unreachable"]
    baseline_device = (dc or edge or [None])[0]
    baseline_rung, baseline_why = _baseline_teacher(rows, baseline_device)
    baseline = next((r for r in rows if baseline_device and r["device"] == baseline_device["name"]
                     and r["rung"] == baseline_rung and r["status"] == "measured"), None)
    for row in rows:
        row["top1_delta_points"] = (_points(rungs[row["rung"]]["top1_delta_points"])
                                    if rungs.get(row["rung"], {}).get("top1_delta_points") is not None else None)
        row.update(_ratios(row, baseline))
    profiles = layer_profiles(devices)
    lead, int8_not_measured = _lead_rung(rows, (edge or [None])[0], profiles)
    headline = _headline(rows, edge, dc, baseline_device, baseline_rung, lead)
    headline["teacher_precision_why"] = baseline_why
    headline["int8_not_measured"] = int8_not_measured
    headline.update(accuracy_evidence(stages["evaluate"]["metrics"].get("per_class"), TEACHER, lead))
    headline["device_deviations"] = [
        {"rung": r["rung"] + (f" ({engine['label']})" if index else ""), "device": r["device"],
         "device_top1": engine["device_top1"], "host_top1": r["host_top1_same_images"], "images": r["device_images"],
         "mcnemar_p": engine["mcnemar_p"]}
        for r in rows for index, engine in enumerate(r.get("engines_scored") or []) if engine.get("device_deviates")]
    headline["two_roads"] = [line for device in edge + dc for line in _two_roads(rows, device, evaluation)]
    headline["int8_vs_fp16"] = [line for device in edge + dc
                                if (line := _int8_vs_fp16(rows, device["name"], device_predictions, evaluation,
                                                          profiles))]
    # The budget is the deploy stage's (recorded with its config): changing it re-runs deploy, whose windows are reused.
    fronts = power_fronts(devices, ((stages.get("deploy") or {}).get("config") or {}).get("deploy", {})
                          .get("latency_budget_ms"))
    headline["power_mode_choices"] = [
        {"device": f["device"], "rung": f["rung"], "text": f["choice"]["text"], "chosen": f["choice"]["chosen"]}
        for f in fronts if f["rung"] == DEPLOYED and f["role"] == "edge"]
    groups = fleet_aggregates(rows)
    traces = []
    for device in devices:
        for rung, entry in device["rungs"].items():
            if entry.get("state") == "succeeded":
                for run in entry["result"].runs:
                    if run.power_trace:
                        traces.append({"device": device["name"], "rung": rung, "batch_size": run.batch_size,
                                       **run.power_trace.model_dump()})
    provenance = {
        "pipeline": {k: v for k, v in (stages.get("evaluate", {}).get("env") or {}).items()},
        "devices": [{"name": d["name"], "role": d["role"], "url": d["url"], "status": d["status"],
                     "error": d["error"], **{k: (d.get("info") or {}).get(k) for k in
                                             ("board", "hostname", "l4t", "jetpack", "gpu", "cuda", "tensorrt",
                                              "onnxruntime", "torch", "nvpmodel", "jetson_clocks")},
                     "peak_temperatures_c": _peak_temps(d)} for d in devices],
    }
    return {"schema": SCHEMA, "model": manifest.get("model"), "run": run_dir.name,
            "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rungs": rungs, "rows": rows, "headline": headline,
            "per_class": stages["evaluate"]["metrics"].get("per_class"),
            "groups": groups,
            "power_traces": traces, "provenance": provenance, "layer_profiles": profiles, "power_fronts": fronts,
            "deployed": deploy is not None, "evaluation": _evaluation_summary(evaluation, rows, device_predictions)}


def power_fronts(devices: list[dict[str, Any]], budget_ms: float | None) -> list[dict[str, Any]]:
    """Per device × rung that ran a power-mode sweep: every setting (mode × jetson_clocks × batch × accelerator)
    over the rounds with intervals, the energy–latency front, the settings not measured and why, and the setting
    to ship under ``deploy.latency_budget_ms`` (:mod:`pipeline.front`)."""
    fronts = []
    for device in devices:
        for rung, entry in device.get("rungs", {}).items():
            if entry.get("state") != "succeeded" or entry["result"].sweep is None:
                continue
            settings = settings_from_windows(w for result in entry["rounds"] for w in result.sweep_windows())
            on_front = {p["label"] for p in energy_front(settings)}
            for setting in settings:
                setting["on_front"] = setting["label"] in on_front
            sweep = entry["result"].sweep
            fronts.append({"device": device["name"], "role": device["role"], "rung": rung, "settings": settings,
                           "controlled": sweep.controlled, "note": sweep.note,
                           "not_measured": [n.model_dump() for n in sweep.not_measured],
                           "budget_ms": budget_ms, "choice": choose(settings, budget_ms)})
    return fronts


def reported_figures(rounds: list[JobResult]) -> dict[str, Any]:
    """Each measured field the schema declares for the report, over every window of every batch size
    (``combine``: a peak's max, a low's min), and ``not_recorded``: the fields some window's result is
    too old to carry (a rung reused from the deploy cache), shown as "not recorded", never as zero."""
    out: dict[str, Any] = {"not_recorded": []}
    for name, how in REPORTED.items():
        if any(result.minor < how.since for result in rounds):
            out[name] = None
            out["not_recorded"].append(name)
            continue
        values = [value for result in rounds for run in result.runs
                  if (value := getattr(run.summary, name)) is not None and value == value]
        out[name] = (max if how.combine == "max" else min)(values) if values else None
    return out


def fleet_aggregates(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per device group and rung: how many devices measured it, the median and the spread (min–max)."""
    import statistics

    aggregates = []
    for group in dict.fromkeys(r["group"] for r in rows):
        members = [r for r in rows if r["group"] == group]
        for rung in dict.fromkeys(r["rung"] for r in members):
            measured = [r for r in members if r["rung"] == rung and r["status"] == "measured"]
            entry = {"group": group, "rung": rung, "role": members[0]["role"],
                     "devices": len({r["device"] for r in members}), "measured": len(measured)}
            for key in ("latency_p50_ms", "throughput_images_per_s", "energy_mj_per_image", "power_mean_w"):
                values = [r[key] for r in measured if r.get(key) is not None]
                entry[f"{key}_median"] = statistics.median(values) if values else None
                entry[f"{key}_min"] = min(values) if values else None
                entry[f"{key}_max"] = max(values) if values else None
            aggregates.append(entry)
    return aggregates


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


def _peak_temps(device: dict[str, Any]) -> dict[str, float]:
    temps: dict[str, float] = {}
    for entry in device.get("rungs", {}).values():
        if entry.get("state") != "succeeded":
            continue
        for run in entry["result"].runs:
            for telemetry in run.telemetry.values():
                for zone, value in telemetry.peak_temperatures_c().items():
                    temps[zone] = max(temps.get(zone, value), value)
    return temps


def _baseline_teacher(rows: list[dict[str, Any]], device: dict[str, Any] | None) -> tuple[str, str]:
    """The teacher rung the ladder is compared with: its FP16 form where the baseline device ran it on
    TensorRT (the precision a data-center user runs it in), else the FP32 teacher — with why, in words."""
    fp16 = fp16_form(TEACHER)
    if device is not None and fp16:
        row = next((r for r in rows if r["device"] == device["name"] and r["rung"] == fp16
                    and r["status"] == "measured"), None)
        if row is not None and row.get("runtime") == "tensorrt":
            return fp16, f"the teacher's FP16 form, as a data-center GPU runs it ({device['name']}, TensorRT)"
        if row is not None:
            return TEACHER, (f"the FP32 teacher: {device['name']} runs {row.get('runtime')}, where FP16 is not how "
                             "the teacher would be served (ONNX Runtime's CPU emulates it)")
    return TEACHER, "the FP32 teacher (no FP16 form measured)"


def _int8_vs_fp16(rows: list[dict[str, Any]], device: str, predictions: dict, evaluation: dict | None,
                  profiles: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The verdict users want: the INT8 student against its FP16 form on one device, with its evidence —
    paired latency and energy ratios with intervals, the device-measured top-1 change with McNemar's p, and,
    when INT8 does not pay off, the reasons the per-layer profile gives."""
    from device.profile import BatchProfile, int8_payoff_reasons

    fp16 = fp16_form(RUNGS[DEPLOYED].form_of)
    int8 = next((r for r in rows if r["device"] == device and r["rung"] == DEPLOYED and r["status"] == "measured"), None)
    half = next((r for r in rows if r["device"] == device and r["rung"] == fp16 and r["status"] == "measured"), None)
    if int8 is None or half is None:
        return None
    out: dict[str, Any] = {"device": device, "runtime": int8.get("runtime")}
    for name, key in (("latency", "latency_p50_windows_ms"), ("energy", "energy_windows_mj")):
        out.update(_ratio_fields(name, _paired_ratio(int8.get(key), half.get(key))))
    if evaluation and (device, DEPLOYED) in predictions and (device, fp16) in predictions:
        change = paired_top1_change(evaluation, predictions[(device, fp16)], predictions[(device, DEPLOYED)])
        out.update(top1_delta_points=change["delta_points"], top1_p=change["mcnemar_p"], top1_source="device-measured",
                   top1_images=change["images"])
    elif int8.get("top1") is not None and half.get("top1") is not None:
        out.update(top1_delta_points=100 * (int8["top1"] - half["top1"]), top1_p=None, top1_source="host ONNX Runtime")
    pays = out.get("latency_ratio") is not None and out.get("latency_significant") and out["latency_ratio"] < 1
    out["pays_off"] = bool(pays)
    if not pays:
        entry = next((p for p in profiles if p["device"] == device and p["rung"] == DEPLOYED
                      and p["status"] == "measured"), None)
        reasons = []
        if entry:
            table = _shown_batch(entry["profile"])
            reasons = int8_payoff_reasons(BatchProfile.model_validate(table))
        out["reasons"] = reasons or ["the per-layer profile names no cause (see \"Where the time goes\")"]
    return out


def _two_roads(rows: list[dict[str, Any]], device: dict[str, Any], evaluation: dict | None) -> list[dict[str, Any]]:
    """A line per rung that ran on both roads on ``device``: Torch-TensorRT against the ONNX road — paired latency
    (at the latency batch) and energy ratios with intervals over the interleaved rounds, each road's top-1 as the
    device measured it, and the ops that fell back to PyTorch."""
    lines = []
    road = (device.get("roads") or {}).get("torch_tensorrt") or {}
    for rung, entry in road.get("rungs", {}).items():
        onnx = next((r for r in rows if r["device"] == device["name"] and r["rung"] == rung
                     and r["status"] == "measured"), None)
        if entry.get("state") != "succeeded":  # said, not dropped: why this rung has no Torch-TensorRT figure
            lines.append({"device": device["name"], "rung": rung, "torch_tensorrt": road.get("torch_tensorrt"),
                          "error": entry.get("error") or entry.get("state"), "sent": (road.get("sent") or {}).get(rung)})
            continue
        if onnx is None:
            continue
        result: JobResult = entry["result"]
        batches = sorted(run.batch_size for run in result.runs)
        torch_road = _window_statistics(entry["rounds"], onnx["latency_batch"], onnx["throughput_batch"])
        info = result.runtime.torch_tensorrt or {}
        fallback = (info.get("fallback") or {}).get(str(batches[0])) or (info.get("fallback") or {}).get(batches[0]) or {}
        out: dict[str, Any] = {"device": device["name"], "rung": rung, "onnx_runtime": onnx.get("runtime"),
                               "torch_tensorrt": info.get("version"), "fallback_count": info.get("fallback_count"),
                               "fallback_ops": fallback.get("fallback_ops") or {},
                               "onnx_top1": onnx.get("device_top1"), "torch_top1": None,
                               "exported_on_device": bool(info.get("exported_on_device"))}
        for name, key in (("latency", "latency_p50_windows_ms"), ("energy", "energy_windows_mj")):
            out.update(_ratio_fields(name, _paired_ratio(torch_road.get(key), onnx.get(key))))
        if result.evaluation is not None and evaluation:
            out["torch_top1"] = device_scores(evaluation, rung, result.evaluation.predictions)["device_top1"]
        lines.append(out)
    return lines


def _evaluation_summary(evaluation: dict | None, rows: list[dict[str, Any]], predictions: dict) -> dict | None:
    """What the on-device evaluation covered, and each device's per-class accuracy of each rung."""
    if not evaluation:
        return None
    per_class = {f"{rung}@{device}": per_class_device(evaluation, preds) for (device, rung), preds in predictions.items()}
    seconds = [r["evaluation_seconds"] for r in rows if r.get("evaluation_seconds") is not None]
    return {"images": evaluation["images"], "of_images": evaluation.get("of_images"),
            "stratified": evaluation.get("stratified"), "classes": evaluation.get("classes"),
            "per_class_device": per_class, "seconds_total": sum(seconds) if seconds else None}


INT8_FIX = ("measure it where TensorRT builds INT8 engines: EDGE=http://<jetson>:8765 (make agent on the Jetson) or "
            "DC=http://<gpu-server>:8765 (an agent with TensorRT)")


def _lead_rung(rows: list[dict[str, Any]], edge_device: dict[str, Any] | None,
               profiles: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    """The rung the headline leads with on the edge device: the INT8 student, unless the device's own profile of it
    shows no compute layer ran in INT8 (ONNX Runtime's CPU provider runs the Q/DQ graph with every quantize and
    dequantize node a layer of its own); then the fastest student form the device really ran, with why and how to
    measure INT8.

    Returns:
        The rung's name, and ``{"device", "rung", "reason", "fix"}`` when INT8 was not measured as INT8, else None.
    """
    if edge_device is None:
        return DEPLOYED, None
    name = edge_device["name"]

    def profile(rung: str) -> dict[str, Any] | None:  # the ONNX road's, listed first
        return next((p for p in profiles if p["device"] == name and p["rung"] == rung and p["status"] == "measured"),
                    None)

    def computes_in(rung: str) -> bool:
        """Whether a compute layer ran in the rung's precision (true when there is no profile to say otherwise)."""
        entry, precision = profile(rung), RUNGS[rung].precision
        if entry is None or precision == "fp32":
            return True
        layers = _time_table(_shown_batch(entry["profile"]))["layers"]
        return any(_get(layer, "precision") == precision and not _get(layer, "overhead") for layer in layers)

    entry = profile(DEPLOYED)
    if entry is None or computes_in(DEPLOYED):
        return DEPLOYED, None
    forms = {RUNGS[DEPLOYED].form_of, fp16_form(RUNGS[DEPLOYED].form_of)}
    ran = [r for r in rows if r["device"] == name and r["rung"] in forms and r["status"] == "measured"
           and r.get("latency_p50_ms") is not None and not no_score(r) and computes_in(r["rung"])]
    if not ran:
        return DEPLOYED, None
    fastest = min(ran, key=lambda r: r["latency_p50_ms"])
    runtime = entry.get("runtime") or "the runtime"
    reason = (f"no compute layer ran in INT8 there: {runtime} ran the INT8 rung's Q/DQ graph with its quantize and "
              "dequantize nodes as layers of their own (its profile, \"Where the time goes\")")
    return fastest["rung"], {"device": name, "rung": DEPLOYED, "reason": reason, "fix": INT8_FIX}


def _get(item: Any, key: str) -> Any:
    return item.get(key) if isinstance(item, dict) else getattr(item, key, None)


def _headline(rows, edge, dc, baseline_device, baseline_rung: str = TEACHER, lead: str = DEPLOYED) -> dict[str, Any]:
    """The lead student rung (the INT8 one, unless the device ran no INT8 compute: :func:`_lead_rung`) on the edge
    device against the teacher on the data-center device."""
    edge_device = (edge or [None])[0]
    if edge_device is None or baseline_device is None:
        return {"status": NOT_MEASURED, "reason": "no reachable device measured the ladder"}
    student = next((r for r in rows if r["device"] == edge_device["name"] and r["rung"] == lead), None)
    teacher = next((r for r in rows if r["device"] == baseline_device["name"] and r["rung"] == baseline_rung), None)
    note = None if dc else ("no data-center device configured (DC=): the teacher's numbers come from the same "
                            f"device, {edge_device['name']}")
    # A runtime that fell back is said in the headline itself: a Jetson's row timed by ONNX Runtime is not TensorRT.
    fallbacks = {d["name"]: d.get("runtime_fallback") for d in (edge_device, baseline_device)
                 if d.get("runtime_fallback")}
    if not student or not teacher or student["status"] != "measured" or teacher["status"] != "measured":
        return {"status": NOT_MEASURED, "reason": f"{lead} or teacher not measured", "note": note,
                "runtime_fallbacks": fallbacks}

    def ratio(a, b):
        return a / b if a is not None and b else None

    # Like with like: the deployed rung's float form (same network) against the float teacher.
    float_form = RUNGS[lead].form_of or lead
    student_fp32 = next((r for r in rows if r["device"] == edge_device["name"] and r["rung"] == float_form), None)
    return {"status": "measured", "lead_rung": lead, "edge_device": edge_device["name"],
            "dc_device": baseline_device["name"],
            "note": note, "runtime_fallbacks": fallbacks, "top1_edge": student["top1"], "top1_dc": teacher["top1"],
            "edge_precision": student.get("precision") or "int8", "dc_precision": teacher.get("precision") or "fp32",
            "accuracy_lost_points": _points(-student["top1_delta_points"]) if student["top1_delta_points"] is not None
            else None,
            "latency_p50_ms_edge": student["latency_p50_ms"], "latency_p50_ms_dc": teacher["latency_p50_ms"],
            "latency_ratio": ratio(student["latency_p50_ms"], teacher["latency_p50_ms"]),
            **_paired(student, teacher),
            "throughput_edge": student["throughput_images_per_s"], "throughput_dc": teacher["throughput_images_per_s"],
            "throughput_ratio": ratio(student["throughput_images_per_s"], teacher["throughput_images_per_s"]),
            "energy_mj_edge": student["energy_mj_per_image"], "energy_mj_dc": teacher["energy_mj_per_image"],
            "energy_ratio": ratio(student["energy_mj_per_image"], teacher["energy_mj_per_image"]),
            "energy_reason": student.get("reason") or teacher.get("reason"),
            "peak_memory_mb_edge": student["peak_memory_mb"], "peak_memory_mb_dc": teacher["peak_memory_mb"],
            "size_mb_edge": student["size_mb"], "size_mb_dc": teacher["size_mb"],
            # Like with like: the student's FP32 form against the FP32 teacher, and the compute both do.
            "size_mb_student_fp32": student_fp32["size_mb"] if student_fp32 else None,
            "macs_ratio": ratio(student["macs_g"], teacher["macs_g"]),
            "params_ratio": ratio(student["params_m"], teacher["params_m"])}


def _paired_ratio(a: list | None, b: list | None) -> tuple[float, float, float, bool] | None:
    """``a / b`` from two rows' windows, paired by round: (estimate, 95% low, high, significant), or None when
    either side has no windows, a window without a value, or no finite ratio."""
    if not a or not b or any(v is None for v in (*a, *b)):
        return None
    estimate, low, high = stats.ratio_interval(a, b)
    return (estimate, low, high, stats.significant(low, high)) if estimate == estimate else None


def _ratio_fields(name: str, ratio: tuple | None, infix: str = "") -> dict[str, Any]:
    """``ratio`` (from :func:`_paired_ratio`) as ``{name}_ratio``, ``{name}{infix}_low``, ``…_high`` and
    ``…_significant``; nothing when there is no ratio."""
    if ratio is None:
        return {}
    keys = (f"{name}_ratio", f"{name}{infix}_low", f"{name}{infix}_high", f"{name}{infix}_significant")
    return dict(zip(keys, ratio))


def _paired(student: dict[str, Any], teacher: dict[str, Any]) -> dict[str, Any]:
    """The headline's ratios from the windows of both rows, paired by round, with their 95% intervals."""
    out = {}
    for name, key in (("latency", "latency_p50_windows_ms"), ("throughput", "throughput_windows"),
                      ("energy", "energy_windows_mj")):
        ratio = _paired_ratio(student.get(key), teacher.get(key))
        if ratio:
            out.update(_ratio_fields(name, ratio, "_ratio"),
                       **{f"{name}_windows": min(len(student[key]), len(teacher[key]))})
    return out


# ----------------------------------------------------------------- rendering
LADDER_CSS = ("", "", "ratio", "ratio")  # the ratio columns: the ones the report exists for, first after the names


def _top1_cell(row: dict[str, Any]) -> str:
    """The host's top-1, marked when FP16 is a CPU emulation there and when the score is no score."""
    return (f"{100 * row['top1']:.2f}%" + (" emulated" if RUNGS[row["rung"]].precision == "fp16" else "")
            + (" " + row["verdict"].split(":")[0] if row.get("verdict") else ""))


def ladder_tables(data: dict[str, Any]) -> tuple[Table, Table]:
    """The ladder, narrow enough for a laptop (the ratios first), and its detail: every other figure,
    the measured fields the result schema declares (:data:`REPORTED`) among them."""
    notes = reason_notes(data)
    main = [["rung", "device", "latency ×", "energy ×", "top-1 host", "top-1 device", "Δ pts", "p50 ms [95% CI]",
             "mJ/image", "status"]]
    detail = [["rung", "device", "runtime", "params M", "GMACs", "MB", "p99 ms", "CV", "images/s", "peak MB", "W",
               *(how.label for how in REPORTED.values())]]
    for r in data["rows"]:
        measured = r["status"] == "measured"
        device_top1 = "—" if r.get("device_top1") is None else (f"{100 * r['device_top1']:.2f}%"
                                                                + (" ≠ host" if r.get("device_deviates") else ""))
        main.append([
            r["rung"], r["device"], _ratio_cell(r, "latency"), _ratio_cell(r, "energy"), _top1_cell(r), device_top1,
            fmt(r["top1_delta_points"], "+.2f"),
            _interval(r.get("latency_p50_ms"), r.get("latency_p50_low_ms"), r.get("latency_p50_high_ms"), ".3f")
            + (f" noisy [{notes[r['noise']]}]" if r.get("noise") else ""),
            fmt(r.get("energy_mj_per_image"), ".2f", NOT_MEASURED if measured else "—")
            + (f" degraded [{notes[r['energy_note']]}]" if r.get("energy_degraded") and r.get("energy_note") else ""),
            ("measured" if measured else NOT_MEASURED) + (f" [{notes[r['reason']]}]" if r.get("reason") else ""),
        ])
        detail.append([
            r["rung"], r["device"],
            (f"{r['runtime']} {r['precision']}" + (f" (fallback) [{notes[r['runtime_fallback']]}]"
                                                   if r.get("runtime_fallback") else "")) if measured else "—",
            f"{r['params_m']:.2f}", f"{r['macs_g']:.3f}", f"{r['size_mb']:.1f}", fmt(r.get("latency_p99_ms"), ".3f"),
            fmt(100 * r["latency_cv_windows"] if r.get("latency_cv_windows") is not None else None, ".0f")
            + ("%" if r.get("latency_cv_windows") is not None else ""),
            fmt(r.get("throughput_images_per_s"), ".0f"), fmt(r.get("peak_memory_mb"), ".0f"),
            fmt(r.get("power_mean_w"), ".2f", NOT_MEASURED if measured else "—"),
            *(NOT_RECORDED if name in (r.get("not_recorded") or []) else fmt(r.get(name), how.fmt)
              for name, how in REPORTED.items()),
        ])
    return Table(main, LADDER_CSS, css="ladder"), Table(detail)


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


def engines_scored(evaluation: dict[str, Any], rung: str, result: JobResult,
                   primary: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """Each engine the job timed and scored, the largest batch's first: its label (batch, accelerator), device top-1
    and how it agrees with the host's predictions (:func:`device_scores`; ``primary``: the first's, when known)."""
    engines = []
    for index, scored in enumerate([result.evaluation, *result.more_evaluations]):
        scores = primary if index == 0 and primary is not None else device_scores(evaluation, rung, scored.predictions)
        engines.append({"label": scored.engine(), "batch_size": scored.batch_size, "accelerator": scored.accelerator,
                        **{key: scores.get(key) for key in ("device_top1", "device_top1_correct", "agreement",
                                                            "mcnemar_p", "device_deviates")}})
    return engines


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


def _interval(value, low, high, spec: str) -> str:
    """``4.020 [3.950, 4.110]``; the bare value when there is no interval (one window)."""
    if value is None:
        return "—"
    if low is None or high is None or low == high:
        return format(value, spec)
    return f"{format(value, spec)} [{format(low, spec)}, {format(high, spec)}]"


def _ratio_cell(row: dict[str, Any], name: str) -> str:
    """A ratio with its interval, or "≈1 (n.s.)" when the interval holds 1: no measurable difference."""
    value = row.get(f"{name}_ratio_vs_dc_teacher")
    if value is None:
        return "—"
    if row.get(f"{name}_ratio_significant") is None and row.get(f"{name}_ratio_low") is None:
        return "1 (reference)" if value == 1.0 else format(value, ".2f")
    text = _interval(value, row.get(f"{name}_ratio_low"), row.get(f"{name}_ratio_high"), ".2f")
    return text if row.get(f"{name}_ratio_significant") is not False else f"{text} n.s."


def reason_notes(data: dict[str, Any]) -> dict[str, int]:
    """Each distinct reason for a missing number or a degraded energy figure, numbered for footnotes."""
    notes: dict[str, int] = {}
    for row in data["rows"]:
        for reason in (row.get("runtime_fallback"), row.get("reason"), row.get("energy_note"), row.get("noise")):
            if reason and reason not in notes:
                notes[reason] = len(notes) + 1
    return notes


def _window_statistics(rounds: list[JobResult], latency_batch: int, throughput_batch: int) -> dict[str, Any]:
    """Per row: each number as the median over the interleaved windows with its 95% interval, the
    spread between windows, and why the windows were noisy (pipeline.stats, device.contention)."""
    small = [r.run(latency_batch) for r in rounds]
    large = [r.run(throughput_batch) for r in rounds]
    p50 = [run.latency_p50_ms if run else None for run in small]
    p99 = [run.latency_p99_ms if run else None for run in small]
    throughput = [run.throughput_images_per_s if run else None for run in large]
    energy = [run.summary.energy_mj_per_image if run else None for run in large]
    p50_est, p50_low, p50_high = stats.median_interval(p50)
    # trtexec's two device times of the same calls, where the runner took them (TensorRT).
    device = {}
    for name, key in (("trt_latency", "latency_p50_ms"), ("gpu_compute", "gpu_compute_p50_ms")):
        values = [getattr(run.device_timing, key) if run and run.device_timing else None for run in small]
        if any(v is not None for v in values):
            estimate, low, high = stats.median_interval(values)
            device.update({f"{name}_p50_ms": estimate, f"{name}_p50_low_ms": low, f"{name}_p50_high_ms": high})
    p99_est, p99_low, p99_high = stats.median_interval(p99)
    tp_est, tp_low, tp_high = stats.median_interval(throughput)
    flags: dict[str, str] = {}
    for run in small + large:
        if run:
            flags.update(run.noise_flags)
    spread = stats.cv(p50)
    if spread is not None and spread > contention.WINDOW_CV_LIMIT:
        flags["windows_disagree"] = (f"latency p50 varies {100 * spread:.0f}% between the interleaved windows; the "
                                     "device was not quiet: stop other work, lock clocks, or add rounds")
    return {"latency_p50_ms": p50_est, "latency_p50_low_ms": p50_low, "latency_p50_high_ms": p50_high,
            "latency_p99_ms": p99_est, "latency_p99_low_ms": p99_low, "latency_p99_high_ms": p99_high,
            "throughput_images_per_s": tp_est, "throughput_low": tp_low, "throughput_high": tp_high,
            "latency_cv_windows": spread, "windows": len(rounds), "noisy": bool(flags), "noise_flags": sorted(flags),
            "noise": "; ".join(f"{flag}: {why}" for flag, why in sorted(flags.items())) or None,
            "latency_p50_windows_ms": p50, "throughput_windows": throughput, "energy_windows_mj": energy,
            **device}


def _ratios(row: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """Latency, throughput and energy against the baseline teacher, each with its paired 95% interval."""
    out: dict[str, Any] = {}
    for name, key in (("latency", "latency_p50_windows_ms"), ("throughput", "throughput_windows"),
                      ("energy", "energy_windows_mj")):
        if row is baseline:  # the reference itself: 1 by definition, not a measurement of no difference
            out.update({f"{name}_ratio_vs_dc_teacher": 1.0 if row.get(key) else None, f"{name}_ratio_low": None,
                        f"{name}_ratio_high": None, f"{name}_ratio_significant": None})
            continue
        ratio = _paired_ratio(row.get(key), (baseline or {}).get(key)) or (None,) * 4
        out.update(zip((f"{name}_ratio_vs_dc_teacher", f"{name}_ratio_low", f"{name}_ratio_high",
                        f"{name}_ratio_significant"), ratio))
    return out


def _energy_quality(summary: dict[str, Any]) -> dict[str, Any]:
    """``energy_degraded`` and a one-line ``energy_note`` (flags and reasons) from a run's summary."""
    reasons = summary.get("energy_degraded_reasons") or {}
    if not summary.get("energy_degraded") or not reasons:
        return {"energy_degraded": False if summary.get("energy_degraded") is False else None, "energy_note": None}
    return {"energy_degraded": True,
            "energy_note": "energy degraded: " + "; ".join(f"{flag}: {why}" for flag, why in sorted(reasons.items()))}


def _batch_note(data) -> str:
    measured = [r for r in data["rows"] if r["status"] == "measured"]
    if not measured:
        return ""
    headline = data.get("headline") or {}
    if headline.get("dc_device") and not headline.get("note"):
        against = f"the teacher on the data-center device ({headline['dc_device']})"
    elif headline.get("dc_device"):
        against = f"the teacher on {headline['dc_device']} (no data-center device configured)"
    else:
        against = "the teacher on the first device measured"
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
    """Every section of the report, in order, as data (:mod:`pipeline.sections` renders both formats).

    Args:
        data: :func:`collect`'s result.
        figures: The plots (:func:`plots`); a plot with nothing to draw is a line of text. None: no plots
            section (report.md, which never embedded them).
        extra: Stage-specific sections placed before the fleet (the latency-budget plan).
    """
    sections = [Section("Headline", [Text(f"Generated {data['generated']}."), Pre(headline_text(data["headline"]))])]
    if data["rows"]:
        main, detail = ladder_tables(data)
        notes = [("", reason) for reason in reason_notes(data)]
        sections.append(Section("The ladder", [Text(_batch_note(data)), main,
                                               *([Bullets(notes, numbered=True, css="notes")] if notes else []),
                                               Details("Ladder detail: runtime, size, p99, spread, throughput, "
                                                       "memory, power, GPU temperature and clock", [detail])]))
    else:
        sections.append(Section("The ladder", [
            Text(f"Devices: {NOT_MEASURED} (the run has no deploy stage). Accuracy and size only:"),
            Table([["rung", "top-1", "params M", "GMACs", "MB"]] + [
                [name, f"{100 * r['top1']:.2f}%", f"{r['params_m']:.2f}", f"{r['macs_g']:.3f}",
                 f"{r.get('onnx_mb', r['size_mb']):.1f}"] for name, r in data["rungs"].items()])]))
    if data.get("per_class"):
        sections.append(perclass.section(data["per_class"]))
    if data.get("evaluation") and len(device_accuracy_rows(data)) > 1:
        sections.append(Section("Accuracy on the device", [
            Text(_evaluation_note(data)), Table(device_accuracy_rows(data)), Text("Per class, on the device (top-1 %):"),
            Table(device_class_rows(data))]))
    if _has_device_timings(data):
        sections.append(Section("Latency as trtexec reports it", [Text(TIMINGS_TEXT), Table(timing_rows(data))]))
    if data.get("layer_profiles"):
        sections.append(time_section(data))
    if data.get("power_fronts"):
        sections.append(power_section(data, figures))
    sections += list(extra)
    if _is_fleet(data):
        sections.append(Section("Fleet", [Text("Per group of devices of the same kind: the median and the spread "
                                               "across them."), Table(fleet_rows(data))]))
    if figures is not None:
        sections.append(Section("Plots", [figure if isinstance(figure, (Figure, Text)) else
                                          Figure(key, figure, PLOT_CAPTIONS[key]) for key, figure in figures.items()
                                          if not key.startswith("power_front:")]))
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
            rows.append([p["label"], _interval(p["latency_p50_ms"], p["latency_p50_ms_low"], p["latency_p50_ms_high"],
                                               ".3f"),
                         _interval(p["energy_mj_per_image"], p["energy_mj_per_image_low"],
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
    return f"EdgeFold report: {data['model']} / {data['run']}"


def render_markdown(data: dict[str, Any], extra: list[Section] = ()) -> str:
    """report.md."""
    return to_markdown(report_title(data), report_sections(data, None, extra))


def render_html(data: dict[str, Any], figures: dict[str, Any], extra: list[Section] = ()) -> str:
    """The self-contained report.html (plots embedded as PNG data URIs)."""
    return to_html(report_title(data), report_sections(data, figures, extra))


# ----------------------------------------------------------------- where the time goes (per-layer profile)
TOP_LAYERS = 5


def layer_profiles(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rung × device: the job's whole per-layer profile (``device.profile.Profile``), or why there is none."""
    entries = []
    for device in devices:
        # The ONNX road's rungs, then each other road's (Torch-TensorRT): their deploy entries have the same shape.
        roads = [device.get("rungs", {})] + [road.get("rungs", {}) for road in (device.get("roads") or {}).values()]
        for rungs in roads:
            for rung, entry in rungs.items():
                if entry.get("state") != "succeeded":
                    continue
                result: JobResult = entry["result"]
                # Deploy profiles the first round only: a road's entry may keep another round as its result.
                profile = result.profile or next((r.profile for r in entry.get("rounds") or [] if r.profile), None)
                entries.append({"device": device["name"], "rung": rung, "runtime": result.runtime.name,
                                "status": "measured" if profile else NOT_MEASURED,
                                "reason": None if profile else (result.runtime.profile_note
                                                                or "the agent recorded no per-layer profile"),
                                "profile": profile})
    return entries


def _time_table(table: dict[str, Any]) -> dict[str, Any]:
    # Profiles stored before the overhead split counted Q/DQ and reformats as INT8: the model splits them on load.
    if "overhead_share" in table:
        return table
    from device.profile import BatchProfile

    return BatchProfile.model_validate(table).model_dump()


def _time_summary(table: dict[str, Any], device: str) -> str:
    """One sentence: INT8 compute, Q/DQ/reformat/cast overhead and float shares, the DLA share and fallbacks,
    the costliest layer left in float."""
    from device.profile import FLOAT_PRECISIONS

    table = _time_table(table)
    floats: dict[str, float] = {}
    for layer in table["layers"]:
        if not layer.get("overhead") and layer["precision"] in FLOAT_PRECISIONS:
            floats[layer["precision"]] = floats.get(layer["precision"], 0.0) + layer["share"]
    float_share = sum(floats.values())
    other = max(0.0, 1.0 - table["int8_share"] - table["overhead_share"] - float_share) if table["layers"] else 0.0
    text = (f"INT8 compute takes {100 * table['int8_share']:.1f}% of the time, Q/DQ/reformat/cast overhead "
            f"{100 * table['overhead_share']:.1f}%, float layers {100 * float_share:.1f}%"
            + (f" ({', '.join(f'{p} {100 * v:.1f}%' for p, v in sorted(floats.items(), key=lambda kv: -kv[1]))})"
               if floats else "")
            + (f", other {100 * other:.1f}%" if other >= 0.0005 else "") + ".")
    if table["float_left_behind"]:
        name = table["float_left_behind"][0]
        layer = next(l for l in table["layers"] if l["name"] == name)
        text += (f" Biggest layer left in float: {name} ({layer['kind']}, {layer['precision']}, "
                 f"{100 * layer['share']:.1f}%).")
    if table["int8_share"] == 0:
        text += (" No compute layer ran in INT8: only its Q/DQ did." if any(
            l.get("overhead") == "qdq" for l in table["layers"]) else " No INT8 layers: the model runs in float.")
    if table.get("dla_share") is not None:
        fallbacks = table["fallback_layers"]
        text += (f" DLA: {100 * table['dla_share']:.1f}% of the time; "
                 + (f"{len(fallbacks)} layer(s) fell back to the GPU: {', '.join(fallbacks[:5])}"
                    + (f" (+{len(fallbacks) - 5})" if len(fallbacks) > 5 else "") + "." if fallbacks
                    else "no layer fell back to the GPU."))
    return text


def _payoff_reasons(table: dict[str, Any], runtime: str) -> list[str]:
    from device.profile import BatchProfile, int8_payoff_reasons

    return int8_payoff_reasons(BatchProfile.model_validate(table), runtime)


_OVERHEAD_LABEL = {"qdq": "Q/DQ", "reformat": "reformat", "cast": "cast"}


def _time_rows(table: dict[str, Any]) -> list[list[str]]:
    rows = [["layer", "kind", "precision", "device", "ms", "share"]]
    for layer in _time_table(table)["layers"][:TOP_LAYERS]:
        # Overhead rows say so beside their precision: a DequantizeLinear touches INT8 but computes nothing.
        overhead = layer.get("overhead")
        rows.append([layer["name"], layer["kind"], layer["precision"]
                     + (f" ({_OVERHEAD_LABEL[overhead]} overhead)" if overhead else ""), layer["device"]
                     + (" (fell back)" if layer.get("fell_back") else ""), f"{layer['time_ms']:.4f}",
                     f"{100 * layer['share']:.1f}%"])
    return rows


def _shown_batch(profile: dict[str, Any]) -> dict[str, Any]:
    # The latency batch (the smallest), as the ladder's latency column; results.json keeps every batch.
    return min(profile["batches"], key=lambda b: b["batch_size"])


TIMINGS_TEXT = ("Three latencies of the same timed calls at the latency batch, each the median over the interleaved "
                "windows with its 95% interval. Wall: the whole call as an application sees it (the batch copied "
                "into the runtime, the copies, the enqueue, the wait, Python) — the ladder's p50. trtexec Latency: "
                "host-to-device copy + GPU compute + device-to-host copy, timed with CUDA events on pinned "
                "buffers, the input shape set once — compare this with trtexec's \"Latency\". GPU Compute: CUDA "
                "events around execute_async_v3 — trtexec's \"GPU Compute Time\". One inference is in flight at a "
                "time, synchronized after each call: trtexec --exposeDMA, not trtexec's default of overlapped "
                "streams, whose throughput can be higher. ONNX Runtime and torch rows have the wall time only.")


def timing_rows(data: dict[str, Any]) -> list[list[str]]:
    """Per measured row: wall, trtexec Latency and GPU Compute p50 with their intervals (— where not taken)."""
    table = [["rung", "device", "runtime", "wall p50 ms", "trtexec Latency p50 ms", "GPU Compute p50 ms"]]
    for r in data["rows"]:
        if r["status"] != "measured":
            continue
        table.append([r["rung"], r["device"], f"{r['runtime']} {r['precision']}",
                      _interval(r.get("latency_p50_ms"), r.get("latency_p50_low_ms"), r.get("latency_p50_high_ms"),
                                ".3f"),
                      _interval(r.get("trt_latency_p50_ms"), r.get("trt_latency_p50_low_ms"),
                                r.get("trt_latency_p50_high_ms"), ".3f"),
                      _interval(r.get("gpu_compute_p50_ms"), r.get("gpu_compute_p50_low_ms"),
                                r.get("gpu_compute_p50_high_ms"), ".3f")])
    return table


def _has_device_timings(data: dict[str, Any]) -> bool:
    return any(r.get("trt_latency_p50_ms") is not None for r in data["rows"])


def time_section(data: dict[str, Any]) -> Section:
    """The "Where the time goes" section: per rung × device, the top layers by time and what they ran in."""
    section = Section("Where the time goes", [Text(
        "Per-layer profile of the engine that ran, from a separate pass after the timed windows (TensorRT: "
        "IEngineInspector + IProfiler; ONNX Runtime: its profiler). The latency batch is shown; results.json "
        f"carries every batch and layer. Top {TOP_LAYERS} layers by time:")])
    for entry in data["layer_profiles"]:
        if entry["status"] != "measured":
            section.blocks.append(Section(f"{entry['rung']} on {entry['device']}",
                                          [Text(f"{NOT_MEASURED}: {entry['reason']}")], level=3))
            continue
        profile = entry["profile"]
        table = _shown_batch(profile)
        blocks: list = [Text(_time_summary(table, entry["device"]))]
        reasons = _payoff_reasons(table, entry["runtime"])
        if reasons:
            blocks += [Text("Why INT8 may not pay off here:"), Bullets([("", reason) for reason in reasons])]
        blocks.append(Table(_time_rows(table)))
        if profile.get("notes"):  # what the numbers leave out (ops outside the engines, unknown precisions …)
            blocks.append(Bullets([("", note) for note in profile["notes"]]))
        section.blocks.append(Section(f"{entry['rung']} on {entry['device']} ({entry['runtime']}, "
                                      f"{profile['requested_device']}, batch {table['batch_size']})", blocks, level=3))
    return section


# ----------------------------------------------------------------- plots
def no_score(row: dict[str, Any]) -> bool:
    """A rung whose top-1 is no score (collapsed onto one class, or at chance): never on a Pareto front."""
    return (row.get("verdict") or "").startswith(("collapsed", "at chance"))


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


def build_report(run_dir: str | Path, out_dir: str | Path | None = None) -> dict[str, Path]:
    """Writes report.md, report.html, results.json and results.csv; returns their paths."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ManifestError(f"no manifest in {run_dir}", fix="pass a run directory (edgefold runs lists them)")
    data = collect(json.loads(manifest_path.read_text()), run_dir)
    out = Path(out_dir or run_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"md": out / "report.md", "html": out / "report.html", "json": out / "results.json",
             "csv": out / "results.csv"}
    paths["json"].write_text(json.dumps(data, indent=1) + "\n")  # no default=str: a non-JSON value is a bug, raised
    with open(paths["csv"], "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=COLUMNS, extrasaction="ignore")
        writer.writeheader()
        for row in data["rows"]:
            writer.writerow({k: ("" if row.get(k) is None else "; ".join(map(str, row[k])) if isinstance(row[k], list)
                                 else row[k]) for k in COLUMNS})
    # The prune stage's latency plan (issue #16), when the run pruned to a latency budget: its own section.
    extra = latency_section(json.loads(manifest_path.read_text()), run_dir, out)
    paths["md"].write_text(render_markdown(data, extra))
    paths["html"].write_text(render_html(data, plots(data), extra))
    return paths


def rebuild_report(run_dir: str | Path, build: Callable[[Path, Path], dict[str, Path]] | None = None
                   ) -> dict[str, Path]:
    """Rebuilds a run's ``report/`` folder whole (``edgefold report RUN``) and keeps the manifest's record of it true.

    The files are rendered into a folder beside ``report/`` that takes its place only once all of
    them were written: a failure (a plot, a full disk) leaves the previous report as it was, never
    new JSON beside old HTML. When the report stage recorded these files, the manifest's sha256 of
    them (and the headline) are updated: a rebuild had made them false, so the next run redid the
    stage and no recorded hash could be checked.

    Args:
        run_dir: The run.
        build: Writes the report's files of ``run_dir`` into a folder (default :func:`build_report`, the
            classification ladder's; a detection run passes :func:`pipeline.detection_report.build_from_run`).

    Returns:
        The paths of the files written in ``report/`` (classification: report.md, report.html, results.json and
        results.csv).
    """
    run_dir = Path(run_dir)
    final = run_dir / "report"
    # mkdir, not mkdtemp: the folder becomes report/ and keeps the umask's permissions, not 0700.
    staging = run_dir / f".report.{os.getpid()}-{uuid.uuid4().hex[:8]}.partial"
    staging.mkdir()
    try:
        built = (build or build_report)(run_dir, staging)
        # Two renames: no call replaces a folder that holds files. Between them the old report waits
        # whole in .report.*.old (a crash there loses nothing).
        old = staging.with_suffix(".old") if final.exists() else None
        if old is not None:
            os.rename(final, old)
        try:
            os.rename(staging, final)
        except BaseException:
            if old is not None:
                os.rename(old, final)
            raise
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    paths = {kind: final / path.name for kind, path in built.items()}
    _record_rebuild(run_dir, paths)
    return paths


def _record_rebuild(run_dir: Path, paths: dict[str, Path]) -> None:
    """Updates the report stage's entry in the manifest to the rebuilt files (nothing if it never ran here)."""
    manifest = Manifest.load(run_dir)
    entry = manifest.stage("report")
    if not entry:
        return
    entry["sha256"] = {**entry.get("sha256", {}),
                       **{rel: sha256_file(run_dir / rel) for rel in entry.get("outputs", {}).values()
                          if (run_dir / rel).is_file()}}
    headline = json.loads(paths["json"].read_text()).get("headline")
    if headline is not None:  # a detection report has none
        entry.setdefault("metrics", {})["headline"] = headline
    entry["rebuilt"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    manifest.save()


# The prune stage's latency-budget section (issue #16).
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
    from pipeline.latency_plots import plot_holdout, plot_plans

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
