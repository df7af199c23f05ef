"""Detection data: a set composited offline from classification images, or the user's COCO JSON.

No labelled detection set is packaged offline, so the embedded default is built from images already
here: objects (Fashion-MNIST garments for the default recipe, scikit-learn's digits for the CI one)
placed at random scales and positions on textured canvases, several per image, each box the exact
extent of its object's pixels. It is seeded and its parameters (:class:`CanvasSpec`) go in the
manifest, so a run can be rebuilt byte for byte. A user's data comes as COCO JSON; bad annotations
(a box outside its image, an unknown category, an image that is missing) are all named before training.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

from device.errors import DataError
from pipeline.tasks.detection.metrics import Boxes, iou

FOREGROUND = 32  # an object pixel: brighter than this (garments and digits are light on black)


@dataclass(frozen=True)
class CanvasSpec:
    """How the composited set is made (recorded in the manifest).

    Attributes:
        size: Canvas side, pixels.
        objects: Fewest and most objects per image.
        scale: Smallest and largest object side, as a fraction of the canvas side.
        max_iou: Two objects overlap at most this much (boxes IoU).
        texture: Background texture amplitude, 0–1 of full scale.
        seed: Drives every choice.
    """

    size: int = 96
    objects: tuple[int, int] = (1, 4)
    scale: tuple[float, float] = (0.2, 0.5)
    max_iou: float = 0.2
    texture: float = 0.3
    seed: int = 0

    def __post_init__(self) -> None:
        low, high = self.objects
        if not 1 <= low <= high <= 32:
            raise DataError(f"canvas objects {self.objects}: need 1 ≤ fewest ≤ most ≤ 32", fix="e.g. objects: [1, 4]")
        if not 0 < self.scale[0] <= self.scale[1] <= 1:
            raise DataError(f"canvas scale {self.scale}: need 0 < smallest ≤ largest ≤ 1", fix="e.g. scale: [0.2, 0.5]")
        if self.size < 16:
            raise DataError(f"canvas size {self.size} is below 16 pixels", fix="e.g. size: 96")


@dataclass
class DetectionSplit:
    """Images (N×H×W uint8) and each image's boxes (pixels, xyxy) and class indices."""

    images: np.ndarray
    boxes: list[Boxes]

    def __len__(self) -> int:
        return len(self.images)


@dataclass
class DetectionSet:
    name: str
    classes: list[str]
    train: DetectionSplit
    test: DetectionSplit
    generator: dict[str, Any] = field(default_factory=dict)


