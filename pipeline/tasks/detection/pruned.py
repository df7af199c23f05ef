"""Detection's part of the prune stage (:class:`pipeline.train.hooks.PruneHooks`): the backbone and neck pruned to the
MACs target (:func:`pipeline.tasks.detection.pruning.prune_detector`), the head's anchor-sized layers kept whole."""

from __future__ import annotations

from pipeline.core.log import log
from pipeline.tasks.detection.files import recorded_classes
from pipeline.tasks.detection.training import DetectionModels, label_offset
from pipeline.train.hooks import PruneHooks, Scored


class DetectionPrune(DetectionModels, PruneHooks):
    """Detection's pruning: see the module's docstring."""

    def keys(self, ctx, stage):
        return {"input_size": ctx.recipe.teacher.size()}

    def prune(self, ctx, start, workdir):
        from pipeline.tasks.detection.pruning import prune_detector

        cfg = ctx.recipe.prune
        result = prune_detector(start.model, start.saved["arch"], cfg.macs_target, start.saved["input_size"],
                                round_to=cfg.round_to, importance=cfg.importance, tolerance=cfg.tolerance,
                                iterations=cfg.iterations)
        for kept in result.kept_whole:
            log(f"prune: kept whole {kept['module']}: {kept['reason']}")
        start.saved["pruned"] = result.to_json()
        return {"pruning": result.to_json(), "macs_fraction": result.fraction}

    def assess(self, ctx, start, workdir):
        from device.errors import StageError
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.metrics import evaluate, require_sane_detector
        from pipeline.tasks.detection.train import predict

        classes, test = recorded_classes(ctx), load_split(ctx.manifest.output("data", "canvases"), "test")
        detections = predict(start.model, test.images, label_offset(start))
        # A pruned detector before fine-tuning may well find nothing yet; distillation restores it.
        try:
            require_sane_detector(detections, test.boxes, classes, "the pruned detector (before fine-tuning)")
            sanity = "ok"
        except StageError as err:
            sanity = err.message
            log(f"prune: note: {sanity}")
        scores = evaluate(test.boxes, detections, classes, [tuple(i.shape[:2]) for i in test.images], resamples=200)
        return Scored({**scores, "sanity": sanity})

    def summary(self, stage, metrics):
        if stage != "prune":
            return super().summary(stage, metrics)
        return (f"{100 * metrics['macs_fraction']:.1f}% of the teacher's MACs ({len(metrics['pruning']['kept_whole'])} "
                f"head layers kept whole), mAP before fine-tuning {100 * metrics['map']:.1f}")
