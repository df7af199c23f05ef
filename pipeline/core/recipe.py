"""Recipes: one YAML file per model under ``models/``, validated before any work starts.

Unknown keys and wrong types are rejected with their full key path (``prune.macs_targt``), and components
(architectures, data sources) are chosen by registry key, never by importing a dotted path from the file."""

from __future__ import annotations

import difflib
import hashlib
import importlib
import json
import os
from pathlib import Path
from typing import Annotated, Any, Callable, Literal, Optional

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from device.errors import ConfigError, EdgeFoldError
from pipeline.core.recipe_jobs import FrameRecipe, SustainedRecipe
from device.schema import (BatchSizes, ClockMHz, IdleSeconds, PowerLimitWatts, MinIterations, ModeId, ModeName, SampleHz, Threads,
                           TimeoutSeconds, WarmupIterations, WindowSeconds)
from device.files import sha256_file
from pipeline.core.onnx_recipe import onnx_recipe, ultralytics_onnx
from pipeline.core.recipe_errors import validation_error
from pipeline.core.rungs import RUNGS, RungName

RECIPES_ENV = "EDGEFOLD_MODELS_DIR"


def registry_check(field: str, check: Callable[[str], None]) -> Any:
    """A validator of ``field`` that runs a registry's ``check`` on its value (an unknown name refused with the
    nearest ones), reported at the key's path: ``_known_arch = registry_check("arch", check)`` in a section."""
    def validate(cls, value: str) -> str:
        as_value_error(check, value)
        return value

    return field_validator(field)(validate)


def as_value_error(check, *args) -> None:
    """Runs a registry check inside a validator so pydantic reports the key path with it."""
    try:
        check(*args)
    except EdgeFoldError as err:
        raise ValueError(f"{err.message}; {err.fix}" if err.fix else err.message) from None


class Strict(BaseModel):
    """A recipe section: unknown keys refused, values frozen once validated."""

    model_config = ConfigDict(extra="forbid", frozen=True)


def _refuse_renamed(data: Any, renamed: dict[str, str]) -> Any:
    """Refuses a key that was renamed, naming the new one (recipes reject unknown keys; this one says where it went)."""
    if isinstance(data, dict):
        for old, new in renamed.items():
            if old in data:
                raise ValueError(f"{old!r} was renamed {new!r}: write {new}: {data[old]!r} instead")
    return data


class AugmentConfig(Strict):
    """Training-time augmentation, applied to preprocessed batches."""

    hflip: bool = False
    crop_padding: int = Field(0, ge=0, description="random crop after zero padding by this many pixels")


class TrainConfig(Strict):
    """One training run (teacher training, fine-tuning, distillation)."""

    epochs: float = Field(ge=0)
    batch_size: int = Field(64, ge=1)
    optimizer: Literal["sgd", "adamw"] = "adamw"
    lr: float = Field(gt=0)
    weight_decay: float = Field(0.0, ge=0)
    momentum: float = Field(0.9, ge=0, lt=1)
    nesterov: bool = True
    schedule: Literal["cosine", "onecycle", "constant"] = "cosine"
    warmup_epochs: float = Field(0.0, ge=0)
    label_smoothing: float = Field(0.0, ge=0, lt=1)
    grad_clip: Optional[float] = Field(None, gt=0, description="max global grad norm")
    amp: Literal["auto", "off", "bf16", "fp16"] = Field(
        "auto", description="mixed precision. auto: on CUDA (bf16 where supported, else fp16), fp32 on a CPU; bf16: also "
                            "on a CPU that computes bf16 natively (AMX, AVX-512-BF16), fp32 on one that does not")
    channels_last: Optional[bool] = Field(
        None, description="NHWC memory format. null (default): on CUDA, and on a CPU for inputs of 64 px or more (on this "
                          "project's CPUs it trained ResNet-50 12% faster at 224 px, the same at 64, 9% slower "
                          "at 32: bench/train_speed.py)")
    eval_every_epoch: bool = Field(False, description="evaluate on the test split after every epoch, not only the last")
    augment: AugmentConfig = AugmentConfig()
    seed: int = 0
    bn_recalibration: Literal["auto", "on", "off"] = Field(
        "auto", description="re-estimate BatchNorm statistics over training images after training; auto: when a "
                            "layer's momentum is below 0.1 (MobileNetV3, EfficientNet), whose statistics go stale")
    bn_recalibration_images: int = Field(4096, ge=1, description="training images the statistics are averaged over")

    @field_validator("bn_recalibration", mode="before")
    @classmethod
    def _yaml_on_off(cls, value: Any) -> Any:
        # YAML 1.1 reads a bare on/off as a boolean.
        return {True: "on", False: "off"}.get(value, value) if isinstance(value, bool) else value


