"""The pipeline stages, each registered in :data:`pipeline.stages.base.STAGES` on import."""

from pipeline.stages import data, distill, evaluate, export, prune, quantize, teacher  # noqa: F401  (registration)
from pipeline.stages.base import STAGE_ORDER, STAGES, Stage, StageResult

__all__ = ["STAGES", "STAGE_ORDER", "Stage", "StageResult"]
