"""One field, three places: a measured field declared on the result schema reaches results.json,
results.csv, report.md and report.html with no report code of its own; results are written strictly and
read leniently within a major version; an older result shows the field as "not recorded", never as zero.

A hand-made run directory keeps these fast: the results are the agent's schema, validated."""

import csv
import json

import numpy as np
import pytest

from device.errors import ResultError, SchemaVersionError
from device.reported import reported_fields
from device.schema import RESULT_SCHEMA, JobResult, RunSummary, parse_result
from pipeline import perclass
from pipeline.deploy.devices import DEPLOY_SCHEMA
from pipeline.tasks.classification.headline import one_line, text
from pipeline.tasks.classification.report import build_report
from pipeline.tasks.classification.report_data import COLUMNS
from pipeline.tasks.classification.report_plots import accuracy_front
from tests.results import job_result, run


def _write_run(tmp_path, rungs_results: dict, per_class=None, rungs_facts=None):
    rungs = rungs_facts or {name: {"top1": 0.9, "params_m": 1.0, "macs_g": 0.1, "size_mb": 4.0}
                            for name in rungs_results}
    device = {"name": "orin", "role": "edge", "url": "http://orin:8321", "status": "ok", "error": None, "info": {},
              "rungs": {name: {"state": "succeeded", "spec": {"precision": "int8"}, "result": rounds[0],
                               "rounds": rounds} for name, rounds in rungs_results.items()}}
    (tmp_path / "deploy").mkdir()
    (tmp_path / "deploy" / "results.json").write_text(json.dumps({"schema": DEPLOY_SCHEMA, "devices": [device]}))
    metrics = {"rungs": rungs, **({"per_class": per_class} if per_class else {})}
    (tmp_path / "manifest.json").write_text(json.dumps({"model": "tiny", "stages": {
        "evaluate": {"metrics": metrics}, "deploy": {"outputs": {"results": "deploy/results.json"}}}}))
    return build_report(tmp_path)


def _old(result: dict) -> dict:
    """The same result as an agent of the previous minor version wrote it: without the fields added since."""
    old = json.loads(json.dumps(result))
    old["schema"] = "edgefold.result/2"
    for run_ in old["runs"]:
        for name, how in reported_fields(RunSummary).items():
            if how.since > 0:
                del run_["summary"][name]
    return old


def test_the_two_new_fields_reach_every_output_and_an_older_result_says_not_recorded(tmp_path):
    windows = [job_result(runs=[run(1, summary={"gpu_temp_peak_c": 61.0, "gpu_freq_low_mhz": 918.0}),
                                run(8, summary={"gpu_temp_peak_c": 64.5, "gpu_freq_low_mhz": 624.8})]),
               job_result(runs=[run(1, summary={"gpu_temp_peak_c": 62.0, "gpu_freq_low_mhz": 1020.0}),
                                run(8, summary={"gpu_temp_peak_c": 63.0, "gpu_freq_low_mhz": 700.0})])]
    paths = _write_run(tmp_path, {"teacher": [_old(w) for w in windows], "student_int8": windows})
    rows = {r["rung"]: r for r in json.loads(paths["json"].read_text())["rows"]}
    # Over every window of every batch: the peak's max, the low's min.
    assert rows["student_int8"]["gpu_temp_peak_c"] == 64.5 and rows["student_int8"]["gpu_freq_low_mhz"] == 624.8
    assert rows["student_int8"]["not_recorded"] == []
    assert rows["teacher"]["gpu_temp_peak_c"] is None
    assert rows["teacher"]["not_recorded"] == ["gpu_temp_peak_c", "gpu_freq_low_mhz"]
    with open(paths["csv"]) as handle:
        csv_rows = {r["rung"]: r for r in csv.DictReader(handle)}
    assert list(next(iter(csv_rows.values()))) == list(COLUMNS)
    assert csv_rows["student_int8"]["gpu_temp_peak_c"] == "64.5" and csv_rows["teacher"]["gpu_temp_peak_c"] == ""
    markdown = paths["md"].read_text()
    assert "GPU °C peak | GPU MHz low |" in markdown
    assert "| 64.5 | 625 |" in markdown and "| not recorded | not recorded |" in markdown
    page = paths["html"].read_text()
    assert "<th>GPU °C peak</th>" in page and "<td>64.5</td>" in page and "<td>not recorded</td>" in page


def test_results_are_written_strictly_and_read_leniently_within_the_major_version():
    document = job_result()
    document["runs"][0]["summary"]["fan_rpm_peak"] = 2400.0  # a field a newer minor version added
    with pytest.raises(Exception, match="fan_rpm_peak"):
        JobResult.model_validate(document)  # the writer: an unknown key is a producer's bug
    document["schema"] = "edgefold.result/2.10"
    read = parse_result(document)  # a reader of this version: the newer key is dropped, the rest kept
    assert read.runs[0].latency_p50_ms == 2.0
    assert "fan_rpm_peak" not in read.runs[0].summary.model_dump() and read.minor == 10
    document["schema"] = "edgefold.result/3.0"
    with pytest.raises(SchemaVersionError, match="reads edgefold.result/2.x"):
        parse_result(document)
    document["schema"] = RESULT_SCHEMA
    document["runs"][0]["latency_p50_ms"] = "fast"
    with pytest.raises(ResultError, match="latency_p50_ms"):
        parse_result(document)


