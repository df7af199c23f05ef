"""A scored rung's record on one device, the part every task whose device scores its rungs shares (detection,
segmentation): the rounds' network p50 with its interval over rounds, the result schema's measured figures, the
profile and engines, the evaluation pass's network and post-processing time per image; and each rung's ratio to the
FP32 student, paired by round. The task adds its scores (:func:`timed_record`'s ``scores``)."""

from __future__ import annotations

from typing import Any

import numpy as np

REFERENCE_RUNG = "student"  # the FP32 student: what the INT8 fold is compared with


def scored_job(ctx, session, job, round_index: int, ladder: dict[str, Any], evaluation, frames=None,
               preprocess: dict[str, Any] | None = None):
    """One window's job of a scored task (:class:`pipeline.core.recipe_jobs.ScoredDeployConfig`): round 1 also runs
    ``evaluation`` (an :class:`device.schema.EvaluationSpec` naming the task's post-processor) through the engine it
    timed, and with ``frames`` (:class:`pipeline.deploy.frames.FrameFiles`) times the camera frame's path with the
    rung's ``preprocess``. TensorRT builds the precision written in the graph; ONNX Runtime runs the graph as stored."""
    from device.schema import JobSpec, PreprocessSpec

    cfg = ctx.recipe.deploy
    precision = ladder["rungs"][job.rung]["precision"] if session.runtime == "tensorrt" else "fp32"
    return JobSpec(artifact=session.digest(job.path), runtime=session.runtime, precision=precision,
                   batch_sizes=list(cfg.batch_sizes), iterations=cfg.iterations,
                   warmup_iterations=cfg.warmup_iterations, idle_s=cfg.idle_s,
                   profile=cfg.profile and round_index == 0, timeout_s=cfg.timeout_s,
                   label=f"{ctx.recipe.name}/{job.rung}/round{round_index + 1}",
                   evaluation=evaluation if round_index == 0 else None,
                   **({"frame": frames.spec(session.client, job.rung), "preprocess": PreprocessSpec(**preprocess)}
                      if frames is not None and round_index == 0 else {}))


def typed_rounds(records: list[dict[str, Any]], where: str) -> list[dict[str, Any]]:
    """The windows' records with each succeeded one's result typed (:func:`device.schema.parse_result`)."""
    from device.schema import parse_result

    return [{**r, "result": parse_result(r["result"], where)} if r["state"] == "succeeded" else r for r in records]


def timed_record(rounds: list[dict[str, Any]], count: int, scores: dict[str, Any],
                 others: list[dict[str, Any]]) -> dict[str, Any]:
    """A rung's record from its typed rounds (round 1 succeeded and scored the set): ``scores`` (the device-measured
    score) and ``others`` (every other engine the job scored, point figures) as the task computed them."""
    from pipeline.deploy.frame_report import frame_fields
    from pipeline.report.results import reported_figures

    first = rounds[0]
    result = first["result"]
    windows: dict[int, list[float]] = {}
    for entry in rounds:
        if entry["state"] == "succeeded":
            for run in entry["result"].runs:
                windows.setdefault(run.batch_size, []).append(run.latency_p50_ms)
    batch = min(windows)
    # The measured fields the result schema declares (latency with its interval over rounds, energy, peak
    # temperature, lowest clock …), over every succeeded round.
    figures = reported_figures(e["result"] for e in rounds if e["state"] == "succeeded")
    frame = frame_fields([e["result"] for e in rounds if e["state"] == "succeeded"])
    return {"state": "succeeded", "job_id": first["job_id"], "spec": first["spec"],
            "precision": result.runtime.precision,
            "scores": scores, "latency_p50_ms": {b: float(np.median(v)) for b, v in windows.items()},
            "latency_p50_windows_ms": {b: v for b, v in windows.items()},
            "network_p50": {"batch": batch, "median_ms": figures["latency_p50_ms"],
                            "low_ms": figures["latency_p50_low_ms"], "high_ms": figures["latency_p50_high_ms"],
                            "rounds": len(windows[batch])},
            "rounds_failed": [e.get("error") for e in rounds if e["state"] != "succeeded"],
            # Round 1's per-layer profile of the engine it timed (or why there is none), for "where the time goes".
            "profile": result.profile, "profile_note": result.runtime.profile_note,
            "runtime": result.runtime.name,
            # Each batch's engine by its key in the agent's cache (edgefold ship fetches it and its build).
            "engines": (result.runtime.built.engines or None) if result.runtime.built else None,
            "network_ms_per_image": 1e3 * result.evaluation.network_s / count,
            "postprocess_ms_per_image": 1e3 * result.evaluation.postprocess_s / count,
            "evaluation_batch": result.evaluation.batch_size, "other_engines": others,
            "evaluation_note": result.evaluation_note, "reported": figures,
            # The camera frame's path, part by part (deploy.frame; empty without one).
            "frame": frame or None}


