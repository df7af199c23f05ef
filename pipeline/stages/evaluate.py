"""evaluate stage, the same for every task: every rung's figures, as the stage that made it measured them, in one
ladder record (:mod:`pipeline.core.ladder`) with each rung compared with the baseline. The task says where its
figures are (:class:`pipeline.core.ladder.EvaluateHooks`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.ladder import LADDER_SCHEMA, EvaluateHooks, baseline_of, check_rows, compare
from pipeline.core.stage import HookedStage, StageResult


class EvaluateStage(HookedStage):
    """The ladder's rows in ``ladder.json`` (and the manifest), each with its difference from the baseline.

    Args:
        hooks: The task's part (:class:`~pipeline.core.ladder.EvaluateHooks`).
    """

    name = "evaluate"
    hooks: EvaluateHooks

    def needs(self, ctx):
        return tuple(dict.fromkeys(("data", *self.hooks.needs(ctx))))

    def config(self, ctx):
        return self.hooks.config(ctx)

    def run(self, ctx, workdir: Path) -> StageResult:
        score = self.hooks.score
        rows = self.hooks.rows(ctx)
        check_rows(rows, score)
        baseline = baseline_of(rows)
        compare(rows, score, baseline)
        outputs, metrics = self.hooks.finish(ctx, workdir, rows)
        classes = json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]
        path = workdir / "ladder.json"
        path.write_text(json.dumps({"schema": LADDER_SCHEMA, "score": score, "baseline": baseline, "classes": classes,
                                    "rungs": rows}, indent=1) + "\n")
        return StageResult(outputs={"ladder": path, **outputs},
                           metrics={"rungs": rows, "baseline": baseline, "score": score, **metrics})

    def summary(self, metrics):
        return self.hooks.summary(metrics)
