"""Detection data and metrics: the composited set's exact boxes, COCO JSON
checked whole, COCO mAP re-accumulated per resample and checked against faster-coco-eval's COCOeval."""

import json

import numpy as np
import pytest

from device.errors import DataError, StageError
from pipeline.tasks.detection.data import FOREGROUND, CanvasSpec, composite, composited, load_coco
from pipeline.tasks.detection.metrics import (Boxes, accumulate, class_changes, coco_reference, evaluate, match,
                                        require_sane_detector, summary)

CLASSES = ["cat", "dog", "bird", "fish"]


def _random_scene(rng, images=40, size=64):
    """Boxes of 4 classes (class 3 never present) and detections: jittered hits with scores, misses, false
    alarms, repeated scores (ties) and images with no boxes at all."""
    truth, detections = [], []
    for index in range(images):
        n = 0 if index % 9 == 0 else int(rng.integers(1, 5))
        xy = rng.uniform(0, size - 20, (n, 2))
        wh = rng.uniform(6, 20, (n, 2))
        boxes = np.hstack([xy, xy + wh])
        labels = rng.integers(0, 3, n)
        truth.append(Boxes(boxes, labels))
        hit = rng.random(n) < 0.8
        jitter = boxes[hit] + rng.normal(0, 0.8, (hit.sum(), 4))
        jitter[:, 2:] = np.maximum(jitter[:, 2:], jitter[:, :2] + 1)
        alarms = rng.integers(0, 3)
        axy = rng.uniform(0, size - 10, (alarms, 2))
        det_boxes = np.vstack([jitter, np.hstack([axy, axy + 8])])
        det_labels = np.concatenate([labels[hit], rng.integers(0, 4, alarms)])
        scores = np.round(rng.uniform(0.05, 1.0, len(det_boxes)), 1)  # rounded: ties across images
        detections.append(Boxes(det_boxes, det_labels, scores))
    return truth, detections


def test_the_reaccumulation_reproduces_cocoeval():
    truth, detections = _random_scene(np.random.default_rng(3))
    sizes = [(64, 64)] * len(truth)
    mine = summary(accumulate(match(truth, detections, len(CLASSES))))
    reference = coco_reference(truth, detections, CLASSES, sizes)
    assert 0.2 < reference["map"] < 0.9, "a scene with hits, misses and false alarms"
    for key in ("map", "ap50", "ap75"):
        assert mine[key] == pytest.approx(reference[key], abs=1e-9), key
    assert mine["per_class_ap"][3] is None, "a class with no boxes has no AP (not 0)"


def test_a_resample_accumulates_as_cocoeval_on_the_images_it_drew():
    """A resample weighs each image by its draws; COCOeval on the drawn copies gives the same numbers (images drawn
    three times included). Scores are made distinct: one image's equal scores rank its copies one detection at a
    time here, copy by copy in COCOeval, a tie rule either way (the point estimate is COCOeval's, ties and all)."""
    rng = np.random.default_rng(5)
    truth, tied = _random_scene(rng)
    detections = [Boxes(d.xyxy, d.labels, d.scores + rng.uniform(0, 0.01, len(d.scores))) for d in tied]
    matches = match(truth, detections, len(CLASSES))
    for _ in range(3):
        picked = rng.integers(0, len(truth), len(truth))
        assert np.bincount(picked).max() >= 3
        drawn = np.sort(picked)
        reference = coco_reference([truth[i] for i in drawn], [detections[i] for i in drawn], CLASSES,
                                   [(64, 64)] * len(drawn))
        mine = summary(accumulate(matches, picked))
        for key in ("map", "ap50", "ap75"):
            assert mine[key] == pytest.approx(reference[key], abs=1e-9), key


def test_intervals_bracket_the_estimate_and_widen_with_fewer_images():
    truth, detections = _random_scene(np.random.default_rng(5), images=60)
    sizes = [(64, 64)] * 60
    full = evaluate(truth, detections, CLASSES, sizes, resamples=200, seed=1)
    few = evaluate(truth[:15], detections[:15], CLASSES, sizes[:15], resamples=200, seed=1)
    for result in (full, few):
        for key in ("map", "ap50", "ap75"):
            assert result[f"{key}_low"] <= result[key] <= result[f"{key}_high"], key
    assert few["map_high"] - few["map_low"] > full["map_high"] - full["map_low"]
    again = evaluate(truth, detections, CLASSES, sizes, resamples=200, seed=1)
    assert again == full, "seeded: the same report twice"


