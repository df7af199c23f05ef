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
        precision: What its ONNX holds: ``fp32``, or ``int8`` for an explicit Q/DQ model.
        predictions: (stage, output key) of each test image's top-1 class.
        deployed_student: The rung the headline puts on the edge device.
        quantized_from: The float rung this one is a quantized form of (same network, same MACs).
    """

    name: str
    checkpoint_stage: str | None
    onnx: tuple[str, str]
    precision: Literal["fp32", "int8"]
    predictions: tuple[str, str]
    deployed_student: bool = False
    quantized_from: str | None = None


RungName = Literal["teacher", "pruned", "student", "student_int8"]
FloatRungName = Literal["teacher", "pruned", "student"]

RUNGS: dict[str, Rung] = {rung.name: rung for rung in (
    Rung("teacher", "teacher", ("export", "teacher"), "fp32", ("teacher", "predictions")),
    Rung("pruned", "prune", ("export", "pruned"), "fp32", ("prune", "predictions")),
    Rung("student", "distill", ("export", "student"), "fp32", ("distill", "predictions")),
    Rung("student_int8", None, ("quantize", "student_int8"), "int8", ("quantize", "predictions"),
         deployed_student=True, quantized_from="student"),
)}
TEACHER = "teacher"
DEPLOYED = next(rung.name for rung in RUNGS.values() if rung.deployed_student)

assert set(get_args(RungName)) == set(RUNGS), "RungName and RUNGS disagree"  # noqa: S101 (a developer error)
assert set(get_args(FloatRungName)) == {r.name for r in RUNGS.values() if r.checkpoint_stage}  # noqa: S101
