"""The synthetic segmentation set: shapes (each a class) composited on textured backgrounds, their masks exact
because they are drawn, not annotated; written once by the data stage, read by every later stage.

Made like the detection canvases (objects on textures, seeded): every pixel's class is the last shape drawn over it,
so an occluded shape's mask is what remains visible. Easy on purpose at the tiny recipe's size: its numbers test the
plumbing, not the method.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device.errors import DataError

CLASSES = ("background", "circle", "square", "triangle")
"""Class 0 is the background; a mask holds these indices."""
IGNORE = 255
"""A mask pixel of no class (VOC's and Cityscapes' "void"): left out of the loss and of every score."""


@dataclass
class SegmentationSplit:
    """Images (N×H×W×3 ``uint8``) and their masks (N×H×W ``uint8`` class indices)."""

    images: np.ndarray
    masks: np.ndarray

    def __len__(self) -> int:
        return len(self.images)


def _texture(rng: np.random.Generator, size: int, amplitude: float) -> np.ndarray:
    """A smooth random background (low-resolution noise, bilinearly enlarged) around a random base colour."""
    import cv2

    base = rng.uniform(40, 215, size=3)
    coarse = rng.uniform(-1, 1, size=(max(2, size // 8), max(2, size // 8), 3)).astype(np.float32)
    noise = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_LINEAR)
    return np.clip(base + 120 * amplitude * noise, 0, 255)


def _shape(kind: int, size: int, rng: np.random.Generator) -> np.ndarray:
    """A boolean mask of one shape of class ``kind`` somewhere on the canvas."""
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32) + 0.5
    radius = rng.uniform(0.12, 0.24) * size
    cy, cx = rng.uniform(radius, size - radius, size=2)
    if CLASSES[kind] == "circle":
        return (yy - cy) ** 2 + (xx - cx) ** 2 <= radius ** 2
    if CLASSES[kind] == "square":
        return (np.abs(yy - cy) <= radius * 0.85) & (np.abs(xx - cx) <= radius * 0.85)
    # A triangle pointing up: below the two slanted edges and above the base.
    top, base = cy - radius, cy + radius * 0.8
    half = (yy - top) / (base - top) * radius
    return (yy >= top) & (yy <= base) & (np.abs(xx - cx) <= half)


def canvases(count: int, size: int, objects: tuple[int, int], texture: float, seed: int) -> SegmentationSplit:
    """``count`` canvases with their masks, the same for the same arguments."""
    rng = np.random.default_rng(seed)
    images = np.empty((count, size, size, 3), np.uint8)
    masks = np.zeros((count, size, size), np.uint8)
    for index in range(count):
        image = _texture(rng, size, texture)
        for _ in range(int(rng.integers(objects[0], objects[1] + 1))):
            kind = int(rng.integers(1, len(CLASSES)))
            drawn = _shape(kind, size, rng)
            image[drawn] = rng.uniform(0, 255, size=3)
            masks[index][drawn] = kind
        images[index] = np.round(image).astype(np.uint8)
    return SegmentationSplit(images, masks)


def make_set(cfg) -> tuple[tuple[str, ...], dict[str, SegmentationSplit]]:
    """The synthetic set of the recipe's ``data`` and its classes: train and test drawn from two seeds apart, each
    class present in both.

    Raises:
        DataError: A split in which a class never appears (too few images or shapes to score it).
    """
    splits = {"train": canvases(cfg.train_images, cfg.size, tuple(cfg.objects), cfg.texture, cfg.seed * 2),
              "test": canvases(cfg.test_images, cfg.size, tuple(cfg.objects), cfg.texture, cfg.seed * 2 + 1)}
    for name, split in splits.items():
        missing = [CLASSES[k] for k in range(len(CLASSES)) if not (split.masks == k).any()]
        if missing:
            raise DataError(f"{cfg.source}: no {', '.join(missing)} pixel in the {name} split of {len(split)} images",
                            fix="raise data.train_images / data.test_images or data.objects")
    return CLASSES, splits


def save_splits(path: Path, splits: dict[str, SegmentationSplit]) -> Path:
    np.savez(path, **{f"{name}_{key}": getattr(split, key) for name, split in splits.items()
                      for key in ("images", "masks")})
    return path


def load_split(path: Path, name: str) -> SegmentationSplit:
    """One split of the data stage's ``canvases.npz``."""
    with np.load(path, allow_pickle=False) as data:
        return SegmentationSplit(data[f"{name}_images"], data[f"{name}_masks"])


def network_inputs(images: np.ndarray) -> np.ndarray:
    """N×H×W×3 ``uint8`` images as the network takes them: N×3×H×W float32 in 0–1 (also the device's evaluation set)."""
    return np.ascontiguousarray(images.transpose(0, 3, 1, 2), dtype=np.float32) / 255.0