def ratios_to_student(rungs: dict[str, dict[str, Any]]) -> None:
    """Each rung's network p50 over the FP32 student's, paired by round (a round's busy spell cancels), with its
    interval (:func:`pipeline.stats.ratio_interval`); ``vs_student`` in each measured rung's record."""
    from pipeline.stats import ratio_interval, significant

    reference = rungs.get(REFERENCE_RUNG, {})
    if reference.get("state") != "succeeded":
        return
    batch = reference["network_p50"]["batch"]
    for name, entry in rungs.items():
        windows = (entry.get("latency_p50_windows_ms") or {}).get(batch)
        if entry.get("state") != "succeeded" or name == REFERENCE_RUNG or not windows:
            continue
        ratio, low, high = ratio_interval(windows, reference["latency_p50_windows_ms"][batch])
        entry["vs_student"] = {"batch": batch, "ratio": ratio, "low": low, "high": high,
                               "significant": significant(low, high)}


def reported_of(measured: dict[str, Any]) -> dict[str, Any]:
    """A rung's declared measured fields; those a rung deployed before they were declared lacks are "not recorded"
    (its network p50 from the record it kept then)."""
    from pipeline.report.results import REPORTED

    if measured.get("state") != "succeeded":
        return {"not_recorded": []}
    figures = dict(measured.get("reported") or {})
    p50, per_batch = measured.get("network_p50") or {}, measured.get("latency_p50_ms") or {}
    if "latency_p50_ms" not in figures and p50:
        figures.update(latency_p50_ms=p50["median_ms"], latency_p50_low_ms=p50["low_ms"],
                       latency_p50_high_ms=p50["high_ms"])
    elif "latency_p50_ms" not in figures and per_batch:  # before rounds: one window per batch, no interval
        figures["latency_p50_ms"] = per_batch[min(per_batch, key=int)]
    figures["not_recorded"] = [*figures.get("not_recorded", ()), *(column for column in REPORTED
                                                                    if column not in figures)]
    return figures


def measured_fields(figures: dict[str, Any]) -> dict[str, Any]:
    """A rung's row's share of :func:`reported_of`: every declared field with its interval (results.csv's columns),
    and each windowed figure's value per round (results.json only), which the headline pairs by round."""
    from pipeline.report.results import REPORTED, csv_columns

    keys = [*(key for key in csv_columns(()) if key != "not_recorded"),
            *(how.windows for how in REPORTED.values() if how.windows)]
    return {key: figures.get(key) for key in keys}


def layer_profiles(deploy: dict[str, Any]) -> list[dict[str, Any]]:
    """Per rung × device, round 1's per-layer profile or why there is none, shaped as the classification
    report's "Where the time goes" reads them (:func:`pipeline.report.profile_report.time_section`); none for a run deployed
    before profiles were kept."""
    entries = []
    for device in deploy.get("devices", []):
        for rung, measured in device.get("rungs", {}).items():
            if measured.get("state") != "succeeded" or "profile" not in measured:
                continue
            profile = measured["profile"]
            entries.append({"device": device["name"], "rung": rung, "runtime": measured.get("runtime"),
                            "status": "measured" if profile else "not measured", "profile": profile,
                            "reason": None if profile else (measured.get("profile_note")
                                                            or "the agent recorded no per-layer profile")})
    return entries


LEAD_RUNG = "student_int8"


