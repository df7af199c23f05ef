"""data stage, the same for every task: the recipe's source read, checked whole and split by seed; ``dataset.json``
records the source and its classes for every later stage. The task supplies how its source is read and split
(:class:`pipeline.core.data.hooks.DataHooks`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.data.hooks import DataHooks
from pipeline.core.stage import HookedStage, StageResult


class DataStage(HookedStage):
    """The task's splits, and ``dataset.json``: the source, the class names in label order and what the task records.

    Args:
        hooks: The task's part (:class:`~pipeline.core.data.hooks.DataHooks`).
    """

    name = "data"
    hooks: DataHooks

    def config(self, ctx):
        return {"data": ctx.recipe.section("data"), **self.hooks.keys(ctx)}

    def run(self, ctx, workdir: Path) -> StageResult:
        splits = self.hooks.split(ctx, workdir)
        dataset = workdir / "dataset.json"
        dataset.write_text(json.dumps({"source": splits.source, "classes": splits.classes, **splits.recorded},
                                      indent=2) + "\n")
        return StageResult(outputs={**splits.outputs, "dataset": dataset},
                           metrics={"source": splits.source, "num_classes": len(splits.classes), **splits.metrics})

    def summary(self, metrics):
        return self.hooks.summary(metrics)
