"""From camera frame to answer: the application's whole path timed on the device, part by part.

A frame of the job's size and format (:class:`device.frame_schema.FrameSpec`) is decoded (JPEG; NV12 converted; BGR
as it comes), preprocessed by the project's one definition (:class:`device.preprocess.Preprocess`: BGR → RGB, the
shorter side resized, centre-cropped, normalized) on the device's CPU with OpenCV, run through the engine (the call as
an application makes it, its copies inside) and reduced to its top-k classes. Each part is timed per frame over
rounds; then the same frames run through a two-stage pipeline — one thread decoding and preprocessing ahead, a
bounded queue, the engine's thread for the rest — whose frame rate is what a camera application sustains. Only numpy
and OpenCV here.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from typing import Any, Callable, Sequence

import numpy as np

from device.errors import ConfigError, require
from device.frame_schema import FRAME_STAGES, FrameSpec
from device.preprocess import Preprocess

WARMUP_FRAMES = 2
# A pipelined rate under this share of the slower thread's ceiling: the two threads are not running side by side.
SHARED_CORES = 0.8


def _cv2():
    return require("cv2", "OpenCV", "pip install 'opencv-python-headless<5'")


def synthetic_frames(spec: FrameSpec, count: int) -> list[Any]:
    """``count`` frames of the spec's size and format, from its seed: smooth colour fields with grain (JPEG encodes
    them to realistic sizes; a flat or white-noise frame would not)."""
    cv2 = _cv2()
    rng = np.random.default_rng(spec.seed)
    frames = []
    for _ in range(count):
        coarse = rng.integers(0, 256, (max(2, spec.height // 32), max(2, spec.width // 32), 3), dtype=np.uint8)
        bgr = cv2.resize(coarse, (spec.width, spec.height), interpolation=cv2.INTER_CUBIC)
        bgr = np.clip(bgr.astype(np.int16) + rng.integers(-12, 13, bgr.shape, dtype=np.int16), 0, 255).astype(np.uint8)
        if spec.format == "jpeg":
            ok, encoded = cv2.imencode(".jpg", bgr, [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality])
            if not ok:
                raise ConfigError("OpenCV could not encode a JPEG frame", fix="check the agent's OpenCV build")
            frames.append(encoded)
        elif spec.format == "nv12":
            frames.append(to_nv12(bgr))
        else:
            frames.append(bgr)
    return frames


def to_nv12(bgr: np.ndarray) -> np.ndarray:
    """A BGR frame as NV12: the Y plane, then U and V interleaved at half resolution ((H·3/2)×W bytes)."""
    cv2 = _cv2()
    height, width = bgr.shape[:2]
    i420 = cv2.cvtColor(bgr, cv2.COLOR_BGR2YUV_I420)  # Y, then the U plane, then the V plane
    y, chroma = i420[:height], i420[height:].reshape(2, height // 2, width // 2)
    interleaved = np.stack([chroma[0], chroma[1]], axis=-1).reshape(height // 2, width)
    return np.ascontiguousarray(np.concatenate([y, interleaved]))


def decoder(fmt: str) -> tuple[Callable[[Any], np.ndarray], str]:
    """The frame format's way to a colour image as OpenCV gives it, and that image's channel order: BGR for a BGR or
    JPEG frame, RGB for NV12 (converted to RGB directly: no full-frame channel swap after it)."""
    cv2 = _cv2()
    if fmt == "jpeg":
        return (lambda frame: cv2.imdecode(frame, cv2.IMREAD_COLOR)), "bgr"
    if fmt == "nv12":
        return (lambda frame: cv2.cvtColor(frame, cv2.COLOR_YUV2RGB_NV12)), "rgb"
    return (lambda frame: frame), "bgr"


def top_k(logits: np.ndarray, k: int) -> np.ndarray:
    """The first row's k best classes, best first (the answer an application acts on)."""
    row = np.asarray(logits, dtype=np.float32).reshape(logits.shape[0], -1)[0]
    k = min(k, row.size)
    best = np.argpartition(row, -k)[-k:]
    return best[np.argsort(row[best])[::-1]]


