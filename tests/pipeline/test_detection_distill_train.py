"""Training with extra loss terms: the distillation adapters are optimised with the student."""

import numpy as np
import torch

from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.metrics import Boxes
from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.train import train_detector
from pipeline.core.recipe import TrainConfig


def test_extra_loss_and_its_modules_are_trained_with_the_detector():
    torch.manual_seed(0)
    images = np.random.default_rng(0).integers(0, 255, (4, 64, 64)).astype(np.uint8)
    split = DetectionSplit(images, [Boxes(np.array([[8.0, 8, 30, 30]]), np.array([1]))] * 4)
    model, adapter = build_detector("tiny_fcos", 2), torch.nn.Linear(1, 1)
    before = adapter.weight.detach().clone()
    calls = []

    def extra(detector, x, batch):
        assert detector is model, "the detector being trained"
        calls.append(len(batch))
        return adapter(torch.ones(1, 1)).pow(2).sum()

    train_detector(model, split, TrainConfig(epochs=1, batch_size=2, lr=0.05), extra_loss=extra, extra_modules=adapter)
    assert calls == [2, 2] and not torch.equal(before, adapter.weight)
