"""Detector training and scoring on the composited set: boxes follow flips, labels keep the data's indices."""

import numpy as np
import pytest
import torch

from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.metrics import Boxes
from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.train import (DetectionBatches, _hflip, image_tensors, predict, targets,
                                            train_detector)
from pipeline.core.recipe import TrainConfig


def _split(images=8, size=64):
    rng = np.random.default_rng(0)
    pictures = rng.integers(0, 60, (images, size, size)).astype(np.uint8)
    boxes = []
    for picture in pictures:  # one bright square per image: a box a detector can learn
        left, top = (int(v) for v in rng.integers(4, size - 28, 2))
        picture[top:top + 20, left:left + 20] = 230
        boxes.append(Boxes(np.array([[left, top, left + 20, top + 20]], float), np.array([int(rng.integers(2))])))
    return DetectionSplit(pictures, boxes)


def test_images_become_three_channel_unit_range():
    x = image_tensors(np.full((2, 5, 7), 255, np.uint8))
    assert x.shape == (2, 3, 5, 7) and float(x.max()) == 1.0


def test_targets_shift_labels_past_the_background():
    out = targets([Boxes(np.array([[1.0, 2, 3, 4]]), np.array([0]))], label_offset=1)
    assert out[0]["labels"].tolist() == [1] and out[0]["boxes"].dtype == torch.float32


def test_a_flip_moves_the_boxes_with_the_pixels():
    x = torch.zeros(1, 3, 10, 20)
    x[..., 2:4, 1:5] = 1.0
    batch = [{"boxes": torch.tensor([[1.0, 2.0, 5.0, 4.0]]), "labels": torch.tensor([0])}]
    flipped, moved = _hflip(x, batch, torch.tensor([True]))
    ys, xs = torch.nonzero(flipped[0, 0], as_tuple=True)
    assert moved[0]["boxes"].tolist() == [[float(xs.min()), 2.0, float(xs.max() + 1), 4.0]] == [[15.0, 2.0, 19.0, 4.0]]


def test_one_training_step_changes_the_detector_and_predictions_use_data_labels():
    torch.manual_seed(0)
    model = build_detector("tiny_fcos", 2)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = TrainConfig(epochs=1, batch_size=8, lr=0.01, augment={"hflip": True})
    history = train_detector(model, _split(), cfg)
    assert len(history) == 1 and np.isfinite(history[0]["loss"]) and history[0]["loss"] > 0
    assert "train_top1" not in history[0], "a detector has no training accuracy to report"
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters()))
    out = predict(model, _split(3).images)
    assert len(out) == 3 and all(d.labels.min(initial=0) >= 0 and d.labels.max(initial=0) < 2 for d in out)


def test_a_padded_crop_is_refused_for_detection():
    from device.errors import ConfigError

    with pytest.raises(ConfigError, match="crop_padding"):
        train_detector(build_detector("tiny_fcos", 2), _split(), TrainConfig(epochs=1, lr=0.01,
                                                                             augment={"crop_padding": 2}))


def test_batches_split_over_ranks_like_one_process_and_a_too_small_last_batch_is_dropped():
    """Two ranks see halves of the global batches one process sees; a last batch with an image for every rank is
    kept, one without is dropped; fewer images than ranks is refused."""
    from device.errors import ConfigError

    one = list(DetectionBatches(_split(10), 4, 0, seed=3, hflip=True, input_size=64))
    ranks = [list(DetectionBatches(_split(10), 4, 0, seed=3, hflip=True, input_size=64).shard(r, 2)) for r in range(2)]
    assert [len(x) for x, _ in one] == [4, 4, 2] and [[len(x) for x, _ in rank] for rank in ranks] == [[2, 2, 1]] * 2
    for step, (x, truth) in enumerate(one):
        assert torch.equal(torch.cat([ranks[0][step][0], ranks[1][step][0]]), torch.cat([x[0::2], x[1::2]]))
    assert len(DetectionBatches(_split(9), 4, 0, seed=3, hflip=False, input_size=64).shard(0, 2)) == 2, \
        "one image left for two ranks: dropped"
    with pytest.raises(ConfigError, match="1 training images cannot feed 2 processes"):
        DetectionBatches(_split(1), 2, 0, seed=3, hflip=False, input_size=64).shard(0, 2)
