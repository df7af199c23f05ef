"""From camera frame to answer: the application's whole path timed on the device, part by part.

A frame of the job's size and format (:class:`device.jobs.frame_schema.FrameSpec`) is decoded (JPEG; NV12 converted; BGR
as it comes), preprocessed by the project's one definition (:class:`device.preprocess.Preprocess`: BGR → RGB, the
shorter side resized, centre-cropped, normalized) on the device's CPU with OpenCV, run through the engine (the call as
an application makes it, its copies inside) and reduced to the task's answer by the post-processor the job names
(:class:`FrameAnswer`: top-k classes, a detector's boxes, a mask). Each part is timed per frame over
rounds; then the same frames run through a two-stage pipeline — one thread decoding and preprocessing ahead, a
bounded queue, the engine's thread for the rest — whose frame rate is what a camera application sustains. Only numpy
and OpenCV here.
"""

from __future__ import annotations

import queue
import statistics
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from device.errors import ConfigError, require
from device.files import sha256_file
from device.jobs.frame_schema import FRAME_STAGES, FrameImages, FrameSpec
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


@dataclass(frozen=True)
class FrameAnswer:
    """What the engine's outputs for one frame come to, by the post-processor the job names
    (:func:`device.scoring.postprocessors.frame_answer`).

    Attributes:
        reduce: The outputs of one engine call (the frame first in the batch) → the frame's answer.
        same: Whether two answers to the same frame agree (the pipelined run's against the one-by-one run's).
    """

    reduce: Callable[[Any], Any]
    same: Callable[[Any, Any], bool]


def top_k_answer(k: int = 5) -> FrameAnswer:
    """A classifier's answer: its k best classes; two agree on their top-1."""
    return FrameAnswer(lambda logits: top_k(logits, k), lambda a, b: bool(a[0] == b[0]))


class FramePath:
    """One frame's way from camera bytes to the task's answer on a loaded runner.

    Args:
        runner: A loaded :class:`device.runners.base.Runner`.
        preprocess: The model's preprocessing (the job's ``preprocess``).
        spec: The frame's size, format and timing.
        batch_size: The engine batch to call (the frame repeated where the runner takes no batch of 1).
        k: Classes kept per frame (top-k).
        answer: The task's post-processing; None: top-k classes.
    """

    def __init__(self, runner, preprocess: Preprocess, spec: FrameSpec, batch_size: int = 1, k: int = 5,
                 answer: FrameAnswer | None = None):
        self.runner, self.preprocess, self.spec = runner, preprocess, spec
        self.batch_size, self.k = batch_size, k
        self.answer = answer or top_k_answer(k)
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
        outputs = self.runner.infer(batch)
        marks.append(time.perf_counter())
        answer = self.answer.reduce(outputs)
        marks.append(time.perf_counter())
        return [b - a for a, b in zip(marks, marks[1:])], answer

    def pipelined(self, frames: Sequence[Any]) -> tuple[float, list[Any]]:
        """The frames through two threads (decode + preprocess ahead, the engine and its answer behind, a bounded queue
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
                answers.append(self.answer.reduce(self.runner.infer(batch)))
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


def frame_from_image(image: np.ndarray, spec: FrameSpec) -> Any:
    """An evaluation image as the camera would frame it (``source: images``): scaled (bilinear) to fit the frame,
    centred on mid-grey, in the spec's format. A frame wider than the image keeps it whole inside the shorter side's
    centre crop, so the model sees what it saw on the build host through the camera's resampling and codec."""
    cv2 = _cv2()
    image = image if image.ndim == 3 and image.shape[2] == 3 else np.repeat(image.reshape(*image.shape[:2], 1), 3, 2)
    scale = min(spec.height / image.shape[0], spec.width / image.shape[1])
    height, width = max(1, round(image.shape[0] * scale)), max(1, round(image.shape[1] * scale))
    canvas = np.full((spec.height, spec.width, 3), 128, dtype=np.uint8)
    top, left = (spec.height - height) // 2, (spec.width - width) // 2
    canvas[top : top + height, left : left + width] = cv2.resize(np.ascontiguousarray(image[:, :, ::-1]),
                                                                 (width, height), interpolation=cv2.INTER_LINEAR)
    if spec.format == "jpeg":
        ok, encoded = cv2.imencode(".jpg", canvas, [cv2.IMWRITE_JPEG_QUALITY, spec.jpeg_quality])
        if not ok:
            raise ConfigError("OpenCV could not encode a JPEG frame", fix="check the agent's OpenCV build")
        return encoded
    return to_nv12(canvas) if spec.format == "nv12" else canvas


