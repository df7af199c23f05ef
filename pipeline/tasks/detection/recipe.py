"""Detection recipes (``task: detection``): validated like classification recipes, in a module of their own.

:func:`pipeline.core.recipe.parse_recipe` loads this module by name only for a recipe that says ``task: detection``:
a stage's code hash follows its imports (:mod:`pipeline.core.codehash`), and every classification stage imports
:mod:`pipeline.core.recipe`, so importing the detectors from there would re-run every classification stage whenever
detection code changed.
"""

from __future__ import annotations

import difflib
from typing import Any, ClassVar, Literal, Optional

from pydantic import Field, ValidationError, field_validator, model_validator

from device.errors import ConfigError, DataError, UnknownKeyError
from pipeline.core.recipe import LadderConfig, RecipeBase, Strict, TrainConfig, registry_check
from pipeline.core.recipe_jobs import ScoredDeployConfig

BOX_HEADS = ("fp16", "float", "int8")
"""How the quantize stage may leave the box-regression branch (``quantize.box_head``): FP16 or FP32 outside Q/DQ, or
quantized."""

OUTPUT_LAYOUTS = ("yolov8", "yolov5", "end2end")
"""The raw outputs of a detector brought as ONNX (:mod:`pipeline.tasks.detection.onnx_start`)."""
LETTERBOXES = ("top_left", "ultralytics")
"""How a COCO image is fitted to the square: EdgeFold's (top-left on black) or Ultralytics' (centred on grey 114)."""
TORCH_SECTIONS = ("teacher", "prune", "distill")
"""The stages a detector brought as ONNX has no PyTorch model for: the ladder enters at export."""

DETECTION_SOURCES = {"fmnist-det": "fashion-mnist", "digits-det": "digits"}
"""Composited canvas sets by recipe key → the classification source whose images are placed on the canvases."""


def check_detection_source(source: str) -> None:
    """Validates a detection ``data.source`` without loading anything.

    Raises:
        UnknownKeyError: Neither a composited set nor ``coco:`` with a path; the near keys are named.
    """

    name, colon, argument = source.partition(":")
    if name == "coco" and colon:
        if not argument.partition("@")[0].strip():
            raise ConfigError("coco: needs the annotations file", fix="e.g. coco:/data/annotations/instances_val2017.json")
        return
    if source in DETECTION_SOURCES:
        return
    known = [*DETECTION_SOURCES, "coco:/path/annotations.json"]
    near = difflib.get_close_matches(source, known, n=2, cutoff=0.5)
    hint = f"did you mean {' or '.join(repr(n) for n in near)}? " if near else ""
    raise UnknownKeyError(f"unknown detection data source {source!r}", fix=f"{hint}known: {', '.join(known)}")


def _check_detector(name: str) -> None:
    from pipeline.tasks.detection.models import DETECTORS

    DETECTORS.get(name)


class CanvasConfig(Strict):
    """How the composited canvases are drawn (:class:`pipeline.tasks.detection.data.CanvasSpec`; the seed is data.seed)."""

    size: int = Field(96, ge=16, description="canvas side, pixels (coco: each image letterboxed to this square)")
    objects: tuple[int, int] = Field((1, 4), description="fewest and most objects per canvas")
    scale: tuple[float, float] = Field((0.2, 0.5), description="object side as a fraction of the canvas side")
    max_iou: float = Field(0.2, ge=0, le=1, description="most overlap (IoU) between two objects' boxes")
    texture: float = Field(0.3, ge=0, le=1, description="background texture amplitude")

    @model_validator(mode="after")
    def _drawable(self) -> "CanvasConfig":
        try:
            self.to_spec(0)  # the generator's own checks, so a bad canvas fails when the recipe is loaded
        except DataError as err:
            raise ValueError(f"{err.message}; {err.fix}" if err.fix else err.message) from None
        return self

    def to_spec(self, seed: int):
        from pipeline.tasks.detection.data import CanvasSpec

        return CanvasSpec(size=self.size, objects=tuple(self.objects), scale=tuple(self.scale), max_iou=self.max_iou,
                          texture=self.texture, seed=seed)


class DetectionDataConfig(Strict):
    """Detection images: a composited canvas set built in the data stage, or the user's COCO JSON."""

    source: str = Field(description="fmnist-det | digits-det | coco:/path/annotations.json[@/path/images]")
    train_images: int = Field(2000, ge=1, description="composited training canvases (coco: at most this many "
                                                      "training images)")
    test_images: int = Field(500, ge=1, description="composited test canvases (coco: at most this many test images, "
                                                    "and a fifth of the set; drawn first by data.seed)")
    canvas: CanvasConfig = CanvasConfig()
    letterbox: Literal[LETTERBOXES] = Field(
        "top_left", description="coco: how each image is fitted to the square: top_left (aspect kept, at the top-left "
                                "corner on black) or ultralytics (aspect kept, centred on grey 114, as Ultralytics' "
                                "LetterBox; the default for a YOLO start)")
    seed: int = 0

    _known_source = registry_check("source", check_detection_source)


