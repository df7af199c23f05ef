"""The agent's request and result schema, shared by the agent, its client and the pipeline.

Unknown fields are rejected (a typo in a job spec must not silently fall back to a default), and
every number carries its unit in its name. A job request is strict: every field typed and bounded,
floats finite, no numeric strings for numbers, no lone surrogates in text, so whatever the agent
accepts it can store, read back and answer in JSON.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from device.errors import EdgeFoldError
from device.jobs.diverge_schema import (  # noqa: F401
    DIVERGE_MAX_BYTES, DivergeResult, DivergeSpec, MarkedTensor, TensorName)
from device.scoring.evaluation_schema import EvaluationSpec, Postprocess  # noqa: F401 (re-exported: the job's part)
from device.jobs.frame_schema import FrameResult, FrameSpec
from device.power.setting_schema import (  # noqa: F401 (re-exported: the result's sweep records)
    NotMeasured, PowerSetting)
from device.jobs.sustain_schema import SustainedResult, SustainedSpec
from device.service.problems import describe_problems, field_problems
from device.reported import reported
from device.jobs.window import (Contention, DeviceTiming, Measured, PowerTrace, RunSummary, TelemetryName,
                                TelemetrySummary)
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_serializer, model_validator

SHA256 = re.compile(r"^[0-9a-f]{64}$")
Runtime = Literal["onnxruntime", "tensorrt", "torch", "torch_tensorrt"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
JobState = Literal["queued", "running", "succeeded", "failed", "interrupted", "cancelled"]
FINISHED = ("succeeded", "failed", "interrupted", "cancelled")
Interpolation = Literal["bilinear", "area", "nearest", "bicubic", "bilinear_antialias"]
BatchSize = Annotated[int, Field(ge=1, le=4096)]
# The bounds of a job's measurement, shared with the recipe's deploy section (pipeline.core.recipe.DeployConfig),
# so a recipe the agent would refuse is refused before the first stage runs, by the same numbers.
BatchSizes = Annotated[list[BatchSize], Field(min_length=1, max_length=8)]
WarmupIterations = Annotated[int, Field(ge=0, le=100_000)]
WindowSeconds = Annotated[float, Field(gt=0, le=3600)]
IdleSeconds = Annotated[float, Field(ge=0, le=60)]
SampleHz = Annotated[float, Field(gt=0, le=1000)]
TimeoutSeconds = Annotated[float, Field(gt=0, le=86_400)]
Threads = Annotated[int, Field(ge=0, le=256)]
MinIterations = Annotated[int, Field(ge=2, le=1_000_000)]
# On the [0,1] scale real values are near 0.5; the bounds only keep absurd numbers out.
MeanValue = Annotated[float, Field(ge=-1000, le=1000)]
StdValue = Annotated[float, Field(gt=0, le=1000)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Request(BaseModel):
    """What a client sends: unknown keys, type coercion ("1" for 1) and NaN/Infinity are all refused."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class PreprocessSpec(Request):
    """The preprocessing a job's smoke inference uses: exactly what ``device.preprocess.Preprocess.to_dict`` gives."""

    input_size: int = Field(ge=1, le=8192, description="side of the square network input, pixels")
    resize: int = Field(ge=1, le=16384, description="shorter side before the center crop, pixels (≥ input_size)")
    channels: int = Field(ge=1, le=3, description="1 or 3")  # not Literal[1, 3]: that lets True pass for 1
    mean: list[MeanValue] = Field(min_length=1, max_length=3, description="per channel, on the [0,1] scale")
    std: list[StdValue] = Field(min_length=1, max_length=3, description="per channel, on the [0,1] scale")
    interpolation: Interpolation = "bilinear"
    channel_order: Literal["rgb", "bgr"] = Field("rgb", description="bgr: the model was trained on BGR images")

    @model_serializer(mode="wrap")
    def _as_recorded(self, handler) -> dict[str, Any]:
        """As ``Preprocess.to_dict`` writes it: the default RGB order left out (a record as before BGR existed)."""
        data = handler(self)
        if data.get("channel_order") == "rgb":
            del data["channel_order"]
        return data

    @model_validator(mode="after")
    def _consistent(self) -> "PreprocessSpec":
        from device.preprocess import Preprocess

        try:  # the device-side definition performs the cross-field checks (resize ≥ input_size, one value a channel)
            Preprocess.from_dict(self.model_dump())
        except EdgeFoldError as err:
            raise ValueError(err.message) from None
        return self


