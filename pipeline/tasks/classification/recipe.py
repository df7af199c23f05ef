"""Classification recipes (``task: classification``, the default): the root model over the shared sections.

:func:`pipeline.core.recipe.parse_recipe` imports it by name (:data:`pipeline.core.recipe.TASKS`), as it does every
task's root, so that the recipe loader depends on no task.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import Field, PrivateAttr, model_validator

from device.architectures import ARCHITECTURES
from device.errors import EdgeFoldError, UnknownKeyError
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
    # Why a section has no default, said when it is left out.
    MISSING_HINTS: ClassVar[dict[str, str]] = {
        "preprocess": "only a teacher.arch that states how it was trained (timm/<name> from its pretrained_cfg, or "
                      "a package's key with a preprocess) supplies it; write input_size, mean and std"}
    # Set when preprocess was left to the teacher's architecture (timm's pretrained_cfg): the run says so.
    _preprocess_from: str | None = PrivateAttr(None)

    @model_validator(mode="wrap")
    @classmethod
    def _preprocess_of_the_model(cls, data: Any, handler) -> "Recipe":
        """A recipe may leave ``preprocess``, whole or in part, to a teacher whose architecture states how it was
        trained (a ``timm/`` key: its ``pretrained_cfg``'s input size, mean, std, interpolation and crop); the keys
        it writes win. Any other teacher's recipe must write it."""
        source = None
        written = data.get("preprocess") if isinstance(data, dict) else None
        needs_model = written is None or isinstance(written, dict) and not {"input_size", "mean", "std"} <= set(written)
        if needs_model and isinstance(data, dict) and isinstance(data.get("teacher"), dict):
            arch = data["teacher"].get("arch")
            try:
                entry = ARCHITECTURES.get(arch) if isinstance(arch, str) else None
                defaults = entry.preprocess() if entry is not None and entry.preprocess else None
            except UnknownKeyError:  # reported at teacher.arch, with the near names
                defaults = None
            except EdgeFoldError as err:
                raise ValueError(f"preprocess is left to {arch}, which cannot give it: {err.message}") from None
            if defaults is not None:  # otherwise pydantic reports the missing keys (MISSING_HINTS says why)
                written = written or {}
                if "input_size" in written and "resize" not in written:
                    defaults.pop("resize", None)  # the model's crop ratio was for its own size
                data = {**data, "preprocess": {**defaults, **written}}
                source = f"{arch}'s pretrained_cfg ({entry.source})" + (
                    f", with {', '.join(sorted(written))} from the recipe" if written else "")
        recipe = handler(data)
        recipe._preprocess_from = source
        return recipe
