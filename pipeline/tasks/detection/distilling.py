"""Detection's part of the distill stage (:class:`pipeline.train.hooks.DistillHooks`): the pruned detector fine-tuned
with its own detection loss plus class KD on matched anchors and feature imitation
(:class:`pipeline.tasks.detection.distill.DetectionDistillLoss`), and which classes changed against the teacher."""

from __future__ import annotations

from pipeline.core import distributed
from pipeline.tasks.detection.files import recorded_classes
from pipeline.tasks.detection.training import DetectionModels, label_offset
from pipeline.train.hooks import DistillHooks, Scored


class DetectionDistill(DetectionModels, DistillHooks):
    """Detection's student and distillation loss: see the module's docstring."""

    def student(self, ctx):
        start = self.checkpoint(ctx, "prune")
        start.saved["distilled"] = _teaching(ctx.recipe.distill)
        return start

    def train(self, ctx, start, cfg, stage, teacher=None):
        import torch

        from pipeline.tasks.detection.distill import DetectionDistillLoss
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.train import train_detector

        distill, size, offset = ctx.recipe.distill, start.saved["input_size"], label_offset(start)
        torch.manual_seed(cfg.seed)  # the imitation adapters' initial weights
        loss = DetectionDistillLoss(start.model, teacher, "softmax" if offset else "sigmoid", distill.temperature,
                                    distill.kd_weight, distill.feature_weight, size) if _teaching(distill) else None
        start.model.train()
        return train_detector(start.model, load_split(ctx.manifest.output("data", "canvases"), "train"), cfg, offset,
                              stage, extra_loss=(lambda student, x, batch: loss(student, teacher, x, batch)["total"])
                              if loss else None, extra_modules=loss, resume=ctx.resume, input_size=size)

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        from pipeline.tasks.detection.files import load_split
        from pipeline.tasks.detection.metrics import class_changes
        from pipeline.tasks.detection.train import predict

        scored = super().finish(ctx, start, cfg, stage, workdir)
        if not distributed.world().main:
            return scored
        test, offset = load_split(ctx.manifest.output("data", "canvases"), "test"), label_offset(start)
        changes = class_changes(test.boxes, predict(teacher, test.images, offset),
                                predict(start.model, test.images, offset), recorded_classes(ctx), resamples=200)
        return Scored({**scored.metrics, "with_teacher": start.saved["distilled"], "class_changes_vs_teacher": changes})


def _teaching(distill) -> bool:
    """Whether the recipe's distillation uses the teacher at all (else the student is fine-tuned alone)."""
    return distill.kd_weight > 0 or distill.feature_weight > 0