# A power mode by the board's own name (``MAXN_SUPER``) or id (``nvpmodel -m ID``).
ModeName = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_]+$")]
ModeId = Annotated[int, Field(ge=0, le=255)]


PowerLimitWatts = Annotated[float, Field(gt=0, le=5000)]
ClockMHz = Annotated[int, Field(ge=1, le=10_000)]
# Where a sweep point runs: the GPU, or a DLA core (TensorRT, built with GPU fallback).
Accelerator = Literal["gpu", "dla0", "dla1"]


class SweepSpec(Request):
    """A sweep over power modes and jetson_clocks states (Jetson, through the jtop service).

    Each setting (mode × jetson_clocks) is set, waited for until the device shows it (online cores and
    clock caps as the board's nvpmodel configuration says), and measured at every batch size of the job;
    the engine is loaded once. The mode and jetson_clocks state found are restored at the end.
    """

    power_modes: Annotated[list[ModeName | ModeId], Field(min_length=1, max_length=16)] | Literal["all"] | None = Field(
        None, description="Jetson: modes by name or id, in the order to visit them; 'all': every mode jtop lists "
                          "(those that need a reboot are skipped with the reason)")
    power_limits_w: Annotated[list[PowerLimitWatts], Field(min_length=1, max_length=16)] | None = Field(
        None, description="data-center GPU: NVML power management limits to measure under, in watts (each within the "
                          "GPU's nvmlDeviceGetPowerManagementLimitConstraints; root)")
    gpu_clocks_mhz: Annotated[list[ClockMHz], Field(min_length=1, max_length=16)] | None = Field(
        None, description="data-center GPU: graphics clocks to lock (nvmlDeviceSetGpuLockedClocks, min = max), in MHz, "
                          "each within the GPU's supported graphics clocks; root")
    jetson_clocks: Annotated[list[bool], Field(min_length=1, max_length=2)] | None = Field(
        None, description="jetson_clocks states to measure each mode in; null: leave it as found")
    settle_timeout_s: float = Field(30.0, gt=0, le=600, description="how long a setting may take to show its mode "
                                                                   "before it is refused, not measured")
    accelerators: Annotated[list[Accelerator], Field(min_length=1, max_length=3)] = Field(
        ["gpu"], description="where each setting is measured: gpu, dla0, dla1 (TensorRT, GPU fallback on, one static "
                             "engine per batch); each is loaded once and measured under every setting. The first is "
                             "the job's runner (a failure to load it fails the job); a later one the device or runtime "
                             "cannot give is recorded as not measured, with the reason")

    @model_validator(mode="after")
    def _distinct(self) -> "SweepSpec":
        knobs = [name for name in ("power_modes", "power_limits_w", "gpu_clocks_mhz") if getattr(self, name) is not None]
        if len(knobs) != 1:
            raise ValueError("a sweep varies one of power_modes (Jetson), power_limits_w or gpu_clocks_mhz (NVML)")
        if self.jetson_clocks is not None and self.power_modes is None:
            raise ValueError("jetson_clocks goes with power_modes (Jetson)")
        for name in ("power_limits_w", "gpu_clocks_mhz"):
            values = getattr(self, name)
            if values is not None and len(set(values)) != len(values):
                raise ValueError(f"{name} names each value once")
        if isinstance(self.power_modes, list) and len(set(self.power_modes)) != len(self.power_modes):
            raise ValueError("power_modes names each mode once")
        if self.jetson_clocks is not None and len(set(self.jetson_clocks)) != len(self.jetson_clocks):
            raise ValueError("jetson_clocks names each state once")
        if len(set(self.accelerators)) != len(self.accelerators):
            raise ValueError("accelerators names each accelerator once")
        return self

    def settle_each_s(self) -> float:
        """The longest a setting takes to show: the settle timeout for a Jetson's modes; NVML's take effect at once."""
        return self.settle_timeout_s if self.power_modes is not None else 0.0

    def settings(self) -> int | None:
        """How many settings the sweep visits (None: ``all`` modes, known only on the board)."""
        if self.power_modes == "all":
            return None
        values = self.power_modes or self.power_limits_w or self.gpu_clocks_mhz
        return len(values) * (len(self.jetson_clocks) if self.jetson_clocks else 1)