class InGraphPath(FramePath):
    """The frame's path with the preprocessing inside the engine (:mod:`pipeline.deploy.frame_prefix`): the frame's bytes as
    they come (JPEG decoded to BGR first) are the engine's uint8 input."""

    def __init__(self, runner, preprocess: Preprocess, spec: FrameSpec, batch_size: int = 1, k: int = 5,
                 answer: FrameAnswer | None = None):
        super().__init__(runner, preprocess, spec, batch_size, k, answer)
        if spec.format != "jpeg":
            self.decode = lambda frame: frame

    def prepare(self, image: np.ndarray) -> np.ndarray:
        batch = image[None]
        return np.repeat(batch, self.batch_size, axis=0) if self.batch_size > 1 else batch


def _one_round(path: FramePath, frames: Sequence[Any], pipelined_first: bool, copies: list[dict]) -> dict[str, Any]:
    """One round of one form: every frame one by one (each part timed) and pipelined, in the order asked."""
    if pipelined_first:
        fps, piped = path.pipelined(frames)
    times, answers, ends = [], [], []
    for frame in frames:  # timed like the pipelined run: from the first answer to the last, by the wall clock
        parts, answer = path.timed(frame)
        times.append(parts)
        answers.append(answer)
        ends.append(time.perf_counter())
        device_ms = getattr(path.runner, "last_device_ms", None)
        if device_ms and "h2d_ms" in device_ms:
            copies.append(device_ms)
    if not pipelined_first:
        fps, piped = path.pipelined(frames)
    return {"stages": [1000 * statistics.median(t[position] for t in times) for position in range(len(FRAME_STAGES))],
            "total": 1000 * statistics.median(sum(t) for t in times),
            "sequential_fps": (len(frames) - 1) / (ends[-1] - ends[0]), "pipelined_fps": fps,
            "agreement": float(np.mean([path.answer.same(a, b) for a, b in zip(answers, piped)])),
            "frames": 2 * len(frames)}  # one by one, then pipelined (or the other way round)


