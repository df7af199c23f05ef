"""The report stage written once (:mod:`pipeline.stages.report`): its key, its code, its hooks."""

from __future__ import annotations

from types import SimpleNamespace

from pipeline.stages.report import ReportStage


def _ctx(stages: dict) -> SimpleNamespace:
    return SimpleNamespace(manifest=SimpleNamespace(data={"stages": stages}))


def test_a_stage_re_run_to_new_metrics_is_a_new_report_and_deploys_counters_are_not():
    from pipeline.tasks.detection.report import build_from_run, headline_line

    stage = ReportStage(build_from_run, headline_line)
    recorded = {"quantize": {"metrics": {"class_changes_vs_fp32": [1]}}, "deploy": {"metrics": {"jobs_reused": 0}},
                "report": {"metrics": {"headline": {}}}}
    key = stage.config(_ctx(recorded))
    assert stage.config(_ctx({**recorded, "deploy": {"metrics": {"jobs_reused": 10}},
                              "report": {"metrics": {"headline": {"rung": "x"}}}})) == key
    assert stage.config(_ctx({**recorded, "quantize": {"metrics": {"class_changes_vs_fp32": [2]}}})) != key
    # The task's builder and console line are part of the stage's code hash.
    assert stage.code_modules == ("pipeline.tasks.detection.report",)
    assert stage.summary({"headline": {"rung": "student_int8", "measured": False}}) == \
        "student_int8: not measured on any device"
