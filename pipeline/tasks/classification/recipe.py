"""Classification recipes (``task: classification``, the default): its sections (data, preprocessing, teacher,
distillation, export, quantization, evaluation) and the root model over them and the shared ones.

:func:`pipeline.core.recipe.parse_recipe` imports it by name (:data:`pipeline.core.recipe.TASKS`), as it does every
task's root, so that the recipe loader depends on no task.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import Field, PrivateAttr, ValidationError, field_validator, model_validator

from device.models.architectures import ARCHITECTURES
from device.errors import ConfigError, EdgeFoldError, UnknownKeyError
from device.preprocess import Preprocess
from pipeline.core.data.sources import check_source_name
from pipeline.core.recipe import (DeployConfig, LadderConfig, PruneConfig, RecipeBase, Strict, TrainConfig,
                                  as_value_error, registry_check)
from pipeline.core.rungs import RUNGS, FloatRungName, Fp16RungName
from pipeline.core.stage import started_without_torch

class DataConfig(Strict):
    """Where images come from and how they are split."""

    source: str = Field(description="fashion-mnist | digits | imagefolder:/path")
    train_size: Optional[int] = Field(None, ge=1, description="seeded subset of the training split; null = all")
    test_size: Optional[int] = Field(None, ge=1, description="seeded subset of the test split; null = all")
    calib_size: int = Field(512, ge=1, description="calibration images for INT8, disjoint from the training subset when possible")
    seed: int = 0
    workers: int = Field(0, ge=0, description="DataLoader workers for file-based sources")
    class_balance: Literal["none", "loss_weights"] = Field(
        "none", description="loss_weights: weigh each class's hard-label loss by n / (classes · n_class)")
    min_images_per_class: int = Field(
        20, ge=1, description="the data stage warns about a class with fewer training images than this")
    imbalance_warning_ratio: float = Field(
        5.0, gt=1, description="the data stage warns when the largest class has this many times the smallest's images")
    allow_missing_test_classes: bool = Field(
        False, description="accept a test (val/) split without images of some training classes; their per-class "
                           "scores are then undefined")

    _known_source = registry_check("source", check_source_name)


class PreprocessConfig(Strict):
    """The one preprocessing definition, shared with the device side (see device.preprocess)."""

    input_size: int = Field(ge=4)
    resize: Optional[int] = Field(None, ge=4, description="shorter side before the center crop; default input_size")
    channels: Literal[1, 3] = 3
    mean: list[float]
    std: list[float]
    interpolation: Literal["bilinear", "area", "nearest", "bicubic", "bilinear_antialias"] = "bilinear"
    channel_order: Literal["rgb", "bgr"] = Field("rgb", description="bgr: a model trained on BGR images (mean, std "
                                                                    "in that order)")

    @model_validator(mode="after")
    def _consistent(self) -> "PreprocessConfig":
        self.to_preprocess()  # the device-side definition performs the checks
        return self

    def to_preprocess(self) -> Preprocess:
        try:
            return Preprocess(input_size=self.input_size, resize=self.resize or self.input_size, channels=self.channels,
                              mean=tuple(self.mean), std=tuple(self.std), interpolation=self.interpolation,
                              channel_order=self.channel_order)
        except ConfigError as err:
            raise ValueError(err.message) from None


class TeacherConfig(Strict):
    """The big model: an architecture from the registry, weights loaded or trained."""

    arch: str
    weights: Optional[str] = Field(None, description="path to a torchvision state_dict, 'imagenet', or null to train")
    preprocess_check: Literal["stop", "warn", "off"] = Field(
        "stop", description="weights of a user's that keep their head: score them on training images under the "
                            "declared preprocessing and the plausible others before training; when another scores "
                            "higher beyond noise, stop with both scores and the keys that select it, or warn")
    train: TrainConfig

    _known_arch = registry_check("arch", ARCHITECTURES.get)


class DistillConfig(Strict):
    """Knowledge distillation from the teacher into the student."""

    student: str = Field("pruned", description="'pruned' (the prune stage's model) or a registry architecture")
    temperature: float = Field(4.0, gt=0)
    alpha: float = Field(0.9, ge=0, le=1, description="weight of the soft-target term")
    cache_teacher_logits: bool = Field(True, description="compute teacher logits once (needs augmentation ⊆ hflip)")
    allow_larger_student: bool = Field(False, description="accept a student with as many MACs or parameters as the "
                                                          "teacher (refused by default: it is no edge model)")
    train: TrainConfig

    @field_validator("student")
    @classmethod
    def _known_student(cls, value: str) -> str:
        if value != "pruned":
            as_value_error(ARCHITECTURES.get, value)
        return value

    @model_validator(mode="after")
    def _cache_compatible(self) -> "DistillConfig":
        if self.cache_teacher_logits and self.train.augment.crop_padding:
            raise ValueError(
                "cache_teacher_logits needs deterministic inputs up to a flip; set "
                "train.augment.crop_padding: 0 or cache_teacher_logits: false"
            )
        return self


class ExportConfig(Strict):
    """ONNX export of every rung that will be measured, checked against torch."""

    opset: int = Field(17, ge=17, le=23)
    rungs: list[FloatRungName] = [name for name, rung in RUNGS.items() if rung.checkpoint_stage]
    fp16_rungs: list[Fp16RungName] = Field(
        [name for name, rung in RUNGS.items() if rung.precision == "fp16"],
        description="FP16 forms written in the graph (FP16 weights and compute, float32 I/O) of exported rungs")
    parity_images: int = Field(256, ge=1, description="test images compared between torch and ONNX Runtime")
    parity_atol: float = Field(1e-3, gt=0, description="largest allowed |torch − ONNX| logit difference")
    min_top1_agreement: float = Field(0.99, ge=0, le=1, description="share of images with the same top-1 class")

    @model_validator(mode="after")
    def _fp16_sources_exported(self) -> "ExportConfig":
        missing = [name for name in self.fp16_rungs if RUNGS[name].form_of not in self.rungs]
        if missing:
            raise ValueError(f"fp16_rungs {missing} need their FP32 rungs "
                             f"{[RUNGS[m].form_of for m in missing]} in export.rungs")
        return self


class QuantizeConfig(LadderConfig):
    """INT8 explicit Q/DQ of the student for TensorRT, with an accuracy gate."""
    float_islands: Literal["fp16", "fp32"] = Field(
        "fp16", description="precision of the layers left out of INT8, written in the graph (ModelOpt's "
                            "high_precision_dtype): fp16 means the same on TensorRT 10 (FP16 flag) and on strongly "
                            "typed 10.12+/11 builds, and INT8 is compared with FP16 on equal terms")


class EvaluateConfig(Strict):
    batch_size: int = Field(256, ge=1)


# The stages an ONNX start has no PyTorch model for: the ladder enters at export.
TORCH_SECTIONS = ("teacher", "prune", "distill")


class StartConfig(Strict):
    """An ONNX file trained elsewhere as the ladder's FP32 student (:mod:`pipeline.export.onnx_start`)."""

    onnx: str = Field(description="path to the .onnx file (one image input, the class scores out)")
    layout: Literal["nchw", "nhwc"] = Field("nchw", description="the input's layout: N×C×H×W (PyTorch) or N×H×W×C "
                                                                "(TensorFlow, Keras)")
    preprocess_check: Literal["stop", "warn", "off"] = Field(
        "stop", description="score the model on training images under the declared preprocessing and the plausible "
                            "others (resize filter, crop, normalisation); when another scores higher beyond noise, "
                            "stop with both scores and the keys that select it, or warn and go on")