def test_the_paired_change_names_the_class_the_fold_lost_and_no_other():
    truth, before = _random_scene(np.random.default_rng(7), images=80)
    # After the fold: the same detections, except that 'bird' (class 2) is found half as often.
    after = []
    for index, d in enumerate(before):
        keep = (d.labels != 2) | (np.arange(len(d.labels)) % 2 == index % 2)
        after.append(Boxes(d.xyxy[keep], d.labels[keep], d.scores[keep]))
    rows = {r["class"]: r for r in class_changes(truth, before, after, CLASSES, resamples=300, seed=2)}
    assert set(rows) == {"cat", "dog", "bird"}, "fish has no boxes: no row"
    assert rows["bird"]["significant"] and rows["bird"]["change_high"] < 0 and rows["bird"]["change_points"] < -3
    assert rows["cat"]["change_points"] == 0 and not rows["cat"]["significant"] and not rows["dog"]["significant"]


def test_composited_boxes_hold_exactly_their_objects():
    rng = np.random.default_rng(0)
    sprites = np.zeros((3, 20, 20), np.uint8)
    sprites[0, 5:15, 8:12] = 200   # a bar
    sprites[1, 2:18, 2:18] = 120   # a square
    sprites[2, 10:11, 0:20] = 255  # a line
    spec = CanvasSpec(size=64, objects=(2, 4), scale=(0.25, 0.5), max_iou=0.0, texture=0.0, seed=0)
    split = composite(sprites, np.array([0, 1, 2]), 30, spec, rng)
    for image, boxes in zip(split.images, split.boxes):
        assert 1 <= len(boxes.labels) <= 4
        covered = np.zeros(image.shape, bool)
        for (x1, y1, x2, y2) in boxes.xyxy.astype(int):
            inside = image[y1:y2, x1:x2] > FOREGROUND
            # Tight: each edge row and column of the box holds a pixel of its object.
            assert inside[0].any() and inside[-1].any() and inside[:, 0].any() and inside[:, -1].any()
            covered[y1:y2, x1:x2] = True
        assert not (image[~covered] > FOREGROUND).any(), "an object pixel outside every box"


def test_the_composited_set_is_seeded_recorded_and_split_by_source(tmp_path):
    spec = CanvasSpec(size=48, objects=(1, 3), seed=4)
    first = composited("digits", 12, 6, spec)
    again = composited("digits", 12, 6, spec)
    other = composited("digits", 12, 6, CanvasSpec(size=48, objects=(1, 3), seed=5))
    assert np.array_equal(first.train.images, again.train.images) and first.generator == again.generator
    assert not np.array_equal(first.train.images, other.train.images)
    assert first.generator["seed"] == 4 and first.generator["source"] == "digits" and len(first.test) == 6
    assert first.classes == [str(d) for d in range(10)]
    assert all(((b.xyxy >= 0) & (b.xyxy <= 48)).all() for b in first.train.boxes + first.test.boxes)
    with pytest.raises(DataError, match="fewest ≤ most"):
        CanvasSpec(objects=(3, 1))


def _coco(tmp_path, annotations, images=("a.png", "b.png"), write=("a.png", "b.png")):
    folder = tmp_path / "images"
    folder.mkdir(exist_ok=True)
    for name in write:
        (folder / name).write_bytes(b"\x89PNG")
    document = {"images": [{"id": i + 1, "file_name": name, "width": 100, "height": 80} for i, name in enumerate(images)],
                "categories": [{"id": 7, "name": "car"}, {"id": 3, "name": "person"}], "annotations": annotations}
    path = tmp_path / "annotations.json"
    path.write_text(json.dumps(document))
    return path


def test_a_good_coco_file_loads_with_classes_in_category_order(tmp_path):
    path = _coco(tmp_path, [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [10, 10, 20, 30]},
                            {"id": 2, "image_id": 2, "category_id": 3, "bbox": [0, 0, 100, 80]}])
    classes, images, boxes, folder = load_coco(str(path))
    assert classes == ["person", "car"] and folder == tmp_path / "images" and len(images) == 2
    assert boxes[0].xyxy.tolist() == [[10, 10, 30, 40]] and boxes[0].labels.tolist() == [1]
    assert boxes[1].labels.tolist() == [0]


def test_every_bad_coco_annotation_is_named_before_training(tmp_path):
    path = _coco(tmp_path, [{"id": 1, "image_id": 1, "category_id": 7, "bbox": [90, 10, 20, 30]},
                            {"id": 2, "image_id": 1, "category_id": 99, "bbox": [1, 1, 5, 5]},
                            {"id": 3, "image_id": 5, "category_id": 7, "bbox": [1, 1, 5, 5]},
                            {"id": 4, "image_id": 2, "category_id": 3, "bbox": [1, 1, 0, 5]}],
                 write=("a.png",))
    with pytest.raises(DataError) as err:
        load_coco(str(path))
    message = err.value.message
    assert "5 problem(s)" in message and "b.png is missing" in message
    assert "annotation 1 (image a.png, 100×80): bbox [90, 10, 20, 30] lies outside the image" in message
    assert "annotation 2 (image a.png): category_id 99 is not among the categories [3, 7]" in message
    assert "annotation 3: image_id 5 is not among the images" in message and "has no area" in message
    assert "DATA=coco:ANNOTATIONS@IMAGES" in err.value.fix
    with pytest.raises(DataError, match="not found"):
        load_coco(str(tmp_path / "nope.json"))


