"""teacher stage, the same for every task: the data-center model, from the user's weights or trained on the data,
scored on the test split and saved as state. The task supplies its models, loss and score
(:class:`pipeline.train.hooks.ModelHooks`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.stage import HookedStage, StageResult, started_without_torch
from pipeline.train.hooks import ModelHooks, section_key, trained_result, weights_digest


class TeacherStage(HookedStage):
    """The teacher: built, the recipe's weights loaded, trained for ``teacher.train.epochs``, scored and saved.

    Args:
        hooks: The task's part (:class:`~pipeline.train.hooks.ModelHooks`).
    """

    name = "teacher"
    hooks: ModelHooks
    distributed = True  # trains under torchrun on every rank (DDP); rank 0 writes the checkpoint

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def preflight(self, ctx):
        self.hooks.check_teacher(ctx)

    def needs(self, ctx):
        return ("data",)

    def config(self, ctx):
        return section_key(ctx, self.hooks, "teacher") | {"weights_sha256": weights_digest(ctx.recipe.teacher.weights)}

    def run(self, ctx, workdir: Path) -> StageResult:
        import torch

        cfg = ctx.recipe.teacher
        torch.manual_seed(cfg.train.seed)
        start = self.hooks.teacher(ctx)
        if start.replaced:
            ctx.log(f"teacher: head re-initialised for {start.saved.get('num_classes')} classes "
                    f"({', '.join(start.replaced)})")
        # The final scores come from one pass in finish (each image's prediction kept), not from training's last epoch.
        history = self.hooks.train(ctx, start, cfg.train, "teacher") if cfg.train.epochs else []
        return trained_result(ctx, self.hooks, "teacher", start, history, workdir,
                              weights=cfg.weights, replaced_head=start.replaced)

    def summary(self, metrics):
        return self.hooks.summary("teacher", metrics)