class Recipe(RecipeBase):
    """A whole model recipe (``models/<name>.yaml``)."""

    task: Literal["classification"] = Field("classification", description="classification (default) or detection "
                                                                          "(see DetectionRecipe)")
    data: DataConfig
    preprocess: PreprocessConfig
    start: Optional[StartConfig] = Field(None, description="an ONNX model to start from at export, instead of "
                                                           "teacher, prune and distill")
    teacher: Optional[TeacherConfig] = None  # the three required without start (_preprocess_of_the_model)
    prune: Optional[PruneConfig] = None
    distill: Optional[DistillConfig] = None
    export: ExportConfig = ExportConfig()
    quantize: QuantizeConfig = QuantizeConfig()
    evaluate: EvaluateConfig = EvaluateConfig()
    deploy: DeployConfig = DeployConfig()
    # Why a section has no default, said when it is left out.
    MISSING_HINTS: ClassVar[dict[str, str]] = {
        "preprocess": "only a teacher.arch that states how it was trained (timm/<name> from its pretrained_cfg, or "
                      "a package's key with a preprocess) supplies it; write input_size, mean and std (an ONNX "
                      "start: those its model was trained with)",
        "data": "say where the images are: DATA=fashion-mnist|digits|imagefolder:/path (an ONNX start: the classes "
                "its model was trained on, in its output order)",
        **{name: "the ladder starts from a PyTorch teacher (teacher, prune, distill), or from an ONNX file "
                 "(start: {onnx: path}, or MODEL=path/to/model.onnx)" for name in TORCH_SECTIONS},
        "prune": "the ladder starts from a PyTorch teacher (teacher, prune, distill), or from an ONNX file (start: "
                 "{onnx: path}); write prune: null to distill the teacher into distill.student without pruning"}
    # Set when preprocess was left to the teacher's architecture (timm's pretrained_cfg): the run says so.
    _preprocess_from: str | None = PrivateAttr(None)

    @model_validator(mode="wrap")
    @classmethod
    def _preprocess_of_the_model(cls, data: Any, handler) -> "Recipe":
        """A recipe may leave ``preprocess``, whole or in part, to a teacher whose architecture states how it was
        trained (a ``timm/`` key: its ``pretrained_cfg``'s input size, mean, std, interpolation and crop); the keys
        it writes win. Any other teacher's recipe must write it. Teacher, prune and distill are required unless the
        recipe starts from an ONNX file, whose sections are then checked (:func:`_sections_of_the_start`)."""
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
        if isinstance(data, dict) and data.get("start") is None:
            # prune: null, written, distills without pruning; left out, it is missing
            missing = [name for name in TORCH_SECTIONS if data.get(name) is None and not (name == "prune"
                                                                                         and "prune" in data)]
            if missing:
                raise ValidationError.from_exception_data(cls.__name__, [
                    {"type": "missing", "loc": (name,), "input": data} for name in missing])
            data = _sections_without_pruning(data)
        elif isinstance(data, dict):
            data = _sections_of_the_start(data)
        recipe = handler(data)
        recipe._preprocess_from = source
        return recipe