class JobSpec(Request):
    """One benchmark job: an uploaded artifact, a runtime, and how to measure it.

    ``iterations`` and ``duration_s`` are exclusive; with neither, 100 iterations are timed.
    """

    artifact: str = Field(pattern=SHA256.pattern, description="sha256 of an uploaded artifact")
    runtime: Runtime = "onnxruntime"
    precision: Precision = Field("fp32", description="fp32/fp16/bf16 for torch; int8 or fp16 builds for tensorrt; "
                                                     "onnxruntime runs the model as stored")
    batch_sizes: BatchSizes = [1]
    warmup_iterations: WarmupIterations = 10
    iterations: int | None = Field(None, ge=2, le=10_000_000)
    duration_s: WindowSeconds | None = None
    min_iterations: MinIterations = Field(2, description="a duration_s window runs at least this many calls")
    idle_s: IdleSeconds = 1.0
    threads: Threads = Field(0, description="intra-op CPU threads; 0 = the runtime's default")
    profile: bool = Field(True, description="run the per-layer profiling pass after the timed windows")
    dla_core: int | None = Field(None, ge=0, le=1)
    timing_cache: str | None = Field(None, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
                                     description="tensorrt: a name; every build with it reads and updates one timing "
                                                 "cache file beside the agent's engines (a latency table's builds "
                                                 "share one: later builds skip the tactic timing earlier ones did)")
    telemetry: Annotated[list[TelemetryName], Field(max_length=3)] | Literal["auto"] = "auto"
    sample_hz: SampleHz = 20.0
    timeout_s: TimeoutSeconds | None = Field(None, description="default: the agent's job_timeout_s")
    cuda_graphs: bool = Field(False, description="torch runner on CUDA: replay a captured graph")
    channels_last: bool = True
    label: str = Field("", max_length=200, description="free text for the caller (rung, run id)")
    preprocess: PreprocessSpec | None = Field(None, description="the pipeline's preprocessing (device.preprocess."
                                                                "Preprocess.to_dict) for the smoke inference")
    evaluation: EvaluationSpec | None = Field(None, description="score the engine that was timed on this set, once, "
                                                                "after the timed windows")
    sweep: SweepSpec | None = Field(None, description="measure every batch size under each power mode × jetson_clocks "
                                                      "setting (Jetson); the device is restored afterwards")
    diverge: DivergeSpec | None = Field(None, description="a debug job: no timed window; the marked tensors of the "
                                                          "evaluation set's first images, for the build host (2.8)")
    frame: FrameSpec | None = Field(None, description="time camera frames of this size and format from bytes to "
                                                      "the task's answer (frame.postprocess), part by part, and "
                                                      "pipelined, after the windows (2.9)")
    sustained: SustainedSpec | None = Field(None, description="a sustained job: no ladder windows; the engine run "
                                                              "without pause for minutes, recorded per interval (2.10)")

    @model_validator(mode="after")
    def _window(self) -> "JobSpec":
        if self.diverge is not None:
            # A debug job post-processes nothing: its set only names the images (none; top_k from a client
            # before 2.15, which had no other).
            if self.evaluation is None or self.evaluation.postprocess not in ("none", "top_k"):
                raise ValueError("diverge runs the evaluation set's images: give evaluation (postprocess none)")
            if self.runtime not in ("tensorrt", "onnxruntime"):
                raise ValueError("diverge marks ONNX tensors as outputs: runtime tensorrt or onnxruntime")
            if self.sweep is not None or len(self.batch_sizes) != 1:
                raise ValueError("diverge builds one engine: one batch size, no sweep")
            if self.diverge.images > self.evaluation.images:
                raise ValueError(f"diverge.images {self.diverge.images} is more than the evaluation set's "
                                 f"{self.evaluation.images}")
        elif self.evaluation is not None and self.evaluation.postprocess == "none":
            raise ValueError("evaluation.postprocess none is a debug job's (diverge): name the post-processor that "
                             "scores the set (top_k, detection, segmentation)")
        if self.sustained is not None:
            batch, (settings, settle_s) = self.sustained.batch_size, self.sustained_settings()
            if batch not in self.batch_sizes:
                raise ValueError(f"sustained.batch_size {batch} is not one of batch_sizes {self.batch_sizes}")
            if self.diverge or self.frame:
                raise ValueError("a sustained job runs alone: no diverge or frame")
            if self.sweep and len(self.sweep.accelerators) > 1:
                raise ValueError("a sustained sweep runs one accelerator (sweep.accelerators has one): the board "
                                 "heats under one engine at a time")
            settings = settings or 1  # a sweep of all modes: one setting at least here, all of them on the board
            if self.timeout_s and self.sustained.budget_s(settings, settle_s) > self.timeout_s:
                raise ValueError(f"{self.sustained.budget_text(settings, settle_s)} is past timeout_s "
                                 f"{self.timeout_s:g} s: raise timeout_s or run shorter")
        if self.frame is not None and (self.preprocess is None or self.diverge is not None):
            raise ValueError("frame needs the model's preprocess (its frames are preprocessed as the application's), "
                             "and no diverge")
        if self.frame is not None and self.frame.postprocess == "detection" and (
                self.evaluation is None or self.evaluation.postprocess != "detection"):
            raise ValueError("frame.postprocess detection decodes each frame with the job's detection sidecar: give "
                             "evaluation with postprocess detection and its head")
        if self.iterations is not None and self.duration_s is not None:
            raise ValueError("give iterations or duration_s, not both")
        if isinstance(self.telemetry, list) and len(set(self.telemetry)) != len(self.telemetry):
            raise ValueError("telemetry names each sampler once")
        if self.dla_core is not None and self.runtime != "tensorrt":
            raise ValueError("dla_core needs runtime 'tensorrt'")
        if self.dla_core is not None and self.sweep is not None and self.sweep.accelerators != ["gpu"]:
            raise ValueError("a sweep names its accelerators in sweep.accelerators; leave dla_core unset")
        if self.timing_cache is not None and self.runtime != "tensorrt":
            raise ValueError("timing_cache needs runtime 'tensorrt'")
        return self

    def sustained_settings(self) -> tuple[int | None, float | None]:
        """(how many sustained runs, each setting's settling): (1, None) without a sweep; None runs for a sweep of
        ``all`` modes (counted on the board); a GPU server's settings (NVML) take effect at once."""
        return (self.sweep.settings(), self.sweep.settle_each_s()) if self.sweep is not None else (1, None)

    def marked_tensors(self) -> tuple[str, ...]:
        """The tensors a debug job marks as outputs (none for a benchmark job)."""
        return tuple(self.diverge.tensors) if self.diverge is not None else ()

    def window(self) -> dict[str, Any]:
        """Iterations or duration for :class:`device.jobs.measure.MeasureSpec`."""
        if self.duration_s is not None:
            return {"iterations": None, "duration_s": self.duration_s}
        return {"iterations": self.iterations or 100, "duration_s": None}


