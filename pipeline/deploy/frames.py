"""What a frame job (``deploy.frame``) needs beside the rung, for every task: each rung with the preprocessing written
into its graph (:mod:`pipeline.deploy.frame_prefix`), and for ``source: images`` the evaluation images as they were taken.
The deploy stage's task writes them once per run (:func:`write_frame_files`) and turns the recipe's frame into each
job's, naming its post-processor (:meth:`FrameFiles.spec`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from device.client import AgentError
from device.errors import ConfigError
from device.jobs.frame_schema import FrameImages, FrameSpec
from device.preprocess import Preprocess

# Evaluation images of different sizes are each cut to their centre square at the median shorter side, at most this.
MAX_SIDE = 1024


@dataclass
class FrameFiles:
    """The recipe's frame, each rung's in-graph ONNX and the image set, written on the build host."""

    recipe: Any  # pipeline.core.recipe_jobs.FrameRecipe
    postprocess: str = "top_k"  # the task's post-processor (FrameSpec.postprocess)
    in_graph: dict[str, Path] = field(default_factory=dict)
    in_graph_note: str | None = None
    in_graph_difference: float | None = None  # the prefix's largest difference from the CPU path, checked here
    images: Path | None = None
    image_count: int = 0
    images_note: str | None = None
    log: Callable[[str], None] = print

    def spec(self, client, rung: str) -> FrameSpec:
        """The job's frame for ``rung``, its files uploaded through the device's ``client`` (content-addressed: once
        per device). What cannot be uploaded is logged, and the job times what it has."""
        fields = {**self.recipe.model_dump(exclude={"in_graph", "images", "postprocess"}),
                  "postprocess": self.postprocess}
        if rung in self.in_graph:
            try:
                fields["in_graph"] = client.upload(self.in_graph[rung])
            except AgentError as err:
                self.log(f"the in-graph form of {rung} was not uploaded: {err.message}")
        if self.images is not None:
            try:
                fields["images"] = FrameImages(artifact=client.upload(self.images), count=self.image_count)
            except AgentError as err:
                self.log(f"the frame image set was not uploaded ({err.message}): synthetic frames instead")
                fields["source"] = "synthetic"
        return FrameSpec(**fields)

    def record(self, stage: str) -> dict[str, Any]:
        """What the deploy stage's results keep of them: the notes, and each file's path in the run (in the stage's
        folder ``stage``: the files are written while it is still a partial folder, renamed at the end)."""
        return {"in_graph": {rung: f"{stage}/{path.name}" for rung, path in self.in_graph.items()},
                "in_graph_note": self.in_graph_note, "in_graph_difference": self.in_graph_difference,
                "images": self.image_count or None, "images_note": self.images_note}


def frame_files(ctx, artifacts: dict[str, Path], workdir: Path, preprocess: dict[str, dict[str, Any]],
                postprocess: str, raw_images: Callable[[], list[np.ndarray]] | None = None) -> FrameFiles | None:
    """The run's frame files for ``deploy.frame`` (:func:`write_frame_files`), their notes logged; None without a
    frame in the recipe."""
    import threading

    if ctx.recipe.deploy.frame is None:
        return None
    lock = threading.Lock()  # the frame files log from the devices' threads too (an upload that failed)

    def log(text: str) -> None:
        with lock:
            ctx.log(f"[  deploy] {text}")

    files = write_frame_files(ctx.recipe.deploy.frame, workdir, artifacts, preprocess, raw_images, log, postprocess)
    for note in filter(None, (files.in_graph_note, files.images_note)):
        ctx.log(f"[  deploy] frames: {note}")
    return files


def write_frame_files(recipe, workdir: Path, artifacts: dict[str, Path], preprocess: dict[str, dict[str, Any]],
                      raw_images: Callable[[], list[np.ndarray]] | None, log: Callable[[str], None],
                      postprocess: str = "top_k") -> FrameFiles:
    """Writes each rung's graph with the prefix in front (``frame-<rung>.onnx``) unless ``recipe.in_graph`` is off
    or the preprocessing cannot be written into a graph (said in ``in_graph_note``), and the image set
    (``frame-images.images.npy``) from ``raw_images`` when the frames come from the evaluation images.

    Args:
        preprocess: Each rung's preprocessing (:meth:`device.preprocess.Preprocess.to_dict`), by rung.
        postprocess: The task's post-processor, which each job's frame names.
    """
    from pipeline.deploy.frame_prefix import write_prefixed

    files = FrameFiles(recipe, postprocess, log=log)
    preps = {rung: Preprocess.from_dict(preprocess[rung]) for rung in artifacts}
    why = None if recipe.in_graph else "deploy.frame.in_graph is false"
    if not why:
        why, files.in_graph_difference = _checked_prefixes(dict.fromkeys(preps.values()), recipe)
    if why:
        files.in_graph_note = f"the in-graph form was not timed: {why}"
    else:
        unwritten = []
        for rung, path in artifacts.items():
            try:
                files.in_graph[rung] = write_prefixed(path, preps[rung], recipe, workdir / f"frame-{rung}.onnx")
            except ConfigError as err:
                unwritten.append(f"{rung} ({err.message})")
        if unwritten:
            files.in_graph_note = f"the in-graph form was not written for {'; '.join(unwritten)}"
    if recipe.source == "images" and raw_images is not None:
        stacked, files.images_note = image_set(raw_images())
        files.images = workdir / "frame-images.images.npy"
        np.save(files.images, stacked, allow_pickle=False)
        files.image_count = len(stacked)
    return files


def _checked_prefixes(preps, recipe) -> tuple[str | None, float | None]:
    """Why no rung's prefix is timed (the first preprocessing that cannot be written into a graph, or whose prefix
    misses its own tolerance: it would not be timed as the preprocessing), or None and the largest difference from the
    CPU path over them."""
    from pipeline.deploy.frame_prefix import check_prefix, refusal

    largest = 0.0
    for prep in preps:
        why = refusal(prep)
        if why:
            return why, None
        try:
            largest = max(largest, check_prefix(prep, recipe))
        except ConfigError as err:
            return err.message, None
    return None, largest


def image_set(images: list[np.ndarray]) -> tuple[np.ndarray, str | None]:
    """The images as one uint8 N×H×W×3 RGB array (grey repeated): as taken when they share a size; otherwise each
    one's centre square at the median shorter side (at most :data:`MAX_SIDE`), and a note that says so."""
    import cv2

    colour = [np.repeat(i.reshape(*i.shape[:2], 1), 3, 2) if i.ndim == 2 or i.shape[2] == 1 else i[:, :, :3]
              for i in images]
    if len({i.shape for i in colour}) == 1:
        return np.ascontiguousarray(np.stack(colour), dtype=np.uint8), None
    side = min(MAX_SIDE, int(np.median([min(i.shape[:2]) for i in colour])))
    squares = []
    for image in colour:
        short = min(image.shape[:2])
        top, left = (image.shape[0] - short) // 2, (image.shape[1] - short) // 2
        squares.append(cv2.resize(np.ascontiguousarray(image[top:top + short, left:left + short]), (side, side),
                                  interpolation=cv2.INTER_AREA))
    return np.stack(squares).astype(np.uint8), (f"the evaluation images differ in size: each was sent as its centre "
                                                f"square at {side}×{side}")


def tensor_preprocess(size: int, channel_order: str = "rgb", input_range: str = "0-1") -> dict[str, Any]:
    """The camera frame's preprocessing for a network that takes its image as plain pixels (detection, segmentation:
    its graph normalizes): the shorter side resized to ``size`` (OpenCV's bilinear), the centre square cut, scaled to
    0–1 (``input_range`` ``0-255``: as they are), in the network's channel order."""
    scale = 255.0 if input_range == "0-255" else 1.0
    return Preprocess(input_size=size, resize=size, channels=3, mean=(0.0, 0.0, 0.0), std=(1 / scale,) * 3,
                      interpolation="bilinear", channel_order=channel_order).to_dict()
