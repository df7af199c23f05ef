"""Segmentation's part of the distill stage (:class:`pipeline.train.hooks.DistillHooks`): the pruned segmenter
fine-tuned with cross-entropy plus pixel-wise KD from the teacher
(:func:`pipeline.tasks.segmentation.train.segmentation_step`; the loss runs on the student's own forward, so DDP
wraps it), and which classes changed against the teacher."""

from __future__ import annotations

from pipeline.core import distributed
from pipeline.tasks.segmentation.training import SegmentationModels, recorded_classes, test_split
from pipeline.train.hooks import DistillHooks, Scored


class SegmentationDistill(SegmentationModels, DistillHooks):
    """Segmentation's student and distillation loss: see the module's docstring."""

    def student(self, ctx):
        start = self.checkpoint(ctx, "prune")
        start.saved["distilled"] = ctx.recipe.distill.kd_weight > 0
        return start

    def train(self, ctx, start, cfg, stage, teacher=None):
        from pipeline.tasks.segmentation.data import load_split
        from pipeline.tasks.segmentation.train import train_segmenter

        distill = ctx.recipe.distill
        return train_segmenter(start.model, load_split(ctx.manifest.output("data", "canvases"), "train"), cfg, stage,
                               resume=ctx.resume, device=ctx.device,
                               teacher=teacher if distill.kd_weight > 0 else None, temperature=distill.temperature,
                               kd_weight=distill.kd_weight)

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        import numpy as np

        from pipeline.tasks.segmentation.metrics import class_changes

        scored = super().finish(ctx, start, cfg, stage, workdir)
        if not distributed.world().main:
            return scored
        test = test_split(ctx)
        teacher_masks = np.load(ctx.manifest.output("teacher", "masks"), allow_pickle=False)
        changes = class_changes(test.masks, teacher_masks, np.load(scored.outputs["masks"], allow_pickle=False),
                                recorded_classes(ctx))
        return Scored({**scored.metrics, "with_teacher": start.saved["distilled"],
                       "class_changes_vs_teacher": changes}, scored.outputs)
