"""A debug job's request and result (``JobSpec.diverge``, ``JobResult.diverge``, 2.8): the rung's engine with tensors
marked as extra outputs, and what it kept (:mod:`device.jobs.debug_tensors`). Re-exported by :mod:`device.schema`."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, field_validator

from device.jobs.window import Measured

SHA256 = re.compile(r"^[0-9a-f]{64}$")
# An ONNX tensor name as exporters write them (``/layer1/layer1.0/conv1/Conv_output_0``): printable, bounded.
TensorName = Annotated[str, Field(min_length=1, max_length=512, pattern=r"^[^\x00-\x1f\x7f]+$")]
# What one debug job may return: the marked tensors of its images, float32, at most this many bytes.
DIVERGE_MAX_BYTES = 512 << 20


class DivergeSpec(BaseModel):
    """A debug job (3.0's ``edgefold diverge``): build the rung's engine with ``tensors`` marked as extra outputs, run
    the first ``images`` of the job's evaluation set through it, and keep those tensors' values for the build host,
    which compares them with ONNX Runtime's (``GET /v1/jobs/{id}/tensors``). Marking a tensor changes how TensorRT
    may fuse around it, so the host marks a few at a time (Polygraphy's ``--trt-outputs`` by hand, NVIDIA/TensorRT#3161).
    """

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # as device.schema.Request
    tensors: Annotated[list[TensorName], Field(min_length=1, max_length=256)] = Field(
        description="tensor names of the ONNX graph, each returned for every image")
    images: int = Field(4, ge=1, le=256, description="the first images of the evaluation set to run")
    max_bytes: int = Field(64 << 20, ge=1, le=DIVERGE_MAX_BYTES,
                           description="refuse the job when the tensors' float32 values would exceed this")

    @field_validator("tensors")
    @classmethod
    def _once(cls, value: list[str]) -> list[str]:
        if len(set(value)) != len(value):
            raise ValueError("name each tensor once")
        return value


class MarkedTensor(Measured):
    """One tensor a debug job returned (2.8)."""

    name: str
    shape: list[int] = Field(description="images first: [images, …]")
    layer: str | None = Field(None, description="the engine layer (or ONNX node) that writes it, where known")


class DivergeResult(Measured):
    """What a debug job kept: the marked tensors' values in ``tensors.npz`` beside the job (2.8)."""

    images: int
    batch_size: int
    tensors: list[MarkedTensor]
    sha256: str = Field(pattern=SHA256.pattern, description="of the .npz the agent serves at /v1/jobs/{id}/tensors")
    size_bytes: int
    seconds: float
