"""The segmenter on the INT8 ladder (:mod:`pipeline.quantize.ladder`): mIoU of ONNX Runtime on the test canvases
against the FP32 student's, calibrated on training canvases; layers the quantizer leaves float stay FP32 (ModelOpt's
islands too), so an INT8 build's float layers mean the same on TensorRT 10 and 11."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Sequence

import numpy as np

from device.errors import StageError
from pipeline.quantize.ladder import HeldOut, LadderTask, QuantizeHooks, Step
from pipeline.tasks.segmentation.training import recorded_classes
from pipeline.core.ladder import signed, size_text


class SegmentationLadder(LadderTask):
    """The segmenter on the shared ladder: mIoU (with its interval) on the test canvases."""

    metric = "mIoU"

    def __init__(self, ctx, workdir: Path, fp32: Path):
        from pipeline.export.onnx import INPUT_NAME
        from pipeline.tasks.segmentation.data import load_split, network_inputs

        self.ctx, self.workdir, self.fp32 = ctx, workdir, fp32
        self.cfg = ctx.recipe.quantize
        self.budget_points, self.input_name = self.cfg.accuracy_budget_points, INPUT_NAME
        canvases = ctx.manifest.output("data", "canvases")
        self.train, self.test = load_split(canvases, "train"), load_split(canvases, "test")
        self.calibration = network_inputs(self.train.images[: self.cfg.calib_images])
        self.classes = recorded_classes(ctx)
        self.masks: dict[str, np.ndarray] = {}

    def _scored(self, candidate: Path, images: np.ndarray, truth: np.ndarray, key: str | None,
                resamples: int) -> dict:
        from pipeline.tasks.segmentation.metrics import score_masks
        from pipeline.tasks.segmentation.train import onnx_masks

        masks = onnx_masks(candidate, images)
        if key is not None:
            self.masks[key] = masks
        scores = score_masks(truth, masks, self.classes, resamples=resamples)
        return {"scores": scores, "value": scores["miou"]}

    def reference(self) -> dict:
        scored = self._scored(self.fp32, self.test.images, self.test.masks, "fp32", self.cfg.resamples)
        return {**scored["scores"], "value": scored["value"]}

    def quantize(self, step: Step, out: Path, exclude: Sequence[str] = (), calibration=None,
                 float32_islands: bool = False) -> dict:
        from pipeline.quantize.quantizers import QUANTIZERS, logged_to, run_isolated

        # Every quantizer takes (fp32, out, calibration, method, per_channel); ModelOpt also the islands' precision,
        # and both nodes_to_exclude after them.
        extra = ("fp32",) if step.quantizer == "modelopt" else ()
        extra += (list(exclude),) if exclude else ()
        run_isolated(logged_to, self.workdir / "quantizer.log", QUANTIZERS.get(step.quantizer), self.fp32, out,
                     self.calibration if calibration is None else calibration, step.method, self.cfg.per_channel,
                     *extra)
        return {"float_islands": "fp32"}

    def hold_out(self, fraction: float) -> HeldOut:
        from pipeline.quantize.mixed_precision import held_apart

        # The calibration canvases are the first training canvases: the slice's indices are the training split's.
        held, rest = held_apart(fraction, len(self.calibration), "quantize.calib_images")
        return HeldOut(self.calibration[rest], self.calibration[held],
                       lambda candidate: self._scored(candidate, self.train.images[held], self.train.masks[held],
                                                      None, 0),
                       "training canvases (the segmenter calibrates on them; the student saw them)")

    def fine_tune(self, out: Path) -> dict:
        raise StageError("segmentation has no QAT step", fix="set quantize.qat: null")

    def score(self, candidate: Path, step: Step) -> dict:
        return self._scored(candidate, self.test.images, self.test.masks, step.method, self.cfg.resamples)

    def fix(self, qat: bool) -> str:
        return "raise quantize.accuracy_budget_points, add calibration methods, or raise quantize.calib_images"


class SegmentationQuantize(QuantizeHooks):
    """Segmentation's part of the quantize stage: its ladder gated on mIoU, the per-class IoU changes against FP32."""

    scratch_name = "student.onnx"

    def ladder(self, ctx, workdir: Path, fp32: Path) -> SegmentationLadder:
        return SegmentationLadder(ctx, workdir, fp32)

    def finish(self, ctx, workdir: Path, task: SegmentationLadder, reference: dict, attempts: list[dict],
               candidate: Path):
        from pipeline.core.stage import StageResult
        from pipeline.tasks.segmentation.metrics import class_changes

        chosen = attempts[-1]
        final = workdir / "student.int8.onnx"
        shutil.copyfile(candidate, final)
        fp32_scores = {key: value for key, value in reference.items() if key != "value"}
        metrics = {"fp32": fp32_scores, "int8": chosen["scores"], "drop_points": chosen["drop_points"],
                   "quantizer": chosen["quantizer"], "method": chosen["method"],
                   "kept_layers": [layer["layer"] for layer in chosen.get("kept_layers", ())],
                   "kept_precision": chosen.get("kept_precision"), "size_mb": chosen["size_mb"],
                   "fp32_size_mb": ctx.manifest.output("export", "student").stat().st_size / 1e6,
                   "attempts": attempts,
                   "class_changes_vs_fp32": class_changes(task.test.masks, task.masks["fp32"],
                                                          task.masks[chosen["method"]], task.classes,
                                                          resamples=ctx.recipe.quantize.resamples)}
        return StageResult(outputs={"student_int8": final}, metrics=metrics)

    def summary(self, metrics: dict) -> str:
        return (f"INT8 mIoU {100 * metrics['int8']['miou']:.1f} ({signed(-metrics['drop_points'])} points vs FP32 "
                f"{100 * metrics['fp32']['miou']:.1f}; {metrics['method']}"
                + (f", {len(metrics['kept_layers'])} layer(s) kept float" if metrics.get("kept_layers") else "")
                + f"), {size_text(metrics['size_mb'])} vs {size_text(metrics['fp32_size_mb'])} FP32")
