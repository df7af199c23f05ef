"""Classification recipes (``task: classification``, the default): the root model over the shared sections.

:func:`pipeline.core.recipe.parse_recipe` imports it by name (:data:`pipeline.core.recipe.TASKS`), as it does every
task's root, so that the recipe loader depends on no task.
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Optional

from pydantic import Field, PrivateAttr, ValidationError, model_validator

from device.architectures import ARCHITECTURES
from device.errors import EdgeFoldError, UnknownKeyError
from pipeline.core.recipe import (DataConfig, DeployConfig, DistillConfig, EvaluateConfig, ExportConfig,
                                  PreprocessConfig, PruneConfig, QuantizeConfig, RecipeBase, Strict, TeacherConfig)
from pipeline.core.stage import started_without_torch
from pipeline.core.rungs import RUNGS

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
