"""Image classification: a classifier folded rung by rung (teacher, pruned, distilled student, FP16, INT8) and
scored by top-1 on the host and on every device.

Its hooks for the stages written once (:mod:`pipeline.stages`) are ``splits.py`` (data), ``training.py``
(teacher), ``pruned.py`` (prune), ``distilling.py`` (distill), ``exported.py`` (export), ``int8.py`` (quantize),
``evaluated.py`` (evaluate) and ``deployed.py`` (deploy); its libraries (training, the report) beside them. It
defines no stage and imports no other task.
"""

from __future__ import annotations

from pipeline.core.task import Task, stage_registry
from pipeline.stages.data import DataStage
from pipeline.stages.deploy import DeployStage
from pipeline.stages.distill import DistillStage
from pipeline.stages.evaluate import EvaluateStage
from pipeline.stages.export import ExportStage
from pipeline.stages.prune import PruneStage
from pipeline.stages.quantize import QuantizeStage
from pipeline.stages.report import ReportStage
from pipeline.stages.teacher import TeacherStage
from pipeline.tasks.classification.deployed import ClassificationDeploy
from pipeline.tasks.classification.distilling import ClassificationDistill
from pipeline.tasks.classification.evaluated import ClassificationEvaluate, ladder_table
from pipeline.tasks.classification.exported import ClassificationExport
from pipeline.tasks.classification.headline import one_line
from pipeline.tasks.classification.int8 import ClassificationQuantize
from pipeline.tasks.classification.pruned import ClassificationPrune
from pipeline.tasks.classification.report import build_report, headline_text
from pipeline.tasks.classification.ship import ClassificationShip
from pipeline.tasks.classification.splits import ClassificationData
from pipeline.tasks.classification.training import ClassificationModels


def _summary(ctx) -> None:
    """The ladder, the headline and where the report and manifest are."""
    evaluated = ctx.manifest.stage("evaluate")
    if evaluated:
        print(ladder_table(evaluated["metrics"]["rungs"]))
    reported = ctx.manifest.stage("report")
    if reported:
        print()
        print(headline_text(reported["metrics"]["headline"]))
        print(f"report: {ctx.run_dir / reported['outputs']['html']}")
    print(f"manifest: {ctx.manifest.path}")


TASK = Task(name="classification",
            stages=stage_registry("classification", [
                DataStage(ClassificationData()), TeacherStage(ClassificationModels()),
                PruneStage(ClassificationPrune()), DistillStage(ClassificationDistill()),
                ExportStage(ClassificationExport()), QuantizeStage(ClassificationQuantize()),
                EvaluateStage(ClassificationEvaluate()),
                DeployStage(ClassificationDeploy()), ReportStage(build_report, one_line)]),
            build_report=build_report, summary=_summary, headline=headline_text, ship=ClassificationShip(),
            deploys_again=("sweep", "sustain"))
