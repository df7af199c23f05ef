"""detection report stage: the ladder as report.md, a self-contained report.html (plots inline) and report.json
(:mod:`pipeline.detection_report`, rendered by the classification report's section renderers)."""

from __future__ import annotations

import json
from pathlib import Path

from pipeline.stages.base import Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES

QUANTIZE_KEYS = ("box_head", "drop_points", "method", "attempts", "other_box_heads", "class_changes_vs_fp32")
"""The quantize stage's metrics the report shows (report.json keeps them beside the ladder and the deploy results)."""


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
        from pipeline.detection_plots import plots
        from pipeline.detection_report import render, render_html

        ladder = json.loads(ctx.manifest.output("evaluate", "ladder").read_text())
        deploy = json.loads(ctx.manifest.output("deploy", "results").read_text())
        metrics = ctx.manifest.stage("quantize")["metrics"]
        quantize = {key: metrics[key] for key in QUANTIZE_KEYS if key in metrics}
        paths = {"markdown": workdir / "report.md", "html": workdir / "report.html", "json": workdir / "report.json"}
        paths["markdown"].write_text(render(ctx.recipe.name, ladder, deploy, quantize))
        paths["html"].write_text(render_html(ctx.recipe.name, ladder, deploy, quantize,
                                             plots(ladder, deploy, quantize)))
        paths["json"].write_text(json.dumps({"ladder": ladder, "deploy": deploy, "quantize": quantize}, indent=1)
                                 + "\n")
        return StageResult(outputs=paths, metrics={"rungs": len(ladder["rungs"])})

    def summary(self, metrics):
        return f"report.md, report.html and report.json, {metrics['rungs']} rungs"


DETECTION_STAGES.add(DetectionReportStage.name, DetectionReportStage())
