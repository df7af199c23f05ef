"""Segmentation's part of the evaluate stage (:mod:`pipeline.stages.evaluate`): every rung's host mIoU (with its
interval) as the stage that made it measured it (teacher and student in torch, the INT8 student under ONNX Runtime),
its ONNX artifact and size; nothing is scored a second time here."""

from __future__ import annotations

from pipeline.core.ladder import EvaluateHooks

SCORED = ("miou", "miou_low", "miou_high", "pixel_accuracy", "per_class_iou")


def _row(scores: dict, artifact: str, size_mb: float, precision: str, macs_g: float) -> dict:
    return {"artifact": artifact, "size_mb": size_mb, "precision": precision, "macs_g": macs_g,
            **{key: scores.get(key) for key in SCORED}}


class SegmentationEvaluate(EvaluateHooks):
    """The ladder's rows from the teacher, distill, export and quantize records."""

    score = "miou"

    def needs(self, ctx):
        return ("teacher", "distill", "export", "quantize")

    def rows(self, ctx):
        m = ctx.manifest
        export, quantize = m.stage("export"), m.stage("quantize")
        teacher, student = m.stage("teacher")["metrics"], m.stage("distill")["metrics"]
        sizes = {rung: facts["size_mb"] for rung, facts in export["metrics"]["rungs"].items()}
        return {"teacher": _row(teacher, export["outputs"]["teacher"], sizes["teacher"], "fp32", teacher["macs_g"]),
                "student": _row(student, export["outputs"]["student"], sizes["student"], "fp32", student["macs_g"]),
                "student_int8": _row(quantize["metrics"]["int8"], quantize["outputs"]["student_int8"],
                                     quantize["metrics"]["size_mb"], "int8", student["macs_g"])}

    def summary(self, metrics):
        return ", ".join(f"{name} mIoU {100 * row['miou']:.1f}" for name, row in metrics["rungs"].items())
