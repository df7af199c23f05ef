"""Semantic segmentation: a segmenter folded rung by rung (teacher, pruned and distilled student, INT8) and scored by
mIoU on the host and on every device, the argmax over classes done on the device and timed apart from the network.

Made of hooks alone for the stages written once (:mod:`pipeline.stages`): ``splits.py`` (data), ``training.py``
(teacher), ``pruned.py`` (prune), ``distilling.py`` (distill), ``exported.py`` (export), ``int8.py`` (quantize),
``evaluated.py`` (evaluate) and ``deployed.py`` (deploy); beside them its recipe root, data, models, metrics and
report. It defines no stage and imports no other task.
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
from pipeline.tasks.segmentation.deployed import SegmentationDeploy
from pipeline.tasks.segmentation.distilling import SegmentationDistill
from pipeline.tasks.segmentation.evaluated import SegmentationEvaluate
from pipeline.tasks.segmentation.exported import SegmentationExport
from pipeline.tasks.segmentation.int8 import SegmentationQuantize
from pipeline.tasks.segmentation.pruned import SegmentationPrune
from pipeline.tasks.segmentation.report import build_from_run, headline_line, headline_text
from pipeline.tasks.segmentation.ship import SegmentationShip
from pipeline.tasks.segmentation.splits import SegmentationData
from pipeline.tasks.segmentation.training import SegmentationModels


def _summary(ctx) -> None:
    """The report's tables and where the report and manifest are."""
    outputs = (ctx.manifest.stage("report") or {}).get("outputs", {})
    if "md" in outputs:
        print((ctx.run_dir / outputs["md"]).read_text())
        print(f"report: {ctx.run_dir / outputs['html']}")
    print(f"manifest: {ctx.manifest.path}")


TASK = Task(name="segmentation",
            stages=stage_registry("segmentation", [
                DataStage(SegmentationData()), TeacherStage(SegmentationModels()), PruneStage(SegmentationPrune()),
                DistillStage(SegmentationDistill()), ExportStage(SegmentationExport()),
                QuantizeStage(SegmentationQuantize()), EvaluateStage(SegmentationEvaluate()),
                DeployStage(SegmentationDeploy()), ReportStage(build_from_run, headline_line)]),
            build_report=build_from_run, summary=_summary, headline=headline_text, ship=SegmentationShip(),
            score="miou", score_name="mIoU")
