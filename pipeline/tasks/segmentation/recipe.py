"""Segmentation recipes (``task: segmentation``): validated like every task's, in a module of their own, which
:func:`pipeline.core.recipe.parse_recipe` imports by name only for a recipe that says ``task: segmentation``."""

from __future__ import annotations

import difflib
from typing import Any, Literal

from pydantic import Field, model_validator

from device.errors import ConfigError, UnknownKeyError
from pipeline.core.recipe import LadderConfig, RecipeBase, Strict, TrainConfig, registry_check
from pipeline.core.recipe_jobs import ScoredDeployConfig

SEGMENTATION_SOURCES = ("shapes-seg",)
"""Synthetic sets made in the data stage, with exact masks (:mod:`pipeline.tasks.segmentation.data`)."""
LAYOUTS = ("voc", "cityscapes")
"""A user's folders of PNG masks, by layout (:mod:`pipeline.tasks.segmentation.folders`): ``voc:/path``."""


def check_segmentation_source(source: str) -> None:
    """Validates ``data.source`` without loading anything.

    Raises:
        UnknownKeyError: Not a source this version reads; a folder layout not read yet is named as such.
    """
    if source in SEGMENTATION_SOURCES:
        return
    layout, colon, where = source.partition(":")
    if layout in LAYOUTS and colon:
        if not where.strip():
            raise ConfigError(f"{layout}: needs the folder", fix=f"e.g. {layout}:/data/{layout}")
        return
    near = difflib.get_close_matches(source, SEGMENTATION_SOURCES + tuple(f"{name}:/path" for name in LAYOUTS), n=1,
                                     cutoff=0.5)
    hint = f"did you mean {near[0]!r}? " if near else ""
    raise UnknownKeyError(f"unknown segmentation data source {source!r}",
                          fix=f"{hint}known: {', '.join(SEGMENTATION_SOURCES)}, voc:/path, cityscapes:/path")


def _check_segmenter(name: str) -> None:
    from pipeline.tasks.segmentation.models import SEGMENTERS

    SEGMENTERS.get(name)


class SegmentationDataConfig(Strict):
    """Composited canvases with exact masks (shapes, one class each, on textured backgrounds), or a user's folder."""

    source: str = Field(description="shapes-seg (synthetic: circles, squares and triangles, their masks exact), "
                                    "voc:/path/VOC2012 or cityscapes:/path (PNG masks, checked whole first)")
    train_images: int = Field(1024, ge=8, description="synthetic canvases; of a folder, at most this many (by seed)")
    test_images: int = Field(128, ge=8, description="synthetic canvases; of a folder's val split, at most this many")
    size: int = Field(64, ge=32, le=1024, description="the square side every image is made or resized to")
    objects: tuple[int, int] = Field((1, 3), description="fewest and most shapes per canvas")
    texture: float = Field(0.3, ge=0, le=1, description="background texture amplitude")
    seed: int = 0

    _known_source = registry_check("source", check_segmentation_source)

    @model_validator(mode="after")
    def _objects(self) -> "SegmentationDataConfig":
        low, high = self.objects
        if not 0 <= low <= high <= 8:
            raise ValueError(f"data.objects {list(self.objects)}: fewest ≤ most, between 0 and 8")
        return self


class SegmentationTeacherConfig(Strict):
    """The teacher: an architecture of :data:`pipeline.tasks.segmentation.models.SEGMENTERS`, trained here."""

    arch: str
    weights: str | None = Field(None, description="path to a state_dict of this architecture and class count "
                                                  "(torchvision's segmenters: the model's own keys), or null to "
                                                  "train from scratch")
    train: TrainConfig

    _known_arch = registry_check("arch", _check_segmenter)


class SegmentationPruneConfig(Strict):
    """Channels pruned to a MACs target; the classifier (one channel per class) kept whole."""

    macs_target: float = Field(gt=0, le=1, description="pruned MACs as a fraction of the teacher's")
    tolerance: float = Field(0.1, gt=0, lt=1, description="relative tolerance on macs_target")
    round_to: int = Field(8, ge=1, description="channel counts rounded to this multiple")
    importance: Literal["l1", "l2"] = Field("l2", description="channel importance: weight magnitude")
    iterations: int = Field(10, ge=1, le=30, description="most trial prunes while bisecting the channel ratio")


class SegmentationDistillConfig(Strict):
    """The pruned segmenter fine-tuned with the teacher: pixel-wise KD on softened class scores."""

    temperature: float = Field(2.0, gt=0)
    kd_weight: float = Field(1.0, ge=0, description="weight of pixel-wise KD; 0 fine-tunes without the teacher")
    train: TrainConfig


class SegmentationExportConfig(Strict):
    opset: int = Field(17, ge=13, le=21)
    parity_images: int = Field(16, ge=1, description="test images whose logits torch and ONNX Runtime compare")
    parity_atol: float = Field(1e-3, gt=0, description="largest |Δ| allowed between torch's and the ONNX's logits")


class SegmentationQuantizeConfig(LadderConfig):
    """INT8 Q/DQ through the ladder every task climbs, gated on mIoU against the FP32 student."""

    calib_images: int = Field(128, ge=1, description="training canvases the activations are calibrated on")
    resamples: int = Field(200, ge=10, description="bootstrap resamples over test images for the intervals")

    @model_validator(mode="after")
    def _no_qat(self) -> "SegmentationQuantizeConfig":
        if self.qat is not None:
            raise ValueError("quantize.qat: segmentation has no QAT step yet; set quantize.qat: null (the ladder "
                             "still tries each calibration method and the mixed-precision step)")
        return self


class SegmentationRecipe(RecipeBase):
    """A segmentation recipe (``task: segmentation``): the same ladder for segmenters, scored by mIoU."""

    task: Literal["segmentation"]
    data: SegmentationDataConfig
    teacher: SegmentationTeacherConfig
    prune: SegmentationPruneConfig
    distill: SegmentationDistillConfig
    export: SegmentationExportConfig = SegmentationExportConfig()
    quantize: SegmentationQuantizeConfig = SegmentationQuantizeConfig()
    deploy: ScoredDeployConfig = ScoredDeployConfig()
    start: None = Field(None, description="an ONNX start is not offered for segmentation yet")

    @model_validator(mode="before")
    @classmethod
    def _no_start(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("start") is not None:
            raise ValueError("start: a segmenter brought as ONNX is not taken by this version of EdgeFold; remove "
                             "start and give teacher, prune and distill (the ladder starts from a PyTorch teacher)")
        return data

    def input_size(self) -> int:
        """The square side every rung runs at."""
        return self.data.size
