"""The agent's request and result schema, shared by the agent, its client and the pipeline.

Unknown fields are rejected (a typo in a job spec must not silently fall back to a default), and
every number carries its unit in its name.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from device.errors import EdgeFoldError
from pydantic import BaseModel, ConfigDict, Field, model_validator

SHA256 = re.compile(r"^[0-9a-f]{64}$")
Runtime = Literal["onnxruntime", "tensorrt", "torch"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
JobState = Literal["queued", "running", "succeeded", "failed", "interrupted", "cancelled"]
FINISHED = ("succeeded", "failed", "interrupted", "cancelled")
TelemetryName = Literal["host", "nvml", "jtop"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobSpec(Strict):
    """One benchmark job: an uploaded artifact, a runtime, and how to measure it.

    ``iterations`` and ``duration_s`` are exclusive; with neither, 100 iterations are timed.
    """

    artifact: str = Field(pattern=SHA256.pattern, description="sha256 of an uploaded artifact")
    runtime: Runtime = "onnxruntime"
    precision: Precision = Field("fp32", description="fp32/fp16/bf16 for torch; int8 or fp16 builds for tensorrt; "
                                                     "onnxruntime runs the model as stored")
    batch_sizes: list[int] = Field(default=[1], min_length=1, max_length=8)
    warmup_iterations: int = Field(10, ge=0, le=100_000)
    iterations: int | None = Field(None, ge=2, le=10_000_000)
    duration_s: float | None = Field(None, gt=0, le=3600)
    idle_s: float = Field(1.0, ge=0, le=60)
    threads: int = Field(0, ge=0, le=256, description="intra-op CPU threads; 0 = the runtime's default")
    dla_core: int | None = Field(None, ge=0, le=1)
    telemetry: list[TelemetryName] | Literal["auto"] = "auto"
    sample_hz: float = Field(20.0, gt=0, le=1000)
    timeout_s: float | None = Field(None, gt=0, le=86_400, description="default: the agent's job_timeout_s")
    cuda_graphs: bool = Field(False, description="torch runner on CUDA: replay a captured graph")
    channels_last: bool = True
    label: str = Field("", max_length=200, description="free text for the caller (rung, run id)")
    preprocess: dict[str, Any] | None = Field(None, description="the pipeline's preprocessing (device.preprocess."
                                                                 "Preprocess.to_dict) for the smoke inference")

    @model_validator(mode="after")
    def _window(self) -> "JobSpec":
        if self.iterations is not None and self.duration_s is not None:
            raise ValueError("give iterations or duration_s, not both")
        if any(not 1 <= b <= 4096 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be in [1, 4096], got {self.batch_sizes}")
        if self.preprocess is not None:
            from device.preprocess import Preprocess

            try:
                Preprocess.from_dict(self.preprocess)
            except (TypeError, KeyError, ValueError, EdgeFoldError) as err:  # a client's mistake: 422, never 500
                raise ValueError(f"preprocess: {err}") from None
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
    spec: JobSpec
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
    status: Literal["ok"]
    version: str
    uptime_s: float
    queued: int
    running: int


class ErrorBody(Strict):
    detail: str
    fix: str | None = None
