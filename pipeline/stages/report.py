"""report stage, the same for every task: report.md, report.html, results.json and results.csv of the run.

The task's report builder (:attr:`pipeline.core.task.Task.build_report`, which ``edgefold report RUN`` calls too)
writes them from what the stages recorded; this stage runs it once the deploy stage has, and records the headline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Callable

from pipeline.core.manifest import sha256_json
from pipeline.core.stage import Stage, StageResult
from pipeline.report.results import RESULTS_SCHEMA


class ReportStage(Stage):
    """Writes the run's report with its task's builder; its metrics are the headline object the report opens with.

    Args:
        build: The task's builder: ``build(run_dir, out_dir)`` writes the files (``md``, ``html``, ``json``, ``csv``
            at least) and returns their paths.
        line: The headline object in one console line (the stage's summary).
    """

    name = "report"

    def __init__(self, build: Callable[[Path, Path], dict[str, Path]], line: Callable[[dict[str, Any]], str]):
        self.build, self.line = build, line
        # The task's report code runs here without this module importing it: it is part of the stage's code hash.
        self.code_modules = tuple(dict.fromkeys((build.__module__, line.__module__)))

    def needs(self, ctx):
        return ("evaluate",) + (("deploy",) if ctx.manifest.stage("deploy") else ())

    def config(self, ctx):
        # The builder reads what the stages before deploy recorded (their metrics, beside the files this stage's
        # inputs hash): a stage re-run to new metrics over the same files is a new report. Deploy's own metrics
        # count this run's reused windows; what it measured is its results file, an input.
        recorded = {name: entry.get("metrics") for name, entry in ctx.manifest.data["stages"].items()
                    if name not in ("deploy", self.name)}
        return {"schema": RESULTS_SCHEMA, "recorded_sha256": sha256_json(recorded)}

    def run(self, ctx, workdir: Path) -> StageResult:
        ctx.manifest.save()  # the builder reads the run from its files, as `edgefold report` does
        paths = self.build(ctx.run_dir, workdir)
        headline = json.loads(paths["json"].read_text())["headline"]
        return StageResult(outputs=dict(paths), metrics={"headline": headline})

    def summary(self, metrics):
        # The same headline object, in the same words, as report.md and report.html.
        return self.line(metrics["headline"])
