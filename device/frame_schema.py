"""The camera frame a job times the application's whole path on (``JobSpec.frame``, recipe ``deploy.frame``), and
what it measured (``JobResult.frame``): decode, preprocess, the engine call, post-processing, the total, and the
frame rate of a two-stage pipeline (:mod:`device.frame`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from device.window import Measured

# The parts of a frame's path, in order. The engine call holds the host→device and device→host copies: a runner
# times the call as a whole, as an application sees it.
FRAME_STAGES = ("decode", "preprocess", "engine", "postprocess")
MAX_HELD_BYTES = 1 << 30  # an 8 GB Jetson runs the engine beside them


class FrameSpec(BaseModel):
    """A camera frame of a size and format, made on the device (synthetic from a seed), and how long to time it."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)
    width: int = Field(1920, ge=16, le=8192, description="pixels")
    height: int = Field(1080, ge=16, le=8192, description="pixels")
    format: Literal["bgr", "nv12", "jpeg"] = Field("bgr", description="bgr: packed 8-bit (a USB/CSI camera through "
                                                                      "OpenCV); nv12: YUV 4:2:0 (a hardware decoder's "
                                                                      "output); jpeg: a compressed frame (MJPEG)")
    source: Literal["synthetic"] = Field("synthetic", description="frames made from the seed on the device")
    frames: int = Field(32, ge=4, le=10_000, description="frames timed per round")
    rounds: int = Field(5, ge=2, le=100, description="rounds; each stage's interval is over the rounds' medians")
    queue: int = Field(4, ge=1, le=64, description="the pipelined run's bounded queue between its two threads")
    jpeg_quality: int = Field(90, ge=10, le=100)
    seed: int = Field(0, ge=0, le=2**31 - 1)

    @model_validator(mode="after")
    def _nv12_even(self) -> "FrameSpec":
        if self.format == "nv12" and (self.width % 2 or self.height % 2):
            raise ValueError(f"an NV12 frame has even width and height (its chroma is subsampled 2×2), got "
                             f"{self.width}×{self.height}")
        held = self.frames * self.width * self.height * 3  # the frames are made once and held while they are timed
        if held > MAX_HELD_BYTES:
            raise ValueError(f"{self.frames} frames of {self.width}×{self.height} hold {held / 2**30:.1f} GiB; at most "
                             f"{MAX_HELD_BYTES // 2**30} GiB: fewer frames (they are reused every round)")
        return self


class FrameStageTimes(Measured):
    """One part of the frame's path: each round's median over its frames, ms."""

    stage: str
    round_medians_ms: list[float]
    median_ms: float = Field(description="the median of the rounds' medians")


class FrameResult(Measured):
    """The frame's path as measured: per part and in total (sequential, one frame after another), and the frame rate
    when decode + preprocess run in a thread of their own ahead of the engine (a bounded queue between them)."""

    spec: FrameSpec
    batch_size: int = Field(description="the engine batch the frames ran at (1, or the smallest the runner takes, the "
                                        "frame repeated)")
    stages: list[FrameStageTimes]
    total: FrameStageTimes
    sequential_fps_rounds: list[float] = Field(description="frames per second one by one, each round's, from the "
                                                           "first answer to the last")
    pipelined_fps_rounds: list[float] = Field(description="frames per second pipelined, each round's, from the first "
                                                          "answer to the last (the queue's filling left out)")
    bound: str = Field(description="the largest part of the slower of the pipeline's two threads (decode + "
                                   "preprocess, engine + postprocess): what sets the pipelined frame rate")
    bound_text: str
    top1_agreement: float = Field(description="share of frames whose top-1 on the pipelined path equals the "
                                              "sequential path's (the same frames; 1.0 unless the runtime is "
                                              "non-deterministic)")
    note: str = ""
