"""The classifier on the INT8 ladder (:mod:`pipeline.quantize.ladder`): top-1 on the test split decided on counts,
the float islands written FP16 in the graph (``quantize.float_islands``), QAT distilled from the FP32 student's
logits (:mod:`pipeline.tasks.classification.qat`). A library: the quantize stage climbs with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from device.errors import StageError
from device.runners.qdq_lint import lint_qdq
from device.runners.trt_settings import trtexec_lines
from pipeline.core.log import log
from pipeline.core.ladder import points, size_text
from pipeline.tasks.classification.onnx_scores import onnx_accuracy
from pipeline.tasks.classification.qat import quantization_aware_finetune
from pipeline.export.onnx import INPUT_NAME
from pipeline.core.stage import StageResult
from pipeline.quantize.ladder import HeldOut, LadderTask, QuantizeHooks, Step
from pipeline.quantize.quantizers import QUANTIZERS, float_islands_to_fp16, logged_to, run_isolated, within_budget
from pipeline.tasks.classification.scores import require_sane
from pipeline.tasks.classification.images import data_set, image_batches, preprocess_of, recorded_splits


class ClassificationLadder(LadderTask):
    """The classifier on the shared ladder: top-1 on the test split, decided on counts; the float islands written
    FP16 in the graph (``quantize.float_islands``); QAT distilled from the FP32 student's logits."""

    metric = "top-1"
    input_name = INPUT_NAME

    def __init__(self, ctx, workdir: Path, fp32: Path, calibration: np.ndarray, images: np.ndarray,
                 labels: np.ndarray, calibration_labels: np.ndarray | None = None):
        self.ctx, self.workdir, self.fp32 = ctx, workdir, fp32
        self.calibration, self.images, self.labels = calibration, images, labels
        self.calibration_labels = calibration_labels
        self.calibration_source = "the calibration split (disjoint from training)"
        self.cfg = ctx.recipe.quantize
        self.budget_points = self.cfg.accuracy_budget_points

    @classmethod
    def from_run(cls, ctx, workdir: Path, fp32: Path) -> "ClassificationLadder":
        """The ladder of a run: its calibration split (with labels, for the held-out slice) and its test split."""
        def arrays(split: str, batch: int) -> tuple[np.ndarray, np.ndarray]:
            batches = list(image_batches(ctx, split, batch))
            return (np.concatenate([x.numpy() for x, *_ in batches]),
                    np.concatenate([y.numpy() for _, y, *_ in batches]))

        (calibration, calibration_labels), (images, labels) = arrays("calib", 256), arrays("test", 500)
        ladder = cls(ctx, workdir, fp32, calibration, images, labels, calibration_labels)
        splits = recorded_splits(ctx)
        if np.intersect1d(splits["train"], splits["calib"]).size:  # a data set too small to keep them apart
            ladder.calibration_source = "calibration images drawn from the training split (the student saw them)"
        return ladder

    def reference(self) -> dict:
        scores = onnx_accuracy(self.fp32, self.images, self.labels,
                               save_predictions=self.workdir / "predictions.fp32.npy")
        return {**scores, "value": scores["top1"]}

    def quantize(self, step: Step, out: Path, exclude: Sequence[str] = (), calibration: np.ndarray | None = None,
                 float32_islands: bool = False) -> dict:
        quantize = QUANTIZERS.get(step.quantizer)
        islands = "fp32" if float32_islands else self.cfg.float_islands
        # Every quantizer takes (fp32, out, calibration, method, per_channel); ModelOpt also the islands' precision,
        # and both nodes_to_exclude after them.
        extra = (islands,) if step.quantizer == "modelopt" else ()
        extra += (list(exclude),) if exclude else ()
        run_isolated(logged_to, self.workdir / "quantizer.log", quantize, self.fp32, out,
                     self.calibration if calibration is None else calibration, step.method, self.cfg.per_channel,
                     *extra)
        if float32_islands:
            return {"float_islands": "fp32"}
        return self._float_islands(out, step, self.cfg.float_islands if step.quantizer == "modelopt" else "fp32")

    def hold_out(self, fraction: float) -> HeldOut:
        from pipeline.quantize.mixed_precision import held_apart

        if self.calibration_labels is None:
            raise StageError("the mixed-precision step needs the calibration images' labels",
                             fix="this is a bug in the quantize stage; set quantize.mixed_precision: null meanwhile")
        held, rest = held_apart(fraction, len(self.calibration), "data.calib_size")
        inputs, labels = self.calibration[held], self.calibration_labels[held]

        def score(candidate: Path) -> dict:
            scores = onnx_accuracy(candidate, inputs, labels)
            return {**scores, "value": scores["top1"]}

        return HeldOut(self.calibration[rest], inputs, score, self.calibration_source)

    def distortion(self, reference: list[np.ndarray], outputs: list[np.ndarray]) -> float:
        from pipeline.quantize.mixed_precision import logit_kl

        return logit_kl(reference, outputs)

    def fine_tune(self, out: Path) -> dict:
        quantization_aware_finetune(self.ctx, out, self.calibration)
        return self._float_islands(out, Step("modelopt", "qat"), "fp32")

    def _float_islands(self, candidate: Path, step: Step, islands: str) -> dict:
        if self.cfg.float_islands == "fp16" and islands == "fp32":
            # One artifact that means the same on TensorRT 10 (FP16 flag) and on strongly typed builds:
            # the layers left out of INT8 are FP16 in the graph, as ModelOpt writes them natively.
            backup = candidate.read_bytes()
            try:
                float_islands_to_fp16(candidate)
                islands = "fp16"
            except Exception as err:  # noqa: BLE001 (a graph the rewrite cannot type: keep it, FP32, said so)
                candidate.write_bytes(backup)
                islands = f"fp32 (FP16 rewrite failed: {type(err).__name__}: {str(err).splitlines()[0][:160]})"
                log(f"quantize: {step}: float islands left FP32: {islands[5:]}")
            lint = lint_qdq(candidate)
            if not lint.ok:
                raise StageError(f"{candidate.name} with FP16 float islands breaks TensorRT's Q/DQ rules: "
                                 f"{lint.describe()}", fix="set quantize.float_islands: fp32")
        return {"float_islands": islands}

    def score(self, candidate: Path, step: Step) -> dict:
        scores = onnx_accuracy(candidate, self.images, self.labels,
                               save_predictions=self.workdir / f"predictions.{step.method}.npy")
        return {**scores, "value": scores["top1"]}

    def within(self, reference: dict, scores: dict) -> bool:
        return within_budget(reference["top1_correct"], scores["top1_correct"], scores["images"], self.budget_points)

    @staticmethod
    def drop_points(reference: dict, scores: dict) -> float:
        return points(100 * (reference["top1_correct"] - scores["top1_correct"]) / max(scores["images"], 1))

    def shown(self, value: float) -> str:
        return f"{100 * value:.2f}%"

    def fix(self, qat: bool) -> str:
        return ("raise quantize.accuracy_budget_points, add calibration methods, enlarge data.calib_size"
                + ("" if qat else ", or set quantize.qat (a short fine-tuning schedule)"))


