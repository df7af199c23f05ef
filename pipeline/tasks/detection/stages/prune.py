"""detection prune stage: backbone and neck pruned to the MACs target, the head's anchor-sized layers kept whole."""

from __future__ import annotations

from pathlib import Path

from device.errors import StageError
from pipeline.tasks.detection.models import detector_size_metrics
from pipeline.core.stage import Stage, StageResult, started_without_torch
from pipeline.tasks.detection.files import recorded_classes


class DetectionPruneStage(Stage):
    """Prunes the teacher's backbone and neck to the MACs target, the head's anchor-sized layers kept whole."""

    name = "prune"

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def needs(self, ctx):
        return ("data", "teacher")

    def config(self, ctx):
        return {"prune": ctx.recipe.section("prune"), "input_size": ctx.recipe.teacher.size()}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.checkpoint import load_detector, save_detector
        from pipeline.tasks.detection.metrics import evaluate, require_sane_detector
        from pipeline.tasks.detection.models import DETECTORS
        from pipeline.tasks.detection.pruning import prune_detector
        from pipeline.tasks.detection.train import predict

        cfg, classes = ctx.recipe.prune, recorded_classes(ctx)
        model, meta = load_detector(ctx.manifest.output("teacher", "model"))
        result = prune_detector(model, meta["arch"], cfg.macs_target, meta["input_size"], round_to=cfg.round_to,
                                importance=cfg.importance, tolerance=cfg.tolerance, iterations=cfg.iterations)
        for kept in result.kept_whole:
            ctx.log(f"prune: kept whole {kept['module']}: {kept['reason']}")
        test = load_split(ctx.manifest.output("data", "canvases"), "test")
        detections = predict(model, test.images, DETECTORS.get(meta["arch"]).label_offset)
        # Not gated: a pruned detector before fine-tuning may well find nothing yet; distillation restores it.
        try:
            require_sane_detector(detections, test.boxes, classes, "the pruned detector (before fine-tuning)")
            sanity = "ok"
        except StageError as err:
            sanity = err.message
            ctx.log(f"prune: note: {sanity}")
        scores = evaluate(test.boxes, detections, classes, [tuple(i.shape[:2]) for i in test.images], resamples=200)
        path = save_detector(workdir / "model.pt", model, meta["arch"], meta["num_classes"], meta["input_size"],
                             pruned=result.to_json())
        return StageResult(outputs={"model": path},
                           metrics={**scores, **detector_size_metrics(model, meta["input_size"]), "pruning": result.to_json(),
                                    "macs_fraction": result.fraction, "sanity": sanity})

    def summary(self, metrics):
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs ({len(metrics['pruning']['kept_whole'])} "
                f"head layers kept whole), mAP before fine-tuning {100 * metrics['map']:.1f}")
