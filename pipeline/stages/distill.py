"""distill stage, the same for every task: the student (the pruned teacher, or a smaller architecture) trained with
the teacher's outputs, scored on the test split and saved as state. The task supplies the student, the distillation
loss and the score (:class:`pipeline.train.hooks.DistillHooks`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.stage import HookedStage, StageResult, started_without_torch
from pipeline.train.hooks import DistillHooks, section_key, trained_result


class DistillStage(HookedStage):
    """The student distilled from the teacher for ``distill.train.epochs``, scored and saved.

    Args:
        hooks: The task's part (:class:`~pipeline.train.hooks.DistillHooks`).
    """

    name = "distill"
    hooks: DistillHooks
    distributed = True  # trains under torchrun on every rank (DDP); rank 0 writes the checkpoint

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def needs(self, ctx):
        return ("data", "teacher", "prune") if self.hooks.from_pruned(ctx) else ("data", "teacher")

    def preflight(self, ctx):
        self.hooks.check_student(ctx)

    def config(self, ctx):
        return section_key(ctx, self.hooks, "distill")

    def run(self, ctx, workdir: Path) -> StageResult:
        teacher = self.hooks.checkpoint(ctx, "teacher").model
        start = self.hooks.student(ctx)
        history = self.hooks.train(ctx, start, ctx.recipe.distill.train, "distill", teacher=teacher)
        return trained_result(ctx, self.hooks, "distill", start, history, workdir, teacher=teacher)

    def summary(self, metrics):
        return self.hooks.summary("distill", metrics)