class Job(Strict):
    """A job as the agent reports it."""

    id: str
    state: JobState
    spec: JobSpec | None = Field(description="null only when a stored spec no longer validates (an agent upgrade "
                                             "tightened the schema): such a job is failed, never run")
    created_at: float
    started_at: float | None = None
    finished_at: float | None = None
    progress: str | None = None
    error: str | None = None
    result: dict[str, Any] | None = None


class Artifact(Strict):
    sha256: str
    kind: Literal["onnx", "torch-export", "torch-checkpoint", "eval-set", "image-set", "detection-head"]
    size_bytes: int
    stored_at: float


class Health(Strict):
    """``ok``, or ``unhealthy`` (answered with status 503) when the agent cannot run jobs."""

    status: Literal["ok", "unhealthy"]
    version: str
    uptime_s: float
    queued: int | None = Field(description="null when the job database cannot be read")
    running: int | None = None
    executor_alive: bool = True
    problem: str | None = Field(None, description="why the agent is unhealthy")


class FieldProblem(Strict):
    """One reason a request was refused: where (``loc``), what (``msg``) and pydantic's error ``type``."""

    loc: list[str | int]
    msg: str
    type: str


class ErrorBody(Strict):
    """Every refusal's body; ``errors`` lists the fields of a request that did not validate."""

    detail: str
    fix: str | None = None
    errors: list[FieldProblem] | None = None


