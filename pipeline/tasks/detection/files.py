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


def planned_classes(recipe) -> list[str]:
    """The class names the data stage will record, read before it runs (a preflight's): a composited set's source
    classes, or a COCO file's categories sorted by id.

    Raises:
        DataError: The COCO file is missing or not JSON with categories (the data stage would say the same).
    """
    from pipeline.tasks.detection.data import parse_coco_argument
    from pipeline.tasks.detection.recipe import DETECTION_SOURCES

    source = recipe.data.source
    if source in DETECTION_SOURCES:
        from pipeline.core.data.sources import load_source

        return list(load_source(DETECTION_SOURCES[source]).classes)
    path, _ = parse_coco_argument(source.partition(":")[2])
    try:
        categories = json.loads(Path(path).read_text())["categories"]
        return [c["name"] for c in sorted(categories, key=lambda c: c["id"])]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise DataError(f"COCO annotations {path} give no categories ({type(err).__name__}: {err})",
                        fix="DATA=coco:/path/annotations.json[@/path/images] with a categories list") from None
