"""A user's COCO detection set through the pipeline: images of many sizes, read as stored, letterboxed to the
recipe's square with their boxes scaled alike, split by seed, then trained on like the composited canvases.
Real files: PNGs of mixed sizes written with OpenCV from composited digits canvases, and COCO JSON beside them."""

from __future__ import annotations

import json

import numpy as np
import pytest

from device.errors import DataError
from pipeline.tasks.detection.data import CanvasSpec, coco_set, composited, letterbox

cv2 = pytest.importorskip("cv2")


def write_coco(folder, count: int, seed: int = 0):
    """``count`` digits canvases (64 px, 1–3 objects) each pasted at a random offset into a larger black image of
    a random size, some also scaled ×1.5, written as PNG with COCO JSON; returns the annotations path."""
    data = composited("digits", count, 1, CanvasSpec(size=64, objects=(1, 3), scale=(0.3, 0.45), max_iou=0.1,
                                                     texture=0.15, seed=seed))
    rng = np.random.default_rng(seed)
    images, annotations = [], []
    (folder / "images").mkdir(parents=True)
    for index, (canvas, boxes) in enumerate(zip(data.train.images, data.train.boxes), start=1):
        scale = 1.5 if index % 3 == 0 else 1.0
        canvas = cv2.resize(canvas, None, fx=scale, fy=scale, interpolation=cv2.INTER_LINEAR) if scale != 1 else canvas
        height, width = int(rng.integers(canvas.shape[0], canvas.shape[0] + 48)), int(
            rng.integers(canvas.shape[1], canvas.shape[1] + 48))
        top, left = int(rng.integers(0, height - canvas.shape[0] + 1)), int(rng.integers(0, width - canvas.shape[1] + 1))
        image = np.zeros((height, width, 3), np.uint8)
        image[top:top + canvas.shape[0], left:left + canvas.shape[1]] = canvas[..., None]
        name = f"{index:04d}.png"
        cv2.imwrite(str(folder / "images" / name), image)
        images.append({"id": index, "file_name": name, "width": width, "height": height})
        for box, label in zip(boxes.xyxy * scale, boxes.labels):
            annotations.append({"id": len(annotations) + 1, "image_id": index, "category_id": int(label) + 1,
                                "bbox": [float(box[0] + left), float(box[1] + top), float(box[2] - box[0]),
                                         float(box[3] - box[1])], "iscrowd": 0, "area": 1.0})
    categories = [{"id": d + 1, "name": str(d)} for d in range(10)]
    path = folder / "annotations.json"
    path.write_text(json.dumps({"images": images, "annotations": annotations, "categories": categories}))
    return path


def test_letterbox_keeps_the_aspect_at_the_top_left():
    image = np.full((40, 80, 3), 200, np.uint8)
    square, factor, _ = letterbox(image, 64)
    assert factor == pytest.approx(0.8) and square.shape == (64, 64, 3)
    assert (square[:32, :64] == 200).all() and (square[32:] == 0).all()


def test_a_coco_set_of_mixed_sizes_is_letterboxed_with_its_boxes(tmp_path):
    path = write_coco(tmp_path, 30)
    data = coco_set(str(path), train_images=100, test_images=5, size=64, seed=0)
    assert data.classes == [str(d) for d in range(10)] and (len(data.train), len(data.test)) == (25, 5)
    assert data.train.images.shape == (25, 64, 64, 3) and data.generator["letterbox"] == 64
    assert len(data.generator["annotations_sha256"]) == 64 and data.generator["images"] == 30
    # Each scaled box still frames its digit: bright inside (the digit's pixels), black around it.
    inside, around = [], []
    for image, boxes in zip(data.train.images, data.train.boxes):
        grey = image[..., 0].astype(float)
        for x0, y0, x1, y1 in np.rint(boxes.xyxy).astype(int):
            inside.append(grey[y0:y1, x0:x1].max())
            ring = np.concatenate([grey[max(0, y0 - 3):y0, x0:x1].ravel(), grey[y1:y1 + 3, x0:x1].ravel()])
            around.append(ring.mean() if ring.size else 0.0)
    assert min(inside) > 100 and np.mean(around) < 60
    again = coco_set(str(path), train_images=100, test_images=5, size=64, seed=0)
    assert np.array_equal(again.test.images, data.test.images)  # the split is the seed's


def test_an_image_whose_size_is_not_the_recorded_one_is_named(tmp_path):
    path = write_coco(tmp_path, 10)
    document = json.loads(path.read_text())
    document["images"][0]["width"] += 7
    document["images"][0]["height"] += 7  # the boxes still fit the recorded size, so only the image check sees it
    path.write_text(json.dumps(document))
    with pytest.raises(DataError, match="0001.png is .* but the annotations say") as err:
        coco_set(str(path), train_images=100, test_images=5, size=64, seed=0)
    assert "re-export the annotations" in err.value.fix


def test_a_detector_trains_on_a_coco_set_through_the_pipeline(repo, tmp_path):
    from pipeline.runner import run_pipeline

    path = write_coco(tmp_path / "coco", 400)
    ctx = run_pipeline(str(repo / "models" / "tiny-det.yaml"), runs_dir=tmp_path / "runs", until="teacher",
                       overrides={"data.source": f"coco:{path}", "data.test_images": 80})
    data = ctx.manifest.stage("data")["metrics"]
    assert data["source"] == "coco:annotations.json" and (data["train"], data["test"]) == (320, 80)
    assert data["generator"]["letterbox"] == ctx.recipe.data.canvas.size
    teacher = ctx.manifest.stage("teacher")["metrics"]
    # The teacher passed its sanity gates (it finds objects of more than one class) on the user's images.
    assert teacher["map"] > 0.02, teacher