# ---------------------------------------------------------------- the job's result
# What the agent measured, typed once: the job process builds it from these models, the client hands it over, the
# deploy stage stores it and the report reads it. A measured figure is declared once, on its field (:func:`reported`):
# the summary fills it from its telemetry series and the report's ladder detail and results.csv show it.
# Versions: "edgefold.result/MAJOR.MINOR". Written strictly (an unknown key is a producer's bug and
# fails the job); read leniently within a major version: keys a newer minor added are dropped on read,
# and a field this version added reads as "not recorded" in an older result (``Reported.since``).
# 2.2: RunResult.power_setting, JobResult.sweep; 2.3: RunResult.accelerator, NotMeasured.accelerator,
# PowerSetting.power_limit_w and gpu_locked_mhz (NVML sweeps); 2.4: runtime torch_tensorrt, RuntimeInfo.torch_tensorrt,
# JobSpec.timing_cache; 2.5: EvaluationSpec.head, EvaluationResult.detections, network_s and postprocess_s (detection);
# 2.6: JobResult.more_evaluations and evaluation_note, EvaluationResult.accelerator (every timed engine scored);
# 2.7: the build facts of TensorRT and Torch-TensorRT in RuntimeInfo.built (each runner reports its own);
# 2.8: JobSpec.diverge, JobResult.diverge; 2.9: JobSpec.frame, JobResult.frame (device.jobs.frame); 2.10: FrameSpec.in_graph,
# source images, images; FrameResult.in_graph, in_graph_error, scores, copies_ms, power; JobSpec and JobResult.sustained;
# 2.11: a sustained sweep (JobResult.more_sustained, SustainedResult.power_setting), cooling, the start's temperature
# 2.12: RuntimeInfo.loaded_from (a torch runner's artifact: a device checkpoint rebuilt here, or a trusted program);
# BuildFacts.engines (each batch's engine by its key in the agent's cache: GET /v1/engines/{key});
# 2.13: EvaluationSpec.postprocess (the job names the device's post-processor)
# 2.14: postprocess segmentation, EvaluationResult.masks and mask_shape
# 2.15: postprocess none (a debug job's images), FrameSpec.postprocess (a frame's answer by the task's post-processor)
RESULT_MAJOR, RESULT_MINOR = 2, 15
RESULT_SCHEMA = f"edgefold.result/{RESULT_MAJOR}.{RESULT_MINOR}"
_RESULT_VERSION = re.compile(r"^edgefold\.result/(?P<major>\d+)(?:\.(?P<minor>\d+))?$")
READING = {"reading": True}  # validation context of a reader: drop the keys a newer minor version added


def result_version(schema: Any) -> tuple[int, int] | None:
    """(major, minor) of a result's ``schema`` string; ``edgefold.result/2`` is 2.0; None if not a result's."""
    match = _RESULT_VERSION.match(schema) if isinstance(schema, str) else None
    return (int(match["major"]), int(match["minor"] or 0)) if match else None


class SweepResult(Measured):
    """How a sweep went: the state it found and restored, and the settings it did not measure (2.2)."""

    controlled: bool = Field(description="false: no power-mode control (no jtop): only the current mode was measured")
    note: str | None = None
    original: dict[str, Any] | None = Field(None, description="nvpmodel_id, nvpmodel_name, jetson_clocks as found")
    restored: bool | None = Field(None, description="whether the job process put the original state back (if not, "
                                                    "the agent retries and refuses other jobs until it has)")
    restore_note: str | None = None
    not_measured: list[NotMeasured] = Field(default_factory=list)