class LatencyTarget(Strict):
    """A latency budget measured on a device's agent (see pipeline.latency): ``{device: edge, ratio: 0.25}``.

    Exactly one of ``ratio`` (of the unpruned model's latency measured there) and ``ms`` is given. The
    runtime, precision and threads are the deploy stage's for that device; the batch size and the
    measurement window are the table's own (short windows, many of them).
    """

    device: str = Field("edge", description="a device name, group or role (EDGE=/DC=/DEVICES=); with no devices "
                                            "configured, the loopback agent on this machine")
    ratio: Optional[float] = Field(None, gt=0, le=1, description="budget as a fraction of the unpruned latency")
    ms: Optional[float] = Field(None, gt=0, description="budget in milliseconds per batch")
    batch_size: int = Field(1, ge=1, le=4096, description="batch the budget is measured at")
    duration_s: float = Field(0.3, gt=0, le=60, description="timed window per measurement")
    warmup_iterations: int = Field(5, ge=0, le=100_000)
    windows: int = Field(3, ge=1, le=20, description="interleaved windows per sub-network; the median is used")
    widths_per_group: int = Field(5, ge=2, le=64, description="widths measured per channel group (interpolated "
                                                               "between)")
    rounds: int = Field(6, ge=1, le=20, description="plans measured on the device until one meets the budget (one "
                                                     "network each: the knapsack's, then a search along a nested path)")
    tolerance: float = Field(0.05, gt=0, lt=1, description="relative tolerance on the measured latency")
    max_pruning_ratio: float = Field(
        0.9, gt=0, le=1, description="the largest fraction of a channel group the plan may remove (Torch-Pruning's "
                                     "max_pruning_ratio): first-order importance cannot judge a group cut to a "
                                     "sliver in one shot (ResNet-50 with 1.0: layer4 cut to 8 channels, 69% top-1; "
                                     "with 0.9 at the same budget: 88.6%)")
    precision: Literal["deployed", "float"] = Field(
        "deployed", description="time the sub-networks in the deployed rung's precision (INT8 Q/DQ: each is "
                                "quantized for timing) or as the float student (faster to build)")
    check: bool = Field(True, description="check the table against measured unpruned and MACs-pruned networks")
    check_macs_target: Optional[float] = Field(None, gt=0, le=1, description="the MACs-pruned network checked; "
                                                                              "default: the chosen plan's MACs")
    holdout: int = Field(3, ge=0, le=20, description="plans measured after the search and never fitted: the "
                                                     "table's error out of sample")
    kernel_multiple: Optional[int] = Field(None, ge=1, le=256, description="the channel tile the device's kernels "
                                           "step at (widths are priced padded to it; default: prune.round_to)")
    reference: Optional[str] = Field(None, description="a checkpoint (model.pt) the ratio is of instead of the "
                                                       "unpruned network: measured afresh beside the table and "
                                                       "beside every plan, never cached (a benchmark's arm A)")
    max_networks: int = Field(600, ge=1, le=100_000, description="the most networks (engines on TensorRT) a budget "
                                                                 "search may build; refused before measuring when "
                                                                 "over it")

    @model_validator(mode="before")
    @classmethod
    def _renamed_keys(cls, data: Any) -> Any:
        return _refuse_renamed(data, {"points": "widths_per_group"})

    @model_validator(mode="after")
    def _one_budget(self) -> "LatencyTarget":
        if (self.ratio is None) == (self.ms is None):
            raise ValueError("give exactly one of ratio (of the unpruned latency) and ms")
        if self.reference is not None and self.ratio is None:
            raise ValueError("reference needs ratio (the budget is ratio × the reference's measured latency), not ms")
        return self


