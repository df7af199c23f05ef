"""Segmentation's part of the export stage (:class:`pipeline.export.hooks.ExportHooks`): teacher and student to ONNX
(input N×3×H×W in 0–1, output the class logits N×classes×H×W), each checked twice: its logits against torch's on test
images, and its mIoU under ONNX Runtime against the mIoU its stage measured through torch."""

from __future__ import annotations

from device.errors import StageError
from pipeline.export.hooks import Exported, ExportHooks
from pipeline.tasks.segmentation.training import recorded_classes
from pipeline.core.ladder import size_text

RUNGS = {"teacher": "teacher", "student": "distill"}
"""Exported rung → the stage whose checkpoint it is."""

MIOU_TOLERANCE = 0.005
"""Largest |ΔmIoU| between torch and ONNX Runtime on the same images: the same network in another order of float
operations moves a few boundary pixels, never half a point."""


class SegmentationExport(ExportHooks):
    """Exports the teacher and the distilled student, with parity and mIoU checks."""

    def inspect_start(self, ctx):
        raise StageError("segmentation takes no ONNX start", fix="remove start from the recipe")

    def started(self, ctx, workdir, probe):
        raise StageError("segmentation takes no ONNX start", fix="remove start from the recipe")

    def rungs(self, ctx):
        return dict(RUNGS)

    def probe(self, ctx):
        from pipeline.tasks.segmentation.training import test_split

        return test_split(ctx)

    def export(self, ctx, rung, stage, workdir, probe):
        from pipeline.export.onnx import check_parity, export_onnx
        from pipeline.tasks.segmentation.data import network_inputs
        from pipeline.tasks.segmentation.metrics import score_masks
        from pipeline.tasks.segmentation.models import load_segmenter
        from pipeline.tasks.segmentation.train import onnx_masks

        cfg = ctx.recipe.export
        model, meta = load_segmenter(ctx.manifest.output(stage, "model"))
        size = meta["input_size"]
        path = workdir / f"{rung}.onnx"
        facts = export_onnx(model, path, (1, 3, size, size), cfg.opset)
        parity = check_parity(model, path, network_inputs(probe.images[: cfg.parity_images]))
        if parity["max_abs_diff"] > cfg.parity_atol:
            raise StageError(f"the {rung}'s ONNX logits differ from torch's by up to {parity['max_abs_diff']:.3g} "
                             f"(allowed {cfg.parity_atol:g}) on {parity['images']} test images",
                             fix="report this model to EdgeFold; try export.opset: 18, or loosen export.parity_atol")
        scores = score_masks(probe.masks, onnx_masks(path, probe.images), recorded_classes(ctx), resamples=0)
        torch_miou = ctx.manifest.stage(stage)["metrics"]["miou"]
        if abs(scores["miou"] - torch_miou) > MIOU_TOLERANCE:
            raise StageError(f"the exported {rung} scores mIoU {scores['miou']:.4f} under ONNX Runtime, "
                             f"{torch_miou:.4f} in torch on the same test images",
                             fix="report this model to EdgeFold: its ONNX graph computes something else")
        return Exported({rung: path}, {rung: {**facts, "parity_max_abs_diff": parity["max_abs_diff"],
                                              "pixel_agreement": parity["top1_agreement"],
                                              "parity_images": parity["images"], "scores": scores,
                                              "torch_miou": torch_miou, "arch": meta["arch"], "input_size": size}})

    def summary(self, metrics):
        return ", ".join(f"{rung} {size_text(m['size_mb'])}, mIoU {100 * m['scores']['miou']:.1f} under ONNX Runtime "
                         f"(torch {100 * m['torch_miou']:.1f}), max |Δ| {m['parity_max_abs_diff']:.1e}"
                         for rung, m in metrics["rungs"].items())
