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
from pydantic import BaseModel, ConfigDict, Field, model_validator

SHA256 = re.compile(r"^[0-9a-f]{64}$")
Runtime = Literal["onnxruntime", "tensorrt", "torch"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
JobState = Literal["queued", "running", "succeeded", "failed", "interrupted", "cancelled"]
FINISHED = ("succeeded", "failed", "interrupted", "cancelled")
TelemetryName = Literal["host", "nvml", "jtop"]
Interpolation = Literal["bilinear", "area", "nearest", "bicubic"]
BatchSize = Annotated[int, Field(ge=1, le=4096)]
# On the [0,1] scale real values are near 0.5; the bounds only keep absurd numbers out.
MeanValue = Annotated[float, Field(ge=-1000, le=1000)]
StdValue = Annotated[float, Field(gt=0, le=1000)]


def safe_text(value: Any, limit: int | None = None) -> str:
    """``value`` as text that UTF-8 (and so JSON) can always carry: lone surrogates become ``\\udXXX``.

    Args:
        value: Anything; ``str()`` is taken.
        limit: Cut to this many characters (with an ellipsis) when given.
    """
    text = str(value)
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    if limit is not None and len(text) > limit:
        text = text[:limit] + "…"
    return text


def field_problems(errors: list[dict[str, Any]], limit: int = 20) -> list[dict[str, Any]]:
    """Pydantic's ``errors()`` as :class:`FieldProblem` dicts that JSON can always carry.

    The offending input is left out on purpose: it may be NaN, a lone surrogate or megabytes long,
    and echoing it is what turned refusals into 500s.
    """
    problems = []
    for error in errors[:limit]:
        loc = [part if isinstance(part, int) and not isinstance(part, bool) else safe_text(part, 100)
               for part in error.get("loc", ())]
        problems.append({"loc": loc, "msg": safe_text(error.get("msg", ""), 300),
                         "type": safe_text(error.get("type", ""), 60)})
    return problems


def describe_problems(problems: list[dict[str, Any]]) -> str:
    """One line naming every problem: ``duration_s: Input should be a finite number; …``."""
    return "; ".join(f"{'.'.join(map(str, p['loc'])) or '(body)'}: {p['msg']}" for p in problems)


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

    @model_validator(mode="after")
    def _consistent(self) -> "PreprocessSpec":
        from device.preprocess import Preprocess

        try:  # the device-side definition performs the cross-field checks (resize ≥ input_size, one value a channel)
            Preprocess.from_dict(self.model_dump())
        except EdgeFoldError as err:
            raise ValueError(err.message) from None
        return self


class JobSpec(Request):
    """One benchmark job: an uploaded artifact, a runtime, and how to measure it.

    ``iterations`` and ``duration_s`` are exclusive; with neither, 100 iterations are timed.
    """

    artifact: str = Field(pattern=SHA256.pattern, description="sha256 of an uploaded artifact")
    runtime: Runtime = "onnxruntime"
    precision: Precision = Field("fp32", description="fp32/fp16/bf16 for torch; int8 or fp16 builds for tensorrt; "
                                                     "onnxruntime runs the model as stored")
    batch_sizes: list[BatchSize] = Field(default=[1], min_length=1, max_length=8)
    warmup_iterations: int = Field(10, ge=0, le=100_000)
    iterations: int | None = Field(None, ge=2, le=10_000_000)
    duration_s: float | None = Field(None, gt=0, le=3600)
    idle_s: float = Field(1.0, ge=0, le=60)
    threads: int = Field(0, ge=0, le=256, description="intra-op CPU threads; 0 = the runtime's default")
    dla_core: int | None = Field(None, ge=0, le=1)
    telemetry: Annotated[list[TelemetryName], Field(max_length=3)] | Literal["auto"] = "auto"
    sample_hz: float = Field(20.0, gt=0, le=1000)
    timeout_s: float | None = Field(None, gt=0, le=86_400, description="default: the agent's job_timeout_s")
    cuda_graphs: bool = Field(False, description="torch runner on CUDA: replay a captured graph")
    channels_last: bool = True
    label: str = Field("", max_length=200, description="free text for the caller (rung, run id)")
    preprocess: PreprocessSpec | None = Field(None, description="the pipeline's preprocessing (device.preprocess."
                                                                "Preprocess.to_dict) for the smoke inference")

    @model_validator(mode="after")
    def _window(self) -> "JobSpec":
        if self.iterations is not None and self.duration_s is not None:
            raise ValueError("give iterations or duration_s, not both")
        if isinstance(self.telemetry, list) and len(set(self.telemetry)) != len(self.telemetry):
            raise ValueError("telemetry names each sampler once")
        if self.dla_core is not None and self.runtime != "tensorrt":
            raise ValueError("dla_core needs runtime 'tensorrt'")
        return self

    def window(self) -> dict[str, Any]:
        """Iterations or duration for :class:`device.measure.MeasureSpec`."""
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
    kind: Literal["onnx", "torch-export"]
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