class RunResult(Measured):
    """One batch size's timed window. ``latency_*`` is the wall time of each whole call (preprocessed
    batch in, outputs out, as an application calls it); ``device_timing`` adds trtexec's two times."""

    batch_size: int
    iterations: int
    images: int
    window_s: float
    throughput_images_per_s: float = reported(
        "images per second over the window", ..., label="images/s", fmt=".0f", combine="median", batch="throughput",
        interval=("throughput_low", "throughput_high"), windows="throughput_windows")
    latency_p50_ms: float = reported(
        "the median call's wall time", ..., label="p50 ms", fmt=".3f", combine="median", batch="latency",
        interval=("latency_p50_low_ms", "latency_p50_high_ms"), windows="latency_p50_windows_ms", ladder=True)
    latency_p90_ms: float
    latency_p99_ms: float = reported(
        "the 99th percentile of the calls' wall time", ..., label="p99 ms", fmt=".3f", combine="median",
        batch="latency", interval=("latency_p99_low_ms", "latency_p99_high_ms"))
    latency_mean_ms: float
    latency_std_ms: float
    latency_cv: float
    telemetry: dict[str, TelemetrySummary] = Field(default_factory=dict)
    summary: RunSummary = Field(default_factory=RunSummary)
    power_trace: PowerTrace | None = None
    contention: Contention | None = None
    noise_flags: dict[str, str] = Field(default_factory=dict, description="why this window is noisy, with the fix")
    device_timing: DeviceTiming | None = Field(None, description="trtexec's Latency and GPU Compute Time of the "
                                                                 "same calls (TensorRT runner only)")
    power_setting: PowerSetting | None = Field(None, description="the sweep setting this window ran under (sweeps only)")
    accelerator: Accelerator | None = Field(None, description="where a sweep window ran (gpu, dla0, dla1); null: the "
                                                              "job's own (dla_core) (2.3)")


class BuildFacts(Measured):
    """What a runtime that builds its engines on the device built: the runtime's own part of :class:`RuntimeInfo`."""

    engine_path: str | None = None
    built_now: bool | None = Field(None, description="built in this job (false: loaded from the engine cache)")
    precision_built: str | None = None
    trtexec: dict[int, str] | None = Field(None, description="batch size → the trtexec line of that engine's build")
    dla_unsupported_layers: list[str] | None = None
    engines: dict[int, str] | None = Field(None, description="batch size → that engine's key in the agent's cache, "
                                                             "for GET /v1/engines/{key} (2.12)")
    host_wait: str | None = Field(None, description="how the host waits for each timed call: 'blocking-sync event' "
                                                    "(trtexec's default, without --useSpinWait) (2.12)")


class RuntimeInfo(Measured):
    """The runtime and precision that actually ran (not what the job asked for)."""

    name: Runtime
    precision: Precision = Field(description="the precision the model ran in: an ONNX Runtime model as stored "
                                             "(int8 for a Q/DQ model), a TensorRT engine as built")
    load_s: float
    python: str
    threads: int | None = Field(None, description="intra-op threads asked of the runtime (0: its default)")
    providers: list[str] | None = Field(None, description="ONNX Runtime: the execution providers the session used")
    device: str | None = Field(None, description="where it ran: torch's device, TensorRT's gpu or dla:N")
    profile_note: str | None = None
    built: BuildFacts | None = Field(None, description="what a runtime that builds engines on the device built "
                                                       "(TensorRT, Torch-TensorRT) (2.7)")

    @model_validator(mode="before")
    @classmethod
    def _built_before_2_7(cls, data: Any) -> Any:
        """A result before 2.7 kept the build facts beside the shared ones: read into ``built``, not dropped."""
        if isinstance(data, dict) and BuildFacts.model_fields.keys() & data.keys():
            data = {key: value for key, value in data.items() if key not in BuildFacts.model_fields} | {
                "built": {key: data[key] for key in BuildFacts.model_fields if key in data} | (data.get("built") or {})}
        return data
    loaded_from: dict[str, Any] | None = Field(None, description="the torch runner: what the module was loaded from "
                                                                "(a device checkpoint rebuilt by this device's "
                                                                "architecture registry, with the architecture's "
                                                                "source; or a torch.export program) (2.12)")
    torch_tensorrt: dict[str, Any] | None = Field(None, description="Torch-TensorRT: release, the rules used (with "
                                                                   "their sources), compile arguments and the ops "
                                                                   "that fell back to PyTorch, per batch (2.4)")


