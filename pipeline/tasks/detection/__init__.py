"""Object detection: a detector folded rung by rung and scored by mAP (AP50, AP75) on the host and on every device,
its box decode and NMS timed apart from the network.

Its hooks for the stages written once (:mod:`pipeline.stages`) are ``splits.py`` (data), ``training.py``
(teacher), ``pruned.py`` (prune), ``distilling.py`` (distill), ``exported.py`` (export), ``int8.py`` (quantize),
``evaluated.py`` (evaluate) and ``deployed.py`` (deploy); its libraries (models, training, metrics, the report)
beside them. It defines no stage and imports no other task.
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
from pipeline.tasks.detection.deployed import DetectionDeploy
from pipeline.tasks.detection.distilling import DetectionDistill
from pipeline.tasks.detection.evaluated import DetectionEvaluate
from pipeline.tasks.detection.exported import DetectionExport
from pipeline.tasks.detection.int8 import DetectionQuantize
from pipeline.tasks.detection.pruned import DetectionPrune
from pipeline.tasks.detection.report import build_from_run, headline_line, headline_text
from pipeline.tasks.detection.ship import DetectionShip
from pipeline.tasks.detection.splits import DetectionData
from pipeline.tasks.detection.training import DetectionModels


def _summary(ctx) -> None:
    """The report's tables (mAP per rung on host and device, timings) and where the report and manifest are."""
    outputs = (ctx.manifest.stage("report") or {}).get("outputs", {})
    markdown = outputs.get("md") or outputs.get("markdown")  # "markdown": a run reported by an older version
    if markdown:
        print((ctx.run_dir / markdown).read_text())
        if "html" in outputs:
            print(f"report: {ctx.run_dir / outputs['html']}")
        print(f"markdown: {ctx.run_dir / markdown}")
    print(f"manifest: {ctx.manifest.path}")


TASK = Task(name="detection",
            stages=stage_registry("detection", [
                DataStage(DetectionData()), TeacherStage(DetectionModels()), PruneStage(DetectionPrune()),
                DistillStage(DetectionDistill()), ExportStage(DetectionExport()),
                QuantizeStage(DetectionQuantize()), EvaluateStage(DetectionEvaluate()), DeployStage(DetectionDeploy()),
                ReportStage(build_from_run, headline_line)]),
            build_report=build_from_run, summary=_summary, headline=headline_text, ship=DetectionShip(),
            score="map", score_name="mAP")
