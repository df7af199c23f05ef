"""detection distill stage: the pruned detector fine-tuned with the teacher (KD on matched anchors + imitation)."""

from __future__ import annotations

from pathlib import Path

from pipeline.tasks.detection.models import detector_size_metrics
from pipeline.core.stage import Stage, StageResult, started_without_torch
from pipeline.tasks.detection.files import recorded_classes


class DetectionDistillStage(Stage):
    """Fine-tunes the pruned detector with the teacher: its own detection loss + class KD + feature imitation."""

    name = "distill"

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def needs(self, ctx):
        return ("data", "teacher", "prune")

    def config(self, ctx):
        return {"distill": ctx.recipe.section("distill")}

    def run(self, ctx, workdir: Path) -> StageResult:
        import torch

        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.checkpoint import load_detector, save_detector
        from pipeline.tasks.detection.distill import DetectionDistillLoss
        from pipeline.tasks.detection.metrics import class_changes
        from pipeline.tasks.detection.models import DETECTORS
        from pipeline.tasks.detection.train import predict, score_detector, train_detector

        cfg, classes = ctx.recipe.distill, recorded_classes(ctx)
        teacher, meta = load_detector(ctx.manifest.output("teacher", "model"))
        student, _ = load_detector(ctx.manifest.output("prune", "model"))
        spec = DETECTORS.get(meta["arch"])
        canvases = ctx.manifest.output("data", "canvases")
        torch.manual_seed(cfg.train.seed)
        teaching = cfg.kd_weight > 0 or cfg.feature_weight > 0
        loss = DetectionDistillLoss(student, teacher, "softmax" if spec.label_offset else "sigmoid",
                                    cfg.temperature, cfg.kd_weight, cfg.feature_weight, meta["input_size"]) \
            if teaching else None
        student.train()
        history = train_detector(student, load_split(canvases, "train"), cfg.train, spec.label_offset, "distill",
                                 extra_loss=(lambda x, batch: loss(student, teacher, x, batch)["total"]) if loss else None,
                                 extra_modules=loss, resume=ctx.resume, input_size=meta["input_size"])
        test = load_split(canvases, "test")
        scores = score_detector(student, test, classes, "the distilled student", spec.label_offset)
        changes = class_changes(test.boxes, predict(teacher, test.images, spec.label_offset),
                                predict(student, test.images, spec.label_offset), classes, resamples=200)
        path = save_detector(workdir / "model.pt", student, meta["arch"], meta["num_classes"], meta["input_size"],
                             distilled=teaching)
        return StageResult(outputs={"model": path},
                           metrics={**scores, **detector_size_metrics(student, meta["input_size"]), "history": history,
                                    "with_teacher": teaching, "class_changes_vs_teacher": changes})

    def summary(self, metrics):
        return (f"mAP {100 * metrics['map']:.1f} [{100 * metrics['map_low']:.1f}, {100 * metrics['map_high']:.1f}], "
                f"AP50 {100 * metrics['ap50']:.1f}, {metrics['macs_g']:.3f} GMACs"
                + ("" if metrics["with_teacher"] else " (fine-tuned without the teacher)"))
