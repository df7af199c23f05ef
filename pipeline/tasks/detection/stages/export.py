"""detection export stage: teacher and student to ONNX up to the raw head outputs, each with its decoding sidecar;
or, for a detector brought as ONNX (``start``), that graph in the ladder's form as the student.

Each exported graph is checked twice: its raw outputs against torch's on test images, and its mAP — through ONNX
Runtime and the device's numpy decode + NMS — against the mAP its stage measured through torchvision's own
post-processing. A started graph is checked before any stage (:meth:`DetectionExportStage.preflight`), and again
when it is written, against its own raw outputs.
"""

from __future__ import annotations

from pathlib import Path

from device.errors import StageError
from pipeline.core.stage import Stage, StageResult
from pipeline.tasks.detection.files import planned_classes, recorded_classes

RUNGS = {"teacher": "teacher", "student": "distill"}
"""Exported rung → the stage whose checkpoint it is."""

MAP_TOLERANCE = 0.01
"""Largest |ΔmAP| between torchvision's post-processing on torch and the device's on the ONNX: the same math in
another order (float rounding can swap near-tied candidates), so anything larger is a decoding bug."""


class DetectionExportStage(Stage):
    """Exports the teacher and the distilled student to the raw head outputs, with parity and mAP checks."""

    name = "export"

    def preflight(self, ctx):
        """A started detector's file is checked before any work: its layout against the data's classes (a composited
        set's are known now; a COCO set's are counted from its annotations)."""
        if ctx.recipe.start is not None:
            from pipeline.tasks.detection.onnx_start import inspect_detection_start

            start = ctx.recipe.start
            inspect_detection_start(start.onnx, start.outputs, None, len(planned_classes(ctx.recipe)))

    def needs(self, ctx):
        return ("data",) if ctx.recipe.start is not None else ("data", *RUNGS.values())

    def config(self, ctx):
        import torch

        config = {"export": ctx.recipe.section("export"), "postprocess": ctx.recipe.section("postprocess"),
                  "torch": torch.__version__}
        if ctx.recipe.start is not None:  # the user's file by its bytes: a re-exported model.onnx is taken again
            from pipeline.onnx_start import start_sha256

            config["start"] = {**ctx.recipe.section("start"), "sha256": start_sha256(Path(ctx.recipe.start.onnx))}
        return config

    def run(self, ctx, workdir: Path) -> StageResult:
        if ctx.recipe.start is not None:
            return self._started(ctx, workdir)
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

    def _started(self, ctx, workdir: Path) -> StageResult:
        """The user's detector written in the ladder's form with its sidecar, its raw outputs checked against the
        given file's, and scored on the test canvases through the device's decode."""
        import numpy as np

        from device.runners.onnxruntime import OnnxRuntimeRunner
        from pipeline.onnx_start import graph_compute, run_graph
        from pipeline.tasks.detection.export import network_inputs, sidecar_path
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.onnx import score_onnx_detector
        from pipeline.tasks.detection.onnx_start import write_detection_start
        from pipeline.tasks.detection.probe import check_started_detector

        cfg, start, classes = ctx.recipe.export, ctx.recipe.start, recorded_classes(ctx)
        path = workdir / "student.onnx"
        feed = {"channel_order": start.channel_order, "input_range": start.input_range}
        facts, written = write_detection_start(start.onnx, start.outputs, None, len(classes), path,
                                               ctx.recipe.section("postprocess"), **feed)
        size = facts.input_shape[-1]
        for change in written["changes"]:
            ctx.log(f"export: {Path(start.onnx).name}: {change}")
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        sizes = [tuple(image.shape[:2]) for image in test.images]
        inputs = network_inputs(test.images, size, **feed)
        probe = inputs[: cfg.parity_images]
        step = 1 if facts.input_shape[0] == 1 else len(probe)  # the given graph at its own batch
        given = np.concatenate([run_graph(Path(start.onnx), probe[i:i + step]) for i in range(0, len(probe), step)])
        with OnnxRuntimeRunner(path) as runner:
            diff = float(np.abs(runner.infer(probe) - given).max())
        if diff > cfg.parity_atol:
            raise StageError(f"the ladder's form of {start.onnx} differs from the given graph by up to {diff:.3g} "
                             f"(allowed {cfg.parity_atol:g}) on {len(probe)} test images",
                             fix="report this model to EdgeFold, or loosen export.parity_atol")
        feed_probe = check_started_detector(ctx, path, classes, size)  # before the test split is scored
        scores, _ = score_onnx_detector(path, inputs, test.boxes, classes, sizes, f"the given {start.outputs} "
                                        "detector", resamples=0)
        what = "images" if ctx.recipe.data.source.startswith("coco:") else "canvases"
        ctx.log(f"export: {Path(start.onnx).name} ({start.outputs}, {facts.rows} boxes per image, {size} px): "
                f"mAP {100 * scores['map']:.1f} on the test {what}; {written['box_branch_nodes']} node(s) in its box "
                "branch")
        rung = {**written, "start": facts.as_dict(), "feed_probe": feed_probe, "parity_max_abs_diff": diff,
                "parity_images": len(probe), "scores": scores, "arch": f"onnx:{Path(start.onnx).name}",
                "input_size": size, **graph_compute(path, (3, size, size))}
        return StageResult(outputs={"student": path, "student_head": sidecar_path(path)},
                           metrics={"rungs": {"student": rung}, "started": True})

    def summary(self, metrics):
        if metrics.get("started"):
            rung = metrics["rungs"]["student"]
            return (f"{rung['arch']} ({rung['start']['outputs']}) as the student, {rung['size_mb']:.1f} MB, mAP "
                    f"{100 * rung['scores']['map']:.1f} through the device's decode, max |Δ| "
                    f"{rung['parity_max_abs_diff']:.1e} to the given graph")
        return ", ".join(f"{rung} {m['size_mb']:.1f} MB, mAP {100 * m['scores']['map']:.1f} through the device's "
                         f"decode (torch {100 * m['torch_map']:.1f}), max |Δ| {m['parity_max_abs_diff']:.1e}"
                         for rung, m in metrics["rungs"].items())
