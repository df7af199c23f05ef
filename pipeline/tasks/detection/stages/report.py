"""detection report stage: the ladder as report.md, a self-contained report.html (plots inline), results.json and
results.csv (:mod:`pipeline.tasks.detection.report`)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.core.stage import Stage, StageResult


class DetectionReportStage(Stage):
    """Writes ``report.md``, ``report.html``, ``results.json`` and ``results.csv``: the headline, mAP per rung on host
    and device, box-head costs, timings, per-class changes, plots."""

    name = "report"
    always_run = True  # it reads the deploy stage's results, which are measured every run

    def needs(self, ctx):
        return ("evaluate", "quantize", "deploy")

    def config(self, ctx):
        return {}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.tasks.detection.report import write_report

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        deploy = json.loads(ctx.manifest.output("deploy", "results").read_text())
        paths = write_report(ctx.recipe.name, ctx.run_dir.name, ladder, deploy,
                             ctx.manifest.stage("quantize")["metrics"], workdir)
        return StageResult(outputs=paths, metrics={"rungs": len(ladder["rungs"]),
                                                   "headline": json.loads(paths["json"].read_text())["headline"]})

    def summary(self, metrics):
        return f"report.md, report.html, results.json and results.csv, {metrics['rungs']} rungs"