def lead_row(rows: list[dict[str, Any]], profiles: list[dict[str, Any]]) -> tuple[dict[str, Any] | None, Any]:
    """What a scored task's headline leads with, true to the device: the INT8 student on the first edge device that
    measured it (else the first device that did); where that rung's own profile there shows no compute layer in INT8
    (ONNX Runtime's CPU provider), the FP32 student measured there.

    Args:
        rows: The report's flat rows (``rung``, ``device``, ``role``, ``status``, ``reason``, ``runtime``).
        profiles: :func:`layer_profiles`.

    Returns:
        ``(row, int8_not_measured)``: the row and, where it is the FP32 student's, why and how to measure INT8
        (``{device, rung, reason, fix}``); or ``(None, why)`` where the INT8 student was measured nowhere.
    """
    from pipeline.report.profile_report import INT8_FIX, computes_in, int8_not_run_reason

    lead = [r for r in rows if r["rung"] == LEAD_RUNG and r["status"] == "measured"]
    lead.sort(key=lambda r: r["role"] != "edge")
    if not lead:
        return None, next((r["reason"] for r in rows if r["rung"] == LEAD_RUNG and r["reason"]), None)
    row = lead[0]
    profile = next((p for p in profiles if p["device"] == row["device"] and p["rung"] == LEAD_RUNG
                    and p["status"] == "measured"), None)
    if profile is not None and not computes_in(profile["profile"], "int8"):
        student = next((r for r in rows if r["device"] == row["device"] and r["rung"] == REFERENCE_RUNG
                        and r["status"] == "measured"), None)
        if student is not None:
            return student, {"device": row["device"], "rung": LEAD_RUNG, "reason": int8_not_run_reason(row["runtime"]),
                             "fix": INT8_FIX}
    return row, None


def headline_data(rows: list[dict[str, Any]], profiles: list[dict[str, Any]], score: str,
                  sustained: list[dict[str, Any]] = (), **made: Any) -> dict[str, Any]:
    """What a scored task's run comes to, as data: the row :func:`lead_row` leads with (the INT8 student on the
    first edge device that measured it, true to the device) against the teacher on the data-center device, as every
    task's headline compares them (:func:`pipeline.report.headline.edge_vs_dc`: latency, throughput, energy, compute,
    size; and the teacher's score there), its score (``score``: ``map``, ``miou``) against the FP32 student's on the
    host, its network time against the FP32 student's on the same device, its post-processing, its camera frame's
    path and whether it settled measurably slower when run for minutes (``sustained``:
    :func:`pipeline.deploy.sustain_report.sustained_runs`); ``made`` says how the INT8 rung was made (``method``, …)."""
    row, missing = lead_row(rows, profiles)
    if row is None:
        return {"rung": LEAD_RUNG, "measured": False, "reason": missing}
    from pipeline.deploy.frame_report import frame_headline
    from pipeline.deploy.sustain_report import headline_text
    from pipeline.report.headline import TEACHER, baseline_device, edge_vs_dc

    keys = ("device", "role", "runtime", "precision", score, f"{score}_low", f"{score}_high",
            f"{score}_vs_student_points", "latency_p50_ms", "latency_p50_low_ms", "latency_p50_high_ms",
            "ratio_vs_student", "ratio_low", "ratio_high", "ratio_significant", "postprocess_ms_per_image",
            "latency_batch")
    # What every task's headline compares: the lead against the teacher on the data-center device (else on its own).
    dc_device, note = baseline_device(rows, row["device"])
    teacher = next((r for r in rows if r["device"] == dc_device and r["rung"] == TEACHER
                    and r["status"] == "measured"), None)
    student_fp32 = next((r for r in rows if r["device"] == row["device"] and r["rung"] == REFERENCE_RUNG), None)
    against = {} if teacher is None else {
        "dc_device": dc_device, "dc_precision": teacher.get("precision"), "note": note,
        **{f"{key}_dc": teacher.get(key) for key in (score, f"{score}_low", f"{score}_high")},
        **edge_vs_dc(row, teacher), "size_mb_student_fp32": (student_fp32 or {}).get("size_mb")}
    # The frame's path and the sustained run, as every task's headline says them (deploy.frame, deploy.sustained).
    runs = [r for r in sustained if r["rung"] == row["rung"] and r["device"] == row["device"]]
    return {"rung": row["rung"], "measured": True, **{k: row.get(k) for k in keys}, "int8_not_measured": missing,
            **against, "frame_text": frame_headline(row), "sustained_text": headline_text(runs), **made}


def headline_line(block, label: str) -> str:
    """A headline block in one console line (the report stage's summary): what leads, its score and its latency."""
    found = dict(block.rows)
    return "; ".join([block.title, *(f"{name} {found[name]}" for name in (label, "latency p50") if name in found)])