def test_a_result_before_2_7_keeps_its_build_facts():
    """2.7 moved what TensorRT built into ``runtime.built``; a stored 2.6 result (an older agent, the deploy cache)
    reads its facts there instead of dropping them as unknown keys."""
    document = job_result()
    document["schema"] = "edgefold.result/2.6"
    document["runtime"].update(name="tensorrt", precision="int8", engine_path="/data/engines/ab12", built_now=True,
                               precision_built="int8", trtexec={"1": "trtexec --onnx=s.onnx --int8 --fp16"})
    built = parse_result(document).runtime.built
    assert (built.engine_path, built.built_now, built.precision_built) == ("/data/engines/ab12", True, "int8")
    assert built.trtexec == {1: "trtexec --onnx=s.onnx --int8 --fp16"} and built.dla_unsupported_layers is None


def test_a_collapsed_or_chance_rung_is_never_on_the_front():
    rows = [{"rung": "teacher", "latency_p50_ms": 4.0, "top1": 0.92},
            {"rung": "pruned", "latency_p50_ms": 1.0, "top1": 0.10, "verdict": "collapsed: predicts 'Bag' for 100%"},
            {"rung": "student", "latency_p50_ms": 2.0, "top1": 0.90},
            {"rung": "student_int8", "latency_p50_ms": 1.5, "top1": 0.11, "verdict": "at chance (10.00%)"}]
    assert accuracy_front(rows) == {"teacher", "student"}


def _significant_shirt_drop():
    """1000 test images of 4 classes; the folded model loses 'Shirt' (25 of 250 more wrong) and nothing else."""
    rng = np.random.default_rng(0)
    labels = np.repeat(np.arange(4), 250)
    teacher = labels.copy()
    teacher[rng.choice(1000, 40, replace=False)] = 0
    student = teacher.copy()
    shirts = np.flatnonzero((labels == 3) & (teacher == 3))[:60]
    student[shirts] = 0
    return perclass.summarize(labels, {"teacher": teacher, "student": student, "student_int8": student},
                              ["T-shirt", "Trouser", "Pullover", "Shirt"])


def test_the_headline_names_the_class_that_dropped_and_every_view_says_the_same(tmp_path):
    summary = _significant_shirt_drop()
    per_class = {"classes": summary["classes"], "comparisons": summary["comparisons"],
                 "accuracy": {r: s["accuracy"] for r, s in summary["rungs"].items()},
                 "never_predicted": {r: s["never_predicted"] for r, s in summary["rungs"].items()}}
    teacher_top1, student_top1 = 0.9, 0.84
    facts = {"teacher": {"top1": teacher_top1, "params_m": 20.0, "macs_g": 4.0, "size_mb": 90.0},
             "student_int8": {"top1": student_top1, "params_m": 2.0, "macs_g": 0.4, "size_mb": 3.0,
                              "top1_delta_points": -100 * (teacher_top1 - student_top1)}}
    # Latency windows that overlap: the interval of the ratio holds 1.
    teacher = [job_result(runs=[run(1, p50_ms=v)]) for v in (2.0, 2.6, 1.8, 2.4, 2.1)]
    student = [job_result(runs=[run(1, p50_ms=v)]) for v in (2.5, 1.7, 2.2, 2.0, 2.6)]
    paths = _write_run(tmp_path, {"teacher": teacher, "student_int8": student}, per_class=per_class,
                       rungs_facts=facts)
    headline = json.loads(paths["json"].read_text())["headline"]
    assert headline["accuracy_p"] < 0.05 and headline["accuracy_images"] == 1000
    assert [d["class"] for d in headline["significant_class_drops"]] == ["Shirt"]
    assert headline["latency_ratio_significant"] is False
    line, block = one_line(headline), text(headline)
    for view in (line, block, paths["md"].read_text()):
        assert "'Shirt' -24.0 points" in view, view
        assert "no measurable difference" in view and "faster" not in view.split("INT8 vs FP16")[0]
    assert "6.00 points lost, McNemar p = " in block and ": beyond noise;" in block


def test_a_result_leaves_the_specs_unset_options_out_for_older_readers():
    """A 2.8 reader's JobSpec refuses keys it does not know: a job that set no frame (2.9) nor diverge (2.8) writes
    neither, so the older reader still reads it; set ones are kept."""
    dumped = JobResult.model_validate(job_result()).dump()
    assert "frame" not in dumped["spec"] and "diverge" not in dumped["spec"] and "artifact" in dumped["spec"]
    assert parse_result(dumped).spec.frame is None
