"""The pipeline stages, each registered in :data:`pipeline.stages.base.STAGES` on import."""

from pipeline.stages import (  # noqa: F401  (registration)
    data, deploy, distill, evaluate, export, prune, quantize, report, teacher)
from pipeline.stages.base import STAGE_ORDER, STAGES, Stage, StageResult

__all__ = ["STAGES", "STAGE_ORDER", "Stage", "StageResult"]