def scored_headline(h: dict[str, Any], score: str, label: str, postprocess: str, spec: str, int8: str | None):
    """A scored task's headline (:func:`headline_data`) as the report's first table, labelled as every task's: why
    INT8 was not measured where it leads with the FP32 student; the score on the device (against the teacher's there
    and the FP32 student's on the host); latency, throughput, energy, compute and size against the teacher on the
    data-center device (:mod:`pipeline.report.headline`); the network's ratio to the FP32 student's on the same
    device; the post-processing's time.

    Args:
        score: The score's key (``map``, ``miou``), a fraction; ``label`` its name (``mAP``, ``mIoU``).
        postprocess: The device's post-processing in words (``decode + NMS``, ``argmax``), ``spec`` its ms format.
        int8: How the INT8 rung was made, in words (None: not said).
    """
    from pipeline.report.headline import compute_row, energy_row, size_row, speed_rows
    from pipeline.report.results import interval_cell
    from pipeline.report.sections import Headline

    if not h.get("measured"):
        return Headline(f"{h['rung']}: not measured on any device", [("why", h["reason"])] if h.get("reason") else [])
    rows: list[tuple[str | None, str]] = []
    missing = h.get("int8_not_measured")
    if missing:  # the headline leads with the FP32 student: say why, and how to measure INT8
        rows += [("INT8 rung", f"{missing['rung']} not measured as INT8 on {missing['device']}: {missing['reason']}"),
                 ("", missing["fix"])]

    def percent(suffix: str = "") -> str:
        return interval_cell(*[None if h.get(key) is None else 100 * h[key]
                               for key in (f"{score}{suffix}", f"{score}_low{suffix}", f"{score}_high{suffix}")],
                             ".1f")

    value = percent() + " on the device"
    if h.get(f"{score}_vs_student_points") is not None:
        value += f", {h[f'{score}_vs_student_points']:+.2f} points against the FP32 student on the host"
    if h.get(f"{score}_dc") is not None and h.get(score) is not None:
        value += (f"; the teacher's on {h['dc_device']}: {percent('_dc')} "
                  f"({100 * (h[score] - h[f'{score}_dc']):+.2f} points)")
    rows.append((label, value))
    if h.get("latency_p50_ms_dc") is not None:  # against the teacher, as every task's headline
        rows += speed_rows(h)
    elif h.get("latency_p50_ms") is not None:  # a result from before rounds has no median over them
        rows.append(("latency p50", f"network {h['latency_p50_ms']:.3f} ms at batch {h['latency_batch']}"))
    if h.get("ratio_vs_student") is not None:
        rows.append(("vs FP32 student", f"network ×{h['ratio_vs_student']:.2f} [{h['ratio_low']:.2f}, "
                                        f"{h['ratio_high']:.2f}] the FP32 student's"
                                        + (f" ({'slower' if h['ratio_vs_student'] > 1 else 'faster'})"
                                           if h["ratio_significant"] else " (no measurable difference)")))
    if h.get("postprocess_ms_per_image") is not None:
        rows.append((postprocess, f"{format(h['postprocess_ms_per_image'], spec)} ms per image"))
    dc = (h.get("dc_precision") or "fp32").upper()
    if h.get("dc_device") is not None:
        rows += [energy_row(h), *compute_row(h), size_row(h, (h.get("precision") or "int8").upper(), dc)]
    if int8:
        rows.append(("INT8", int8))
    rows += [(name, h[key]) for name, key in (("frame", "frame_text"), ("sustained", "sustained_text"),
                                              ("note", "note")) if h.get(key)]
    against = f" vs teacher {dc} on {h['dc_device']}" if h.get("dc_device") else ""
    return Headline(f"{h['rung']} on {h['device']} ({h['runtime']}){against}", rows)


def finished_run(run_dir) -> tuple[str, str, dict[str, Any], dict[str, Any], dict[str, Any]]:
    """What a scored task's report is built from, read back from a finished run (``edgefold report RUN``): the model's
    name, the run's, the ladder record, the deploy results and the quantize stage's metrics.

    Raises:
        ManifestError: The run has not reached its deploy stage.
    """
    import json
    from pathlib import Path

    from device.errors import ManifestError

    run_dir = Path(run_dir)
    manifest = json.loads((run_dir / "manifest.json").read_text())
    stages = manifest.get("stages") or {}
    missing = [stage for stage in ("evaluate", "quantize", "deploy") if stage not in stages]
    if missing:
        raise ManifestError(f"{run_dir} has no {', '.join(missing)} stage yet: nothing to report",
                            fix=f"finish the run first: edgefold run {manifest.get('model')} --run-id {run_dir.name}")
    ladder = json.loads((run_dir / stages["evaluate"]["outputs"]["ladder"]).read_text())
    deploy = json.loads((run_dir / stages["deploy"]["outputs"]["results"]).read_text())
    return (manifest.get("model", run_dir.parent.name), run_dir.name, ladder, deploy,
            stages["quantize"].get("metrics", {}))
