"""The detector on the INT8 ladder (:mod:`pipeline.quantize.ladder`): COCO mAP of ONNX Runtime + the device's
decode on the test canvases; the box-regression branch kept out of Q/DQ as ``quantize.box_head`` says (FP16 in the
graph, FP32, or quantized); QAT towards the FP32 student's raw head outputs (:mod:`pipeline.tasks.detection.qat`).
A library: the detection quantize stage climbs with it.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
from typing import Sequence

from device.errors import StageError
from pipeline.quantize.ladder import HeldOut, LadderTask, QuantizeHooks, Step
from pipeline.core.ladder import signed


def box_branch_fp16(path: Path, box_nodes: list[str]) -> dict:
    """Rewrites the quantized graph's box branch (left float by the quantizer) to FP16, in place.

    Raises:
        StageError: The rewrite put a node outside the box branch in FP16, or none inside it.
    """
    import onnx

    from pipeline.quantize.fp16_nodes import fp16_nodes, nodes_to_fp16

    model = onnx.load(str(path))
    facts = nodes_to_fp16(model, box_nodes)
    halves = fp16_nodes(model)
    stray = sorted(halves - set(box_nodes))
    if stray or not halves:
        raise StageError(f"the box branch's FP16 rewrite of {path.name} left "
                         + (f"{len(stray)} node(s) outside the branch in FP16 (e.g. {stray[0]})" if stray
                            else "no node in FP16"),
                         fix="this is a bug in pipeline/quantize/fp16_nodes.py; "
                             "set quantize.box_head: float meanwhile")
    onnx.save(model, str(path))
    return {"box_nodes_fp16": facts["fp16_nodes"], "box_casts": facts["casts_in"] + facts["casts_out"]}


def quantize_detector(step: Step, fp32: Path, out: Path, calibration, per_channel: bool, box_head: str,
                      workdir: Path, exclude: Sequence[str] = (), float32_islands: bool = False) -> dict:
    """The post-training candidate of ``step`` for a detector: its box branch out of Q/DQ unless ``box_head`` is
    ``int8``, and FP16 in the graph for ``fp16``; the decoding sidecar copied beside it. Returns what to record.

    Args:
        exclude: More layers left out of Q/DQ (the mixed-precision step's), FP16 when the box branch is.
        float32_islands: Every layer left out of Q/DQ in FP32 (the sensitivity's graph edits need float32 weights).
    """
    from pipeline.tasks.detection.export import box_branch_nodes, sidecar_path
    from pipeline.quantize.ort import quantize_ort, quiet
    from pipeline.quantize.quantizers import logged_to, quantize_modelopt, run_isolated

    box_nodes = box_branch_nodes(fp32) if box_head in ("fp16", "float") else []
    excluded = box_nodes + [name for name in exclude if name not in box_nodes]
    # The mixed step's layers take the box branch's precision; with the branch quantized (int8), FP16 where only
    # they can be made FP16 (ONNX Runtime's graph, rewritten node by node).
    halves_wanted = not float32_islands and (box_head == "fp16" or (box_head == "int8" and bool(exclude)
                                                                    and step.quantizer != "modelopt"))
    if step.quantizer == "modelopt":
        # ModelOpt writes every layer it leaves float in high_precision_dtype: FP16 only where the box head is.
        islands = "fp16" if halves_wanted else "fp32"
        run_isolated(logged_to, workdir / "quantizer.log", quantize_modelopt, fp32, out, calibration, step.method,
                     per_channel, islands, excluded)
        import onnx

        from pipeline.quantize.fp16_nodes import fp16_nodes

        halves = {"float_islands": islands,
                  "box_nodes_fp16": len(fp16_nodes(onnx.load(str(out))) & set(box_nodes))}
    else:
        with quiet():
            quantize_ort(fp32, out, calibration, step.method, per_channel, excluded)
        halves = {"float_islands": "fp16" if halves_wanted else "fp32",
                  **(box_branch_fp16(out, excluded) if halves_wanted else {})}
        if halves_wanted and exclude:
            halves["box_nodes_fp16"] = len(box_nodes) if box_head == "fp16" else 0
    shutil.copyfile(sidecar_path(fp32), sidecar_path(out))  # the same anchors and thresholds
    return {"box_head": box_head, "box_nodes_float": len(box_nodes), **halves}


class DetectionLadder(LadderTask):
    """The detector on the shared ladder: COCO mAP of ONNX Runtime + the device's decode on the test canvases; the box
    branch kept out of Q/DQ as ``box_head`` says; QAT towards the FP32 student's raw head outputs."""

    metric = "mAP"

    def __init__(self, ctx, workdir: Path, fp32: Path, calibration, train, size: int, inputs, test, classes, sizes,
                 box_head: str, columns_first: bool = False):
        self.ctx, self.workdir, self.fp32, self.box_head = ctx, workdir, fp32, box_head
        self.columns_first = columns_first
        self.calibration, self.train, self.size, self.inputs = calibration, train, size, inputs
        self.test, self.classes, self.sizes = test, classes, sizes
        self.cfg = ctx.recipe.quantize
        self.budget_points = self.cfg.accuracy_budget_points
        self.detections: dict[str, list] = {}

    @classmethod
    def from_run(cls, ctx, workdir: Path, fp32: Path) -> "DetectionLadder":
        """The ladder of a run: its first training canvases to calibrate on, its test canvases; the export stage's
        decoding sidecar copied beside ``fp32`` (a copy of the exported student)."""
        import json

        from pipeline.tasks.detection.export import feed_of, network_inputs, sidecar_path
        from pipeline.tasks.detection.files import load_split, recorded_classes

        cfg = ctx.recipe.quantize
        shutil.copyfile(ctx.manifest.output("export", "student_head"), sidecar_path(fp32))
        head = json.loads(ctx.manifest.output("export", "student_head").read_text())
        size, feed = head["input_shape"][-1], feed_of(head)
        canvases = ctx.manifest.output("data", "canvases")
        train, test = load_split(canvases, "train"), load_split(canvases, "test")
        calibration = network_inputs(train.images[: cfg.calib_images], size, **feed)
        inputs, sizes = network_inputs(test.images, size, **feed), [tuple(image.shape[:2]) for image in test.images]
        return cls(ctx, workdir, fp32, calibration, train, size, inputs, test, recorded_classes(ctx), sizes,
                   cfg.box_head, columns_first=bool(head.get("transpose")))

    def reference(self) -> dict:
        from pipeline.tasks.detection.onnx import score_onnx_detector

        scores, self.detections["fp32"] = score_onnx_detector(self.fp32, self.inputs, self.test.boxes, self.classes,
                                                              self.sizes, "the FP32 student", resamples=self.cfg.resamples)
        return {**scores, "value": scores["map"]}

    def quantize(self, step: Step, out: Path, exclude: Sequence[str] = (), calibration=None,
                 float32_islands: bool = False, box_head: str | None = None) -> dict:
        return quantize_detector(step, self.fp32, out, self.calibration if calibration is None else calibration,
                                 self.cfg.per_channel, box_head or self.box_head, self.workdir, exclude,
                                 float32_islands)

    def rename(self, source: Path, target: Path) -> None:
        from pipeline.tasks.detection.export import sidecar_path

        source.replace(target)
        sidecar_path(source).replace(sidecar_path(target))

    def hold_out(self, fraction: float) -> HeldOut:
        from pipeline.quantize.mixed_precision import held_apart
        from pipeline.tasks.detection.onnx import score_onnx_detector

        # The calibration canvases are the first training canvases: the slice's indices are the training split's.
        held, rest = held_apart(fraction, len(self.calibration), "quantize.calib_images")
        inputs = self.calibration[held]
        truth = [self.train.boxes[i] for i in held]
        sizes = [tuple(self.train.images[i].shape[:2]) for i in held]

        def score(candidate: Path) -> dict:
            scores, _ = score_onnx_detector(candidate, inputs, truth, self.classes, sizes,
                                            f"{candidate.name} on the held-out canvases", resamples=0)
            return {"scores": scores, "value": scores["map"]}

        return HeldOut(self.calibration[rest], inputs, score,
                       "training canvases (the detector calibrates on them; the student saw them)")

    def fine_tune(self, out: Path) -> dict:
        from pipeline.tasks.detection.export import box_branch_nodes, network_inputs
        from pipeline.tasks.detection.qat import detector_qat

        train_inputs = network_inputs(self.train.images, self.size)  # only here: QAT is the one step that trains
        facts = detector_qat(self.ctx.manifest.output("distill", "model"), out, self.calibration, train_inputs,
                             self.cfg.qat, self.box_head, self.ctx.recipe.export.opset,
                             self.ctx.recipe.section("postprocess"))
        excluded = box_branch_nodes(out) if self.box_head in ("fp16", "float") else []
        halves = box_branch_fp16(out, excluded) if self.box_head == "fp16" else {}
        return {"box_head": self.box_head, "box_nodes_float": len(excluded), **halves, **facts}

    def distortion(self, reference, outputs) -> float:
        """The normalised error per column of the raw head: a YOLOv8 layout's columns are its second axis
        (``N×(4+C)×A``); read along the last, every anchor would be a "channel" mixing box pixels with class
        probabilities, and the box columns (kept in FP16) would drown every class layer's error."""
        from pipeline.quantize.mixed_precision import normalised_error

        if self.columns_first:
            reference = [np.moveaxis(value, 1, -1) for value in reference]
            outputs = [np.moveaxis(value, 1, -1) for value in outputs]
        return normalised_error(reference, outputs)

    def score(self, candidate: Path, step: Step) -> dict:
        from pipeline.tasks.detection.metrics import map_change
        from pipeline.tasks.detection.onnx import score_onnx_detector

        scores, self.detections[step.method] = score_onnx_detector(
            candidate, self.inputs, self.test.boxes, self.classes, self.sizes, f"the INT8 student ({step})",
            resamples=self.cfg.resamples)
        change = map_change(self.test.boxes, self.detections["fp32"], self.detections[step.method], self.classes,
                            resamples=self.cfg.resamples)
        return {"scores": scores, "value": scores["map"], "change_vs_fp32": change}

    def fix(self, qat: bool) -> str:
        """Only what this recipe can still change: QAT not for a detector brought as ONNX (no PyTorch model), the
        mixed-precision step where it is off, calibration methods not yet tried, more calibration images where the
        training split has them; and a larger test split where the loss is within its noise."""
        from pipeline.core.recipe import MODELOPT_METHODS

        cfg, recipe = self.cfg, self.ctx.recipe
        steps = ["raise quantize.accuracy_budget_points"]
        offered = MODELOPT_METHODS if cfg.quantizer == "modelopt" else ("max", "entropy", "percentile")
        untried = [m for m in offered if m not in cfg.calibration_methods]
        if untried:
            steps.append(f"add calibration methods ({', '.join(untried)})")
        if len(self.train.images) > cfg.calib_images:
            steps.append(f"raise quantize.calib_images (now {cfg.calib_images} of {len(self.train.images)} "
                         "training images)")
        if cfg.mixed_precision is None:
            steps.append("set quantize.mixed_precision: {} (the most sensitive layers kept in FP16)")
        if self.box_head == "int8":
            steps.append("set quantize.box_head: fp16")
        if not qat and recipe.start is None:
            steps.append("set quantize.qat (a short fine-tuning schedule)")
        steps.append(f"raise data.test_images (now {len(self.test.images)}) where the loss is within the test "
                     "split's noise")
        return ", ".join(steps[:-1]) + ", or " + steps[-1]


class DetectionQuantize(QuantizeHooks):
    """Detection's part of the quantize stage: its ladder gated on COCO mAP with the box branch outside Q/DQ in
    FP16 unless ``quantize.box_head`` says ``float`` (FP32) or ``int8``; the decoding sidecar beside the INT8 rung;
    with ``compare_box_head`` the other box-head settings quantized with the accepted calibration and their mAP
    recorded (what each costs); the per-class changes against FP32."""

    scratch_name = "student.onnx"

    def ladder(self, ctx, workdir: Path, fp32: Path) -> DetectionLadder:
        return DetectionLadder.from_run(ctx, workdir, fp32)

    def finish(self, ctx, workdir: Path, task: DetectionLadder, reference: dict, attempts: list[dict],
               candidate: Path):
        from pipeline.core.stage import StageResult
        from pipeline.tasks.detection.export import sidecar_path
        from pipeline.tasks.detection.metrics import class_changes

        cfg = ctx.recipe.quantize
        chosen = attempts[-1]
        others, other_outputs = _other_box_heads(ctx, task, reference, chosen, workdir) \
            if cfg.compare_box_head else (None, {})
        final = workdir / "student.int8.onnx"
        shutil.copyfile(candidate, final)
        shutil.copyfile(sidecar_path(candidate), sidecar_path(final))
        outputs = {"student_int8": final, "student_int8_head": sidecar_path(final), **other_outputs}
        fp32_scores = {key: value for key, value in reference.items() if key != "value"}
        metrics = {"fp32": fp32_scores, "int8": chosen["scores"], "drop_points": chosen["drop_points"],
                   "quantizer": chosen["quantizer"], "method": chosen["method"], "box_head": cfg.box_head,
                   "kept_layers": [layer["layer"] for layer in chosen.get("kept_layers", ())],
                   "kept_precision": chosen.get("kept_precision"), "size_mb": chosen["size_mb"],
                   "change_vs_fp32": chosen.get("change_vs_fp32"),
                   "fp32_size_mb": ctx.manifest.output("export", "student").stat().st_size / 1e6,
                   "attempts": attempts,
                   "class_changes_vs_fp32": class_changes(task.test.boxes, task.detections["fp32"],
                                                          task.detections[chosen["method"]], task.classes,
                                                          resamples=cfg.resamples)}
        if others is not None:
            metrics["other_box_heads"] = others
        return StageResult(outputs=outputs, metrics=metrics)

    def summary(self, metrics: dict) -> str:
        change = metrics.get("change_vs_fp32")
        noise = "" if not change else (f" [{signed(change['low'])}, {signed(change['high'])}], "
                                       + ("within noise" if change["low"] <= 0 <= change["high"] else "beyond noise"))
        line = (f"INT8 mAP {100 * metrics['int8']['map']:.1f} ({signed(-metrics['drop_points'])} points{noise} vs FP32 "
                f"{100 * metrics['fp32']['map']:.1f}; box head {metrics['box_head']}, {metrics['method']}"
                + (f", {len(metrics['kept_layers'])} more layer(s) in {metrics['kept_precision'].upper()}"
                   if metrics.get("kept_layers") else "")
                + ")")
        for other in metrics.get("other_box_heads", ()):
            line += (f"; box head {other['box_head']}: mAP {100 * other['scores']['map']:.1f} "
                     f"({signed(-other['drop_points'])})")
        return line


def _other_box_heads(ctx, task: DetectionLadder, reference: dict, chosen: dict, workdir: Path):
    """The other box-head settings quantized with the same quantizer and calibration (after QAT: the first
    calibration method) and scored: (their records, their outputs)."""
    from pipeline.quantize.ladder import check_candidate
    from pipeline.tasks.detection.export import sidecar_path
    from pipeline.tasks.detection.recipe import BOX_HEADS

    cfg = ctx.recipe.quantize
    # After QAT: the first calibration method; after the mixed step: its calibration, no layer kept in float.
    step = Step(cfg.quantizer, cfg.calibration_methods[0]) if chosen["method"] == "qat" else \
        Step(chosen["quantizer"], chosen.get("base_method", chosen["method"]))
    records, outputs = [], {}
    for other in (setting for setting in BOX_HEADS if setting != cfg.box_head):
        path = workdir / f"student.int8.box_{other}.onnx"
        facts = {**task.quantize(step, path, box_head=other), **check_candidate(path, step)}
        scored = task.score(path, Step(step.quantizer, f"box_{other}"))
        scores = scored["scores"]
        drop = task.drop_points(reference, {"value": scores["map"]})
        records.append({**facts, "method": step.method, "scores": scores, "drop_points": drop,
                        "change_vs_fp32": scored["change_vs_fp32"]})
        ctx.log(f"quantize: box head {other}: INT8 mAP {100 * scores['map']:.2f} ({signed(-drop)} points)")
        outputs[f"student_int8_box_{other}"] = path
        outputs[f"student_int8_box_{other}_head"] = sidecar_path(path)
    return records, outputs
