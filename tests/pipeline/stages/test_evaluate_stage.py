"""The evaluate stage written once (:mod:`pipeline.stages.evaluate`) over a task's hooks
(:class:`pipeline.core.ladder.EvaluateHooks`): driven by a toy task of hooks alone, so the one ladder record every
task writes is seen apart from classification's and detection's hooks, which the pipelines' tests run."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from device.errors import StageError
from pipeline.core.ladder import LADDER_SCHEMA, EvaluateHooks
from pipeline.stages.evaluate import EvaluateStage


class ToyEvaluate(EvaluateHooks):
    """Three rungs scored by ``iou``; the teacher left out on request (a run started from the user's graph)."""

    score = "iou"

    def __init__(self, teacher: bool = True, broken: str | None = None):
        self.teacher, self.broken = teacher, broken

    def needs(self, ctx):
        return ("teacher", "quantize", "data")

    def rows(self, ctx):
        rows = {"teacher": {"precision": "fp32", "artifact": "teacher/model.pt", "size_mb": 40.0, "macs_g": 4.0,
                            "iou": 0.62, "iou_correct": 31, "images": 50},
                "student": {"precision": "fp32", "artifact": "export/student.onnx", "size_mb": 8.0, "macs_g": 1.0,
                            "iou": 0.60, "iou_correct": 31, "images": 50},
                "student_int8": {"precision": "int8", "artifact": "quantize/student_int8.onnx", "size_mb": 2.0,
                                 "macs_g": 1.0, "iou": 0.55}}
        if not self.teacher:
            del rows["teacher"]
        if self.broken == "field":
            del rows["student"]["macs_g"]
        elif self.broken == "precision":
            rows["student"]["precision"] = "int4"
        return rows

    def finish(self, ctx, workdir, rows):
        rows["student"]["note"] = "added by the task"
        (workdir / "extra.json").write_text("{}")
        return {"extra": workdir / "extra.json"}, {"extra": 1}


def _ctx(tmp_path) -> SimpleNamespace:
    (tmp_path / "dataset.json").write_text(json.dumps({"source": "toy", "classes": ["bg", "cat"]}))
    return SimpleNamespace(manifest=SimpleNamespace(output=lambda stage, key: tmp_path / "dataset.json"))


def test_every_task_writes_one_ladder_record_compared_with_its_teacher(tmp_path):
    stage = EvaluateStage(ToyEvaluate())
    assert stage.needs(None) == ("data", "teacher", "quantize") and stage.code_modules == (__name__,)
    work = tmp_path / "work"
    work.mkdir()
    result = stage.run(_ctx(tmp_path), work)
    record = json.loads((work / "ladder.json").read_text())
    assert result.outputs == {"ladder": work / "ladder.json", "extra": work / "extra.json"}
    assert {k: record[k] for k in ("schema", "score", "baseline", "classes")} == {
        "schema": LADDER_SCHEMA, "score": "iou", "baseline": "teacher", "classes": ["bg", "cat"]}
    assert list(record["rungs"]) == ["teacher", "student", "student_int8"], "the task's order is kept"
    rows = record["rungs"]
    # Equal counts on the same images: exactly 0 points, though the fractions differ; otherwise from the fractions.
    assert rows["student"]["iou_delta_points"] == 0.0 and rows["teacher"]["iou_delta_points"] == 0.0
    assert rows["student_int8"]["iou_delta_points"] == pytest.approx(-7.0)
    assert [rows[r]["macs_fraction"] for r in rows] == [1.0, 0.25, 0.25]
    assert rows["student"]["note"] == "added by the task", "what finish adds to a row is written"
    assert result.metrics == {"rungs": rows, "baseline": "teacher", "score": "iou", "extra": 1}
    assert stage.summary(result.metrics) == "teacher 62.00, student 60.00, student_int8 55.00"


def test_without_a_teacher_the_fp32_student_is_the_baseline(tmp_path):
    result = EvaluateStage(ToyEvaluate(teacher=False)).run(_ctx(tmp_path), tmp_path)
    assert result.metrics["baseline"] == "student"
    assert result.metrics["rungs"]["student_int8"]["iou_delta_points"] == pytest.approx(-5.0)
    assert result.metrics["rungs"]["student_int8"]["macs_fraction"] == 1.0


@pytest.mark.parametrize("broken, named", [("field", "student row lacks macs_g"), ("precision", "'int4'")])
def test_a_row_a_reader_could_not_take_is_refused_before_anything_is_written(tmp_path, broken, named):
    work = tmp_path / "work"
    work.mkdir()
    with pytest.raises(StageError, match=named):
        EvaluateStage(ToyEvaluate(broken=broken)).run(_ctx(tmp_path), work)
    assert list(work.iterdir()) == []