class Detections(Measured):
    """One image's detections as the device's post-processing left them: xyxy boxes in the network input's pixels,
    scores, and the data's class indices (2.5)."""

    boxes: list[list[float]]
    scores: list[float]
    labels: list[int]


class EvaluationResult(Measured):
    """The top-k classes the device's engine gave each image of the evaluation set (not logits), in order."""

    artifact: str
    images: int
    top_k: int
    batch_size: int = Field(description="the engine batch the set ran at (the last batch padded, the padding dropped)")
    seconds: float = Field(description="wall time of the evaluation pass (outside every timed window)")
    predictions: list[list[int]] = Field(default_factory=list, description="classification: top-k per image")
    detections: list[Detections] | None = Field(None, description="detection: each image's boxes after decode + "
                                                                 "NMS on the device (2.5)")
    masks: str | None = Field(None, description="segmentation: each image's argmax mask, N×H×W uint8, zlib then "
                                                "base64 (device.scoring.segmentation_evaluation.pack_masks) (2.14)")
    mask_shape: list[int] | None = Field(None, description="segmentation: N, H, W of masks (2.14)")
    network_s: float | None = Field(None, description="detection, segmentation: the engine's share of the pass (2.5)")
    postprocess_s: float | None = Field(None, description="detection: decode + NMS's share of the pass; "
                                                          "segmentation: the argmax's (2.5)")
    accelerator: str | None = Field(None, description="the sweep accelerator whose engine this is (gpu, dla0, dla1); "
                                                      "null: the job's own device (2.6)")

    def engine(self) -> str:  # which engine, in the report's words: "batch 8", "batch 8 on dla0"
        return f"batch {self.batch_size}" + (f" on {self.accelerator}" if self.accelerator else "")


class SmokeResult(Measured):
    image: str
    output_shape: list[int]
    top1_index: int
    preprocess: dict[str, Any]


