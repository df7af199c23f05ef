"""detection quantize stage: the student to INT8 Q/DQ on backbone and neck through the ladder every task climbs
(:mod:`pipeline.quantize_ladder`: ONNX Runtime or ModelOpt with each calibration method in order, then QAT distilled
from the FP32 student), the box branch outside Q/DQ in FP16 unless the recipe says ``quantize.box_head: float``
(FP32) or ``int8`` (quantized too), gated on COCO mAP.

The box-regression branch's nodes are excluded from Q/DQ; for ``fp16`` those nodes alone are then rewritten to FP16
with Casts at the branch's edges (:mod:`pipeline.fp16_nodes`), so the precision is written in the graph, where a
strongly typed TensorRT build takes it. Each candidate passes the ladder's TensorRT Q/DQ lint and int8-weights check.
Its mAP comes from ONNX Runtime and the device's own decode + NMS (:mod:`pipeline.detection_onnx`). With
``compare_box_head`` the other box-head settings are quantized with the accepted calibration too, and their mAP
recorded: what each costs.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from device.errors import StageError
from pipeline.detection_recipe import BOX_HEADS
from pipeline.quantize_ladder import LadderTask, Step, check_candidate, climb, steps
from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES


def _classes(ctx) -> list[str]:
    return json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]


def box_branch_fp16(path: Path, box_nodes: list[str]) -> dict:
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


def quantize_detector(step: Step, fp32: Path, out: Path, calibration, per_channel: bool, box_head: str,
                      workdir: Path) -> dict:
    """The post-training candidate of ``step`` for a detector: its box branch out of Q/DQ unless ``box_head`` is
    ``int8``, and FP16 in the graph for ``fp16``; the decoding sidecar copied beside it. Returns what to record."""
    from pipeline.detection_export import box_branch_nodes, sidecar_path
    from pipeline.ort_quantize import quantize_ort, quiet
    from pipeline.quantizers import logged_to, quantize_modelopt, run_isolated

    excluded = box_branch_nodes(fp32) if box_head in ("fp16", "float") else []
    if step.quantizer == "modelopt":
        # ModelOpt writes every layer it leaves float in high_precision_dtype: FP16 only where the box head is.
        islands = "fp16" if box_head == "fp16" else "fp32"
        run_isolated(logged_to, workdir / "quantizer.log", quantize_modelopt, fp32, out, calibration, step.method,
                     per_channel, islands, excluded)
        halves = {"float_islands": islands}
    else:
        with quiet():
            quantize_ort(fp32, out, calibration, step.method, per_channel, excluded)
        halves = box_branch_fp16(out, excluded) if box_head == "fp16" else {}
    shutil.copyfile(sidecar_path(fp32), sidecar_path(out))  # the same anchors and thresholds
    return {"box_head": box_head, "box_nodes_float": len(excluded), **halves}


class DetectionLadder(LadderTask):
    """The detector on the shared ladder: COCO mAP of ONNX Runtime + the device's decode on the test canvases; the box
    branch kept out of Q/DQ as ``box_head`` says; QAT towards the FP32 student's raw head outputs."""

    metric = "mAP"

    def __init__(self, ctx, workdir: Path, fp32: Path, calibration, train, size: int, inputs, test, classes, sizes,
                 box_head: str):
        self.ctx, self.workdir, self.fp32, self.box_head = ctx, workdir, fp32, box_head
        self.calibration, self.train, self.size, self.inputs = calibration, train, size, inputs
        self.test, self.classes, self.sizes = test, classes, sizes
        self.cfg = ctx.recipe.quantize
        self.budget_points = self.cfg.accuracy_budget_points
        self.detections: dict[str, list] = {}

    def reference(self) -> dict:
        from pipeline.detection_onnx import score_onnx_detector

        scores, self.detections["fp32"] = score_onnx_detector(self.fp32, self.inputs, self.test.boxes, self.classes,
                                                              self.sizes, "the FP32 student", resamples=self.cfg.resamples)
        return {**scores, "value": scores["map"]}

    def quantize(self, step: Step, out: Path, box_head: str | None = None) -> dict:
        return quantize_detector(step, self.fp32, out, self.calibration, self.cfg.per_channel, box_head or self.box_head,
                                 self.workdir)

    def fine_tune(self, out: Path) -> dict:
        from pipeline.detection_export import box_branch_nodes, network_inputs
        from pipeline.detection_qat import detector_qat

        train_inputs = network_inputs(self.train.images, self.size)  # only here: QAT is the one step that trains
        facts = detector_qat(self.ctx.manifest.output("distill", "model"), out, self.calibration, train_inputs,
                             self.cfg.qat, self.box_head, self.ctx.recipe.export.opset,
                             self.ctx.recipe.section("postprocess"))
        excluded = box_branch_nodes(out) if self.box_head in ("fp16", "float") else []
        halves = box_branch_fp16(out, excluded) if self.box_head == "fp16" else {}
        return {"box_head": self.box_head, "box_nodes_float": len(excluded), **halves, **facts}

    def score(self, candidate: Path, step: Step) -> dict:
        from pipeline.detection_onnx import score_onnx_detector

        scores, self.detections[step.method] = score_onnx_detector(
            candidate, self.inputs, self.test.boxes, self.classes, self.sizes, f"the INT8 student ({step})",
            resamples=self.cfg.resamples)
        return {"scores": scores, "value": scores["map"]}

    def fix(self, qat: bool) -> str:
        other = "; or set quantize.box_head: fp16" if self.box_head == "int8" else ""
        return ("raise quantize.accuracy_budget_points, add calibration methods, raise quantize.calib_images"
                + ("" if qat else ", or set quantize.qat (a short fine-tuning schedule)") + other)