class ClassificationQuantize(QuantizeHooks):
    """Classification's part of the quantize stage: its ladder gated on top-1, the INT8 rung's predictions and
    sanity, the trtexec lines of the engines the agent builds, and the Torch-TensorRT road's ModelOpt state."""

    def ladder(self, ctx, workdir: Path, fp32: Path) -> ClassificationLadder:
        return ClassificationLadder.from_run(ctx, workdir, fp32)

    def needs(self, ctx) -> tuple[str, ...]:
        return ("distill",) if "torch_tensorrt" in ctx.recipe.deploy.runtimes else ()

    def config(self, ctx) -> dict:
        # The batch sizes shape the recorded trtexec lines (one engine per measured batch).
        return {"calib_size": ctx.recipe.data.calib_size, "batch_sizes": list(ctx.recipe.deploy.batch_sizes),
                "runtimes": list(ctx.recipe.deploy.runtimes)}

    def finish(self, ctx, workdir: Path, task: ClassificationLadder, reference: dict, attempts: list[dict],
               candidate: Path) -> StageResult:
        accepted = attempts[-1]
        shutil.copyfile(candidate, workdir / "student.int8.onnx")
        shutil.copyfile(workdir / f"predictions.{accepted['method']}.npy", workdir / "predictions.npy")
        sanity = require_sane(
            "the INT8 student", accepted, data_set(ctx).classes,
            causes="a collapsed FP32 student passes the gate with the same score; calibration data that does not "
                   "match the test data",
            fix=("check the export stage's score of the given model" if ctx.recipe.start is not None
                 else "check the distill stage's scores") + "; enlarge data.calib_size")
        chw = preprocess_of(ctx).input_shape(1)[1:]
        # The engines the agent builds: one per measured batch, opt = that batch (one line each).
        trtexec = {f"tensorrt_{version.split('.')[0]}": trtexec_lines(
            "student.int8.onnx", "student.int8", INPUT_NAME, chw, ctx.recipe.deploy.batch_sizes, "int8", version)
            for version in ("10.3", "11.1")}
        scored = ("top1", "top5", "top1_correct", "top5_correct", "images", "predicted_counts", "label_counts")
        outputs = {"student_int8": workdir / "student.int8.onnx", "predictions": workdir / "predictions.npy",
                   "fp32_predictions": workdir / "predictions.fp32.npy"}
        torch_road = None
        if "torch_tensorrt" in ctx.recipe.deploy.runtimes:
            outputs["student_int8_device_checkpoint"], torch_road = _modelopt_state(ctx, workdir, task, reference)
        return StageResult(
            outputs=outputs,
            metrics={"fp32_top1": reference["top1"], "fp32_top1_correct": reference["top1_correct"],
                     **{key: accepted[key] for key in scored}, "sanity": sanity,
                     "drop_points": accepted["drop_points"],
                     "method": accepted["method"], "size_mb": accepted["size_mb"],
                     "kept_layers": [layer["layer"] for layer in accepted.get("kept_layers", ())],
                     "kept_precision": accepted.get("kept_precision"),
                     "float_islands": accepted["float_islands"],
                     "fp32_size_mb": ctx.manifest.output("export", "student").stat().st_size / 1e6,
                     "attempts": attempts, "trtexec": trtexec, "torch_road": torch_road})

    def summary(self, metrics: dict) -> str:
        kept = len(metrics.get("kept_layers") or [])
        precision = (metrics.get("kept_precision") or "fp16").upper()
        method = metrics["method"] + (f", {kept} layer{'s' if kept != 1 else ''} in {precision}" if kept else "")
        return (f"INT8 top-1 {100 * metrics['top1']:.2f}% ({points(-metrics['drop_points']):+.2f} points, {method}), "
                f"{size_text(metrics['size_mb'])} vs {size_text(metrics['fp32_size_mb'])} FP32")


