"""detection export stage: teacher and student to ONNX up to the raw head outputs, each with its decoding sidecar.

Each graph is checked twice: its raw outputs against torch's on test images, and its mAP — through ONNX Runtime and
the device's numpy decode + NMS — against the mAP its stage measured through torchvision's own post-processing.
"""

from __future__ import annotations

from pathlib import Path

from device.errors import StageError
from pipeline.core.stage import Stage, StageResult
from pipeline.tasks.detection.files import recorded_classes

RUNGS = {"teacher": "teacher", "student": "distill"}
"""Exported rung → the stage whose checkpoint it is."""

MAP_TOLERANCE = 0.01
"""Largest |ΔmAP| between torchvision's post-processing on torch and the device's on the ONNX: the same math in
another order (float rounding can swap near-tied candidates), so anything larger is a decoding bug."""


class DetectionExportStage(Stage):
    """Exports the teacher and the distilled student to the raw head outputs, with parity and mAP checks."""

    name = "export"

    def needs(self, ctx):
        return ("data", *RUNGS.values())

    def config(self, ctx):
        import torch

        return {"export": ctx.recipe.section("export"), "postprocess": ctx.recipe.section("postprocess"),
                "torch": torch.__version__}

    def run(self, ctx, workdir: Path) -> StageResult:
        import numpy as np

        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.checkpoint import load_detector
        from pipeline.tasks.detection.export import export_detector, network_inputs, raw_outputs, sidecar_path
        from pipeline.tasks.detection.models import DETECTORS
        from pipeline.tasks.detection.onnx import score_onnx_detector
        from device.runners.onnxruntime import OnnxRuntimeRunner

        cfg, classes = ctx.recipe.export, recorded_classes(ctx)
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        sizes = [tuple(image.shape[:2]) for image in test.images]
        outputs, metrics = {}, {}
        for rung, stage in RUNGS.items():
            model, meta = load_detector(ctx.manifest.output(stage, "model"))
            size, offset = meta["input_size"], DETECTORS.get(meta["arch"]).label_offset
            inputs = network_inputs(test.images, size)
            path = workdir / f"{rung}.onnx"
            facts = export_detector(model, path, meta["arch"], size, offset, cfg.opset, ctx.recipe.section("postprocess"))
            probe = inputs[: cfg.parity_images]
            with OnnxRuntimeRunner(path) as runner:
                got = runner.infer(probe)
            diff = float(np.abs(got - raw_outputs(model, probe)).max())
            if diff > cfg.parity_atol:
                raise StageError(f"the {rung}'s ONNX raw head output differs from torch's by up to {diff:.3g} "
                                 f"(allowed {cfg.parity_atol:g}) on {len(probe)} test images",
                                 fix="report this model to EdgeFold; try export.opset: 18, or loosen export.parity_atol")
            # Point estimates only: the check compares them, and the quantize stage reports the intervals.
            scores, _ = score_onnx_detector(path, inputs, test.boxes, classes, sizes, f"the exported {rung}",
                                            resamples=0)
            torch_map = ctx.manifest.stage(stage)["metrics"]["map"]
            own_thresholds = all(v is None for v in ctx.recipe.section("postprocess").values())
            # With the recipe's own thresholds the two post-processings are meant to differ; only compared without.
            if own_thresholds and abs(scores["map"] - torch_map) > MAP_TOLERANCE:
                raise StageError(f"the exported {rung} decoded on the device's path scores mAP {scores['map']:.4f}, "
                                 f"torchvision's post-processing {torch_map:.4f} on the same test images",
                                 fix="report this to EdgeFold: device.detection_post decodes this architecture "
                                     "differently from torchvision")
            metrics[rung] = {**facts, "parity_max_abs_diff": diff, "parity_images": len(probe), "scores": scores,
                             "torch_map": torch_map, "arch": meta["arch"], "input_size": size}
            outputs[rung], outputs[f"{rung}_head"] = path, sidecar_path(path)
        return StageResult(outputs=outputs, metrics={"rungs": metrics})

    def summary(self, metrics):
        return ", ".join(f"{rung} {m['size_mb']:.1f} MB, mAP {100 * m['scores']['map']:.1f} through the device's "
                         f"decode (torch {100 * m['torch_map']:.1f}), max |Δ| {m['parity_max_abs_diff']:.1e}"
                         for rung, m in metrics["rungs"].items())
