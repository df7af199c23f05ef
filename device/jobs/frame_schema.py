"""The camera frame a job times the application's whole path on (``JobSpec.frame``, recipe ``deploy.frame``), and
what it measured (``JobResult.frame``): decode, preprocess, the engine call, post-processing, the total, and the
frame rate of a two-stage pipeline (:mod:`device.jobs.frame`); the same with the preprocessing written into the graph;
and the evaluation images scored through the whole path."""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, model_serializer, model_validator

from device.jobs.window import Measured

# The parts of a frame's path, in order. The engine call holds the host→device and device→host copies: a runner
# times the call as a whole, as an application sees it.
FRAME_STAGES = ("decode", "preprocess", "engine", "postprocess")
MAX_HELD_BYTES = 1 << 30  # an 8 GB Jetson runs the engine beside them
SHA256 = re.compile(r"^[0-9a-f]{64}$")
# The name every node of the preprocessing written into a graph starts with (pipeline.deploy.frame_prefix): the device tells
# them from the network's by it (its precision is the network's, device.runners.engine; TensorRT keeps them in FP32).
PREFIX_NODES = "frame_prefix/"


class FrameImages(BaseModel):
    """The evaluation images the frames are made from (``source: images``): an uploaded image set."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)
    artifact: str = Field(pattern=SHA256.pattern, description="sha256 of the uploaded image set (uint8 N×H×W×3 RGB "
                                                              ".npy, the evaluation set's images in its order)")
    count: int = Field(ge=1, le=100_000, description="images in the set (the evaluation set's, in its order)")


class FrameSpec(BaseModel):
    """A camera frame of a size and format, made on the device (synthetic from a seed), and how long to time it."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False, frozen=True)
    width: int = Field(1920, ge=16, le=8192, description="pixels")
    height: int = Field(1080, ge=16, le=8192, description="pixels")
    format: Literal["bgr", "nv12", "jpeg"] = Field("bgr", description="bgr: packed 8-bit (a USB/CSI camera through "
                                                                      "OpenCV); nv12: YUV 4:2:0 (a hardware decoder's "
                                                                      "output); jpeg: a compressed frame (MJPEG)")
    source: Literal["synthetic", "images"] = Field(
        "synthetic", description="synthetic: frames made from the seed on the device; images: the evaluation images, "
                                 "each scaled to fit the frame, centred and encoded to the format (the device "
                                 "also scores every one through the whole path)")
    frames: int = Field(32, ge=4, le=10_000, description="frames timed per round")
    rounds: int = Field(5, ge=2, le=100, description="rounds; each stage's interval is over the rounds' medians")
    queue: int = Field(4, ge=1, le=64, description="the pipelined run's bounded queue between its two threads")
    jpeg_quality: int = Field(90, ge=10, le=100)
    seed: int = Field(0, ge=0, le=2**31 - 1)
    in_graph: str | None = Field(None, pattern=SHA256.pattern,
                                 description="sha256 of the uploaded rung with the preprocessing written into its graph "
                                             "(pipeline.deploy.frame_prefix: uint8 frame in): timed beside the CPU path")
    images: FrameImages | None = Field(None, description="the image set of source: images")
    postprocess: Literal["top_k", "detection", "segmentation"] = Field(
        "top_k", description="what a frame's engine outputs are reduced to, by the device's post-processor the job "
                             "names (device.scoring.postprocessors): top_k classes; detection, the boxes (the job's "
                             "evaluation sidecar decodes them, then NMS); segmentation, the mask (the argmax) (2.15)")
    needs_artifacts: ClassVar[bool] = True  # a job names its uploads; a recipe's form (the deploy stage fills them) not

    @model_serializer(mode="wrap")
    def _on_the_wire(self, handler) -> dict[str, Any]:
        """Without ``postprocess`` where it is top_k (or unset, a recipe's form): the bytes an agent before 2.15
        accepts (it refuses an unknown key), and a classification frame job's cache key as before."""
        data = handler(self)
        if isinstance(data, dict) and "postprocess" in data and data["postprocess"] in ("top_k", None):
            del data["postprocess"]
        return data

    @model_validator(mode="after")
    def _nv12_even(self) -> "FrameSpec":
        if self.source == "images" and self.postprocess not in ("top_k", None):
            raise ValueError(f"source: images scores each frame's top-k classes against the labels; a "
                             f"{self.postprocess} frame is timed on synthetic frames (source: synthetic)")
        if self.needs_artifacts and (self.source == "images") != (self.images is not None):
            raise ValueError("source: images needs images (the uploaded image set), and images needs source: images")
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


class FrameForm(Measured):
    """The frame's path with the preprocessing inside the engine (``FrameSpec.in_graph``): decode (JPEG), the engine
    (the prefix and the network), post-processing; timed in the same rounds as the CPU path, interleaved with it."""

    stages: list[FrameStageTimes]
    total: FrameStageTimes
    sequential_fps_rounds: list[float]
    pipelined_fps_rounds: list[float]
    bound: str
    bound_text: str


class FrameScores(Measured):
    """The evaluation images through the whole path (``source: images``): each image's top-k by the CPU path, and by
    the in-graph form where it was timed; the build host holds the labels and scores them."""

    artifact: str
    images: int
    top_k: int
    predictions: list[list[int]]
    in_graph_predictions: list[list[int]] | None = None
    seconds: float


class FramePower(Measured):
    """The board's power over the whole frame timing (both forms, every round: one telemetry window around them)."""

    source: str = Field(description="sampler:series, as the job's windows name it")
    mean_mw: float
    peak_mw: float
    window_s: float
    energy_mj_per_frame: float = Field(description="the window's energy ÷ the frames run in it: an average over "
                                                   "the mix of forms (CPU path, in the graph) and modes (one by one, "
                                                   "pipelined) the rounds interleave, not one of them (2.12)")
    temp_peak_c: float | None = Field(None, description="the hottest temperature any sampler read in the window")


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
    top1_agreement: float = Field(description="share of frames whose answer on the pipelined path equals the "
                                              "sequential path's: the top-1 class; detection, the same boxes and "
                                              "classes; segmentation, the same mask (the same frames; 1.0 unless the "
                                              "runtime is non-deterministic)")
    copies_ms: dict[str, float] | None = Field(None, description="host→device and device→host copies inside the engine "
                                                                 "call, medians (TensorRT's CUDA events; None where "
                                                                 "the runtime has no copies to time apart)")
    in_graph: FrameForm | None = None
    in_graph_error: str | None = Field(None, description="why the in-graph form was not timed")
    scores: FrameScores | None = None
    power: FramePower | None = None
    power_note: str | None = Field(None, description="why there is no power over the frame timing")
    frames_timed: int | None = Field(None, description="the frames run inside the telemetry window: every form's "
                                                       "rounds, one by one and pipelined (2.12)")
    note: str = ""