class PruneConfig(Strict):
    """Structured channel pruning (Torch-Pruning DepGraph) to a MACs target or a measured latency budget."""

    macs_target: Optional[float] = Field(None, gt=0, le=1, description="pruned MACs as a fraction of the teacher's")
    latency: Optional[LatencyTarget] = Field(None, description="a latency budget on a device instead of macs_target")
    tolerance: float = Field(0.05, gt=0, lt=1, description="relative tolerance on macs_target")
    round_to: int = Field(8, ge=1, description="channel counts rounded to this multiple (Tensor Cores want 8/16/32)")
    importance: Literal["auto", "l1", "l2", "taylor"] = Field(
        "auto", description="channel importance: weight magnitude (a uniform ratio per layer on the MACs target), "
                            "or the first-order loss change on training batches, comparable across groups (a "
                            "knapsack over groups, with MACs or latency as the cost); auto: taylor for a latency "
                            "target, l2 for macs_target")
    max_pruning_ratio: Optional[float] = Field(None, gt=0, le=1, description="macs_target with importance taylor: "
                                                                             "the most of a group the knapsack may "
                                                                             "remove (default 0.9)")
    steps: int = Field(1, ge=1, description="iterative prune-and-finetune steps")
    seed: int = Field(0, ge=0, description="seed of the training batches the Taylor importance is computed on (a "
                                           "benchmark pairs it with the distillation's seed)")
    finetune: Optional[TrainConfig] = Field(None, description="fine-tuning after each step; null = none")

    @model_validator(mode="after")
    def _one_target(self) -> "PruneConfig":
        if (self.macs_target is None) == (self.latency is None):
            raise ValueError("give exactly one target: macs_target (a MACs fraction) or latency ({device, ratio|ms})")
        if self.max_pruning_ratio is not None and not (self.importance == "taylor" and self.macs_target is not None):
            raise ValueError("max_pruning_ratio bounds the MACs target's knapsack (importance taylor); a latency "
                             "budget takes prune.latency.max_pruning_ratio")
        if self.importance == "auto":  # resolved here, so that the run's recorded recipe says what was used
            object.__setattr__(self, "importance", "taylor" if self.latency is not None else "l2")
        return self


MODELOPT_METHODS = ("max", "entropy")  # modelopt.onnx.quantization's int8 calibration methods


class MixedPrecisionConfig(Strict):
    """The ladder's step between calibration and QAT: the most sensitive layers left out of INT8 (FP16 in the graph),
    as few as meet the budget on calibration images held apart (:mod:`pipeline.quantize.mixed_precision`)."""

    max_layers: int = Field(8, ge=1, description="most layers left out of INT8; k ≤ this is found by bisection")
    held_out: float = Field(0.25, gt=0, lt=1, description="fraction of the calibration images held apart from "
                                                          "calibration, on which sensitivity and k are measured "
                                                          "(never the test split)")


class LadderConfig(Strict):
    """The INT8 ladder every task climbs (:mod:`pipeline.quantize.ladder`): each calibration method in order, then
    the most sensitive layers left in FP16, then quantization-aware fine-tuning, until the INT8 student is within the
    budget of the FP32 one."""

    quantizer: Literal["ort", "modelopt"] = Field("ort", description="ONNX Runtime quantize_static, or NVIDIA ModelOpt")
    calibration_methods: list[Literal["max", "entropy", "percentile"]] = Field(
        ["max", "percentile"], min_length=1, description="tried in order until the accuracy budget is met")
    accuracy_budget_points: float = Field(1.0, ge=0, description="largest allowed drop of the task's score (top-1, "
                                                                  "mAP) against the FP32 student, in points")
    per_channel: bool = True
    mixed_precision: Optional[MixedPrecisionConfig] = Field(
        MixedPrecisionConfig(), description="when every calibration method misses the budget: the fewest most "
                                            "sensitive layers kept in FP16 that meet it; null = off")
    qat: Optional[TrainConfig] = Field(None, description="quantization-aware fine-tuning (ModelOpt, distilled from the "
                                                         "FP32 student) when every calibration method misses the "
                                                         "budget; null = off")

    @model_validator(mode="after")
    def _methods_the_quantizer_has(self) -> "LadderConfig":
        if self.quantizer == "modelopt":
            lacking = [m for m in self.calibration_methods if m not in MODELOPT_METHODS]
            if lacking:
                raise ValueError(f"ModelOpt calibrates with max or entropy, not {lacking[0]!r} "
                                 "(set quantize.calibration_methods: [max, entropy] for the modelopt quantizer)")
        return self


def accelerator_name(accelerator: str) -> str:
    """The agent's name for a recipe accelerator: ``dla`` is DLA core 0 (both of an AGX Orin's cores are alike)."""
    return "dla0" if accelerator == "dla" else accelerator


