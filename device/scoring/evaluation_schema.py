"""A job's evaluation: the set the device runs through the engine it timed, and the post-processor the job names
(:mod:`device.scoring.postprocessors`). Part of :class:`device.schema.JobSpec`."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

SHA256 = re.compile(r"^[0-9a-f]{64}$")

Postprocess = Literal["top_k", "detection", "segmentation", "none"]
"""The device's post-processors by name (:data:`device.scoring.postprocessors.POSTPROCESSORS` loads each); ``none``: the
engine's outputs as they are, a debug job's (``JobSpec.diverge``: its set names the images, nothing scores them)."""


class EvaluationSpec(BaseModel):
    """An evaluation set the job runs through the engine it timed, outside the timed windows: an uploaded
    ``.npy`` of preprocessed images (float32, N×C×H×W, the shared preprocessing) named by its sha256."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)  # as device.schema.Request

    artifact: str = Field(pattern=SHA256.pattern, description="sha256 of the uploaded evaluation set (.npy)")
    images: int = Field(ge=1, le=1_000_000, description="how many images the set holds (checked on the device)")
    top_k: int = Field(5, ge=1, le=5, description="predictions returned per image (k = min(5, classes))")
    head: str | None = Field(None, pattern=SHA256.pattern,
                             description="sha256 of an uploaded detection sidecar (.head.json): the device decodes "
                                         "and runs NMS after each batch and returns detections, not classes (2.5)")
    postprocess: Postprocess | None = Field(
        None, description="the post-processor the device runs on the engine's outputs (device.scoring.postprocessors): "
                          "top_k classes, detection (the sidecar head's decode + NMS) or segmentation (the argmax over "
                          "classes, a mask per image, 2.14), or none (a debug job's images, 2.15); named by the job, "
                          "so the device never guesses the task from which fields are set. Absent (a client before "
                          "2.13): detection where head is given, else top_k (2.13)")

    @model_serializer(mode="wrap")
    def _on_the_wire(self, handler) -> dict[str, Any]:
        """Without ``postprocess`` where ``head`` implies it: the bytes an agent and a reader before 2.13 accept
        (both refuse an unknown key), and the deploy cache's keys as before. A post-processor no older agent has is
        always written, and refused there by name."""
        data = handler(self)
        if isinstance(data, dict) and data.get("postprocess") == ("detection" if self.head is not None else "top_k"):
            del data["postprocess"]
        return data

    @model_validator(mode="after")
    def _named_postprocessor(self) -> "EvaluationSpec":
        if self.postprocess is None:  # a job from a client before 2.13, which named no post-processor
            self.postprocess = "detection" if self.head is not None else "top_k"
        if (self.postprocess == "detection") != (self.head is not None):
            raise ValueError(f"postprocess {self.postprocess} "
                             + ("needs head: the sha256 of the uploaded .head.json sidecar" if self.head is None
                                else "takes no head (a detection sidecar): name postprocess detection"))
        return self
