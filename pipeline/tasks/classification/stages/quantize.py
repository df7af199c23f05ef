"""quantize stage: INT8 explicit Q/DQ of the student for TensorRT, linted, behind an accuracy gate.

Calibration methods are tried in the recipe's order until the INT8 top-1 (ONNX Runtime on the
test split) is within the budget of the FP32 student; every attempt is recorded. The model that
passes is ``quantize/student.int8.onnx``.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from device.errors import StageError
from device.trt_settings import trtexec_lines
from pipeline.tasks.classification.int8 import ClassificationLadder
from pipeline.onnx_export import INPUT_NAME
from pipeline.quantize.ort import quiet as _quiet
from pipeline.quantize.ladder import climb, scratch_copy, steps
from pipeline.quantize.quantizers import within_budget
from pipeline.tasks.classification.scores import points, require_sane
from pipeline.core.stage import Stage, StageResult


class QuantizeStage(Stage):
    name = "quantize"

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        torch_road = "torch_tensorrt" in ctx.recipe.deploy.runtimes
        return ("data", "export") + (("distill",) if ctx.recipe.quantize.qat or torch_road else ())

    def config(self, ctx):
        # The batch sizes shape the recorded trtexec lines (one engine per measured batch).
        return {"quantize": ctx.recipe.section("quantize"), "calib_size": ctx.recipe.data.calib_size,
                "batch_sizes": list(ctx.recipe.deploy.batch_sizes), "runtimes": list(ctx.recipe.deploy.runtimes)}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.quantize
        exported = ctx.manifest.output("export", "student")
        with scratch_copy(workdir, exported) as fp32:
            task = ClassificationLadder.from_run(ctx, workdir, fp32)
            calibration, images, labels = task.calibration, task.images, task.labels
            reference, attempts, chosen = climb(
                task, steps(cfg.quantizer, cfg.calibration_methods, bool(cfg.qat), bool(cfg.mixed_precision)),
                workdir, cfg.mixed_precision)
        accepted = attempts[-1]
        shutil.copyfile(chosen, workdir / "student.int8.onnx")
        shutil.copyfile(workdir / f"predictions.{accepted['method']}.npy", workdir / "predictions.npy")
        sanity = require_sane(
            "the INT8 student", accepted, ctx.dataset().classes,
            causes="a collapsed FP32 student passes the gate with the same score; calibration data that does not "
                   "match the test data",
            fix=("check the export stage's score of the given model" if ctx.recipe.start is not None
                 else "check the distill stage's scores") + "; enlarge data.calib_size")
        chw = ctx.preprocess.input_shape(1)[1:]
        # The engines the agent builds: one per measured batch, opt = that batch (one line each).
        trtexec = {f"tensorrt_{version.split('.')[0]}": trtexec_lines(
            "student.int8.onnx", "student.int8", INPUT_NAME, chw, ctx.recipe.deploy.batch_sizes, "int8", version)
            for version in ("10.3", "11.1")}
        scored = ("top1", "top5", "top1_correct", "top5_correct", "images", "predicted_counts", "label_counts")
        outputs = {"student_int8": workdir / "student.int8.onnx", "predictions": workdir / "predictions.npy",
                   "fp32_predictions": workdir / "predictions.fp32.npy"}
        torch_road = None
        if "torch_tensorrt" in ctx.recipe.deploy.runtimes:
            outputs["student_int8_device_checkpoint"], torch_road = self._modelopt_state(ctx, workdir, calibration, images,
                                                                                labels, reference)
        return StageResult(
            outputs=outputs,
            metrics={"fp32_top1": reference["top1"], "fp32_top1_correct": reference["top1_correct"],
                     **{key: accepted[key] for key in scored}, "sanity": sanity,
                     "drop_points": accepted["drop_points"],
                     "method": accepted["method"], "size_mb": accepted["size_mb"],
                     "kept_layers": [layer["layer"] for layer in accepted.get("kept_layers", ())],
                     "kept_precision": accepted.get("kept_precision"),
                     "float_islands": accepted["float_islands"],
                     "fp32_size_mb": exported.stat().st_size / 1e6,
                     "attempts": attempts, "trtexec": trtexec, "torch_road": torch_road},
        )

    @staticmethod
    def _modelopt_state(ctx, workdir: Path, calibration: np.ndarray, images: np.ndarray, labels: np.ndarray,
                        reference: dict) -> tuple[Path, dict]:
        """The Torch-TensorRT road's INT8 rung: ModelOpt's quantizer state calibrated (max) on the same calibration
        images, restored into a fresh student and gated with fake quantization on the same budget as the ONNX road.

        Raises:
            StageError: When the restored, fake-quantized student misses the budget.
        """
        import torch

        from pipeline.quantize.modelopt_state import calibrate, restore

        cfg = ctx.recipe.quantize
        checkpoint = ctx.manifest.output("distill", "model")
        path = workdir / "student.int8.device.pt"
        with _quiet("modelopt"):
            record = calibrate(checkpoint, calibration, path, "max", ctx.preprocess.input_shape(1)[1:])
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

    def summary(self, metrics):
        kept = len(metrics.get("kept_layers") or [])
        precision = (metrics.get("kept_precision") or "fp16").upper()
        method = metrics["method"] + (f", {kept} layer{'s' if kept != 1 else ''} in {precision}" if kept else "")
        return (f"INT8 top-1 {100 * metrics['top1']:.2f}% ({points(-metrics['drop_points']):+.2f} points, {method}), "
                f"{metrics['size_mb']:.1f} MB vs {metrics['fp32_size_mb']:.1f} MB FP32")
