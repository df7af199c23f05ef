"""report stage: the side-by-side ladder as report.md, report.html, results.json and results.csv.

The rendering lives in :mod:`pipeline.tasks.classification.report` so ``edgefold report RUN`` rebuilds the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.tasks.classification.headline import one_line
from pipeline.tasks.classification.report import build_report, headline_text
from pipeline.core.stage import Stage, StageResult
from pipeline.results import RESULTS_SCHEMA


class ReportStage(Stage):
    name = "report"

    def needs(self, ctx):
        return ("evaluate",) + (("deploy",) if ctx.manifest.stage("deploy") else ())

    def config(self, ctx):
        return {"schema": RESULTS_SCHEMA}

    def run(self, ctx, workdir: Path) -> StageResult:
        ctx.manifest.save()
        paths = build_report(ctx.run_dir, workdir)
        headline = json.loads(paths["json"].read_text())["headline"]
        return StageResult(outputs=dict(paths), metrics={"headline": headline})

    def summary(self, metrics):
        # The same headline object, in the same words, as report.md and report.html.
        return one_line(metrics["headline"])


__all__ = ["ReportStage", "headline_text"]
