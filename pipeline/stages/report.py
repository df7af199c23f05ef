"""report stage: the side-by-side ladder as report.md, report.html, results.json and results.csv.

The rendering lives in :mod:`pipeline.report` so ``edgefold report RUN`` rebuilds the same files.
"""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.report import build_report, direction, headline_text
from pipeline.stages.base import STAGES, Stage, StageResult


class ReportStage(Stage):
    name = "report"

    def needs(self, ctx):
        return ("evaluate",) + (("deploy",) if ctx.manifest.stage("deploy") else ())

    def config(self, ctx):
        return {"schema": "edgefold.report/1"}

    def run(self, ctx, workdir: Path) -> StageResult:
        ctx.manifest.save()
        paths = build_report(ctx.run_dir, workdir)
        headline = json.loads(paths["json"].read_text())["headline"]
        return StageResult(outputs=dict(paths), metrics={"headline": headline})

    def summary(self, metrics):
        headline = metrics["headline"]
        if headline["status"] != "measured":
            return f"headline not measured ({headline['reason']})"
        lost = headline["accuracy_lost_points"] or 0.0
        accuracy = "no accuracy change" if not lost else (f"{lost:.2f} points lost" if lost > 0
                                                          else f"{-lost:.2f} points gained")
        return (f"student INT8 on {headline['edge_device']}: {accuracy}, "
                f"{direction(headline['latency_ratio'], 'faster', 'slower')} than the teacher on "
                f"{headline['dc_device']}")


STAGES.add("report", ReportStage())


__all__ = ["ReportStage", "headline_text"]
