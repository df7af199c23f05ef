"""The compression ladder's rungs: one table of what each rung is, where it comes from, and in what precision.

Every stage and the report look rungs up here (export, evaluate, deploy, the recipe's rung lists,
the headline), so adding a rung or renaming an output touches one place.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args


@dataclass(frozen=True)
class Rung:
    """One rung of the ladder.

    Attributes:
        name: The rung's name in recipes, manifests and reports.
        checkpoint_stage: The stage whose ``model`` checkpoint it is (None: no torch checkpoint).
        onnx: (stage, output key) of its ONNX file.
        precision: What its ONNX holds, written in the graph (never only asked of a builder): ``fp32``,
            ``fp16`` (FP16 weights and compute, float32 I/O) or ``int8`` (explicit Q/DQ, FP16 float islands
            by default). The deploy stage sends this precision; TensorRT 10 and 11 build it as written.
        predictions: (stage, output key) of each test image's top-1 class.
        deployed_student: The rung the headline puts on the edge device.
        form_of: The FP32 rung this one is another precision of (same network, same MACs): its
            converted (FP16) or quantized (INT8) form.
    """

    name: str
    checkpoint_stage: str | None
    onnx: tuple[str, str]
    precision: Literal["fp32", "fp16", "int8"]
    predictions: tuple[str, str]
    deployed_student: bool = False
    form_of: str | None = None


RungName = Literal["teacher", "teacher_fp16", "pruned", "student", "student_fp16", "student_int8"]
FloatRungName = Literal["teacher", "pruned", "student"]
Fp16RungName = Literal["teacher_fp16", "student_fp16"]

RUNGS: dict[str, Rung] = {rung.name: rung for rung in (
    Rung("teacher", "teacher", ("export", "teacher"), "fp32", ("teacher", "predictions")),
    # The teacher as a data-center user runs it: FP16 on a GPU (the headline's comparison where it exists).
    Rung("teacher_fp16", None, ("export", "teacher_fp16"), "fp16", ("export", "teacher_fp16_predictions"),
         form_of="teacher"),
    Rung("pruned", "prune", ("export", "pruned"), "fp32", ("prune", "predictions")),
    Rung("student", "distill", ("export", "student"), "fp32", ("distill", "predictions")),
    # INT8 against FP16 on the same board: the question users ask most about INT8.
    Rung("student_fp16", None, ("export", "student_fp16"), "fp16", ("export", "student_fp16_predictions"),
         form_of="student"),
    Rung("student_int8", None, ("quantize", "student_int8"), "int8", ("quantize", "predictions"),
         deployed_student=True, form_of="student"),
)}
TEACHER = "teacher"
DEPLOYED = next(rung.name for rung in RUNGS.values() if rung.deployed_student)


def predictions_output(manifest, rung: str) -> tuple[str, str]:
    """(stage, output key) of a rung's test predictions in a run (``manifest``): its producing stage's, or, for a float
    rung that no stage trained (an ONNX start's student, scored when exported), the export stage's
    ``<rung>_predictions``."""
    exported = (manifest.stage("export") or {}).get("outputs", {})
    if RUNGS[rung].checkpoint_stage and f"{rung}_predictions" in exported:
        return "export", f"{rung}_predictions"
    return RUNGS[rung].predictions


def fp16_form(rung: str) -> str | None:
    """The FP16 rung of a float rung (``student`` → ``student_fp16``), if the ladder has one."""
    return next((r.name for r in RUNGS.values() if r.form_of == rung and r.precision == "fp16"), None)

assert set(get_args(RungName)) == set(RUNGS), "RungName and RUNGS disagree"  # noqa: S101 (a developer error)
assert set(get_args(FloatRungName)) == {r.name for r in RUNGS.values() if r.checkpoint_stage}  # noqa: S101
assert set(get_args(Fp16RungName)) == {r.name for r in RUNGS.values() if r.precision == "fp16"}  # noqa: S101
