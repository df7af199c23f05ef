"""The classification report's data: every rung × device row of results.json with its intervals, ratios and the
device's accuracy, the headline object, the power fronts and the per-layer profiles, from the run's manifest.

Nothing is estimated: a measurement that does not exist is "not measured", with why.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterable

from device.telemetry import contention
from device.errors import ManifestError, SchemaVersionError
from device.schema import JobResult, parse_result
from pipeline import stats
from pipeline.core.ladder import points as _points
from pipeline.core.rungs import DEPLOYED, RUNGS, TEACHER, fp16_form
from pipeline.deploy.devices import DEPLOY_SCHEMA
from pipeline.report.diverge_report import answer_text, diverge_answers
from pipeline.report.headline import WINDOWED, edge_vs_dc, paired_ratio, ratio_fields
from pipeline.report.profile_report import INT8_FIX, NOT_MEASURED, computes_in, int8_not_run_reason, shown_batch
from pipeline.quantize.report import quantize_summary
from pipeline.report.results import csv_columns, reported_figures
from pipeline.tasks.classification.scores import verdict
from pipeline.tasks.classification.device_accuracy import (device_scores, paired_top1_change, per_class_device,
                                                              whole_path_scores)
from pipeline.tasks.classification.front import choose, energy_front, settings_from_windows
from pipeline.deploy.frame_report import FRAME_COLUMNS, frame_fields, frame_headline
from pipeline.tasks.classification.headline import accuracy_evidence
from pipeline.deploy.sustain_report import SUSTAINED_COLUMNS, headline_text, join_rows, sustained_runs


# The row's own figures (names, accuracy on host and device, ratios with intervals, noise); the measured fields the
# result schema declares (device.reported: latency, throughput, energy, power, memory … with their intervals) follow
# them, so a new measured field needs no edit here.
BASE_COLUMNS = ("rung", "device", "group", "role", "top1", "top1_delta_points", "params_m", "macs_g", "size_mb", "runtime",
                "precision", "latency_batch", "throughput_batch", "latency_cv_windows", "windows", "power_source",
                "energy_degraded", "energy_note", "latency_ratio_vs_dc_teacher", "latency_ratio_low",
                "latency_ratio_high", "latency_ratio_significant", "throughput_ratio_vs_dc_teacher",
                "throughput_ratio_low", "throughput_ratio_high", "throughput_ratio_significant",
                "energy_ratio_vs_dc_teacher", "energy_ratio_low", "energy_ratio_high", "energy_ratio_significant",
                "noisy", "noise_flags", "noise", "status", "reason", "runtime_fallback", "device_top1",
                "device_top1_correct", "device_images", "host_top1_same_images", "agreement", "mcnemar_p",
                "device_deviates", *FRAME_COLUMNS, *SUSTAINED_COLUMNS)


COLUMNS = csv_columns(BASE_COLUMNS)


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


def _diverged(run_dir: Path, rung: str, device: str) -> str | None:
    """The answer edgefold diverge recorded for this rung on this device, as a line; None before it ran."""
    return next((answer_text(a) for a in diverge_answers(run_dir) if (a["rung"], a["device"]) == (rung, device)), None)


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
                row.update(runtime=result.runtime.name, precision=result.runtime.precision,
                           latency_batch=batches[0], throughput_batch=batches[-1],
                           **_energy_quality(entry["rounds"], batches[-1]),
                           **_window_statistics(entry["rounds"], batches[0], batches[-1], evaluation, rung))
                if result.evaluation is not None and evaluation:
                    # The accuracy of the engine that was timed, beside the host's on the same images.
                    scores = device_scores(evaluation, rung, result.evaluation.predictions)
                    row.update(scores, evaluation_seconds=result.evaluation.seconds,
                               engines_scored=engines_scored(evaluation, rung, result, scores),
                               evaluation_note=result.evaluation_note)
                    device_predictions[(device["name"], rung)] = result.evaluation.predictions
                if row["power_mean_w"] is None:
                    notes = result.telemetry_notes
                    row["reason"] = "no power telemetry on this device" + (f" ({'; '.join(notes)})" if notes else "")
            rows.append(row)
    dc = [d for d in devices if d["role"] == "dc" and d["status"] != "unreachable"]
    edge = [d for d in devices if d["role"] == "edge" and d["status"] != "unreachable"]
    baseline_device = (dc or edge or [None])[0]
    source = stages["evaluate"]["metrics"].get("baseline", TEACHER)  # an ONNX start's: the given graph
    baseline_rung, baseline_why = _baseline_teacher(rows, baseline_device, source)
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
    headline["baseline_label"] = "teacher" if source == TEACHER else "given model"
    headline["int8_not_measured"] = int8_not_measured
    headline.update(accuracy_evidence(stages["evaluate"]["metrics"].get("per_class"), source, lead))
    headline["device_deviations"] = [
        {"rung": r["rung"] + (f" ({engine['label']})" if index else ""), "device": r["device"],
         "device_top1": engine["device_top1"], "host_top1": r["host_top1_same_images"], "images": r["device_images"],
         "mcnemar_p": engine["mcnemar_p"], "diverge": _diverged(run_dir, r["rung"], r["device"])}
        for r in rows for index, engine in enumerate(r.get("engines_scored") or []) if engine.get("device_deviates")]
    headline["two_roads"] = [line for device in edge + dc for line in _two_roads(rows, device, evaluation)]
    quantize = quantize_summary((stages.get("quantize") or {}).get("metrics") or {})
    headline["int8_vs_fp16"] = [line for device in edge + dc
                                if (line := _int8_vs_fp16(rows, device["name"], device_predictions, evaluation,
                                                          profiles, quantize))]
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
    return {"model": manifest.get("model"), "run": run_dir.name,
            "generated": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "rungs": rungs, "rows": rows, "headline": headline,
            "per_class": stages["evaluate"]["metrics"].get("per_class"), "groups": groups, "quantize": quantize,
            "power_traces": traces, "provenance": _provenance(stages, devices), "layer_profiles": profiles,
            "power_fronts": fronts, "deployed": deploy is not None, "evaluation": _evaluation_summary(evaluation, rows, device_predictions),
            "absent_rungs": _absent_rungs(stages, rungs), **_jobs_of_their_own(deploy, rows, headline)}


def _provenance(stages: dict[str, Any], devices: list[dict[str, Any]]) -> dict[str, Any]:
    """Who measured what: the build host's versions (the evaluate stage's), and each device's board, software, power
    mode and peak temperatures."""
    return {
        "pipeline": {k: v for k, v in (stages.get("evaluate", {}).get("env") or {}).items()},
        "devices": [{"name": d["name"], "role": d["role"], "url": d["url"], "status": d["status"],
                     "error": d["error"], **{k: (d.get("info") or {}).get(k) for k in
                                             ("board", "hostname", "l4t", "jetpack", "gpu", "cuda", "tensorrt",
                                              "onnxruntime", "torch", "nvpmodel", "jetson_clocks")},
                     "peak_temperatures_c": _peak_temps(d)} for d in devices],
    }


def _absent_rungs(stages: dict[str, Any], rungs: dict[str, Any]) -> dict[str, str]:
    """The rungs the ladder does not have, each with why (the report says so beside the ladder): an ONNX start's
    (no PyTorch model), or the pruned rung of a teacher distilled without pruning."""
    start = ((stages.get("export") or {}).get("config") or {}).get("start")
    if not start:
        student = (((stages.get("distill") or {}).get("config") or {}).get("distill") or {}).get("student")
        return {} if "prune" in stages or "pruned" in rungs or student in (None, "pruned") else {
            "pruned": f"the teacher is distilled into {student} without pruning (prune: null, or a registry student)"}
    why = (f"the ladder starts at export from {start['onnx']}: there is no PyTorch model to train, prune or distill "
           "(the given graph is the student)")
    return {name: why for name in RUNGS if name not in rungs and RUNGS[name].form_of != RUNGS[DEPLOYED].form_of
            and name != RUNGS[DEPLOYED].form_of}


def power_fronts(devices: list[dict[str, Any]], budget_ms: float | None) -> list[dict[str, Any]]:
    """Per device × rung that ran a power-mode sweep: every setting (mode × jetson_clocks × batch × accelerator)
    over the rounds with intervals, the energy–latency front, the settings not measured and why, and the setting
    to ship under ``deploy.latency_budget_ms`` (:mod:`pipeline.tasks.classification.front`)."""
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


def _baseline_teacher(rows: list[dict[str, Any]], device: dict[str, Any] | None,
                      source: str = TEACHER) -> tuple[str, str]:
    """The rung the ladder is compared with (the teacher; an ONNX start's given graph): its FP16 form where the
    baseline device ran it on TensorRT (the precision a data-center user runs it in), else its FP32 form — with why,
    in words."""
    fp16 = fp16_form(source)
    name = "teacher" if source == TEACHER else "given model"
    if device is not None and fp16:
        row = next((r for r in rows if r["device"] == device["name"] and r["rung"] == fp16
                    and r["status"] == "measured"), None)
        if row is not None and row.get("runtime") == "tensorrt":
            return fp16, f"the {name}'s FP16 form, as a data-center GPU runs it ({device['name']}, TensorRT)"
        if row is not None:
            return source, (f"the FP32 {name}: {device['name']} runs {row.get('runtime')}, where FP16 is not how "
                            f"the {name} would be served (ONNX Runtime's CPU emulates it)")
    return source, f"the FP32 {name} (no FP16 form measured)"


def _int8_vs_fp16(rows: list[dict[str, Any]], device: str, predictions: dict, evaluation: dict | None,
                  profiles: list[dict[str, Any]], quantize: dict[str, Any]) -> dict[str, Any] | None:
    """The verdict users want: the INT8 student against its FP16 form on one device, with its evidence —
    paired latency and energy ratios with intervals, the device-measured top-1 change with McNemar's p, and,
    when INT8 does not pay off, the reasons the per-layer profile gives; the layers the INT8 rung keeps out of INT8
    (``quantize``: :func:`pipeline.quantize.report.quantize_summary`) counted."""
    from device.jobs.profile import BatchProfile, int8_payoff_reasons

    fp16 = fp16_form(RUNGS[DEPLOYED].form_of)
    int8 = next((r for r in rows if r["device"] == device and r["rung"] == DEPLOYED and r["status"] == "measured"), None)
    half = next((r for r in rows if r["device"] == device and r["rung"] == fp16 and r["status"] == "measured"), None)
    if int8 is None or half is None:
        return None
    out: dict[str, Any] = {"device": device, "runtime": int8.get("runtime"),
                           "int8_kept_layers": len(quantize["kept_layers"]),
                           "int8_kept_precision": quantize["kept_precision"]}
    for name, key in (("latency", "latency_p50_windows_ms"), ("energy", "energy_windows_mj")):
        out.update(ratio_fields(name, paired_ratio(int8.get(key), half.get(key))))
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
            table = shown_batch(entry["profile"])
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
            out.update(ratio_fields(name, paired_ratio(torch_road.get(key), onnx.get(key))))
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

    def ran_as(rung: str) -> bool:
        """Whether a compute layer ran in the rung's precision (true when there is no profile to say otherwise)."""
        entry = profile(rung)
        return computes_in(entry and entry["profile"], RUNGS[rung].precision)

    entry = profile(DEPLOYED)
    if entry is None or ran_as(DEPLOYED):
        return DEPLOYED, None
    forms = {RUNGS[DEPLOYED].form_of, fp16_form(RUNGS[DEPLOYED].form_of)}
    ran = [r for r in rows if r["device"] == name and r["rung"] in forms and r["status"] == "measured"
           and r.get("latency_p50_ms") is not None and not no_score(r) and ran_as(r["rung"])]
    if not ran:
        return DEPLOYED, None
    fastest = min(ran, key=lambda r: r["latency_p50_ms"])
    return fastest["rung"], {"device": name, "rung": DEPLOYED, "reason": int8_not_run_reason(entry.get("runtime")),
                             "fix": INT8_FIX}


def _headline(rows, edge, dc, baseline_device, baseline_rung: str = TEACHER, lead: str = DEPLOYED) -> dict[str, Any]:
    """The lead student rung (the INT8 one, unless the device ran no INT8 compute: :func:`_lead_rung`) on the edge
    device against the teacher on the data-center device."""
    edge_device = (edge or [None])[0]
    if edge_device is None or baseline_device is None:
        return {"status": NOT_MEASURED, "reason": "no reachable device measured the ladder"}
    student = next((r for r in rows if r["device"] == edge_device["name"] and r["rung"] == lead), None)
    teacher = next((r for r in rows if r["device"] == baseline_device["name"] and r["rung"] == baseline_rung), None)
    note = None if dc else (f"no data-center device configured (DC=): the {baseline_rung} rung's numbers come from "
                            f"the same device, {edge_device['name']}")
    # A runtime that fell back is said in the headline itself: a Jetson's row timed by ONNX Runtime is not TensorRT.
    fallbacks = {d["name"]: d.get("runtime_fallback") for d in (edge_device, baseline_device)
                 if d.get("runtime_fallback")}
    if not student or not teacher or student["status"] != "measured" or teacher["status"] != "measured":
        return {"status": NOT_MEASURED, "reason": f"{lead} or {baseline_rung} not measured", "note": note,
                "runtime_fallbacks": fallbacks}

    # Like with like: the deployed rung's float form (same network) against the float teacher.
    float_form = RUNGS[lead].form_of or lead
    student_fp32 = next((r for r in rows if r["device"] == edge_device["name"] and r["rung"] == float_form), None)
    return {"status": "measured", "lead_rung": lead, "edge_device": edge_device["name"],
            "dc_device": baseline_device["name"],
            "note": note, "runtime_fallbacks": fallbacks, "top1_edge": student["top1"], "top1_dc": teacher["top1"],
            "edge_precision": student.get("precision") or "int8", "dc_precision": teacher.get("precision") or "fp32",
            "accuracy_lost_points": _points(-student["top1_delta_points"]) if student["top1_delta_points"] is not None
            else None,
            **edge_vs_dc(student, teacher),
            "energy_reason": student.get("reason") or teacher.get("reason"),
            "size_mb_student_fp32": student_fp32["size_mb"] if student_fp32 else None,
            "frame_text": frame_headline(student)}


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


def _jobs_of_their_own(deploy: dict[str, Any] | None, rows: list[dict[str, Any]],
                       headline: dict[str, Any]) -> dict[str, Any]:
    """The frame job's files and the sustained runs (``sustained``); each run's figures are also joined to its rung's
    row, and the first that settled measurably slower to the headline (``sustained_text``)."""
    runs = sustained_runs((deploy or {}).get("devices", []))
    join_rows(runs, rows)
    headline["sustained_text"] = headline_text(runs)
    return {"frame_files": (deploy or {}).get("frame"), "sustained": runs}


def _window_statistics(rounds: list[JobResult], latency_batch: int, throughput_batch: int,
                       evaluation: dict[str, Any] | None = None, rung: str | None = None) -> dict[str, Any]:
    """Per row: every declared measured field over the interleaved windows (a median with its 95% interval, a
    peak, a low: :func:`pipeline.report.results.reported_figures`), the spread between windows, why the windows were noisy
    (pipeline.stats, device.telemetry.contention), and the frame's figures (the deploy stage's ``evaluation`` scores them)."""
    figures = reported_figures(rounds, latency_batch, throughput_batch)
    flags: dict[str, str] = {}
    for result in rounds:
        for run in (result.run(latency_batch), result.run(throughput_batch)):
            if run:
                flags.update(run.noise_flags)
    spread = stats.cv(figures["latency_p50_windows_ms"])
    if spread is not None and spread > contention.WINDOW_CV_LIMIT:
        flags["windows_disagree"] = (f"latency p50 varies {100 * spread:.0f}% between the interleaved windows; the "
                                     "device was not quiet: stop other work, lock clocks, or add rounds")
    return {**figures, **frame_fields(rounds, whole_path_scores(evaluation, rung)), "latency_cv_windows": spread, "windows": len(rounds),
            "noisy": bool(flags), "noise_flags": sorted(flags),
            "noise": "; ".join(f"{flag}: {why}" for flag, why in sorted(flags.items())) or None}


def _ratios(row: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """Latency, throughput and energy against the baseline teacher, each with its paired 95% interval."""
    out: dict[str, Any] = {}
    for name, key in WINDOWED:
        if row is baseline:  # the reference itself: 1 by definition, not a measurement of no difference
            out.update({f"{name}_ratio_vs_dc_teacher": 1.0 if row.get(key) else None, f"{name}_ratio_low": None,
                        f"{name}_ratio_high": None, f"{name}_ratio_significant": None})
            continue
        ratio = paired_ratio(row.get(key), (baseline or {}).get(key)) or (None,) * 4
        out.update(zip((f"{name}_ratio_vs_dc_teacher", f"{name}_ratio_low", f"{name}_ratio_high",
                        f"{name}_ratio_significant"), ratio))
    return out


def _energy_quality(rounds: list[JobResult], throughput_batch: int) -> dict[str, Any]:
    """``power_source``, ``energy_degraded`` and a one-line ``energy_note`` (flags and reasons) over the windows the
    energy figure is the median of (each round's at the throughput batch): the first source named, degraded when
    any window is (its flags named, with in how many windows), None when none says."""
    summaries = [run.summary for result in rounds if (run := result.run(throughput_batch)) is not None]
    source = next((summary.power_source for summary in summaries if summary.power_source), None)
    degraded = [s for s in summaries if s.energy_degraded]
    if not degraded:
        return {"power_source": source, "energy_note": None,
                "energy_degraded": False if any(s.energy_degraded is False for s in summaries) else None}
    reasons: dict[str, str] = {}
    for summary in degraded:
        reasons.update(summary.energy_degraded_reasons)
    share = "" if len(degraded) == len(summaries) else f" in {len(degraded)} of {len(summaries)} windows"
    return {"power_source": source, "energy_degraded": True, "energy_note": f"energy degraded{share}: " + ("; ".join(
        f"{flag}: {why}" for flag, why in sorted(reasons.items())) or "no reason recorded")}


# ----------------------------------------------------------------- where the time goes (per-layer profile)
def layer_profiles(devices: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per rung × device: the job's whole per-layer profile (``device.jobs.profile.Profile``), or why there is none."""
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


# ----------------------------------------------------------------- plots
def no_score(row: dict[str, Any]) -> bool:
    """A rung whose top-1 is no score (collapsed onto one class, or at chance): never on a Pareto front."""
    return (row.get("verdict") or "").startswith(("collapsed", "at chance"))