class FramePath:
    """One frame's way from camera bytes to top-k on a loaded runner.

    Args:
        runner: A loaded :class:`device.runners.base.Runner`.
        preprocess: The model's preprocessing (the job's ``preprocess``).
        spec: The frame's size, format and timing.
        batch_size: The engine batch to call (the frame repeated where the runner takes no batch of 1).
        k: Classes kept per frame.
    """

    def __init__(self, runner, preprocess: Preprocess, spec: FrameSpec, batch_size: int = 1, k: int = 5):
        self.runner, self.preprocess, self.spec = runner, preprocess, spec
        self.batch_size, self.k = batch_size, k
        self.decode, self.order = decoder(spec.format)

    def prepare(self, image: np.ndarray) -> np.ndarray:
        """The decoded frame as the network's input: :class:`Preprocess` exactly, which takes RGB. A BGR frame's
        channels are swapped after the resize and crop, on the network's few pixels (resizing works per channel, so
        the result is the same); a grey model's conversion weighs RGB, so its frame is swapped first."""
        if self.order == "bgr" and self.preprocess.channels == 1:
            image, swap = _cv2().cvtColor(image, _cv2().COLOR_BGR2RGB), False
        else:
            swap = self.order == "bgr"
        pixels = self.preprocess.geometry(image)
        batch = self.preprocess.normalize((pixels[:, :, ::-1] if swap else pixels)[None])
        return np.repeat(batch, self.batch_size, axis=0) if self.batch_size > 1 else batch

    def timed(self, frame: Any) -> tuple[list[float], np.ndarray]:
        """One frame, sequentially: each part's seconds, and the answer."""
        marks = [time.perf_counter()]
        bgr = self.decode(frame)
        marks.append(time.perf_counter())
        batch = self.prepare(bgr)
        marks.append(time.perf_counter())
        logits = self.runner.infer(batch)
        marks.append(time.perf_counter())
        answer = top_k(logits, self.k)
        marks.append(time.perf_counter())
        return [b - a for a, b in zip(marks, marks[1:])], answer

    def pipelined(self, frames: Sequence[Any]) -> tuple[float, list[np.ndarray]]:
        """The frames through two threads (decode + preprocess ahead, the engine and top-k behind, a bounded queue
        between): frames per second from the first answer to the last (the queue's filling left out), and the
        answers. Either thread's failure stops the other and is raised here."""
        handoff: queue.Queue = queue.Queue(maxsize=self.spec.queue)
        stop = threading.Event()
        failed: list[BaseException] = []

        def hand_over(item) -> None:
            while not stop.is_set():
                try:
                    handoff.put(item, timeout=0.1)
                    return
                except queue.Full:
                    continue

        def produce() -> None:
            try:
                for frame in frames:
                    if stop.is_set():
                        return
                    hand_over(self.prepare(self.decode(frame)))
            except BaseException as err:  # noqa: BLE001 (handed to the engine's thread, which raises it)
                failed.append(err)
            finally:
                hand_over(None)

        worker = threading.Thread(target=produce, name="frame-decode", daemon=True)
        worker.start()
        answers, first = [], None
        try:
            while (batch := handoff.get()) is not None:
                answers.append(top_k(self.runner.infer(batch), self.k))
                first = first or time.perf_counter()
            seconds = time.perf_counter() - (first or time.perf_counter())
        finally:
            stop.set()
            worker.join()
        if failed:
            raise failed[0]
        return (len(answers) - 1) / seconds if seconds > 0 else float("nan"), answers


