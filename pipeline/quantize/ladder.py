"""The one INT8 ladder every task climbs: post-training quantization with each calibration method in the recipe's
order, then the most sensitive layers kept out of INT8 (:mod:`pipeline.quantize.mixed_precision`), then
quantization-aware fine-tuning distilled from the FP32 student, until a candidate is within the task's accuracy
budget of the FP32 student.

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
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from device.errors import StageError
from pipeline.core.log import log
from pipeline.core.ladder import signed


@dataclass(frozen=True)
class Step:
    """One rung of the ladder: a quantizer and a calibration method, ``(quantizer, "mixed")`` (the most sensitive
    layers left out of INT8, :func:`mixed_step`) or ``("modelopt", "qat")``."""

    quantizer: str
    method: str

    @property
    def qat(self) -> bool:
        return self.method == "qat"

    def __str__(self) -> str:
        return f"{self.quantizer}/{self.method}"

    @property
    def mixed(self) -> bool:
        return self.method == "mixed"


class QuantizeHooks(ABC):
    """What a task gives the quantize stage written once (:class:`pipeline.stages.quantize.QuantizeStage`): its
    :class:`LadderTask` for a run, what it reads and depends on beyond the quantize section, and what it records
    once the ladder accepted a candidate.

    Attributes:
        scratch_name: The exported student's name in the quantizers' scratch copy (None: its own).
    """

    scratch_name: str | None = None

    @abstractmethod
    def ladder(self, ctx, workdir: Path, fp32: Path) -> "LadderTask":
        """The task's ladder for this run, over ``fp32`` (the scratch copy of the exported student)."""

    def needs(self, ctx) -> tuple[str, ...]:
        """Stages read beyond data and export (and distill, for QAT)."""
        return ()

    def config(self, ctx) -> dict[str, Any]:
        """What decides the result beyond the recipe's quantize section."""
        return {}

    @abstractmethod
    def finish(self, ctx, workdir: Path, task: "LadderTask", reference: dict[str, Any], attempts: list[dict[str, Any]],
               candidate: Path) -> Any:
        """The stage's result (a :class:`pipeline.core.stage.StageResult`): the accepted ``candidate`` as the task
        names its INT8 rung, and its metrics."""

    @abstractmethod
    def summary(self, metrics: dict[str, Any]) -> str:
        """The stage's console line."""


def steps(quantizer: str, calibration_methods: list[str], qat: bool, mixed: bool = False) -> list[Step]:
    """The ladder a recipe asks for: each calibration method with its quantizer, the mixed-precision step when it is
    set, then QAT when it is set."""
    return ([Step(quantizer, method) for method in calibration_methods] + ([Step(quantizer, "mixed")] if mixed else [])
            + ([Step("modelopt", "qat")] if qat else []))


@dataclass(frozen=True)
class HeldOut:
    """A slice of the calibration data held apart from calibration, for the mixed-precision step's choices.

    Attributes:
        calibration: The calibration images without the slice (what the step's candidates are calibrated on).
        inputs: The slice's network inputs (the sensitivity is measured on them).
        score: Scores a candidate on the slice (with ``value``, as :meth:`LadderTask.score` does on the test split).
        source: Where the slice comes from, as the report says it (training images make its scores optimistic).
    """

    calibration: np.ndarray
    inputs: np.ndarray
    score: Callable[[Path], dict[str, Any]]
    source: str = "the calibration split"