class SweepConfig(Strict):
    """A power-mode sweep of every deployed rung on each Jetson (the agent's :class:`device.schema.SweepSpec`).

    Each point — mode × jetson_clocks × batch size — is set through the device's jtop service, waited for
    and measured in every round; the report draws the energy–latency front and names the point to ship.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    modes: Annotated[list[ModeName | ModeId], Field(min_length=1, max_length=16)] | Literal["all"] = Field(
        "all", description="power modes by the board's names or ids; all: every mode jtop lists (those that need "
                           "a reboot are skipped with the reason)")
    jetson_clocks: Annotated[list[bool], Field(min_length=1, max_length=2)] | None = Field(
        None, description="jetson_clocks states per mode, e.g. [false, true]; null: as found")
    batch_sizes: BatchSizes | None = Field(None, description="the sweep's batch sizes; null: deploy.batch_sizes")
    accelerators: Annotated[list[Literal["gpu", "dla", "dla0", "dla1"]], Field(min_length=1, max_length=3)] = Field(
        ["gpu"], description="where each point runs: gpu, dla (DLA core 0) or dla0/dla1 (TensorRT, GPU fallback, one "
                             "static engine per batch, built once and kept across modes); on a board or TensorRT "
                             "without that DLA the points are recorded as not measured, with the reason")

    @field_validator("accelerators")
    @classmethod
    def _one_each(cls, value: list[str]) -> list[str]:
        cores = [accelerator_name(a) for a in value]
        if len(set(cores)) != len(cores):
            raise ValueError("accelerators names each accelerator once (dla is dla0)")
        return value

    def job_accelerators(self) -> list[str]:
        """The agent's names (:data:`device.schema.Accelerator`), in the recipe's order."""
        return [accelerator_name(a) for a in self.accelerators]
    settle_timeout_s: float = Field(30.0, gt=0, le=600, description="how long a point may take to show its mode")
    power_limits_w: Annotated[list[PowerLimitWatts], Field(min_length=1, max_length=16)] | None = Field(
        None, description="GPU servers: NVML power limits to sweep, W (root; each within the GPU's constraints); "
                          "Jetsons sweep modes")
    gpu_clocks_mhz: Annotated[list[ClockMHz], Field(min_length=1, max_length=16)] | None = Field(
        None, description="GPU servers: graphics clocks to lock through NVML, MHz (root), instead of power limits")

    @model_validator(mode="after")
    def _one_gpu_knob(self) -> "SweepConfig":
        if self.power_limits_w is not None and self.gpu_clocks_mhz is not None:
            raise ValueError("a GPU server's sweep varies power_limits_w or gpu_clocks_mhz, not both")
        for name in ("power_limits_w", "gpu_clocks_mhz"):
            values = getattr(self, name)
            if values is not None and len(set(values)) != len(values):
                raise ValueError(f"{name} names each value once")
        return self


class DeployConfig(Strict):
    """Benchmark jobs sent to every device's agent for every rung.

    The measurement fields take their types and bounds from the agent's job schema
    (:class:`device.schema.JobSpec`): one set of bounds, checked when the recipe is loaded.
    """

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)
    rungs: list[RungName] = list(RUNGS)
    batch_sizes: BatchSizes = Field([1, 32], description="batch 1 for latency, the largest for throughput")
    duration_s: WindowSeconds = Field(3.0, description="timed window per rung, batch size and round")
    rounds: int = Field(5, ge=1, le=100, description="interleaved rounds: each round times every rung once, so "
                                                     "every rung × batch gets this many windows")
    min_iterations: MinIterations = Field(10, description="a window runs at least this many calls")
    warmup_iterations: WarmupIterations = 10
    idle_s: IdleSeconds = Field(1.0, description="idle power baseline before each job")
    sample_hz: SampleHz = 20.0
    threads: Threads = Field(0, description="intra-op CPU threads of the runtime; 0 = its default")
    runtime: Literal["auto", "tensorrt", "onnxruntime"] = Field(
        "auto", description="auto: TensorRT where the agent has it, else ONNX Runtime")
    runtimes: list[Literal["tensorrt", "torch_tensorrt"]] = Field(
        ["tensorrt"], min_length=1, description="the roads to each device: tensorrt is the ONNX road (its runtime "
                                                "chosen by deploy.runtime); torch_tensorrt adds the PyTorch road "
                                                "(each rung's device checkpoint, with ModelOpt's quantizer state for "
                                                "INT8, rebuilt and compiled by Torch-TensorRT on the device)")
    torch_programs: bool = Field(False, description="on the torch_tensorrt road, send the build host's torch.export "
                                                    "program (.pt2) to devices with the same torch release instead of "
                                                    "the device checkpoint: only to agents started with "
                                                    "--trust-programs (a program is code the device runs)")
    job_timeout_s: TimeoutSeconds = Field(1800.0, description="per job, engine build included")
    parallel_devices: int = Field(8, ge=1, le=256, description="devices benchmarked at once")
    retries: int = Field(1, ge=0, le=5, description="resubmissions of a job that failed or was interrupted")
    evaluate_images: int = Field(
        1000, ge=0, le=100_000, description="test images (stratified per class) each rung's engine scores on each "
                                            "device, once, outside the timed windows; 0: host accuracy only")
    sweep: SweepConfig | None = Field(None, description="power modes × jetson_clocks × batch on each Jetson")
    frame: FrameRecipe | None = Field(None, description="camera frames (width, height, bgr | nv12 | jpeg) each rung "
                                                      "is timed on from bytes to top-k, part by part and pipelined")
    sustained: SustainedRecipe | None = Field(None, description="one rung run without pause for minutes on each "
                                                                "device (edgefold sustain): burst against settled")
    nvinfer: bool = Field(True, description="also measure, after each rung in every round, the graph DeepStream's "
                                            "nvinfer runs where it differs from the rung's (a Softmax at the end, a "
                                            "per-channel 1/std in front): edgefold ship then ships the engine that "
                                            "was timed for it")
    latency_budget_ms: float | None = Field(None, gt=0, le=60_000, description="the p50 a product must meet: the "
                                                                                "report names the least-energy "
                                                                                "sweep point within it")

    @field_validator("runtimes")
    @classmethod
    def _roads_once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError(f"deploy.runtimes names each road once, got {value}")
        return value

    @model_validator(mode="after")
    def _jobs(self) -> "DeployConfig":
        if self.frame is not None and self.frame.source == "images" and not self.evaluate_images:
            raise ValueError("deploy.frame.source: images makes its frames from the evaluation images: set "
                             "deploy.evaluate_images above 0")
        if self.sustained is not None:
            self.sustained.check(self)
        if self.torch_programs and "torch_tensorrt" not in self.runtimes:
            raise ValueError("deploy.torch_programs sends programs on the torch_tensorrt road: add torch_tensorrt to "
                             "deploy.runtimes, or leave deploy.torch_programs out")
        return self


class RecipeBase(Strict):
    """What every task's recipe has: its name, a description, its task and its sections."""

    name: str
    description: str = ""

    def section(self, name: str) -> dict[str, Any]:
        """A section as plain JSON-able data (what a stage hashes into its config)."""
        return getattr(self, name).model_dump(mode="json")


