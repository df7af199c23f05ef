"""Detection's part of the export stage (:class:`pipeline.export.hooks.ExportHooks`): teacher and student to ONNX
up to the raw head outputs, each with its decoding sidecar; or, for a detector brought as ONNX (``start``), that graph
in the ladder's form as the student.

Each exported graph is checked twice: its raw outputs against torch's on test images, and its mAP — through ONNX
Runtime and the device's numpy decode + NMS — against the mAP its stage measured through torchvision's own
post-processing. A started graph is checked before any stage (:meth:`DetectionExport.inspect_start`), and again
when it is written, against its own raw outputs.
"""

from __future__ import annotations

from pathlib import Path

from device.errors import StageError
from pipeline.export.hooks import Exported, ExportHooks
from pipeline.tasks.detection.files import planned_classes, recorded_classes
from pipeline.core.ladder import size_text

RUNGS = {"teacher": "teacher", "student": "distill"}
"""Exported rung → the stage whose checkpoint it is."""

MAP_TOLERANCE = 0.01
"""Largest |ΔmAP| between torchvision's post-processing on torch and the device's on the ONNX: the same math in
another order (float rounding can swap near-tied candidates), so anything larger is a decoding bug."""


class DetectionExport(ExportHooks):
    """Exports the teacher and the distilled student to the raw head outputs, with parity and mAP checks."""

    def keys(self, ctx):
        return {"postprocess": ctx.recipe.section("postprocess")}

    def inspect_start(self, ctx):
        """Its layout against the data's classes (a composited set's are known now; a COCO set's are counted from its
        annotations)."""
        from pipeline.tasks.detection.onnx_start import inspect_detection_start

        start = ctx.recipe.start
        inspect_detection_start(start.onnx, start.outputs, ctx.recipe.input_size(), len(planned_classes(ctx.recipe)))

    def rungs(self, ctx):
        return dict(RUNGS)

    def probe(self, ctx):
        """The test split and each image's size."""
        from pipeline.tasks.detection.files import load_split

        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        return test, [tuple(image.shape[:2]) for image in test.images]

    def export(self, ctx, rung, stage, workdir, probe):
        import numpy as np

        from device.runners.onnxruntime import OnnxRuntimeRunner
        from pipeline.tasks.detection.checkpoint import load_detector
        from pipeline.tasks.detection.export import export_detector, network_inputs, raw_outputs, sidecar_path
        from pipeline.tasks.detection.models import DETECTORS
        from pipeline.tasks.detection.onnx import score_onnx_detector

        cfg, classes, (test, sizes) = ctx.recipe.export, recorded_classes(ctx), probe
        model, meta = load_detector(ctx.manifest.output(stage, "model"))
        size, offset = meta["input_size"], DETECTORS.get(meta["arch"]).label_offset
        inputs = network_inputs(test.images, size)
        path = workdir / f"{rung}.onnx"
        facts = export_detector(model, path, meta["arch"], size, offset, cfg.opset, ctx.recipe.section("postprocess"))
        parity_inputs = inputs[: cfg.parity_images]
        with OnnxRuntimeRunner(path) as runner:
            got = runner.infer(parity_inputs)
        diff = float(np.abs(got - raw_outputs(model, parity_inputs)).max())
        if diff > cfg.parity_atol:
            raise StageError(f"the {rung}'s ONNX raw head output differs from torch's by up to {diff:.3g} "
                             f"(allowed {cfg.parity_atol:g}) on {len(parity_inputs)} test images",
                             fix="report this model to EdgeFold; try export.opset: 18, or loosen export.parity_atol")
        # Point estimates only: the check compares them, and the quantize stage reports the intervals.
        scores, _ = score_onnx_detector(path, inputs, test.boxes, classes, sizes, f"the exported {rung}", resamples=0)
        torch_map = ctx.manifest.stage(stage)["metrics"]["map"]
        own_thresholds = all(v is None for v in ctx.recipe.section("postprocess").values())
        # With the recipe's own thresholds the two post-processings are meant to differ; only compared without.
        if own_thresholds and abs(scores["map"] - torch_map) > MAP_TOLERANCE:
            raise StageError(f"the exported {rung} decoded on the device's path scores mAP {scores['map']:.4f}, "
                             f"torchvision's post-processing {torch_map:.4f} on the same test images",
                             fix="report this to EdgeFold: device.scoring.detection_post decodes this architecture "
                                 "differently from torchvision")
        return Exported({rung: path, f"{rung}_head": sidecar_path(path)},
                        {rung: {**facts, "parity_max_abs_diff": diff, "parity_images": len(parity_inputs),
                                "scores": scores, "torch_map": torch_map, "arch": meta["arch"], "input_size": size}})

    def started(self, ctx, workdir, probe):
        """The user's detector written in the ladder's form with its sidecar, its raw outputs checked against the
        given file's, and scored on the test canvases through the device's decode (at the file's own input size)."""
        import numpy as np

        from device.runners.onnxruntime import OnnxRuntimeRunner
        from pipeline.export.onnx_start import graph_compute, one_at_a_time
        from pipeline.tasks.detection.export import network_inputs, sidecar_path
        from pipeline.tasks.detection.onnx import score_onnx_detector
        from pipeline.tasks.detection.onnx_start import batch_refusal, write_detection_start
        from pipeline.tasks.detection.probe import check_started_detector

        cfg, start, classes = ctx.recipe.export, ctx.recipe.start, recorded_classes(ctx)
        path = workdir / "student.onnx"
        feed = {"channel_order": start.channel_order, "input_range": start.input_range}
        facts, written = write_detection_start(start.onnx, start.outputs, ctx.recipe.input_size(), len(classes), path,
                                               ctx.recipe.section("postprocess"), **feed)
        size = facts.size
        for change in written["changes"]:
            ctx.log(f"export: {Path(start.onnx).name}: {change}")
        test, sizes = probe
        inputs = network_inputs(test.images, size, **feed)
        parity_inputs = inputs[: cfg.parity_images]
        # The given graph one image at a time (its answers, whatever it does with a batch) against the ladder's form
        # at the whole batch: on real images, where a graph that answers only a batch's first image shows it.
        given = one_at_a_time(Path(start.onnx), parity_inputs)
        with OnnxRuntimeRunner(path) as runner:
            batched = runner.infer(parity_inputs)
        refusal = batch_refusal(Path(start.onnx), start.outputs, batched, given)
        if refusal is not None:
            raise refusal
        diff = float(np.abs(batched - given).max())
        if diff > cfg.parity_atol:
            raise StageError(f"the ladder's form of {start.onnx} differs from the given graph by up to {diff:.3g} "
                             f"(allowed {cfg.parity_atol:g}) on {len(parity_inputs)} test images",
                             fix="report this model to EdgeFold, or loosen export.parity_atol")
        feed_probe = check_started_detector(ctx, path, classes, size)  # before the test split is scored
        scores, _ = score_onnx_detector(path, inputs, test.boxes, classes, sizes, f"the given {start.outputs} "
                                        "detector", resamples=0)
        what = "images" if ctx.recipe.data.source.startswith("coco:") else "canvases"
        ctx.log(f"export: {Path(start.onnx).name} ({start.outputs}, {facts.rows} boxes per image, {size} px): "
                f"mAP {100 * scores['map']:.1f} on the test {what}; {written['box_branch_nodes']} node(s) in its box "
                "branch")
        rung = {**written, "start": facts.as_dict(), "feed_probe": feed_probe, "parity_max_abs_diff": diff,
                "parity_images": len(parity_inputs), "scores": scores, "arch": f"onnx:{Path(start.onnx).name}",
                "input_size": size, **graph_compute(path, (3, size, size))}
        return Exported({"student": path, "student_head": sidecar_path(path)}, {"student": rung})

    def summary(self, metrics):
        if metrics.get("started"):
            rung = metrics["rungs"]["student"]
            return (f"{rung['arch']} ({rung['start']['outputs']}) as the student, {size_text(rung['size_mb'])}, mAP "
                    f"{100 * rung['scores']['map']:.1f} through the device's decode, max |Δ| "
                    f"{rung['parity_max_abs_diff']:.1e} to the given graph")
        return ", ".join(f"{rung} {size_text(m['size_mb'])}, mAP {100 * m['scores']['map']:.1f} through the device's "
                         f"decode (torch {100 * m['torch_map']:.1f}), max |Δ| {m['parity_max_abs_diff']:.1e}"
                         for rung, m in metrics["rungs"].items())
