"""A user's own segmentation set in VOC's and Cityscapes' layouts: real PNG/JPEG files written here in each layout
(the synthetic canvases as their pictures), read whole, resized, and every bad pair named before any training."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from device.errors import DataError
from pipeline.tasks.segmentation.data import IGNORE, canvases
from pipeline.tasks.segmentation.folders import CITYSCAPES_CLASSES, VOC_CLASSES, read_layout
from pipeline.tasks.segmentation.metrics import score_masks


def _palette_png(path, mask: np.ndarray) -> None:
    image = Image.fromarray(mask.astype(np.uint8), mode="P")
    image.putpalette([value for k in range(256) for value in (k * 37 % 256, k * 91 % 256, k * 53 % 256)])
    image.save(path)


def _voc(root, train: int = 6, val: int = 4, side: int = 40):
    """A VOC2012-layout folder: JPEG images, palette masks with a void (255) rim around each shape, split lists."""
    sets = root / "ImageSets" / "Segmentation"
    for folder in (root / "JPEGImages", root / "SegmentationClass", sets):
        folder.mkdir(parents=True)
    for split, count, seed in (("train", train, 0), ("val", val, 1)):
        drawn = canvases(count, side, (1, 3), 0.3, seed)
        ids = [f"2007_{split}_{i:03d}" for i in range(count)]
        for item, image, mask in zip(ids, drawn.images, drawn.masks):
            Image.fromarray(image).save(root / "JPEGImages" / f"{item}.jpg", quality=95)
            mask = mask * 5  # circle, square, triangle as VOC's classes 5, 10, 15
            mask[:, 0] = IGNORE
            _palette_png(root / "SegmentationClass" / f"{item}.png", mask)
        (sets / f"{split}.txt").write_text("\n".join(ids) + "\n")
    return root


def test_a_voc_folder_is_read_resized_with_its_void_kept(tmp_path):
    classes, splits = read_layout(f"voc:{_voc(tmp_path / 'VOC2012')}", 100, 100, 32, 0)
    assert classes == VOC_CLASSES and len(splits["train"]) == 6 and len(splits["test"]) == 4
    assert splits["train"].images.shape == (6, 32, 32, 3) and splits["test"].masks.shape == (4, 32, 32)
    values = set(np.unique(splits["train"].masks).tolist())
    assert values <= {0, 5, 10, 15, IGNORE} and IGNORE in values and values & {5, 10, 15}, \
        "nearest-neighbour: only the classes drawn and the void, no class invented at a boundary"


def test_at_most_the_recipes_counts_are_taken_by_seed(tmp_path):
    root = _voc(tmp_path / "VOC2012", train=8)
    _, one = read_layout(f"voc:{root}", 3, 2, 32, 0)
    _, again = read_layout(f"voc:{root}", 3, 2, 32, 0)
    _, other = read_layout(f"voc:{root}", 3, 2, 32, 1)
    assert len(one["train"]) == 3 and len(one["test"]) == 2
    assert np.array_equal(one["train"].images, again["train"].images)
    assert not np.array_equal(one["train"].images, other["train"].images)


def test_every_bad_pair_is_named_before_any_training(tmp_path):
    root = _voc(tmp_path / "VOC2012")
    (root / "SegmentationClass" / "2007_train_001.png").unlink()
    _palette_png(root / "SegmentationClass" / "2007_train_002.png", np.zeros((20, 40), np.uint8))
    _palette_png(root / "SegmentationClass" / "2007_val_003.png", np.full((40, 40), 30, np.uint8))
    Image.fromarray(np.zeros((40, 40, 3), np.uint8)).save(root / "SegmentationClass" / "2007_train_004.png")
    with pytest.raises(DataError) as err:
        read_layout(f"voc:{root}", 100, 100, 32, 0)
    text = str(err.value)
    assert "4 bad image/mask pair(s)" in text
    assert "train 2007_train_001: no mask 2007_train_001.png" in text
    assert "train 2007_train_002: mask 40×20 for an image 40×40" in text
    assert "val 2007_val_003: mask holds class indices [30] beyond the 21 classes" in text
    assert "train 2007_train_004: mask 2007_train_004.png is RGB, not class indices" in text


def test_a_cityscapes_folder_pairs_each_image_with_its_train_ids(tmp_path):
    root = tmp_path / "cityscapes"
    for split, seed in (("train", 0), ("val", 1)):
        drawn = canvases(3, 48, (1, 3), 0.3, seed)
        for index, (image, mask) in enumerate(zip(drawn.images, drawn.masks)):
            city = "aachen" if index < 2 else "bremen"
            name = f"{city}_{index:06d}_000019"
            for folder in (root / "leftImg8bit" / split / city, root / "gtFine" / split / city):
                folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image).save(root / "leftImg8bit" / split / city / f"{name}_leftImg8bit.png")
            Image.fromarray((mask * 6).astype(np.uint8), mode="L").save(
                root / "gtFine" / split / city / f"{name}_gtFine_labelTrainIds.png")
    classes, splits = read_layout(f"cityscapes:{root}", 100, 100, 32, 0)
    assert classes == CITYSCAPES_CLASSES and len(splits["train"]) == len(splits["test"]) == 3
    assert set(np.unique(splits["test"].masks).tolist()) <= {0, 6, 12, 18}
    (root / "gtFine" / "val" / "bremen" / "bremen_000002_000019_gtFine_labelTrainIds.png").unlink()
    with pytest.raises(DataError, match="val bremen/bremen_000002_000019: no mask"):
        read_layout(f"cityscapes:{root}", 100, 100, 32, 0)


def test_a_void_pixel_counts_in_no_score():
    truth = canvases(6, 32, (1, 3), 0.3, 7).masks
    predicted, truth_with_void = truth.copy(), truth.copy()
    predicted[:, :, :4] = 3  # wrong in the first four columns where the truth is not class 3 …
    truth_with_void[:, :, :4] = IGNORE  # … which the truth marks void
    assert score_masks(truth_with_void, predicted, ("a", "b", "c", "d"), resamples=0)["miou"] == 1.0
    assert score_masks(truth, predicted, ("a", "b", "c", "d"), resamples=0)["miou"] < 1.0


def test_the_data_stage_records_a_voc_folders_classes(tmp_path):
    from pipeline.runner import run_pipeline

    root = _voc(tmp_path / "VOC2012")
    ctx = run_pipeline("tiny-seg", runs_dir=tmp_path / "runs", until="data",
                       overrides={"data.source": f"voc:{root}", "data.size": 32})
    recorded = json.loads(ctx.manifest.output("data", "dataset").read_text())
    assert recorded["classes"] == list(VOC_CLASSES) and recorded["source"] == f"voc:{root}"
    assert ctx.manifest.stage("data")["metrics"]["test"] == 4


def test_the_shipped_infer_py_feeds_a_voc_photo_as_the_data_stage_did(tmp_path):
    """A segmenter's shipped preprocessing (``stretch``): infer.py's tensor for a VOC-layout JPEG of another aspect
    equals the data stage's image bit for bit (the data stage decodes with Pillow, infer.py with OpenCV)."""
    import importlib.util

    from pipeline.ship import bundle

    root = _voc(tmp_path / "VOC2012", train=2, val=3)
    for path in sorted((root / "JPEGImages").glob("*val*.jpg")):  # 53×40: stretched, not cropped
        with Image.open(path) as image:
            image.convert("RGB").resize((53, 40)).save(path, quality=95)
        mask_path = root / "SegmentationClass" / f"{path.stem}.png"
        with Image.open(mask_path) as mask:
            mask.resize((53, 40), Image.NEAREST).save(mask_path)
    _, splits = read_layout(f"voc:{root}", 100, 100, 32, 0)
    spec = importlib.util.spec_from_file_location("shipped_infer_stretch", bundle.INFER_SCRIPT)
    infer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(infer)
    pre = {"kind": "stretch", "input_size": 32, "resize": 32, "channels": 3, "mean": [0.0] * 3, "std": [1.0] * 3,
           "interpolation": "bilinear"}
    fed = [infer.geometry(infer.read_rgb(path), pre)[0] for path in sorted((root / "JPEGImages").glob("*val*.jpg"))]
    assert all(any(np.array_equal(image, mine) for mine in fed) for image in splits["test"].images)