def _sections_of_the_start(data: dict) -> dict:
    """An ONNX start has one float rung, the given graph as ``student``: the rung lists left unwritten shrink to its
    forms; a section, rung, QAT or the Torch-TensorRT road written that needs the PyTorch model is refused. Sections
    that are no mapping are left to the models, which say so with their key path."""
    written = [name for name in TORCH_SECTIONS if data.get(name) is not None]
    if written:
        raise ValueError(f"start.onnx enters the ladder at export: {', '.join(written)} would not run; remove "
                         f"{'them' if len(written) > 1 else 'it'} from the recipe")
    sections = {name: dict(data.get(name) or {}) for name in ("export", "quantize", "deploy")
                if isinstance(data.get(name) or {}, dict)}
    if sections.get("quantize", {}).get("qat") is not None:
        raise ValueError("quantize.qat needs the PyTorch model, which an ONNX start does not have; set quantize.qat: "
                         "null (the INT8 ladder still tries each calibration method and mixed precision)")
    runtimes = sections.get("deploy", {}).get("runtimes")
    if isinstance(runtimes, list) and "torch_tensorrt" in runtimes:
        raise ValueError("deploy.runtimes: torch_tensorrt compiles the PyTorch model, which an ONNX start does not "
                         "have; use [tensorrt]")
    started = [name for name, rung in RUNGS.items() if name == "student" or rung.form_of == "student"]
    for section, key, kind in (("export", "rungs", "fp32"), ("export", "fp16_rungs", "fp16"), ("deploy", "rungs", None)):
        if section not in sections:
            continue
        allowed = [name for name in started if kind in (None, RUNGS[name].precision)]
        given = sections[section].get(key)
        if key not in sections[section]:
            sections[section][key] = allowed
        elif isinstance(given, list) and (set(map(str, given)) - set(allowed) or (kind == "fp32" and not given)):
            raise ValueError(f"{section}.{key}: an ONNX start has {', '.join(allowed)} here (the given graph is the "
                             f"student), not {given}; leave {section}.{key} out")
    return {**data, **sections}


def _student(data: dict) -> Any:
    distill = data.get("distill")
    return distill.get("student", "pruned") if isinstance(distill, dict) else "pruned"


def _sections_without_pruning(data: dict) -> dict:
    """A recipe that distills without pruning (``prune: null``, or a ``distill.student`` from the registry) has no
    ``pruned`` rung: the rung lists left unwritten lose it, a written one that names it is refused, and
    ``distill.student: pruned`` with no prune section is refused with both ways out."""
    student = _student(data)
    if data.get("prune") is None and student == "pruned":
        raise ValueError("distill.student: pruned distills the prune stage's model, and prune is null: name a student "
                         "from the registry (distill.student: mobilenet_v3_small, timm/<name>) to distill without "
                         "pruning, or write the prune section")
    if student == "pruned":
        return data
    sections = {name: dict(data.get(name) or {}) for name in ("export", "deploy")
                if isinstance(data.get(name) or {}, dict)}
    for section, key, default in (("export", "rungs", ExportConfig().rungs), ("deploy", "rungs", list(RUNGS))):
        if section not in sections:
            continue
        given = sections[section].get(key, default)
        if key in sections[section] and isinstance(given, list) and "pruned" in given:
            raise ValueError(f"{section}.{key} names pruned, but {pruning_skipped_reason(data)}: leave pruned out of "
                             f"{section}.{key}")
        if key not in sections[section]:
            sections[section][key] = [name for name in default if name != "pruned"]
    return {**data, **sections}


def pruning_skipped_reason(data: dict) -> str:
    """Why a recipe's ladder has no pruned rung, from its raw data or its validated model."""
    student = _student(data) if isinstance(data, dict) else data.distill.student
    prune = data.get("prune") if isinstance(data, dict) else data.prune
    if prune is None:
        return f"prune is null: the teacher is distilled into {student} without pruning"
    return f"distill.student is {student}, not the pruned teacher: the prune section is not used"


def pruning_skipped(recipe) -> str | None:
    """Why the prune stage is not in a run (an ONNX start, ``prune: null``, a registry student); None when it is."""
    started = started_without_torch(recipe)
    if started or recipe.distill.student != "pruned":
        return started or pruning_skipped_reason(recipe)
    return None
