"""The pipeline stages, each registered in :data:`pipeline.stages.base.STAGES` (classification) or
:data:`pipeline.stages.detection_base.DETECTION_STAGES` (``task: detection``) on import."""

from pipeline.stages import (  # noqa: F401  (registration)
    data, deploy, detection_data, detection_deploy, detection_distill, detection_evaluate, detection_export,
    detection_prune, detection_quantize, detection_report, detection_teacher, distill, evaluate, export, prune,
    quantize, report, teacher)
from pipeline.stages.base import STAGE_ORDER, STAGES, Stage, StageResult
from pipeline.stages.detection_base import DETECTION_STAGES

__all__ = ["DETECTION_STAGES", "STAGES", "STAGE_ORDER", "Stage", "StageResult"]
