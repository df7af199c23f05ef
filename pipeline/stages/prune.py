"""prune stage, the same for every task: the teacher pruned to the recipe's target (its channels, structurally),
scored before fine-tuning and saved as state. The task supplies how its model is pruned and scored
(:class:`pipeline.train.hooks.PruneHooks`)."""

from __future__ import annotations

from pathlib import Path

from pipeline.core.stage import HookedStage, StageResult
from pipeline.train.hooks import PruneHooks, section_key


class PruneStage(HookedStage):
    """The teacher's checkpoint pruned by the task, its scores recorded (not gated) and saved.

    Args:
        hooks: The task's part (:class:`~pipeline.train.hooks.PruneHooks`).
    """

    name = "prune"
    hooks: PruneHooks

    def absent(self, ctx):
        return self.hooks.skipped(ctx)

    def needs(self, ctx):
        return ("data", "teacher")

    def code_roots(self, ctx) -> tuple[str, ...]:
        return self.hooks.roots(ctx)

    def config(self, ctx):
        return section_key(ctx, self.hooks, "prune")

    def run(self, ctx, workdir: Path) -> StageResult:
        start = self.hooks.checkpoint(ctx, "teacher")
        pruning = self.hooks.prune(ctx, start, workdir)
        # Not gated: a pruned model before distillation is expected to be bad; its verdict is recorded.
        scored = self.hooks.assess(ctx, start, workdir)
        path = self.hooks.save(workdir / "model.pt", start)
        return StageResult(outputs={"model": path, **scored.outputs},
                           metrics={**scored.metrics, **self.hooks.size(ctx, start), **pruning})

    def summary(self, metrics):
        return self.hooks.summary("prune", metrics)