AnyRecipe = RecipeBase  # a task's root: Recipe, DetectionRecipe, SegmentationRecipe. It is imported, as
# "module:class", only for a recipe of that task, so that no other task's stages hash its code (pipeline.core.codehash
# follows import statements).
TASKS: dict[str, str] = {"classification": "pipeline.tasks.classification.recipe:Recipe",
                         "detection": "pipeline.tasks.detection.recipe:DetectionRecipe",
                         "segmentation": "pipeline.tasks.segmentation.recipe:SegmentationRecipe"}


def task_model(task: str) -> type[BaseModel]:
    """The root model of a task's recipes (``TASKS``)."""
    module, _, name = TASKS[task].partition(":")
    return getattr(importlib.import_module(module), name)


def recipes_dir() -> Path:
    """Where recipes live: ``$EDGEFOLD_MODELS_DIR``, ``./models`` or the checkout's ``models/``."""
    if os.environ.get(RECIPES_ENV):
        return Path(os.environ[RECIPES_ENV])
    local = Path.cwd() / "models"
    return local if local.is_dir() else Path(__file__).resolve().parents[2] / "models"


def available_recipes(directory: Path | None = None) -> list[str]:
    """Names of the recipes in ``directory`` (default :func:`recipes_dir`)."""
    return sorted(p.stem for p in (directory or recipes_dir()).glob("*.yaml"))


