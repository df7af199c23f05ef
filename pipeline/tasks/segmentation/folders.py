"""A user's own segmentation set, in one of the two layouts the field publishes its masks in, read and checked whole
before any training: every image with its mask, the same size, only known class indices (and 255, the layouts'
"void": ignored by the loss and the scores); every bad pair named.

- ``voc:/path/VOC2012``: ``JPEGImages/<id>.jpg``, ``SegmentationClass/<id>.png`` (palette-indexed, as VOC ships
  them), the splits listed in ``ImageSets/Segmentation/train.txt`` and ``val.txt`` (the test split); 21 classes.
- ``cityscapes:/path``: ``leftImg8bit/{train,val}/<city>/<name>_leftImg8bit.png`` and
  ``gtFine/{train,val}/<city>/<name>_gtFine_labelTrainIds.png`` (cityscapesScripts' ``createTrainIdLabelImgs``
  writes them); 19 classes.

At most ``data.train_images`` and ``data.test_images`` pairs are taken, drawn by ``data.seed``; each image is
resized to the recipe's square (bilinear; its mask nearest-neighbour, so no class is invented at a boundary), its
aspect not kept.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from device.errors import DataError
from pipeline.tasks.segmentation.data import IGNORE, SegmentationSplit

VOC_CLASSES = ("background", "aeroplane", "bicycle", "bird", "boat", "bottle", "bus", "car", "cat", "chair", "cow",
               "diningtable", "dog", "horse", "motorbike", "person", "pottedplant", "sheep", "sofa", "train",
               "tvmonitor")
CITYSCAPES_CLASSES = ("road", "sidewalk", "building", "wall", "fence", "pole", "traffic light", "traffic sign",
                      "vegetation", "terrain", "sky", "person", "rider", "car", "truck", "bus", "train", "motorcycle",
                      "bicycle")
LAYOUTS = {"voc": VOC_CLASSES, "cityscapes": CITYSCAPES_CLASSES}
SHOWN = 10  # bad pairs named in the message; the count says how many more


def _voc_pairs(root: Path, split: str) -> list[tuple[str, Path, Path]]:
    listing = root / "ImageSets" / "Segmentation" / f"{split}.txt"
    if not listing.is_file():
        raise DataError(f"voc:{root}: no {listing.relative_to(root)} (the split's image ids)",
                        fix="point voc: at the VOC2012 folder (the one holding JPEGImages and SegmentationClass)")
    ids = [line.strip() for line in listing.read_text().splitlines() if line.strip()]
    return [(i, root / "JPEGImages" / f"{i}.jpg", root / "SegmentationClass" / f"{i}.png") for i in ids]


def _cityscapes_pairs(root: Path, split: str) -> list[tuple[str, Path, Path]]:
    images = sorted((root / "leftImg8bit" / split).glob("*/*_leftImg8bit.png"))
    if not images:
        raise DataError(f"cityscapes:{root}: no leftImg8bit/{split}/<city>/*_leftImg8bit.png",
                        fix="point cityscapes: at the folder holding leftImg8bit and gtFine")
    pairs = []
    for image in images:
        name = image.name[: -len("_leftImg8bit.png")]
        mask = root / "gtFine" / split / image.parent.name / f"{name}_gtFine_labelTrainIds.png"
        pairs.append((f"{image.parent.name}/{name}", image, mask))
    return pairs


def layout_files(source: str) -> dict[str, list[tuple[str, Path, Path]]]:
    """``{"train", "test"}`` → ``[(id, image, mask)]`` of a ``voc:`` or ``cityscapes:`` source, before any is read."""
    layout, _, where = source.partition(":")
    root = Path(where).expanduser()
    if not root.is_dir():
        raise DataError(f"{source}: {root} is not a folder", fix=f"give the {layout} folder's path after {layout}:")
    lister = _voc_pairs if layout == "voc" else _cityscapes_pairs
    return {"train": lister(root, "train"), "test": lister(root, "val")}


def _chosen(pairs: list, count: int, seed: int) -> list:
    if count >= len(pairs):
        return pairs
    order = np.random.default_rng(seed).permutation(len(pairs))[:count]
    return [pairs[i] for i in sorted(order)]


def _read(image_path: Path, mask_path: Path, classes: int) -> tuple[np.ndarray | None, np.ndarray | None, str | None]:
    """The pair as arrays, or why it is refused."""
    from PIL import Image

    if not image_path.is_file():
        return None, None, f"no image {image_path.name}"
    if not mask_path.is_file():
        return None, None, f"no mask {mask_path.name}"
    try:
        with Image.open(image_path) as image:
            rgb = np.asarray(image.convert("RGB"))
        with Image.open(mask_path) as mask:
            if mask.mode not in ("P", "L"):  # an RGB rendering of the mask holds colours, not class indices
                return None, None, f"mask {mask_path.name} is {mask.mode}, not class indices (P or L)"
            indices = np.asarray(mask)
    except (OSError, ValueError) as err:
        return None, None, f"cannot be decoded ({type(err).__name__}: {err})"
    if indices.shape != rgb.shape[:2]:
        return None, None, f"mask {indices.shape[1]}×{indices.shape[0]} for an image {rgb.shape[1]}×{rgb.shape[0]}"
    unknown = sorted(set(np.unique(indices).tolist()) - set(range(classes)) - {IGNORE})
    if unknown:
        return None, None, f"mask holds class indices {unknown[:5]} beyond the {classes} classes (and {IGNORE})"
    return rgb, indices, None


def read_layout(source: str, train_images: int, test_images: int, size: int,
                seed: int) -> tuple[tuple[str, ...], dict[str, SegmentationSplit]]:
    """The layout's classes and its two splits at ``size``×``size``.

    Raises:
        DataError: A missing folder or split list, or any bad pair (each named, the first :data:`SHOWN`).
    """
    import cv2

    classes = LAYOUTS[source.partition(":")[0]]
    files = layout_files(source)
    splits, bad = {}, []
    for name, listed, count in (("train", "train", train_images), ("test", "val", test_images)):
        chosen = _chosen(files[name], count, seed)
        if not chosen:
            raise DataError(f"{source}: the {listed} split lists no image", fix="check the layout's split files")
        images = np.empty((len(chosen), size, size, 3), np.uint8)
        masks = np.empty((len(chosen), size, size), np.uint8)
        for index, (item, image_path, mask_path) in enumerate(chosen):
            rgb, indices, why = _read(image_path, mask_path, len(classes))
            if why:
                bad.append(f"{listed} {item}: {why}")
                continue
            images[index] = cv2.resize(rgb, (size, size), interpolation=cv2.INTER_LINEAR)
            masks[index] = cv2.resize(indices, (size, size), interpolation=cv2.INTER_NEAREST)
        splits[name] = SegmentationSplit(images, masks)
    if bad:
        more = f" and {len(bad) - SHOWN} more" if len(bad) > SHOWN else ""
        raise DataError(f"{source}: {len(bad)} bad image/mask pair(s): " + "; ".join(bad[:SHOWN]) + more,
                        fix="fix or remove them from the split lists; nothing was trained")
    return classes, splits
