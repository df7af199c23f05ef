"""Training a segmenter on the shared engine (:func:`pipeline.train.engine.fit`: resume, DDP, mixed precision,
progress): its batches, its step (pixel-wise cross-entropy, plus pixel-wise KD when distilling), its predictions."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import torch

from device.errors import ConfigError
from pipeline.core.distributed import require_divisible
from pipeline.core.recipe import TrainConfig
from pipeline.tasks.segmentation.data import IGNORE, SegmentationSplit, network_inputs
from pipeline.train import engine
from pipeline.train.engine import Step, StepFn


class SegmentationBatches:
    """A split as the engine's batches: ``(images N×3×H×W, masks N×H×W)``, reshuffled each epoch from ``(seed,
    epoch)`` with the flips drawn per global batch, so a resumed run and every rank see what one process would."""

    def __init__(self, split: SegmentationSplit, batch_size: int, seed: int, hflip: bool):
        self.images = torch.from_numpy(network_inputs(split.images))
        self.masks = torch.from_numpy(split.masks.astype(np.int64))
        self.batch_size, self.seed, self.hflip = batch_size, seed, hflip
        self.input_size = int(self.images.shape[-1])
        self.epoch, self.rank, self.world = 0, 0, 1

    def __len__(self) -> int:
        return max(1, len(self.images) // self.batch_size)

    def shard(self, rank: int, world: int) -> "SegmentationBatches":
        require_divisible(self.batch_size, world)
        self.rank, self.world = rank, world
        return self

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        order = torch.randperm(len(self.images), generator=generator)
        self.epoch += 1
        for batch in range(len(self)):
            idx = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            flips = torch.rand(len(idx), generator=generator) < 0.5 if self.hflip else None
            mine = slice(self.rank, None, self.world)
            x, y = self.images[idx[mine]], self.masks[idx[mine]]
            if flips is not None:
                flip = flips[mine]
                x, y = x.clone(), y.clone()
                x[flip], y[flip] = x[flip].flip(-1), y[flip].flip(-1)
            yield x, y


def segmentation_step(teacher: torch.nn.Module | None = None, temperature: float = 2.0,
                      kd_weight: float = 0.0) -> StepFn:
    """Pixel-wise cross-entropy (a pixel of no class left out); with ``teacher``, plus ``kd_weight`` × the KL divergence of the student's softened
    class scores from the teacher's at every pixel (× T², Hinton et al.'s scaling)."""

    def step(model: torch.nn.Module, batch, device: torch.device, memory_format: torch.memory_format) -> Step:
        x, y = batch
        x, y = x.to(device).contiguous(memory_format=memory_format), y.to(device)
        logits = model(x)
        loss = torch.nn.functional.cross_entropy(logits, y, ignore_index=IGNORE)
        if teacher is not None and kd_weight > 0:
            with torch.no_grad():
                target = torch.log_softmax(teacher(x).float() / temperature, dim=1)
            student = torch.log_softmax(logits.float() / temperature, dim=1)
            kd = torch.nn.functional.kl_div(student, target, log_target=True, reduction="none").sum(1).mean()
            loss = loss + kd_weight * temperature ** 2 * kd
        return Step(loss, len(x))

    return step


def train_segmenter(model: torch.nn.Module, split: SegmentationSplit, cfg: TrainConfig, desc: str,
                    resume: Path | None = None, device: torch.device | None = None,
                    teacher: torch.nn.Module | None = None, temperature: float = 2.0,
                    kd_weight: float = 0.0) -> list[dict]:
    """Trains ``model`` in place; returns each epoch's record. The model comes back on the CPU, in eval mode.

    Raises:
        ConfigError: ``augment.crop_padding`` is set (only ``hflip`` moves images and masks together here).
    """
    if cfg.augment.crop_padding:
        raise ConfigError("segmentation training has no padded crop yet",
                          fix="set train.augment.crop_padding: 0; augment.hflip flips images and masks together")
    device = device or torch.device("cpu")
    if teacher is not None:
        teacher = teacher.to(device).eval()
    batches = SegmentationBatches(split, cfg.batch_size, cfg.seed, cfg.augment.hflip)
    history = engine.fit(model, batches, cfg, segmentation_step(teacher, temperature, kd_weight), device, desc,
                         resume=resume)
    model.cpu().eval()
    if teacher is not None:
        teacher.cpu()
    return history


@torch.no_grad()
def predict(model: torch.nn.Module, images: np.ndarray, batch_size: int = 64) -> np.ndarray:
    """Each image's argmax mask (N×H×W ``uint8``) from the torch model."""
    model.eval()
    inputs = torch.from_numpy(network_inputs(images))
    return np.concatenate([model(inputs[i:i + batch_size]).argmax(1).numpy().astype(np.uint8)
                           for i in range(0, len(inputs), batch_size)])


def onnx_masks(path: Path, images: np.ndarray, batch: int = 32) -> np.ndarray:
    """Each image's argmax mask from an ONNX graph under ONNX Runtime (the host's score of a graph)."""
    from device.runners.onnxruntime import OnnxRuntimeRunner

    inputs, masks = network_inputs(images), []
    with OnnxRuntimeRunner(path) as runner:
        for start in range(0, len(inputs), batch):
            masks.append(np.asarray(runner.infer(inputs[start:start + batch])).argmax(1).astype(np.uint8))
    return np.concatenate(masks)