class DetectionQuantizeStage(Stage):
    """INT8 student with explicit Q/DQ, linted, int8 weights checked, within the mAP budget of its FP32 form."""

    name = "quantize"

    def needs(self, ctx):
        # Quantization-aware fine-tuning starts from the distilled checkpoint, not from the ONNX.
        return ("data", "export") + (("distill",) if ctx.recipe.quantize.qat else ())

    def config(self, ctx):
        return {"quantize": ctx.recipe.section("quantize")}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.data.detection_files import load_split
        from pipeline.detection_export import network_inputs, sidecar_path
        from pipeline.detection_metrics import class_changes

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
        task = DetectionLadder(ctx, workdir, fp32, calibration, train, size, inputs, test, classes, sizes, cfg.box_head)
        reference, attempts, candidate = climb(task, steps(cfg.quantizer, cfg.calibration_methods, bool(cfg.qat)),
                                               workdir)
        chosen = attempts[-1]
        final = workdir / "student.int8.onnx"
        shutil.copyfile(candidate, final)
        shutil.copyfile(sidecar_path(candidate), sidecar_path(final))
        outputs = {"student_int8": final, "student_int8_head": sidecar_path(final)}
        fp32_scores = {key: value for key, value in reference.items() if key != "value"}
        metrics = {"fp32": fp32_scores, "int8": chosen["scores"], "drop_points": chosen["drop_points"],
                   "quantizer": chosen["quantizer"], "method": chosen["method"], "box_head": cfg.box_head,
                   "size_mb": chosen["size_mb"], "fp32_size_mb": exported.stat().st_size / 1e6, "attempts": attempts,
                   "class_changes_vs_fp32": class_changes(test.boxes, task.detections["fp32"],
                                                          task.detections[chosen["method"]], classes,
                                                          resamples=cfg.resamples)}
        if cfg.compare_box_head:
            # The other settings with the same quantizer and calibration (QAT's pick: the first calibration method).
            step = Step(cfg.quantizer, cfg.calibration_methods[0]) if chosen["method"] == "qat" else \
                Step(chosen["quantizer"], chosen["method"])
            metrics["other_box_heads"] = []
            for other in (setting for setting in BOX_HEADS if setting != cfg.box_head):
                path = workdir / f"student.int8.box_{other}.onnx"
                facts = {**task.quantize(step, path, box_head=other), **check_candidate(path, step)}
                scores = task.score(path, Step(step.quantizer, f"box_{other}"))["scores"]
                drop = round(100 * (reference["map"] - scores["map"]), 4)
                metrics["other_box_heads"].append({**facts, "method": step.method, "scores": scores,
                                                   "drop_points": drop})
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