class DetectionTeacherConfig(Strict):
    """The teacher detector: an architecture from :data:`pipeline.tasks.detection.models.DETECTORS`."""

    arch: str
    input_size: Optional[int] = Field(None, ge=16, description="square input side; null = the architecture's own")
    weights: Optional[str] = Field(None, description="path to a torchvision detector state_dict (FrozenBatchNorm "
                                                     "converted to BatchNorm), or null to train")
    train: TrainConfig

    _known_arch = registry_check("arch", _check_detector)

    @model_validator(mode="after")
    def _size_fits(self) -> "DetectionTeacherConfig":
        from pipeline.tasks.detection.models import DETECTORS

        spec = DETECTORS.get(self.arch)
        if spec.fixed_size and self.input_size not in (None, spec.input_size):
            raise ValueError(f"{self.arch} is laid out for {spec.input_size}×{spec.input_size} inputs; set "
                             f"input_size: {spec.input_size} or null")
        return self

    def size(self) -> int:
        """The input side the detector runs (and its MACs are counted) at."""
        from pipeline.tasks.detection.models import DETECTORS

        return self.input_size or DETECTORS.get(self.arch).input_size


class DetectionPruneConfig(Strict):
    """Backbone and neck pruned to a MACs target; the head's anchor-sized layers kept whole."""

    macs_target: float = Field(gt=0, le=1, description="pruned MACs as a fraction of the teacher's, at its input size")
    tolerance: float = Field(0.05, gt=0, lt=1, description="relative tolerance on macs_target")
    round_to: int = Field(8, ge=1, description="channel counts rounded to this multiple (Tensor Cores want 8/16/32)")
    importance: Literal["l1", "l2"] = Field("l2", description="channel importance: weight magnitude")
    iterations: int = Field(10, ge=1, le=30, description="most trial prunes while bisecting the channel ratio")


class DetectionDistillConfig(Strict):
    """The pruned detector fine-tuned with the teacher (:mod:`pipeline.tasks.detection.distill`, Chen et al. 2017)."""

    temperature: float = Field(2.0, gt=0, description="softens both detectors' class scores")
    kd_weight: float = Field(1.0, ge=0, description="weight of KD on the matched anchors' class scores; 0 with "
                                                    "feature_weight 0 fine-tunes without the teacher")
    feature_weight: float = Field(1.0, ge=0, description="weight of feature imitation on the levels the head reads")
    train: TrainConfig


class DetectionPostprocessConfig(Strict):
    """Decode + per-class NMS after the network (:mod:`device.scoring.detection_post`, the same on host and device);
    a key left null keeps the architecture's own value (torchvision's)."""

    score_threshold: Optional[float] = Field(None, ge=0, lt=1, description="scores kept above this")
    iou_threshold: Optional[float] = Field(None, gt=0, le=1, description="per-class NMS IoU")
    max_detections: Optional[int] = Field(None, ge=1, description="detections kept per image (COCO scores 100)")
    topk_candidates: Optional[int] = Field(None, ge=1, description="candidates per level (FPN) or class (SSD)")


class DetectionExportConfig(Strict):
    """ONNX up to the raw head outputs (:mod:`pipeline.tasks.detection.export`), teacher and student."""

    opset: int = Field(17, ge=13, le=21)
    parity_images: int = Field(32, ge=1, description="test images whose raw outputs torch and ONNX Runtime compare")
    parity_atol: float = Field(1e-3, gt=0, description="largest |Δ| allowed between torch's and the ONNX's raw output")


class DetectionQuantizeConfig(LadderConfig):
    """INT8 Q/DQ on backbone and neck through the ladder every task climbs (ONNX Runtime or ModelOpt, each
    calibration method, then QAT), gated on COCO mAP."""

    calib_images: int = Field(256, ge=1, description="training canvases the activations are calibrated on")
    box_head: Literal[BOX_HEADS] = Field(
        "fp16", description="the box-regression branch, which INT8 calibration hurts most: left out of Q/DQ in FP16 "
                            "(default; only its nodes, Casts at its edges), in FP32 (float), or quantized (int8)")
    compare_box_head: bool = Field(True, description="also quantize with the other box_head settings and record "
                                                     "their mAP (what each setting of the box head costs)")
    resamples: int = Field(200, ge=10, description="bootstrap resamples over test images for the FP32 and INT8 "
                                                    "intervals and the per-class changes")