def _texture(rng: np.random.Generator, size: int, amplitude: float) -> np.ndarray:
    import cv2

    coarse = rng.random((max(2, size // 12), max(2, size // 12)))
    smooth = cv2.resize(coarse, (size, size), interpolation=cv2.INTER_CUBIC)
    fine = rng.random((size, size))
    return np.clip(255 * amplitude * (0.7 * smooth + 0.3 * fine), 0, 255)


def composite(objects: np.ndarray, labels: np.ndarray, count: int, spec: CanvasSpec,
              rng: np.random.Generator) -> DetectionSplit:
    """``count`` canvases with objects drawn from ``objects`` (N×h×w uint8, light on black) and their exact boxes.

    Each box is the extent of the object's foreground pixels (brighter than :data:`FOREGROUND`): they are
    pasted opaque, and the fainter pixels around them (the resize's soft edge) blend into the texture by
    their brightness, so on a black canvas exactly the boxed pixels stand out.
    """
    import cv2

    canvases = np.zeros((count, spec.size, spec.size), np.uint8)
    all_boxes = []
    for index in range(count):
        canvas = _texture(rng, spec.size, spec.texture)
        boxes, classes = [], []
        for _ in range(int(rng.integers(spec.objects[0], spec.objects[1] + 1))):
            for _attempt in range(20):
                source = int(rng.integers(len(objects)))
                side = max(4, int(round(spec.size * rng.uniform(*spec.scale))))
                sprite = cv2.resize(objects[source], (side, side), interpolation=cv2.INTER_AREA).astype(np.float64)
                ys, xs = np.nonzero(sprite > FOREGROUND)
                if not len(ys):
                    continue
                top, left = int(rng.integers(0, spec.size - side + 1)), int(rng.integers(0, spec.size - side + 1))
                box = np.array([left + xs.min(), top + ys.min(), left + xs.max() + 1, top + ys.max() + 1], np.float64)
                if boxes and iou(box[None], np.array(boxes)).max() > spec.max_iou:
                    continue
                alpha = np.clip(sprite / FOREGROUND, 0.0, 1.0)
                region = canvas[top:top + side, left:left + side]
                canvas[top:top + side, left:left + side] = region * (1 - alpha) + sprite * alpha
                boxes.append(box)
                classes.append(int(labels[source]))
                break
        canvases[index] = np.clip(np.rint(canvas), 0, 255).astype(np.uint8)
        all_boxes.append(Boxes(np.array(boxes, np.float64).reshape(-1, 4), np.array(classes, np.int64)))
    return DetectionSplit(canvases, all_boxes)


def composited(source: str, train_images: int, test_images: int, spec: CanvasSpec) -> DetectionSet:
    """The composited set from classification source ``source`` (``fashion-mnist`` or ``digits``): the
    training canvases use the source's training images only, the test canvases its test images only."""
    from pipeline.core.data.sources import load_source

    data = load_source(source)
    if not data.train.in_memory:
        raise DataError(f"canvas:{source}: the objects must be an in-memory set (fashion-mnist, digits)",
                        fix="DATA=canvas:fashion-mnist or canvas:digits; for your own data use DATA=coco:…")
    rng = np.random.default_rng(spec.seed)
    train = composite(data.train.images, data.train.labels, train_images, spec, rng)
    test = composite(data.test.images, data.test.labels, test_images, spec, rng)
    return DetectionSet(name=f"canvas:{source}", classes=data.classes, train=train, test=test,
                        generator={**asdict(spec), "source": source, "source_fingerprint": data.fingerprint,
                                   "train_images": train_images, "test_images": test_images})


# ---------------------------------------------------------------- the user's COCO JSON
def parse_coco_argument(argument: str) -> tuple[Path, Path]:
    """``/path/annotations.json`` (images beside it, or in the folder COCO names after the file:
    ``annotations/instances_val2017.json`` → ``val2017/``) or ``/path/annotations.json@/path/images``."""
    annotations, _, images = argument.partition("@")
    path = Path(annotations)
    if images:
        return path, Path(images)
    stem = path.stem.removeprefix("instances_")
    for candidate in (path.parent.parent / stem, path.parent / stem, path.parent / "images"):
        if candidate.is_dir():
            return path, candidate
    return path, path.parent


def check_coco(document: Any, images_dir: Path, where: str, limit: int = 10) -> list[str]:
    """Every problem of a COCO detection document, each naming the image or annotation (empty: fine)."""
    if not isinstance(document, dict) or not all(isinstance(document.get(k), list)
                                                 for k in ("images", "annotations", "categories")):
        return [f"{where} is not COCO detection JSON: it needs lists 'images', 'annotations' and 'categories'"]
    problems: list[str] = []
    categories = {c.get("id") for c in document["categories"] if isinstance(c, dict)}
    images = {}
    for image in document["images"]:
        if not isinstance(image, dict) or not {"id", "file_name", "width", "height"} <= set(image):
            problems.append(f"image entry {image!r:.80} lacks id, file_name, width or height")
            continue
        images[image["id"]] = image
        if not (images_dir / image["file_name"]).is_file():
            problems.append(f"image {image['id']}: {images_dir / image['file_name']} is missing")
    for annotation in document["annotations"]:
        name = f"annotation {annotation.get('id', '?')}" if isinstance(annotation, dict) else repr(annotation)[:40]
        if not isinstance(annotation, dict):
            problems.append(f"{name} is not an object")
            continue
        image = images.get(annotation.get("image_id"))
        if image is None:
            problems.append(f"{name}: image_id {annotation.get('image_id')!r} is not among the images")
            continue
        if annotation.get("category_id") not in categories:
            problems.append(f"{name} (image {image['file_name']}): category_id {annotation.get('category_id')!r} "
                            f"is not among the categories {sorted(categories)}")
        box = annotation.get("bbox")
        if not (isinstance(box, list) and len(box) == 4 and all(isinstance(v, (int, float)) for v in box)):
            problems.append(f"{name} (image {image['file_name']}): bbox {box!r} is not [x, y, width, height]")
            continue
        x, y, w, h = box
        if w <= 0 or h <= 0:
            problems.append(f"{name} (image {image['file_name']}): bbox {box} has no area")
        elif x < 0 or y < 0 or x + w > image["width"] + 0.5 or y + h > image["height"] + 0.5:
            problems.append(f"{name} (image {image['file_name']}, {image['width']}×{image['height']}): bbox {box} "
                            "lies outside the image")
    return problems[:limit] + ([f"… and {len(problems) - limit} more"] if len(problems) > limit else [])


def load_coco(argument: str) -> tuple[list[str], list[dict[str, Any]], list[Boxes], Path]:
    """A user's COCO detection JSON, checked whole before anything trains.

    Returns:
        (class names in category-id order, the image entries, each image's boxes as xyxy with class
        indices, the image folder).

    Raises:
        DataError: The file is missing or not JSON, or any annotation is bad: each problem named.
    """
    path, images_dir = parse_coco_argument(argument)
    if not path.is_file():
        raise DataError(f"COCO annotations not found: {path}", fix="DATA=coco:/path/annotations.json[@/path/images]")
    try:
        document = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise DataError(f"{path} is not readable JSON: {err}", fix="export the annotations again as COCO JSON") from None
    problems = check_coco(document, images_dir, str(path))
    if problems:
        raise DataError(f"{path}: {len(problems)} problem(s) in the annotations: " + "; ".join(problems),
                        fix=f"fix or drop those annotations (images are read from {images_dir}; name another folder "
                            "with DATA=coco:ANNOTATIONS@IMAGES)")
    categories = sorted(document["categories"], key=lambda c: c["id"])
    index = {c["id"]: k for k, c in enumerate(categories)}
    by_image: dict[Any, list[dict]] = {image["id"]: [] for image in document["images"]}
    for annotation in document["annotations"]:
        if not annotation.get("iscrowd"):
            by_image[annotation["image_id"]].append(annotation)
    boxes = []
    for image in document["images"]:
        annotations = by_image[image["id"]]
        xyxy = np.array([[a["bbox"][0], a["bbox"][1], a["bbox"][0] + a["bbox"][2], a["bbox"][1] + a["bbox"][3]]
                         for a in annotations], np.float64).reshape(-1, 4)
        boxes.append(Boxes(xyxy, np.array([index[a["category_id"]] for a in annotations], np.int64)))
    return [c["name"] for c in categories], document["images"], boxes, images_dir


def letterbox(image: np.ndarray, size: int, style: str = "top_left") -> tuple[np.ndarray, float, tuple[int, int]]:
    """``image`` (H×W×3 uint8) scaled to fit a ``size``×``size`` square, its aspect kept.

    ``top_left``: at the square's top-left corner on black, shrunk with area (boxes map by one factor, no offset).
    ``ultralytics``: centred on grey 114, resized bilinearly, the padding split as Ultralytics' ``LetterBox`` splits
    it (``round(d - 0.1)`` before, the rest after), so a YOLO model sees its own training geometry.

    Returns:
        The square, the scale factor, and the (x, y) offset of the image inside it.
    """
    import cv2

    height, width = image.shape[:2]
    factor = size / max(height, width)
    new = (max(1, int(round(width * factor))), max(1, int(round(height * factor))))
    if style == "ultralytics":
        resized = cv2.resize(image, new, interpolation=cv2.INTER_LINEAR) if new != (width, height) else image
        left, top = int(round((size - new[0]) / 2 - 0.1)), int(round((size - new[1]) / 2 - 0.1))
        square = np.full((size, size, 3), 114, np.uint8)
        square[top:top + new[1], left:left + new[0]] = resized
        return square, factor, (left, top)
    resized = cv2.resize(image, new, interpolation=cv2.INTER_AREA if factor < 1 else cv2.INTER_LINEAR)
    square = np.zeros((size, size, 3), np.uint8)
    square[:new[1], :new[0]] = resized
    return square, factor, (0, 0)


def coco_set(argument: str, train_images: int, test_images: int, size: int, seed: int,
             log: Callable[[str], None] | None = None, style: str = "top_left",
             train_only: int | None = None) -> DetectionSet:
    """The user's COCO set as the pipeline trains on it: checked whole (:func:`load_coco`), split by ``seed`` (the
    test images drawn first: at most ``test_images`` and a fifth of the set; then at most ``train_images`` of the
    rest), each image letterboxed to ``size``×``size`` RGB (:func:`letterbox`, ``style``) with its boxes mapped
    alike.

    Images are read as stored (EXIF orientation ignored, as COCO's tools read them, so the boxes still fit).
    Box IoU does not change under one scale factor, so mAP on the letterboxed images is the images' own, except
    COCO's small/medium/large area ranges, which EdgeFold does not report.

    Args:
        log: Where progress lines (images read, rate, ETA) go on a set that takes more than a few seconds.
        train_only: Read only the first this many training images (the test split empty): the preprocessing
            probe's slice, letterboxed another way.

    Raises:
        DataError: A bad annotation (all named), an unreadable image or one whose size is not the one recorded,
            or a set too small to split.
    """
    import cv2

    from device.files import sha256_file
    from pipeline.core.log import progress_lines

    classes, entries, boxes, images_dir = load_coco(argument)
    if len(entries) < 2:
        raise DataError(f"coco:{argument} has {len(entries)} image(s): a test and a training split need 2 or more",
                        fix="annotate more images")
    order = np.random.default_rng(seed).permutation(len(entries))
    test_count = max(1, min(test_images, len(entries) // 5))
    chosen = {"test": order[:test_count], "train": order[test_count:test_count + train_images]}
    if train_only is not None:
        chosen = {"test": order[:0], "train": chosen["train"][:train_only]}
    splits, problems = {}, []
    progress = progress_lines(sum(len(i) for i in chosen.values()), "reading COCO images", "images",
                              **({"log_fn": log} if log else {}))
    for name, indices in chosen.items():
        images, scaled = np.zeros((len(indices), size, size, 3), np.uint8), []
        for row, index in enumerate(indices):
            entry, path = entries[index], images_dir / entries[index]["file_name"]
            image = cv2.imread(str(path), cv2.IMREAD_COLOR | cv2.IMREAD_IGNORE_ORIENTATION)
            progress.update()
            if image is None:
                problems.append(f"{path} is not an image OpenCV can read")
                continue
            if image.shape[:2] != (entry["height"], entry["width"]):
                problems.append(f"{path} is {image.shape[1]}×{image.shape[0]}, but the annotations say "
                                f"{entry['width']}×{entry['height']}")
                continue
            images[row], factor, (left, top) = letterbox(cv2.cvtColor(image, cv2.COLOR_BGR2RGB), size, style)
            scaled.append(Boxes(boxes[index].xyxy * factor + np.array([left, top, left, top], np.float64),
                                boxes[index].labels))
        splits[name] = DetectionSplit(images, scaled)
    progress.close()
    if problems:
        raise DataError(f"coco:{argument}: {len(problems)} image(s) do not match their annotations: "
                        + "; ".join(problems[:10]) + (f"; … and {len(problems) - 10} more" if len(problems) > 10 else ""),
                        fix="re-export the annotations from the images as they are on disk")
    annotations = Path(parse_coco_argument(argument)[0])
    return DetectionSet(name=f"coco:{annotations.name}", classes=classes, train=splits["train"], test=splits["test"],
                        generator={"source": f"coco:{argument}", "annotations_sha256": sha256_file(annotations),
                                   "images": len(entries), "seed": seed, "letterbox": size, "letterbox_style": style,
                                   "train_images": len(chosen["train"]), "test_images": len(chosen["test"]),
                                   "split": "seeded: test drawn first (at most test_images and a fifth of the set), "
                                            "then at most train_images of the rest"})

