"""detection quantize stage: the student to INT8 Q/DQ on backbone and neck, the box branch outside Q/DQ in FP16 unless
the recipe says ``quantize.box_head: float`` (FP32) or ``int8`` (quantized too), gated on COCO mAP.

The quantizer is the classification ``ort`` path (:func:`pipeline.ort_quantize.quantize_ort`: ONNX Runtime's static
quantizer, symmetric int8, Q/DQ on Conv and Add) with the box-regression branch's nodes excluded; for ``fp16`` those
nodes alone are then rewritten to FP16 with Casts at the branch's edges (:mod:`pipeline.fp16_nodes`), so the precision
is written in the graph, where a strongly typed TensorRT build takes it. Each candidate passes the same TensorRT Q/DQ
lint and int8-weights check as a classifier's. Its mAP comes from ONNX Runtime and the device's own decode + NMS
(:mod:`pipeline.detection_onnx`). With ``compare_box_head`` the other box-head settings are quantized with the
accepted calibration too, and their mAP recorded: what each costs (issue 28's benchmark).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from device.errors import StageError
from pipeline.detection_recipe import BOX_HEADS
from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES


def _classes(ctx) -> list[str]:
    return json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]


def _points(value: float) -> float:
    return round(100 * value, 4)


class DetectionQuantizeStage(Stage):
    """INT8 student with explicit Q/DQ, linted, int8 weights checked, within the mAP budget of its FP32 form."""

    name = "quantize"

    def needs(self, ctx):
        return ("data", "export")

    def config(self, ctx):
        return {"quantize": ctx.recipe.section("quantize")}

    def _candidate(self, fp32: Path, out: Path, calibration, method: str, box_head: str, per_channel: bool) -> dict:
        """Quantizes ``fp32`` into ``out`` and runs the classification rung's checks on it.

        Raises:
            StageError: The Q/DQ lint or the int8-weights check fails.
        """
        from device.qdq_lint import lint_qdq
        from pipeline.detection_export import box_branch_nodes
        from pipeline.int8_weights import float_weights
        from pipeline.ort_quantize import quantize_ort

        excluded = box_branch_nodes(fp32) if box_head in ("fp16", "float") else []
        quantize_ort(fp32, out, calibration, method, per_channel, excluded)
        halves = self._box_branch_fp16(out, excluded) if box_head == "fp16" else {}
        lint = lint_qdq(out)
        if not lint.ok:
            raise StageError(f"{out.name} breaks TensorRT's Q/DQ rules: {lint.describe()}",
                             fix="this is a quantizer bug; report it with the ONNX")
        unconverted = float_weights(out)
        if unconverted:
            raise StageError(f"{out.name} stores {len(unconverted)} quantized weights in float (e.g. {unconverted[0]}): "
                             "not an INT8 artifact", fix="this is a quantizer bug; report it with the ONNX")
        return {"method": method, "box_head": box_head, "box_nodes_float": len(excluded), **halves,
                "size_mb": out.stat().st_size / 1e6, "lint": lint.to_dict()}

    @staticmethod
    def _box_branch_fp16(path: Path, box_nodes: list[str]) -> dict:
        """Rewrites the quantized graph's box branch (left float by the quantizer) to FP16, in place.

        Raises:
            StageError: The rewrite put a node outside the box branch in FP16, or none inside it.
        """
        import onnx

        from pipeline.fp16_nodes import fp16_nodes, nodes_to_fp16

        model = onnx.load(str(path))
        facts = nodes_to_fp16(model, box_nodes)
        halves = fp16_nodes(model)
        stray = sorted(halves - set(box_nodes))
        if stray or not halves:
            raise StageError(f"the box branch's FP16 rewrite of {path.name} left "
                             + (f"{len(stray)} node(s) outside the branch in FP16 (e.g. {stray[0]})" if stray
                                else "no node in FP16"),
                             fix="this is a bug in pipeline/fp16_nodes.py; set quantize.box_head: float meanwhile")
        onnx.save(model, str(path))
        return {"box_nodes_fp16": facts["fp16_nodes"], "box_casts": facts["casts_in"] + facts["casts_out"]}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.data.detection_files import load_split
        from pipeline.detection_export import network_inputs, sidecar_path
        from pipeline.detection_metrics import class_changes
        from pipeline.detection_onnx import score_onnx_detector
        from pipeline.ort_quantize import quiet

        cfg, classes = ctx.recipe.quantize, _classes(ctx)
        exported = ctx.manifest.output("export", "student")
        size = json.loads(ctx.manifest.output("export", "student_head").read_text())["input_shape"][-1]
        canvases = ctx.manifest.output("data", "canvases")
        train, test = load_split(canvases, "train"), load_split(canvases, "test")
        calibration = network_inputs(train.images[: cfg.calib_images], size)
        inputs, sizes = network_inputs(test.images, size), [tuple(image.shape[:2]) for image in test.images]
        # The quantizer writes beside its input (shape inference): it gets a copy with its sidecar, never the
        # export stage's recorded files.
        scratch = workdir / ".scratch"
        scratch.mkdir()
        fp32 = scratch / "student.onnx"
        shutil.copyfile(exported, fp32)
        shutil.copyfile(ctx.manifest.output("export", "student_head"), sidecar_path(fp32))
        reference, fp32_detections = score_onnx_detector(fp32, inputs, test.boxes, classes, sizes, "the FP32 student",
                                                         resamples=cfg.resamples)

        def score(path: Path, what: str):
            shutil.copyfile(sidecar_path(fp32), sidecar_path(path))  # the same anchors and thresholds
            return score_onnx_detector(path, inputs, test.boxes, classes, sizes, what, resamples=cfg.resamples)

        attempts, accepted = [], None
        for method in cfg.calibration_methods:
            candidate = workdir / f"student.int8.{method}.onnx"
            with quiet():
                facts = self._candidate(fp32, candidate, calibration, method, cfg.box_head, cfg.per_channel)
            scores, detections = score(candidate, f"the INT8 student ({method})")
            drop = _points(reference["map"] - scores["map"])
            attempts.append({**facts, "scores": scores, "drop_points": drop})
            ctx.log(f"quantize: ort/{method}, box head {cfg.box_head}: INT8 mAP {100 * scores['map']:.2f} "
                    f"({-drop:+.2f} points vs FP32 {100 * reference['map']:.2f})")
            if drop <= cfg.accuracy_budget_points + 1e-9:  # the budget is decimal points; 1e-9 absorbs float noise
                accepted = (candidate, attempts[-1], detections)
                break
        if accepted is None:
            table = "\n".join(f"  ort/{a['method']}: mAP {100 * a['scores']['map']:.2f}, drop {a['drop_points']:.2f} "
                              "points" for a in attempts)
            other = "; or set quantize.box_head: fp16" if cfg.box_head == "int8" else ""
            raise StageError(f"INT8 misses the mAP budget of {cfg.accuracy_budget_points} points (FP32 student mAP "
                             f"{100 * reference['map']:.2f}), box head {cfg.box_head}:\n{table}",
                             fix="raise quantize.accuracy_budget_points, add calibration methods, or raise "
                                 f"quantize.calib_images{other}")
        candidate, chosen, detections = accepted
        final = workdir / "student.int8.onnx"
        shutil.copyfile(candidate, final)
        shutil.copyfile(sidecar_path(candidate), sidecar_path(final))
        outputs = {"student_int8": final, "student_int8_head": sidecar_path(final)}
        metrics = {"fp32": reference, "int8": chosen["scores"], "drop_points": chosen["drop_points"],
                   "method": chosen["method"], "box_head": cfg.box_head, "size_mb": chosen["size_mb"],
                   "fp32_size_mb": exported.stat().st_size / 1e6, "attempts": attempts,
                   "class_changes_vs_fp32": class_changes(test.boxes, fp32_detections, detections, classes,
                                                          resamples=cfg.resamples)}
        if cfg.compare_box_head:
            metrics["other_box_heads"] = []
            for other in (setting for setting in BOX_HEADS if setting != cfg.box_head):
                path = workdir / f"student.int8.box_{other}.onnx"
                with quiet():
                    facts = self._candidate(fp32, path, calibration, chosen["method"], other, cfg.per_channel)
                scores, _ = score(path, f"the INT8 student (box head {other})")
                drop = _points(reference["map"] - scores["map"])
                metrics["other_box_heads"].append({**facts, "scores": scores, "drop_points": drop})
                ctx.log(f"quantize: box head {other}: INT8 mAP {100 * scores['map']:.2f} ({-drop:+.2f} points)")
                outputs[f"student_int8_box_{other}"] = path
                outputs[f"student_int8_box_{other}_head"] = sidecar_path(path)
        shutil.rmtree(scratch)
        return StageResult(outputs=outputs, metrics=metrics)

    def summary(self, metrics):
        line = (f"INT8 mAP {100 * metrics['int8']['map']:.1f} ({-metrics['drop_points']:+.2f} points vs FP32 "
                f"{100 * metrics['fp32']['map']:.1f}; box head {metrics['box_head']}, {metrics['method']})")
        for other in metrics.get("other_box_heads", ()):
            line += f"; box head {other['box_head']}: mAP {100 * other['scores']['map']:.1f} ({-other['drop_points']:+.2f})"
        return line


DETECTION_STAGES.add(DetectionQuantizeStage.name, DetectionQuantizeStage())