def bound_words(medians_ms: dict[str, float], pipelined_fps: float) -> tuple[str, str]:
    """The part that sets the pipelined frame rate, and the sentence that says so.

    The pipeline's two threads run decode + preprocess and engine + post-processing side by side: the slower of the
    two sets the rate, and the largest part within it is named. What the slower thread alone would allow (from the
    one-by-one medians) is a ceiling; a measured rate well below it means the two threads compete for the same cores
    (the runtime's own threads among them), and the sentence says so.
    """
    producer = medians_ms["decode"] + medians_ms["preprocess"]
    consumer = medians_ms["engine"] + medians_ms["postprocess"]
    group = ("decode", "preprocess") if producer > consumer else ("engine", "postprocess")
    bound = max(group, key=medians_ms.__getitem__)
    ceiling = 1000 / max(producer, consumer)
    engine_fps = 1000 / medians_ms["engine"] if medians_ms["engine"] > 0 else float("inf")
    shared = ("; the threads compete for the same cores" if pipelined_fps < SHARED_CORES * ceiling else "")
    if bound == "engine":
        return bound, (f"the engine bounds the frame rate: {pipelined_fps:.0f} fps pipelined (its thread alone "
                       f"≈{ceiling:.0f}; decode and preprocess take {producer:.2f} ms a frame beside it{shared})")
    return bound, (f"{bound} bounds the frame rate: {pipelined_fps:.0f} fps pipelined (its thread alone "
                   f"≈{ceiling:.0f}, the engine alone ≈{engine_fps:.0f}{shared})")


def time_frames(runner, preprocess: Preprocess, spec: FrameSpec, accepted: Sequence[int] | None = None,
                k: int = 5, progress: Callable[[str], None] = lambda text: None) -> dict[str, Any]:
    """Times the frame's path on a loaded runner: ``spec.rounds`` rounds of ``spec.frames`` frames, each round one
    by one (every part timed per frame) and pipelined (the frame rate), the same frames in both, the order alternating.
    The intervals the report gives are over these rounds, within one job.

    Args:
        accepted: The batch sizes the runner was built for (TensorRT: one engine each); None: any.

    Returns:
        A :class:`device.frame_schema.FrameResult` as a dict.
    """
    batch_size = 1 if not accepted or 1 in accepted else min(accepted)
    path = FramePath(runner, preprocess, spec, batch_size, k)
    progress(f"frames: making {spec.frames} {spec.width}×{spec.height} {spec.format}")
    frames = synthetic_frames(spec, spec.frames)
    for frame in frames[:WARMUP_FRAMES]:
        path.timed(frame)
    per_stage: dict[str, list[float]] = {name: [] for name in (*FRAME_STAGES, "total")}
    sequential_fps, pipelined_fps, agreement = [], [], []
    for index in range(spec.rounds):
        progress(f"frames: round {index + 1}/{spec.rounds}")
        if index % 2:  # every other round pipelined first: neither form always runs on a warmer device
            fps, piped = path.pipelined(frames)
        times, answers, ends = [], [], []
        for frame in frames:  # timed like the pipelined run: from the first answer to the last, by the wall clock
            parts, answer = path.timed(frame)
            times.append(parts)
            answers.append(answer)
            ends.append(time.perf_counter())
        if not index % 2:
            fps, piped = path.pipelined(frames)
        for position, name in enumerate(FRAME_STAGES):
            per_stage[name].append(1000 * statistics.median(t[position] for t in times))
        per_stage["total"].append(1000 * statistics.median(sum(t) for t in times))
        sequential_fps.append((len(frames) - 1) / (ends[-1] - ends[0]))
        pipelined_fps.append(fps)
        agreement.append(np.mean([a[0] == b[0] for a, b in zip(answers, piped)]))
    medians = {name: statistics.median(values) for name, values in per_stage.items()}
    bound, text = bound_words(medians, statistics.median(pipelined_fps))
    stages = [{"stage": name, "round_medians_ms": per_stage[name], "median_ms": medians[name]}
              for name in FRAME_STAGES]
    return {"spec": spec.model_dump(), "batch_size": batch_size, "stages": stages,
            "total": {"stage": "total", "round_medians_ms": per_stage["total"], "median_ms": medians["total"]},
            "sequential_fps_rounds": sequential_fps, "pipelined_fps_rounds": pipelined_fps, "bound": bound,
            "bound_text": text, "top1_agreement": float(np.mean(agreement)),
            "note": ("the engine call holds the host→device and device→host copies (the runner times the call as a "
                     "whole)") + (f"; batch {batch_size} (the frame repeated): the runner takes no batch of 1"
                                  if batch_size > 1 else "")}