def _form(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """A form's rounds as :class:`device.jobs.frame_schema.FrameForm`'s fields."""
    per_stage = {name: [r["stages"][position] for r in rounds] for position, name in enumerate(FRAME_STAGES)}
    totals = [r["total"] for r in rounds]
    medians = {name: statistics.median(values) for name, values in per_stage.items()}
    pipelined = [r["pipelined_fps"] for r in rounds]
    bound, text = bound_words(medians, statistics.median(pipelined))
    return {"stages": [{"stage": name, "round_medians_ms": per_stage[name], "median_ms": medians[name]}
                       for name in FRAME_STAGES],
            "total": {"stage": "total", "round_medians_ms": totals, "median_ms": statistics.median(totals)},
            "sequential_fps_rounds": [r["sequential_fps"] for r in rounds], "pipelined_fps_rounds": pipelined,
            "bound": bound, "bound_text": text}


def frame_batch(accepted: Sequence[int] | None) -> int:
    """The engine batch a frame runs at: 1, or the smallest the runner was built for (the frame repeated)."""
    return 1 if not accepted or 1 in accepted else min(accepted)


def load_image_set(path: str, images: FrameImages) -> np.ndarray:
    """The stored image set, memory-mapped, once its bytes and count are the job's.

    Raises:
        ConfigError: Another set's bytes, or another count, naming both.
    """
    actual = sha256_file(path)
    if actual != images.artifact:
        raise ConfigError(f"the frame image set's bytes hash to sha256 {actual}, not {images.artifact} as the job says",
                          fix="upload the set again (the deploy stage does), then resubmit the job")
    data = np.load(path, mmap_mode="r", allow_pickle=False)
    if data.shape[0] != images.count:
        raise ConfigError(f"the frame image set holds {data.shape[0]} images, the job says {images.count}",
                          fix="resubmit the job with the set's own count")
    return data


def time_frames(runner, preprocess: Preprocess, spec: FrameSpec, accepted: Sequence[int] | None = None,
                k: int = 5, progress: Callable[[str], None] = lambda text: None, graph_runner=None,
                images: np.ndarray | None = None,
                around_rounds: Callable[[Callable[[], None]], Any] = lambda work: work(),
                answer: FrameAnswer | None = None) -> dict[str, Any]:
    """Times the frame's path on a loaded runner: ``spec.rounds`` rounds of ``spec.frames`` frames, each round one
    by one (every part timed per frame) and pipelined (the frame rate), the same frames in both, the order alternating;
    with ``graph_runner`` (the rung with the preprocessing in its graph), that form too, interleaved round by round.
    The intervals the report gives are over these rounds, within one job. With ``images`` (``source: images``) the
    frames are made from them, and every one is then scored through the whole path (:func:`score_images`).

    Args:
        accepted: The batch sizes the runner was built for (TensorRT: one engine each); None: any.
        around_rounds: Runs the timed rounds (a telemetry window around them, :func:`device.jobs.jobrun.frame_times`).
        answer: The task's post-processing (None: top-k classes; ``images`` are scored by top-k only).

    Returns:
        A :class:`device.jobs.frame_schema.FrameResult` as a dict.
    """
    batch_size = frame_batch(accepted)
    paths = {"cpu": FramePath(runner, preprocess, spec, batch_size, k, answer)}
    if graph_runner is not None:
        paths["in_graph"] = InGraphPath(graph_runner, preprocess, spec, batch_size, k, answer)
    progress(f"frames: making {spec.frames} {spec.width}×{spec.height} {spec.format}")
    frames = ([frame_from_image(images[i % len(images)], spec) for i in range(spec.frames)] if images is not None
              else synthetic_frames(spec, spec.frames))
    failures: dict[str, str] = {}

    def run_form(name: str, work: Callable[[], Any]) -> Any:
        """The in-graph form's failure drops that form, said in the result; the CPU path's fails the frame job."""
        try:
            return work()
        except Exception as err:  # noqa: BLE001 (a runtime's own error on the in-graph engine)
            if name == "cpu":
                raise
            failures[name] = f"{type(err).__name__}: {(str(err).strip().splitlines() or [''])[0]}"
            paths.pop(name, None)
            return None

    for name, path in list(paths.items()):
        run_form(name, lambda: [path.timed(frame) for frame in frames[:WARMUP_FRAMES]])
    rounds: dict[str, list[dict[str, Any]]] = {name: [] for name in paths}
    copies: list[dict] = []

    def timed_rounds() -> None:
        for index in range(spec.rounds):
            progress(f"frames: round {index + 1}/{spec.rounds}")
            # Every other round reversed: neither form, nor the pipelined run, always runs on a warmer device.
            for name in (list(paths) if index % 2 == 0 else list(paths)[::-1]):
                measured = run_form(name, lambda: _one_round(paths[name], frames, pipelined_first=bool(index % 2),
                                                             copies=copies if name == "cpu" else []))
                if measured is not None:
                    rounds[name].append(measured)

    around_rounds(timed_rounds)
    cpu = _form(rounds["cpu"])
    # Every frame that ran inside the telemetry window: each form's rounds, one by one and pipelined.
    frames_timed = sum(r["frames"] for form in rounds.values() for r in form)
    # The spec's unset options left out: a reader one minor version older refuses keys its FrameSpec does not know.
    result = {"spec": spec.model_dump(exclude_none=True), "batch_size": batch_size, **cpu, "frames_timed": frames_timed,
              "top1_agreement": float(np.mean([r["agreement"] for r in rounds["cpu"]])),
              "copies_ms": ({"h2d": statistics.median(c["h2d_ms"] for c in copies),
                             "d2h": statistics.median(c["d2h_ms"] for c in copies)} if copies else None),
              "note": ("the engine call holds the host→device and device→host copies" +
                       (" (timed apart by CUDA events: copies_ms)" if copies else " (the runtime has none to time "
                                                                                  "apart, or does not say)"))
                      + (f"; batch {batch_size} (the frame repeated; the in-graph form repeats the whole uint8 frame, "
                         f"its copy and prefix {batch_size}× a frame's): the runner takes no batch of 1"
                         if batch_size > 1 else "")}
    if "in_graph" in paths:  # timed in every round (a failure while scoring, below, leaves its timing standing)
        result["in_graph"] = _form(rounds["in_graph"])
    if images is not None:
        result["scores"] = score_images(paths, images, spec, k, progress, run_form)
    if failures:
        result["in_graph_error"] = failures["in_graph"]
    return result


def score_images(paths: dict[str, FramePath], images: np.ndarray, spec: FrameSpec, k: int,
                 progress: Callable[[str], None] = lambda text: None,
                 run_form: Callable[[str, Callable[[], Any]], Any] = lambda name, work: work()) -> dict[str, Any]:
    """Every image, framed and encoded as :func:`frame_from_image` does, through each form's whole path: decode,
    preprocess, the engine, top-k (the application's answer on the evaluation images); progress with rate and ETA."""
    started = said = time.perf_counter()
    predictions: dict[str, list[list[int]]] = {name: [] for name in paths}
    for done, image in enumerate(images, start=1):
        frame = frame_from_image(np.asarray(image), spec)
        for name, path in list(paths.items()):
            answer = run_form(name, lambda: path.timed(frame)[1])
            if answer is not None:
                predictions[name].append([int(c) for c in answer])
        if (now := time.perf_counter()) - said > 2 or done == 1:
            rate = done / (now - started)
            progress(f"frames: scoring images through the whole path, {done}/{len(images)} ({rate:.0f}/s, "
                     f"ETA {(len(images) - done) / rate:.0f} s)")
            said = now
    return {"artifact": spec.images.artifact, "images": len(images), "top_k": len(predictions["cpu"][0]),
            "predictions": predictions["cpu"],
            "in_graph_predictions": predictions["in_graph"] if "in_graph" in paths else None,
            "seconds": time.perf_counter() - started}
