"""Training and scoring a torchvision-style detector on a :class:`~pipeline.tasks.detection.data.DetectionSplit`.

The detector owns its resizing and normalisation (torchvision's ``GeneralizedRCNNTransform``) and maps its boxes
back to the image's pixels, so images go in as they are (grey canvases repeated to three channels, 0–1) and
predictions come out in the same pixels as the ground truth. Training is the engine's
(:mod:`pipeline.train.engine`); this module supplies its batches and step. Scores come from
:mod:`pipeline.tasks.detection.metrics` (COCO mAP, checked against faster-coco-eval, with bootstrap intervals).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from device.errors import ConfigError
from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.metrics import Boxes, evaluate, require_sane_detector
from pipeline.core.distributed import require_divisible
from pipeline.core.recipe import TrainConfig
from pipeline.train import engine
from pipeline.train.engine import Step, StepFn


def image_tensors(images: np.ndarray) -> torch.Tensor:
    """N×H×W uint8 (grey) or N×H×W×3 → N×3×H×W float in [0, 1], the range torchvision's detectors expect."""
    x = torch.from_numpy(np.ascontiguousarray(images)).float().div_(255.0)
    if x.ndim == 3:
        x = x[:, None].expand(-1, 3, -1, -1)
    else:
        x = x.permute(0, 3, 1, 2)
    return x.contiguous()


def targets(boxes: Sequence[Boxes], label_offset: int) -> list[dict[str, torch.Tensor]]:
    """torchvision's training targets: float xyxy boxes and int64 labels shifted past the background label."""
    return [{"boxes": torch.as_tensor(b.xyxy, dtype=torch.float32).reshape(-1, 4),
             "labels": torch.as_tensor(b.labels, dtype=torch.int64) + label_offset} for b in boxes]


def _hflip(images: torch.Tensor, batch: list[dict[str, torch.Tensor]], flip: torch.Tensor):
    width = images.shape[-1]
    images = images.clone()
    images[flip] = images[flip].flip(-1)
    for index in torch.nonzero(flip).flatten().tolist():
        box = batch[index]["boxes"].clone()
        box[:, [0, 2]] = width - batch[index]["boxes"][:, [2, 0]]
        batch[index] = {**batch[index], "boxes": box}
    return images, batch


class DetectionBatches:
    """A detection split as the training engine's batches: images 0–1 with torchvision's targets, reshuffled each
    epoch from ``(seed, epoch)`` with the flips drawn per global batch, so a resumed run and every rank under torchrun
    see the batches one uninterrupted process would.

    Args:
        split: Images and boxes.
        batch_size: The global batch (split across the ranks under torchrun).
        label_offset: Added to the data's class indices (torchvision's background label).
        seed: Shuffling and flip draws.
        hflip: Flip half the images, boxes with them.
        input_size: The detector's input side (the engine picks the memory format by it).
    """

    def __init__(self, split: DetectionSplit, batch_size: int, label_offset: int, seed: int, hflip: bool,
                 input_size: int):
        self.images, self.truth = image_tensors(split.images), targets(split.boxes, label_offset)
        self.batch_size, self.seed, self.hflip, self.input_size = batch_size, seed, hflip, input_size
        self.epoch, self.rank, self.world = 0, 0, 1

    def __len__(self) -> int:
        # Under torchrun a last batch too small to give every rank an image is dropped: a rank without images
        # cannot step, and the others would wait for it.
        full, rest = divmod(len(self.images), self.batch_size)
        return full + (rest >= self.world)

    def shard(self, rank: int, world: int) -> "DetectionBatches":
        """Makes this iterator yield rank ``rank``'s share of each global batch.

        Raises:
            ConfigError: The batch does not split over the ranks, or there are fewer images than ranks.
        """
        require_divisible(self.batch_size, world)
        if len(self.images) < world:
            raise ConfigError(f"{len(self.images)} training images cannot feed {world} processes",
                              fix="train on one process (without torchrun), or on more images")
        self.rank, self.world = rank, world
        return self

    def __iter__(self) -> Iterator[tuple[torch.Tensor, list[dict[str, torch.Tensor]]]]:
        """Yields ``(images N×3×H×W, targets)``."""
        generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        order = torch.randperm(len(self.images), generator=generator)
        self.epoch += 1
        for batch in range(len(self)):
            idx = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            flips = torch.rand(len(idx), generator=generator) < 0.5 if self.hflip else None
            mine = slice(self.rank, None, self.world)
            idx = idx[mine]
            x, truth = self.images[idx], [self.truth[i] for i in idx.tolist()]
            if flips is not None:
                x, truth = _hflip(x, truth, flips[mine])
            yield x, truth


