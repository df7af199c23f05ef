"""Training and scoring a torchvision-style detector on a :class:`~pipeline.tasks.detection.data.DetectionSplit`.

The detector owns its resizing and normalisation (torchvision's ``GeneralizedRCNNTransform``) and maps its boxes
back to the image's pixels, so images go in as they are (grey canvases repeated to three channels, 0–1) and
predictions come out in the same pixels as the ground truth. Scores come from :mod:`pipeline.tasks.detection.metrics`
(COCO mAP, checked against faster-coco-eval, with bootstrap intervals). A library: the detection teacher and
distill stages will call it.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np
import torch

from device.errors import ConfigError
from pipeline.tasks.detection.data import DetectionSplit
from pipeline.tasks.detection.metrics import Boxes, evaluate, require_sane_detector
from pipeline.core.recipe import TrainConfig


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


def _optimizer(model: torch.nn.Module, cfg: TrainConfig, steps: int, extra: torch.nn.Module | None = None):
    params = [p for m in (model, extra) if m is not None for p in m.parameters() if p.requires_grad]
    if cfg.optimizer == "adamw":
        optimizer = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    else:
        optimizer = torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                                    weight_decay=cfg.weight_decay)
    if cfg.schedule == "onecycle":
        return optimizer, torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=max(1, steps))
    warmup = int(cfg.warmup_epochs / max(cfg.epochs, 1e-9) * steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        if cfg.schedule == "constant":
            return 1.0
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def train_detector(model: torch.nn.Module, split: DetectionSplit, cfg: TrainConfig, label_offset: int = 0,
                   log=None, extra_loss: Callable | None = None, extra_modules: torch.nn.Module | None = None
                   ) -> list[float]:
    """Trains ``model`` in place on ``split`` with the detector's own losses (summed); returns each epoch's mean.

    Args:
        extra_loss: ``extra_loss(images, targets) -> tensor`` added to each batch's loss (distillation terms).
        extra_modules: Trained alongside the model (the distillation adapters).

    Raises:
        ConfigError: ``augment.crop_padding`` is set (a crop would cut boxes; only ``hflip`` moves them here).
    """
    if cfg.augment.crop_padding:
        raise ConfigError("detection training has no padded crop (it would have to cut and drop boxes)",
                          fix="set train.augment.crop_padding: 0; augment.hflip flips images and boxes together")
    torch.manual_seed(cfg.seed)
    generator = torch.Generator().manual_seed(cfg.seed)
    images, truth = image_tensors(split.images), targets(split.boxes, label_offset)
    per_epoch = math.ceil(len(split) / cfg.batch_size)
    optimizer, schedule = _optimizer(model, cfg, max(1, int(round(cfg.epochs * per_epoch))), extra_modules)
    total, losses = int(round(cfg.epochs * per_epoch)), []
    model.train()
    step = 0
    while step < total:
        order, running = torch.randperm(len(split), generator=generator), []
        for start in range(0, len(split), cfg.batch_size):
            if step >= total:
                break
            idx = order[start:start + cfg.batch_size]
            x, batch = images[idx], [truth[i] for i in idx.tolist()]
            if cfg.augment.hflip:
                x, batch = _hflip(x, batch, torch.rand(len(idx), generator=generator) < 0.5)
            loss = sum(model(list(x), batch).values())
            if extra_loss is not None:
                loss = loss + extra_loss(x, batch)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if cfg.grad_clip:
                torch.nn.utils.clip_grad_norm_([p for group in optimizer.param_groups for p in group["params"]],
                                               cfg.grad_clip)
            optimizer.step()
            schedule.step()
            running.append(float(loss.detach()))
            step += 1
        losses.append(float(np.mean(running)))
        if log:
            log(f"detector epoch {len(losses)}: loss {losses[-1]:.3f}")
    model.eval()
    return losses


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