class LadderTask(ABC):
    """What a task gives the ladder.

    Attributes:
        metric: The gated score's name in messages (``top-1``, ``mAP``).
        budget_points: The largest drop from the FP32 student allowed, in points.
        input_name: The network's image input (the sensitivity feeds it).
    """

    metric: str = "score"
    budget_points: float = 1.0
    input_name: str = "input"

    @abstractmethod
    def reference(self) -> dict[str, Any]:
        """The FP32 student's scores (with ``value``, the gated score as a fraction)."""

    @abstractmethod
    def quantize(self, step: Step, out: Path, exclude: Sequence[str] = (), calibration: np.ndarray | None = None,
                 float32_islands: bool = False) -> dict[str, Any]:
        """Writes the post-training candidate of ``step`` to ``out``; returns facts to record (what stayed float).

        Args:
            exclude: Layers (node names) left out of Q/DQ, in the task's float-island precision.
            calibration: Other calibration images than the task's (the mixed step holds a slice apart).
            float32_islands: Leave every float layer FP32 (the sensitivity's graph edits need float32 weights).
        """

    def hold_out(self, fraction: float) -> HeldOut:
        """A ``fraction`` of the calibration images, spread over them, held apart with their scorer."""
        raise StageError(f"the {type(self).__name__} ladder has no held-out slice for the mixed-precision step",
                         fix="set quantize.mixed_precision: null")

    def rename(self, source: Path, target: Path) -> None:
        """Moves a candidate and whatever travels with it (a detector's decoding sidecar)."""
        source.replace(target)

    def distortion(self, reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
        """How far a candidate's outputs are from the FP32 model's (the sensitivity's measure)."""
        from pipeline.quantize.mixed_precision import normalised_error

        return normalised_error(reference, outputs)

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
    from device.runners.qdq_lint import lint_qdq
    from pipeline.quantize.int8_weights import float_weights

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


def mixed_step(task: LadderTask, methods: list[Step], workdir: Path, out: Path, most: int, fraction: float
               ) -> dict[str, Any]:
    """The fewest most-sensitive layers left out of INT8 that meet the budget on a slice of the calibration data
    held apart from calibration, the candidate written to ``out``; never a candidate below the best plain rung.

    Every choice is made on that slice, never on the test split: the calibration method (of ``methods``, the one
    whose candidate scores best there; the closer to the FP32 student on a tie), the ranking, and k. The candidate is
    then calibrated on every calibration image, as the plain rungs were, so that it differs from its method's plain
    rung only by the layers kept in float; and where it does not score above the best plain rung on the slice
    (keeping layers in float is not always a gain: a ranking from a poor distortion measure, a layer whose float
    island costs more in its neighbours' calibration than it returns), the best plain rung is the step's candidate,
    with no layer kept. Returns what to record: the ranking, the layers kept in float with what each buys back and
    costs, every k tried, and that comparison."""
    import onnx

    from pipeline.quantize.mixed_precision import fewest, layer_macs, run_model, sensitivity

    held = task.hold_out(fraction)
    fp32 = onnx.load(str(task.fp32))
    probes: dict[int, dict[str, Any]] = {}
    try:
        reference_outputs = run_model(fp32, held.inputs, task.input_name)
        closeness, held_scores = {}, {}
        for step in methods:
            path = workdir / f"student.int8.mixed.ranked.{step.method}.onnx"
            task.quantize(step, path, calibration=held.calibration, float32_islands=True)
            closeness[step] = task.distortion(reference_outputs, run_model(onnx.load(str(path)), held.inputs,
                                                                           task.input_name))
            held_scores[step] = held.score(path)["value"]
        base = max(methods, key=lambda step: (held_scores[step], -closeness[step]))
        macs = layer_macs(fp32)
        distortion, ranking = sensitivity(
            onnx.load(str(workdir / f"student.int8.mixed.ranked.{base.method}.onnx")), fp32, held.inputs,
            task.input_name, task.distortion, progress=lambda line: log(f"quantize: sensitivity {line}"),
            reference=reference_outputs, macs=macs)
        reference = held.score(task.fp32)

        def passes(k: int) -> bool:
            path = workdir / f"student.int8.mixed.k{k}.onnx"
            facts = task.quantize(base, path, exclude=[layer.layer for layer in ranking[:k]],
                                  calibration=held.calibration)
            facts = {**facts, **check_candidate(path, Step(base.quantizer, "mixed"))}
            scores = held.score(path)
            probes[k] = {"k": k, "value": scores["value"], "drop_points": task.drop_points(reference, scores),
                         "within": task.within(reference, scores), "facts": facts}
            log(f"quantize: mixed: {k} layer(s) in float: held-out {task.metric} {task.shown(scores['value'])} "
                f"({signed(-probes[k]['drop_points'])} points vs FP32 {task.shown(reference['value'])})")
            return probes[k]["within"]

        most = min(most, len(ranking))
        chosen = fewest(passes, most)
        k = most if chosen is None else chosen  # even the most missed there: the test gate decides, as for any step
        kept = [layer.to_dict() for layer in ranking[:k]]
        facts = task.quantize(base, out, exclude=[layer["layer"] for layer in kept])
        mixed_value = held.score(out)["value"]
        fallback = _best_plain_instead(task, methods, workdir, held, mixed_value, len(kept))
        if fallback is not None:
            facts, kept = task.quantize(Step(fallback["quantizer"], fallback["method"]), out), []
    finally:
        for path in [*workdir.glob("student.int8.mixed.ranked.*"), *workdir.glob("student.int8.mixed.k*")]:
            path.unlink()
    return {**facts, "base_method": base.method if fallback is None else fallback["method"],
            "held_out_images": len(held.inputs), "held_out_source": held.source,
            "calibration_images": len(held.calibration), "held_out_fp32": reference["value"],
            "closeness_by_method": {step.method: value for step, value in closeness.items()},
            "held_out_by_method": {step.method: value for step, value in held_scores.items()},
            "met_on_held_out": chosen is not None, "candidate_distortion": distortion,
            "held_out_mixed": mixed_value, "plain_rung_kept": fallback,
            "kept_layers": kept, "kept_precision": "fp16" if str(facts.get("float_islands")).startswith("fp16")
            else "fp32", "kept_macs": sum(layer["macs"] for layer in kept),
            "kept_macs_fraction": sum(layer["macs"] for layer in kept) / (sum(macs.values()) or 1),
            "probes": [{key: value for key, value in probe.items() if key != "facts"}
                       for _, probe in sorted(probes.items())],
            "sensitivity": [layer.to_dict() for layer in ranking]}


def _best_plain_instead(task: LadderTask, methods: list[Step], workdir: Path, held: HeldOut, mixed_value: float,
                        layers: int) -> dict[str, Any] | None:
    """The best plain rung (as the ladder made it, on every calibration image) where it scores at least the mixed
    candidate's ``mixed_value`` on the held-out slice (or no layer was kept), what was compared; else None."""
    plain = {step: held.score(workdir / f"student.int8.{step.method}.onnx")["value"] for step in methods
             if (workdir / f"student.int8.{step.method}.onnx").is_file()}
    best = max(plain, key=lambda step: plain[step], default=None)
    if best is None or (layers and mixed_value > plain[best]):
        return None
    log(f"quantize: mixed: {layers} layer(s) in float score {task.shown(mixed_value)} on the held-out slice, the "
        f"plain {best.method} rung {task.shown(plain[best])}: the step keeps the plain rung, no layer in float")
    return {"quantizer": best.quantizer, "method": best.method, "held_out": plain[best], "mixed_held_out": mixed_value,
            "layers_tried": layers}


def climb(task: LadderTask, ladder: list[Step], workdir: Path, mixed: Any = None
          ) -> tuple[dict[str, Any], list[dict[str, Any]], Path]:
    """Tries each step until one is within the budget.

    Args:
        mixed: The recipe's ``quantize.mixed_precision`` (``max_layers``, ``held_out``) for a ``mixed`` step.

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
        if step.mixed:
            methods = [Step(a["quantizer"], a["method"]) for a in attempts if a["method"] not in ("mixed", "qat")]
            facts = mixed_step(task, methods, workdir, candidate, mixed.max_layers, mixed.held_out)
        else:
            facts = task.fine_tune(candidate) if step.qat else task.quantize(step, candidate)
        facts = {**facts, **check_candidate(candidate, step)}
        scores = task.score(candidate, step)
        drop = task.drop_points(reference, scores)
        attempts.append({"quantizer": step.quantizer, "method": step.method, **facts, **scores, "drop_points": drop})
        log(f"quantize: {step}: INT8 {task.metric} {task.shown(scores['value'])} ({signed(-drop)} points vs FP32 "
            f"{task.shown(reference['value'])}{change_words(scores.get('change_vs_fp32'))})")
        if task.within(reference, scores):
            return reference, attempts, candidate
    qat = any(step.qat for step in ladder)
    table = "\n".join(f"  {a['quantizer']}/{a['method']}: {task.metric} {task.shown(a['value'])}, "
                      f"{signed(-a['drop_points'])} points{change_words(a.get('change_vs_fp32'))}"
                      + (f" ({len(a['kept_layers'])} layers kept in float)" if a.get("kept_layers") else "")
                      + (" (the plain rung kept: no layer in float scored above it on the held-out slice)"
                         if a.get("plain_rung_kept") else "")
                      for a in attempts)
    best = max(attempts, key=lambda a: a["value"])
    noise = best.get("change_vs_fp32")
    said = ""
    if noise and noise["low"] <= 0 <= noise["high"]:
        said = (f"\n  the best attempt's loss is within the noise of {noise['images']} test images: a loss of "
                f"{task.budget_points} points cannot be told from none at this size")
    raise StageError(f"INT8 misses the {task.metric} budget of {task.budget_points} points (FP32 student "
                     f"{task.shown(reference['value'])}):\n{table}" + said
                     + ("" if qat else "\n  quantization-aware fine-tuning is off"), fix=task.fix(qat))


def change_words(change: dict[str, Any] | None) -> str:
    """A candidate's change against the FP32 student with its paired interval, and whether it is a loss or the test
    split's noise (the interval holds 0), for a task that measures one (detection's mAP)."""
    if not change or change["low"] != change["low"]:
        return ""
    noise = "within noise" if change["low"] <= 0 <= change["high"] else "beyond noise"
    return (f"; paired 95% interval [{signed(change['low'])}, {signed(change['high'])}] over {change['images']} "
            f"test images: {noise}")