def detection_step(extra_loss: Callable | None = None) -> StepFn:
    """The engine's step for a torchvision detector: its own losses summed, plus ``extra_loss(detector, images,
    targets)``, given the detector the engine trains (under torchrun the module inside DDP, with its synchronized
    norms: a second pass through it adds to the same gradients, which DDP averages once per step)."""

    def step(model: torch.nn.Module, batch, device: torch.device, memory_format: torch.memory_format) -> Step:
        x, truth = batch
        x = x.to(device).contiguous(memory_format=memory_format)
        truth = [{key: value.to(device) for key, value in target.items()} for target in truth]
        loss = sum(model(list(x), truth).values())
        if extra_loss is not None:
            loss = loss + extra_loss(getattr(model, "module", model), x, truth)
        return Step(loss, len(x))

    return step


def train_detector(model: torch.nn.Module, split: DetectionSplit, cfg: TrainConfig, label_offset: int = 0,
                   desc: str = "detector", extra_loss: Callable | None = None,
                   extra_modules: torch.nn.Module | None = None, resume: Path | None = None,
                   input_size: int | None = None, device: torch.device | None = None) -> list[dict]:
    """Trains ``model`` in place on ``split`` with the detector's own losses, on the training engine
    (:func:`pipeline.train.engine.fit`: resume, DDP, mixed precision, progress); returns each epoch's record.

    Args:
        desc: The progress bar's and the log's label ("teacher", "distill").
        extra_loss: ``extra_loss(detector, images, targets) -> tensor`` added to each batch's loss (distillation
            terms), given the detector being trained (:func:`detection_step`).
        extra_modules: Trained alongside the model (the distillation adapters).
        resume: The engine's per-epoch state file (the stage's ``ctx.resume``).
        input_size: The detector's input side (default: the images'); the engine picks the memory format by it.
        device: Where to train (default the CPU); the model comes back on the CPU, where it is scored.

    Raises:
        ConfigError: ``augment.crop_padding`` is set (a crop would cut boxes; only ``hflip`` moves them here).
    """
    if cfg.augment.crop_padding:
        raise ConfigError("detection training has no padded crop (it would have to cut and drop boxes)",
                          fix="set train.augment.crop_padding: 0; augment.hflip flips images and boxes together")
    batches = DetectionBatches(split, cfg.batch_size, label_offset, cfg.seed, cfg.augment.hflip,
                               input_size or int(split.images.shape[1]))
    history = engine.fit(model, batches, cfg, detection_step(extra_loss), device or torch.device("cpu"), desc,
                         resume=resume, extra=extra_modules)
    model.cpu().eval()
    return history


@torch.no_grad()
def predict(model: torch.nn.Module, images: np.ndarray, label_offset: int = 0, batch_size: int = 64) -> list[Boxes]:
    """Detections per image, in the image's pixels, with the data's class indices (background offset removed)."""
    model.eval()
    x, out = image_tensors(images), []
    for start in range(0, len(x), batch_size):
        for d in model(list(x[start:start + batch_size])):
            out.append(Boxes(d["boxes"].double().numpy().reshape(-1, 4), d["labels"].numpy().astype(np.int64)
                             - label_offset, d["scores"].double().numpy()))
    return out


def score_detector(model: torch.nn.Module, split: DetectionSplit, classes: Sequence[str], what: str,
                   label_offset: int = 0, resamples: int = 200, seed: int = 0) -> dict[str, Any]:
    """COCO mAP/AP50/AP75 with bootstrap intervals and per-class AP, after the sanity gates.

    Raises:
        StageError: The detector finds nothing or calls one class everywhere (with the numbers).
    """
    detections = predict(model, split.images, label_offset)
    require_sane_detector(detections, split.boxes, classes, what)
    sizes = [tuple(image.shape[:2]) for image in split.images]
    return evaluate(split.boxes, detections, classes, sizes, resamples=resamples, seed=seed)
