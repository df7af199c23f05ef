"""A composited detection set on disk: one ``.npz`` of plain arrays (no pickles) written by the data stage."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from device.errors import DataError
from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.metrics import Boxes


def save_splits(path: Path, splits: dict[str, DetectionSplit]) -> Path:
    """Writes each split's images and its boxes flattened with their image index."""
    arrays = {}
    for name, split in splits.items():
        arrays[f"{name}_images"] = split.images
        arrays[f"{name}_boxes"] = np.concatenate([b.xyxy for b in split.boxes]).reshape(-1, 4)
        arrays[f"{name}_labels"] = np.concatenate([b.labels for b in split.boxes]).astype(np.int64)
        arrays[f"{name}_image"] = np.concatenate([np.full(len(b.labels), i) for i, b in enumerate(split.boxes)]
                                                 ).astype(np.int64)
    with open(path, "wb") as handle:
        np.savez(handle, **arrays)
    return path


def load_split(path: Path, name: str) -> DetectionSplit:
    """One split back from :func:`save_splits`.

    Raises:
        DataError: The file lacks the split (written by another version, or damaged).
    """
    with np.load(path, allow_pickle=False) as archive:
        if f"{name}_images" not in archive.files:
            raise DataError(f"{path} holds no {name!r} split", fix="rerun the data stage (--force data)")
        images, image = archive[f"{name}_images"], archive[f"{name}_image"]
        boxes, labels = archive[f"{name}_boxes"], archive[f"{name}_labels"]
    return DetectionSplit(images, [Boxes(boxes[image == i], labels[image == i]) for i in range(len(images))])


def recorded_classes(ctx) -> list[str]:
    """The class names the data stage recorded (``data/dataset.json``), in label order."""
    return json.loads(ctx.manifest.output("data", "dataset").read_text())["classes"]
