"""The one INT8 ladder every task climbs: post-training quantization with each calibration method in the recipe's
order, then quantization-aware fine-tuning distilled from the FP32 student, until a candidate is within the task's
accuracy budget of the FP32 student.

What is the same for every task lives here: the order of the steps, the checks every candidate passes before it is
scored (TensorRT's Q/DQ rules, weights stored as int8), the record of every attempt, and the error that names each
attempt's score when none passes. What a task owns is behind :class:`LadderTask`: how a step quantizes its graph
(which nodes stay float, and in which precision), how QAT trains its model (its own loss), and how a candidate is
scored against the FP32 student (top-1 on labels, or COCO mAP through the device's decode). A library: stages call
:func:`climb`.
"""

from __future__ import annotations

import shutil
from abc import ABC, abstractmethod
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

from device.errors import StageError
from pipeline.core.log import log


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: a quantizer and a calibration method, or ``("modelopt", "qat")``."""

    quantizer: str
    method: str

    @property
    def qat(self) -> bool:
        return self.method == "qat"

    def __str__(self) -> str:
        return f"{self.quantizer}/{self.method}"


def steps(quantizer: str, calibration_methods: list[str], qat: bool) -> list[Step]:
    """The ladder a recipe asks for: each calibration method with its quantizer, then QAT when it is set."""
    return [Step(quantizer, method) for method in calibration_methods] + ([Step("modelopt", "qat")] if qat else [])


class LadderTask(ABC):
    """What a task gives the ladder.

    Attributes:
        metric: The gated score's name in messages (``top-1``, ``mAP``).
        budget_points: The largest drop from the FP32 student allowed, in points.
    """

    metric: str = "score"
    budget_points: float = 1.0

    @abstractmethod
    def reference(self) -> dict[str, Any]:
        """The FP32 student's scores (with ``value``, the gated score as a fraction)."""

    @abstractmethod
    def quantize(self, step: Step, out: Path) -> dict[str, Any]:
        """Writes the post-training candidate of ``step`` to ``out``; returns facts to record (what stayed float)."""

    @abstractmethod
    def fine_tune(self, out: Path) -> dict[str, Any]:
        """Writes the QAT candidate to ``out`` (distilled from the FP32 student with the task's own loss)."""

    @abstractmethod
    def score(self, candidate: Path, step: Step) -> dict[str, Any]:
        """The candidate's scores (with ``value``) on the same images as :meth:`reference`."""

    def shown(self, value: float) -> str:
        """A score as messages show it (``91.20%`` for top-1, ``16.70`` for mAP)."""
        return f"{100 * value:.2f}"

    def within(self, reference: dict[str, Any], scores: dict[str, Any]) -> bool:
        """Whether a candidate is within the budget (a task with counts decides on them exactly)."""
        return self.drop_points(reference, scores) <= self.budget_points + 1e-9

    @staticmethod
    def drop_points(reference: dict[str, Any], scores: dict[str, Any]) -> float:
        return round(100 * (reference["value"] - scores["value"]), 4)

    def fix(self, qat: bool) -> str:
        """What to change when no step passes."""
        return ("raise quantize.accuracy_budget_points, add calibration methods, enlarge the calibration set"
                + ("" if qat else ", or set quantize.qat (a short fine-tuning schedule)"))


@contextmanager
def scratch_copy(workdir: Path, source: Path, name: str | None = None) -> Iterator[Path]:
    """A copy of the exported FP32 student for the quantizers, in ``workdir/.scratch``: ModelOpt's shape inference
    writes into the file it is given, and the export stage's recorded file must stay as recorded. The folder goes
    when the block ends, however it ends (a failed ladder leaves its attempts, not the copy)."""
    scratch = workdir / ".scratch"
    scratch.mkdir()
    try:
        copy = scratch / (name or source.name)
        shutil.copyfile(source, copy)
        yield copy
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def check_candidate(path: Path, step: Step) -> dict[str, Any]:
    """The checks every candidate passes before it is scored: TensorRT's Q/DQ rules and weights stored as int8.

    Raises:
        StageError: Either fails (a quantizer bug: no score would mean anything).
    """
    from device.qdq_lint import lint_qdq
    from pipeline.int8_weights import float_weights

    lint = lint_qdq(path)
    if not lint.ok:
        raise StageError(f"{path.name} ({step}) breaks TensorRT's Q/DQ rules: {lint.describe()}",
                         fix=f"this is a quantizer bug; try another quantize.quantizer than {step.quantizer!r}")
    unconverted = float_weights(path)
    if unconverted:
        raise StageError(f"{path.name} ({step}) stores {len(unconverted)} quantized weights in float (e.g. "
                         f"{unconverted[0]}): it is {path.stat().st_size / 1e6:.2f} MB, not an INT8 artifact",
                         fix="this is a quantizer bug; choose another quantize.quantizer")
    return {"size_mb": path.stat().st_size / 1e6, "lint": lint.to_dict()}


def climb(task: LadderTask, ladder: list[Step], workdir: Path) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    """Tries each step until one is within the budget.

    Returns:
        (the FP32 reference, every attempt in order — the last one accepted —, the accepted candidate's path).

    Raises:
        StageError: No step is within the budget (every attempt's score in the message), or a candidate fails
            the checks of :func:`check_candidate`.
    """
    reference = task.reference()
    attempts: list[dict[str, Any]] = []
    for step in ladder:
        candidate = workdir / f"student.int8.{step.method}.onnx"
        facts = task.fine_tune(candidate) if step.qat else task.quantize(step, candidate)
        facts = {**facts, **check_candidate(candidate, step)}
        scores = task.score(candidate, step)
        drop = task.drop_points(reference, scores)
        attempts.append({"quantizer": step.quantizer, "method": step.method, **facts, **scores, "drop_points": drop})
        log(f"quantize: {step}: INT8 {task.metric} {task.shown(scores['value'])} ({-drop:+.2f} points vs FP32 "
            f"{task.shown(reference['value'])})")
        if task.within(reference, scores):
            return reference, attempts, candidate
    qat = any(step.qat for step in ladder)
    table = "\n".join(f"  {a['quantizer']}/{a['method']}: {task.metric} {task.shown(a['value'])}, drop "
                      f"{a['drop_points']:.2f} points" for a in attempts)
    raise StageError(f"INT8 misses the {task.metric} budget of {task.budget_points} points (FP32 student "
                     f"{task.shown(reference['value'])}):\n{table}"
                     + ("" if qat else "\n  quantization-aware fine-tuning is off"), fix=task.fix(qat))