class JobResult(Measured):
    """Everything one job measured: the spec it ran, the runtime, one :class:`RunResult` per batch size,
    the per-layer profile and the device's environment."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    schema_: str = Field(RESULT_SCHEMA, alias="schema", description="edgefold.result/MAJOR.MINOR")
    spec: JobSpec
    input_chw: list[int]
    runtime: RuntimeInfo
    smoke: SmokeResult
    telemetry_notes: list[str] = Field(default_factory=list)
    runs: list[RunResult]
    profile: dict[str, Any] | None = Field(None, description="device.jobs.profile.Profile (per-layer times)")
    evaluation: EvaluationResult | None = Field(None, description="the evaluation set's predictions by the engine "
                                                                  "that was timed (the largest batch's)")
    more_evaluations: list[EvaluationResult] = Field(default_factory=list, description="every other engine timed: "
                                                     "each batch's (TensorRT builds one per batch), each accelerator's (2.6)")
    evaluation_note: str | None = Field(None, description="why the timed batches share one score, if they do (2.6)")
    environment: dict[str, Any] = Field(default_factory=dict)
    sweep: SweepResult | None = Field(None, description="a sweep's original and restored state and the settings it "
                                                        "did not measure; its runs carry power_setting")
    diverge: DivergeResult | None = Field(None, description="a debug job's marked tensors (no runs) (2.8)")
    frame: FrameResult | None = Field(None, description="the frame's path from bytes to the task's answer "
                                                        "(JobSpec.frame) (2.9)")
    frame_error: str | None = Field(None, description="why the frame's path was not timed; the job's windows, "
                                                      "profile and evaluation stand (2.9)")
    sustained: SustainedResult | None = Field(None, description="a sustained job's intervals (2.10); a sustained "
                                                                "sweep's first setting's")
    more_sustained: list[SustainedResult] = Field(default_factory=list, description="a sustained sweep's other "
                                                                                    "settings, in its order (2.11)")

    @field_validator("schema_")
    @classmethod
    def _same_major(cls, value: str) -> str:
        version = result_version(value)
        if version is None or version[0] != RESULT_MAJOR:
            raise ValueError(f"schema {value!r} is not edgefold.result/{RESULT_MAJOR}.x")
        return value

    @property
    def minor(self) -> int:
        """The minor version the result was written with (fields added later read as not recorded)."""
        return result_version(self.schema_)[1]

    def run(self, batch_size: int) -> RunResult | None:
        """The run at ``batch_size``, if one was measured (a sweep's first setting's; see ``power_setting``)."""
        return next((run for run in self.runs if run.batch_size == batch_size), None)

    def sweep_windows(self) -> list[dict[str, Any]]:
        """One dict per timed window with its sweep setting, in the shape the report's front takes
        (``pipeline.tasks.classification.front.points_from_windows``): ``mode``, ``mode_id``, ``jetson_clocks``, ``batch_size``,
        ``accelerator`` (``gpu``, ``dla0``, ``dla1``), ``latency_p50_ms``, ``energy_mj_per_image``,
        ``throughput_images_per_s``, ``power_mean_w``, ``energy_degraded``. A window of no sweep has mode None
        (the current mode)."""
        job_accelerator = "gpu" if self.spec.dla_core is None else f"dla{self.spec.dla_core}"
        windows = []
        for run in self.runs:
            setting, summary = run.power_setting, run.summary
            accelerator = run.accelerator or job_accelerator
            windows.append({
                "mode": setting.label() if setting else None, "mode_id": setting.nvpmodel_id if setting else None,
                "jetson_clocks": setting.jetson_clocks if setting else None, "batch_size": run.batch_size,
                "accelerator": accelerator, "latency_p50_ms": run.latency_p50_ms,
                "energy_mj_per_image": summary.energy_mj_per_image,
                "throughput_images_per_s": run.throughput_images_per_s,
                "power_mean_w": None if summary.power_mean_mw is None else summary.power_mean_mw / 1000,
                "energy_degraded": summary.energy_degraded})
        return windows

    def dump(self) -> dict[str, Any]:
        """The JSON document (with its ``schema`` key). The spec's unset options are left out: a reader of an older
        minor version reads a job that used none of the newer ones (its JobSpec and a sustained run's spec refuse keys
        they do not know)."""
        document = self.model_dump(mode="json", by_alias=True)
        spec = {key: value for key, value in document["spec"].items() if value is not None}
        for part in ("frame", "sustained"):
            if spec.get(part):
                spec[part] = {key: value for key, value in spec[part].items() if value is not None}
        for run in ([document["sustained"]] if document.get("sustained") else []) + document["more_sustained"]:
            run["spec"] = {key: value for key, value in run["spec"].items() if value is not None}
        return {**document, "spec": spec}


def parse_result(data: Any, where: str = "the job result") -> JobResult:
    """Validates a result document, refusing another schema version with a clear message.

    Within the major version it reads leniently: keys a newer minor version added are dropped.

    Raises:
        SchemaVersionError: A result of another major version.
        ResultError: A document that does not fit this schema.
    """
    from pydantic import ValidationError

    from device.errors import ResultError, SchemaVersionError

    if not isinstance(data, dict):
        raise ResultError(f"{where} is not a JSON object", fix="re-run the measurement")
    version = result_version(data.get("schema"))
    if version is None or version[0] != RESULT_MAJOR:
        raise SchemaVersionError(
            f"{where} is schema {data.get('schema')!r}; this EdgeFold reads edgefold.result/{RESULT_MAJOR}.x",
            fix="use the same EdgeFold major version on the agent and here, and measure again (make edge FORCE=deploy)")
    try:
        return JobResult.model_validate(data, context=READING)
    except ValidationError as err:
        raise ResultError(f"{where} does not fit {RESULT_SCHEMA}: {describe_problems(field_problems(err.errors()))}",
                          fix="the agent and this EdgeFold disagree on the result; use the same version on both") \
            from None
