"""Classification recipes (``task: classification``, the default): the root model over the shared sections.

:func:`pipeline.core.recipe.parse_recipe` imports it by name (:data:`pipeline.core.recipe.TASKS`), as it does every
task's root, so that the recipe loader depends on no task.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from pipeline.core.recipe import (DataConfig, DeployConfig, DistillConfig, EvaluateConfig, ExportConfig,
                                  PreprocessConfig, PruneConfig, QuantizeConfig, RecipeBase, TeacherConfig)


class Recipe(RecipeBase):
    """A whole model recipe (``models/<name>.yaml``)."""

    task: Literal["classification"] = Field("classification", description="classification (default) or detection "
                                                                          "(see DetectionRecipe)")
    data: DataConfig
    preprocess: PreprocessConfig
    teacher: TeacherConfig
    prune: PruneConfig
    distill: DistillConfig
    export: ExportConfig = ExportConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    deploy: DeployConfig = DeployConfig()