def resolve_recipe_path(model: str) -> Path:
    """Maps a model name (``resnet50``) or a YAML path to the recipe file.

    Raises:
        ConfigError: Naming the recipes that exist when ``model`` is none of them.
    """
    candidate = Path(model)
    if candidate.suffix in (".yaml", ".yml"):
        if not candidate.is_file():
            raise ConfigError(f"recipe file {model} does not exist", fix="check the path")
        return candidate
    path = recipes_dir() / f"{model}.yaml"
    if path.is_file():
        return path
    names = available_recipes()
    near = difflib.get_close_matches(model, names, n=3, cutoff=0.5)
    hint = f"did you mean {' or '.join(near)}? " if near else ""
    raise ConfigError(
        f"no recipe for model {model!r} in {recipes_dir()}",
        fix=f"{hint}recipes that exist: {', '.join(names) or '(none)'}; or pass a path to a YAML file",
    )


def _apply_overrides(raw: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Sets dotted keys (``data.source``) in a copy of ``raw``; None is the recipe's null (``quantize.qat=null``
    turns QAT off), an empty string an unset flag (ignored)."""
    merged = json.loads(json.dumps(raw))
    for dotted, value in overrides.items():
        if isinstance(value, str) and value == "":
            continue
        node = merged
        *parents, leaf = dotted.split(".")
        if not all(dotted.split(".")):
            raise ConfigError(f"--set {dotted}: empty key in the dotted path", fix="e.g. --set distill.train.epochs=2")
        for depth, key in enumerate(parents):
            node = node.setdefault(key, {})
            if not isinstance(node, dict):
                where = ".".join(parents[: depth + 1])
                raise ConfigError(f"--set {dotted}: {where} is a value ({node!r}), not a section with keys",
                                  fix=f"set {where} itself, e.g. --set {where}=…")
        node[leaf] = value
    return merged


def parse_recipe(raw: Any, source: str = "<recipe>", overrides: dict[str, Any] | None = None) -> AnyRecipe:
    """Validates raw recipe data (already parsed YAML) into its task's root model (:data:`TASKS`): a classification
    ``Recipe`` by default, a ``DetectionRecipe`` when it says ``task: detection``."""
    if not isinstance(raw, dict):
        raise ConfigError(f"recipe {source} must be a YAML mapping, got {type(raw).__name__}", fix="see models/tiny.yaml")
    raw = _apply_overrides(raw, overrides or {})
    start = raw.get("start") if isinstance(raw.get("start"), dict) else {}  # start: {onnx, task: detection} names it
    task = (raw := {"task": start.get("task", "classification"), **raw})["task"]
    if task not in TASKS:
        near = difflib.get_close_matches(str(task), TASKS, n=1, cutoff=0.5)
        hint = f"did you mean {near[0]!r}? " if near else ""
        raise ConfigError(f"invalid recipe {source}: task {task!r} is unknown",
                          fix=f"{hint}tasks: {', '.join(TASKS)}")
    root = task_model(task)
    try:
        return root.model_validate(raw)
    except ValidationError as err:
        raise validation_error(err, source, root) from None


def load_recipe(model: str, overrides: dict[str, Any] | None = None) -> tuple[AnyRecipe, Path, str]:
    """Loads and validates a recipe by model name or path.

    Returns:
        The recipe, its path and the sha256 of the file's bytes.
    """
    if Path(model).suffix == ".pt" and not Path(model).with_suffix(".yaml").is_file():
        from pipeline.core.log import log

        model = str(ultralytics_onnx(Path(model), log))  # MODEL=best.pt: an Ultralytics checkpoint, exported
    if Path(model).suffix == ".onnx":  # MODEL=model.onnx: the file is the recipe (its hash the recipe's)
        raw, assumed = onnx_recipe(Path(model))
        recipe = parse_recipe(raw, model, overrides)
        recipe._preprocess_from = assumed if not any(key.startswith("preprocess") for key in overrides or {}) else None
        return recipe, Path(model), sha256_file(Path(model))
    path = resolve_recipe_path(model)
    data = path.read_bytes()
    try:
        raw = yaml.safe_load(data)
    except yaml.YAMLError as err:
        raise ConfigError(f"recipe {path} is not valid YAML: {err}", fix="fix the YAML syntax") from None
    return parse_recipe(raw, str(path), overrides), path, hashlib.sha256(data).hexdigest()
