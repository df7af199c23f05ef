"""detection report stage: the ladder as Markdown and JSON (:mod:`pipeline.detection_report`); no HTML or plots yet."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES


class DetectionReportStage(Stage):
    """Writes ``report.md`` and ``report.json``: mAP per rung on host and device, box-head cost, timings."""

    name = "report"
    always_run = True  # it reads the deploy stage's results, which are measured every run

    def needs(self, ctx):
        return ("evaluate", "quantize", "deploy")

    def config(self, ctx):
        return {}

    def run(self, ctx, workdir: Path) -> StageResult:
        from pipeline.detection_report import render

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        deploy = json.loads(ctx.manifest.output("deploy", "results").read_text())
        quantize = ctx.manifest.stage("quantize")["metrics"]
        (workdir / "report.md").write_text(render(ctx.recipe.name, ladder, deploy, quantize))
        (workdir / "report.json").write_text(json.dumps({"ladder": ladder, "deploy": deploy, "quantize": {
            key: quantize[key] for key in ("box_head", "drop_points", "method", "other_box_heads",
                                           "class_changes_vs_fp32") if key in quantize}}, indent=1) + "\n")
        return StageResult(outputs={"markdown": workdir / "report.md", "json": workdir / "report.json"},
                           metrics={"rungs": len(ladder["rungs"])})

    def summary(self, metrics):
        return f"report.md and report.json, {metrics['rungs']} rungs"


DETECTION_STAGES.add(DetectionReportStage.name, DetectionReportStage())
