"""detection quantize stage: the student to INT8 Q/DQ on backbone and neck through the ladder every task climbs
(:mod:`pipeline.quantize.ladder`: ONNX Runtime or ModelOpt with each calibration method in order, then QAT distilled
from the FP32 student), the box branch outside Q/DQ in FP16 unless the recipe says ``quantize.box_head: float``
(FP32) or ``int8`` (quantized too), gated on COCO mAP.

The box-regression branch's nodes are excluded from Q/DQ; for ``fp16`` those nodes alone are then rewritten to FP16
with Casts at the branch's edges (:mod:`pipeline.quantize.fp16_nodes`), so the precision is written in the graph,
where a strongly typed TensorRT build takes it. Each candidate passes the ladder's TensorRT Q/DQ lint and int8-weights
check. Its mAP comes from ONNX Runtime and the device's own decode + NMS (:mod:`pipeline.tasks.detection.onnx`). With
``compare_box_head`` the other box-head settings are quantized with the accepted calibration too, and their mAP
recorded: what each costs.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from pipeline.tasks.detection.int8 import DetectionLadder
from pipeline.tasks.detection.recipe import BOX_HEADS
from pipeline.quantize.ladder import Step, check_candidate, climb, scratch_copy, steps
from pipeline.core.stage import Stage, StageResult


class DetectionQuantizeStage(Stage):
    """INT8 student with explicit Q/DQ, linted, int8 weights checked, within the mAP budget of its FP32 form."""

    name = "quantize"

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        return ("data", "export") + (("distill",) if ctx.recipe.quantize.qat else ())

    def config(self, ctx):
        return {"quantize": ctx.recipe.section("quantize")}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.tasks.detection.export import sidecar_path
        from pipeline.tasks.detection.metrics import class_changes

        cfg = ctx.recipe.quantize
        exported = ctx.manifest.output("export", "student")
        with scratch_copy(workdir, exported, "student.onnx") as fp32:
            task = DetectionLadder.from_run(ctx, workdir, fp32)
            test, classes = task.test, task.classes
            reference, attempts, candidate = climb(
                task, steps(cfg.quantizer, cfg.calibration_methods, bool(cfg.qat), bool(cfg.mixed_precision)),
                workdir, cfg.mixed_precision)
            chosen = attempts[-1]
            others, other_outputs = self._other_box_heads(ctx, task, reference, chosen, workdir) \
                if cfg.compare_box_head else (None, {})
        final = workdir / "student.int8.onnx"
        shutil.copyfile(candidate, final)
        shutil.copyfile(sidecar_path(candidate), sidecar_path(final))
        outputs = {"student_int8": final, "student_int8_head": sidecar_path(final), **other_outputs}
        fp32_scores = {key: value for key, value in reference.items() if key != "value"}
        metrics = {"fp32": fp32_scores, "int8": chosen["scores"], "drop_points": chosen["drop_points"],
                   "quantizer": chosen["quantizer"], "method": chosen["method"], "box_head": cfg.box_head,
                   "kept_layers": [layer["layer"] for layer in chosen.get("kept_layers", ())],
                   "kept_precision": chosen.get("kept_precision"),
                   "size_mb": chosen["size_mb"], "fp32_size_mb": exported.stat().st_size / 1e6, "attempts": attempts,
                   "class_changes_vs_fp32": class_changes(test.boxes, task.detections["fp32"],
                                                          task.detections[chosen["method"]], classes,
                                                          resamples=cfg.resamples)}
        if others is not None:
            metrics["other_box_heads"] = others
        return StageResult(outputs=outputs, metrics=metrics)

    @staticmethod
    def _other_box_heads(ctx, task: DetectionLadder, reference: dict, chosen: dict, workdir: Path):
        """The other box-head settings quantized with the same quantizer and calibration (after QAT: the first
        calibration method) and scored: (their records, their outputs)."""
        from pipeline.tasks.detection.export import sidecar_path

        cfg = ctx.recipe.quantize
        # After QAT: the first calibration method; after the mixed step: its calibration, no layer kept in float.
        step = Step(cfg.quantizer, cfg.calibration_methods[0]) if chosen["method"] == "qat" else \
            Step(chosen["quantizer"], chosen.get("base_method", chosen["method"]))
        records, outputs = [], {}
        for other in (setting for setting in BOX_HEADS if setting != cfg.box_head):
            path = workdir / f"student.int8.box_{other}.onnx"
            facts = {**task.quantize(step, path, box_head=other), **check_candidate(path, step)}
            scores = task.score(path, Step(step.quantizer, f"box_{other}"))["scores"]
            drop = task.drop_points(reference, {"value": scores["map"]})
            records.append({**facts, "method": step.method, "scores": scores, "drop_points": drop})
            ctx.log(f"quantize: box head {other}: INT8 mAP {100 * scores['map']:.2f} ({-drop:+.2f} points)")
            outputs[f"student_int8_box_{other}"] = path
            outputs[f"student_int8_box_{other}_head"] = sidecar_path(path)
        return records, outputs


    def summary(self, metrics):
        line = (f"INT8 mAP {100 * metrics['int8']['map']:.1f} ({-metrics['drop_points']:+.2f} points vs FP32 "
                f"{100 * metrics['fp32']['map']:.1f}; box head {metrics['box_head']}, {metrics['method']}"
                + (f", {len(metrics['kept_layers'])} more layer(s) in {metrics['kept_precision'].upper()}"
                   if metrics.get("kept_layers") else "")
                + ")")
        for other in metrics.get("other_box_heads", ()):
            line += f"; box head {other['box_head']}: mAP {100 * other['scores']['map']:.1f} ({-other['drop_points']:+.2f})"
        return line