def test_a_detector_that_finds_nothing_or_one_class_everywhere_fails_with_the_numbers():
    truth, detections = _random_scene(np.random.default_rng(1))
    require_sane_detector(detections, truth, CLASSES, "student")  # a working detector passes
    silent = [Boxes(d.xyxy, d.labels, d.scores * 0.01) for d in detections]
    with pytest.raises(StageError, match="student finds nothing: no detection scored 0.05"):
        require_sane_detector(silent, truth, CLASSES, "student")
    one = [Boxes(d.xyxy, np.full_like(d.labels, 3), d.scores) for d in detections]
    with pytest.raises(StageError, match="calls 'fish' for 100% of its .* which hold 0% of the boxes"):
        require_sane_detector(one, truth, CLASSES, "student")


def test_the_bias_corrected_interval_undoes_a_shift_of_the_draws():
    from pipeline.tasks.detection.metrics import bias_corrected_interval

    rng = np.random.default_rng(0)
    draws = rng.normal(0.5, 1.0, 20000)  # the draws' median half a unit above the point (0): a bias of +0.5
    low, high = bias_corrected_interval(draws, 0.0)
    # z0 = Φ⁻¹(Φ(−0.5)) = −0.5; the draws' quantiles at Φ(−1 ± 1.96) are 0.5 − 1 ± 1.96: the point less the bias.
    assert low == pytest.approx(-2.46, abs=0.06) and high == pytest.approx(1.46, abs=0.06)
    centred = rng.normal(0.0, 1.0, 20000)
    assert np.allclose(bias_corrected_interval(centred, 0.0), np.percentile(centred, [2.5, 97.5]), atol=0.06)
    assert np.isnan(bias_corrected_interval(np.array([np.nan]), 0.3)[0])
    # Nearly every draw above the point: BC would collapse onto the top draws; the percentile interval is kept.
    lopsided = rng.normal(3.0, 1.0, 20000)
    low, high = bias_corrected_interval(lopsided, 0.0)
    assert (low, high) == pytest.approx(tuple(np.percentile(lopsided, [2.5, 97.5]))) and high - low > 3.5


def test_map_intervals_are_bias_corrected_against_draws_that_sit_above_the_point():
    """On a synthetic scene the draws sit above the point; the reported interval is moved down by that bias."""
    from pipeline.tasks.detection.metrics import bootstrap_draws

    truth, detections = _random_scene(np.random.default_rng(1), images=128)
    scores = evaluate(truth, detections, CLASSES, [(64, 64)] * len(truth), resamples=500)
    matches = match(truth, detections, len(CLASSES))
    draws = bootstrap_draws(len(truth), lambda p: [summary(accumulate(matches, p))["map"]], 500, 0)[:, 0]
    assert np.mean(draws < scores["map"]) < 0.45, "the planted problem: draws mostly above the point"
    plain_low, plain_high = np.percentile(draws, [2.5, 97.5])
    bias = np.median(draws) - scores["map"]
    assert scores["map_low"] < plain_low and scores["map_high"] < plain_high
    middle, plain_middle = (scores["map_low"] + scores["map_high"]) / 2, (plain_low + plain_high) / 2
    assert middle == pytest.approx(plain_middle - 2 * bias, abs=0.5 * bias)


def test_a_resample_that_loses_a_rare_class_still_averages_every_class():
    """One box of class 2 in the whole set, never found (AP 0): a resample without its image used to average the
    other classes alone, a jump up; it now keeps class 2's full-set AP."""
    from pipeline.tasks.detection.metrics import class_ap, resampled_summary

    truth, detections = _random_scene(np.random.default_rng(2), images=60)
    truth = [Boxes(t.xyxy, np.where(t.labels == 2, 1, t.labels)) for t in truth]
    truth[5] = Boxes(np.vstack([truth[5].xyxy, [[1, 1, 9, 9]]]), np.append(truth[5].labels, 2))  # the rare box
    detections = [Boxes(d.xyxy, np.where(d.labels == 2, 1, d.labels), d.scores) for d in detections]
    matches = match(truth, detections, len(CLASSES))
    full = accumulate(matches)
    assert class_ap(full)[2] == 0.0
    without = np.array([i for i in range(60) if i != 5] * 2)[:60]  # a resample that never draws image 5
    dropped = summary(accumulate(matches, without))["map"]  # class 2 left out of the mean
    kept = resampled_summary(matches, without, full)
    assert np.isnan(class_ap(accumulate(matches, without))[2]) and kept["per_class_ap"][2] == 0.0
    assert kept["map"] == pytest.approx(dropped * 2 / 3, rel=1e-9)  # the same two classes' APs, over three