def _modelopt_state(ctx, workdir: Path, task: ClassificationLadder, reference: dict) -> tuple[Path, dict]:
    """The Torch-TensorRT road's INT8 rung: ModelOpt's quantizer state calibrated (max) on the same calibration
    images, restored into a fresh student and gated with fake quantization on the same budget as the ONNX road.

    Raises:
        StageError: When the restored, fake-quantized student misses the budget.
    """
    import torch

    from pipeline.quantize.modelopt_state import calibrate, restore
    from pipeline.quantize.ort import quiet

    cfg = ctx.recipe.quantize
    images, labels = task.images, task.labels
    checkpoint = ctx.manifest.output("distill", "model")
    path = workdir / "student.int8.device.pt"
    with quiet("modelopt"):
        record = calibrate(checkpoint, task.calibration, path, "max", preprocess_of(ctx).input_shape(1)[1:])
        restored = restore(path)  # what the device does, with the device's code, from the file it gets
    with torch.no_grad():
        predicted = np.concatenate([restored(torch.from_numpy(images[i : i + 256])).argmax(1).numpy()
                                    for i in range(0, len(images), 256)])
    correct = int((predicted == labels).sum())
    drop = 100 * (reference["top1_correct"] - correct) / len(labels)
    gate = {**record, "top1": correct / len(labels), "top1_correct": correct, "drop_points": drop,
            "host_note": "ModelOpt fake quantization on CPU; the device compiles the restored student"}
    if not within_budget(reference["top1_correct"], correct, len(labels), cfg.accuracy_budget_points):
        raise StageError(f"the ModelOpt INT8 student (Torch-TensorRT road, max calibration) drops {drop:.2f} "
                         f"points, over the budget of {cfg.accuracy_budget_points}",
                         fix="raise quantize.accuracy_budget_points, enlarge data.calib_size, or leave "
                             "torch_tensorrt out of deploy.runtimes")
    return path, gate