class DetectionStartConfig(Strict):
    """A detector trained elsewhere, as ONNX, as the ladder's FP32 student (:mod:`pipeline.tasks.detection.onnx_start`)."""

    onnx: str = Field(description="path to the .onnx file (one RGB image input, one raw or end-to-end output)")
    outputs: Literal[OUTPUT_LAYOUTS] = Field(
        description="the output's layout: yolov8 (YOLOv8/YOLO11: N×(4+classes)×A, boxes cx cy w h in input pixels, "
                    "class scores after the sigmoid), yolov5 (YOLOv5/v7: N×A×(5+classes), with objectness) or "
                    "end2end (N×D×6: x1 y1 x2 y2 score class, no NMS after)")
    task: Literal["detection"] = Field("detection", description="the file is a detector (the recipe's task)")
    channel_order: Literal["rgb", "bgr"] = Field("rgb", description="the images the model was trained on: RGB "
                                                                    "(Ultralytics') or BGR (OpenCV's, YOLOX's)")
    input_range: Literal["0-1", "0-255"] = Field("0-1", description="the pixel values the graph takes: 0-1 "
                                                                     "(Ultralytics') or 0-255 (YOLOX's)")
    preprocess_check: Literal["stop", "warn", "off"] = Field(
        "stop", description="score the model on training images as declared and with the other channel order, "
                            "input range and (COCO) letterbox; when one scores higher beyond noise, stop with both "
                            "mAPs and the keys that select it, or warn and go on")


class DetectionRecipe(RecipeBase):
    """A detection recipe (``task: detection``): the same ladder for detectors, built stage by stage."""

    task: Literal["detection"]
    data: DetectionDataConfig
    start: Optional[DetectionStartConfig] = Field(None, description="a detector brought as ONNX, entering the ladder "
                                                                    "at export instead of teacher, prune and distill")
    teacher: Optional[DetectionTeacherConfig] = None  # the three required without start (_sections_of_the_start)
    prune: Optional[DetectionPruneConfig] = None
    distill: Optional[DetectionDistillConfig] = None
    export: DetectionExportConfig = DetectionExportConfig()
    quantize: DetectionQuantizeConfig = DetectionQuantizeConfig()
    postprocess: DetectionPostprocessConfig = DetectionPostprocessConfig()
    deploy: ScoredDeployConfig = ScoredDeployConfig()
    MISSING_HINTS: ClassVar[dict[str, str]] = {
        "data.source": "say where the images are: DATA=digits-det|fmnist-det|coco:/path/annotations.json (a "
                       "detector's ONNX: the classes it was trained on, in its output order)",
        **{name: "the detection ladder starts from a PyTorch teacher (teacher, prune, distill), or from a detector's "
              "ONNX file (start: {onnx: path, outputs: yolov8|yolov5|end2end})" for name in TORCH_SECTIONS}}

    @model_validator(mode="before")
    @classmethod
    def _sections_of_the_start(cls, data: Any) -> Any:
        """Teacher, prune and distill are required without ``start``; with it they are refused (they would not run),
        as is QAT (it needs the PyTorch model), and COCO images are letterboxed as Ultralytics does unless the
        recipe says otherwise."""
        if not isinstance(data, dict):
            return data
        if data.get("start") is None:
            missing = [name for name in TORCH_SECTIONS if data.get(name) is None]
            if missing:
                raise ValidationError.from_exception_data(cls.__name__, [
                    {"type": "missing", "loc": (name,), "input": data} for name in missing])
            return data
        written = [name for name in TORCH_SECTIONS if data.get(name) is not None]
        if written:
            raise ValueError(f"start.onnx enters the ladder at export: {', '.join(written)} would not run; remove "
                             f"{'them' if len(written) > 1 else 'it'} from the recipe")
        quantize = data.get("quantize")
        if isinstance(quantize, dict) and quantize.get("qat") is not None:
            raise ValueError("quantize.qat needs the PyTorch model, which a detector brought as ONNX does not have; "
                             "set quantize.qat: null (the INT8 ladder still tries each calibration method)")
        source = data.get("data")
        if isinstance(source, dict) and "letterbox" not in source:
            data = {**data, "data": {**source, "letterbox": "ultralytics"}}
        return data

    def input_size(self) -> int:
        """The square side the student runs at: the teacher's, or the started graph's own."""
        if self.start is not None:
            from pipeline.tasks.detection.onnx_start import input_size

            return input_size(self.start.onnx) or self.data.canvas.size
        return self.teacher.size()
