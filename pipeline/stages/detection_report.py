"""detection report stage: the ladder as report.md, a self-contained report.html (plots inline) and report.json
(:mod:`pipeline.detection_report`, rendered by the classification report's section renderers)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES


class DetectionReportStage(Stage):
    """Writes ``report.md``, ``report.html`` and ``report.json``: mAP per rung on host and device, box-head costs,
    timings, per-class changes, plots."""

    name = "report"
    always_run = True  # it reads the deploy stage's results, which are measured every run

    def needs(self, ctx):
        return ("evaluate", "quantize", "deploy")

    def config(self, ctx):
        return {}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.detection_report import write_report

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        deploy = json.loads(ctx.manifest.output("deploy", "results").read_text())
        paths = write_report(ctx.recipe.name, ladder, deploy, ctx.manifest.stage("quantize")["metrics"], workdir)
        return StageResult(outputs=paths, metrics={"rungs": len(ladder["rungs"])})

    def summary(self, metrics):
        return f"report.md, report.html and report.json, {metrics['rungs']} rungs"


DETECTION_STAGES.add(DetectionReportStage.name, DetectionReportStage())
