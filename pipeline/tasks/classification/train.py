"""A classifier's hooks into the training engine (:mod:`pipeline.train.engine`): its step (logits, the loss, top-1
counted), scoring, BatchNorm re-estimation after training and class-balanced loss weights."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn
from tqdm import tqdm

from pipeline.core import distributed
from pipeline.tasks.classification.batches import Batches
from pipeline.core.recipe import TrainConfig
from pipeline.tasks.classification.scores import accuracy, save_top1
from pipeline.core.log import log
from pipeline.train import engine
from pipeline.train.engine import Step, StepFn, progress_disabled
from pipeline.tasks.classification.images import data_set, image_batches, recorded_splits

class Batch(NamedTuple):
    """One training batch as the loss sees it."""

    x: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    flipped: torch.Tensor


LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]


def classification_step(loss_fn: LossFn) -> StepFn:
    """The engine's step for a classifier: images through the model, ``loss_fn`` on the logits, top-1 counted."""

    def step(model: nn.Module, batch, device: torch.device, memory_format: torch.memory_format) -> Step:
        x, labels, positions, flipped = batch
        x, labels = x.to(device, non_blocking=True), labels.to(device, non_blocking=True)
        # Batches come from HWC images (NHWC strides): left so, the convolutions would run channels_last whatever was
        # chosen, and on a CPU some networks' backward then crawls (timm's FastViT: over 60 s a step against 0.4 s).
        x = x.contiguous(memory_format=memory_format)
        logits = model(x)
        loss = loss_fn(logits.float(), Batch(x, labels, positions, flipped))
        return Step(loss, len(labels), int((logits.argmax(1) == labels).sum()))

    return step


def fit(model: nn.Module, batches: Batches, cfg: TrainConfig, loss_fn: LossFn, device: torch.device,
        desc: str, evaluate_fn: Callable[[], dict] | None = None, resume: Path | None = None) -> list[dict]:
    """:func:`pipeline.train.engine.fit` with :func:`classification_step` (the arguments are the engine's)."""
    return engine.fit(model, batches, cfg, classification_step(loss_fn), device, desc, evaluate_fn, resume)


def finish_and_score(model: nn.Module, cfg: TrainConfig, ctx, test: Batches, device: torch.device, desc: str,
                     predictions: Path) -> tuple[dict, int]:
    """After training: BatchNorm statistics re-estimated where the recipe asks, then one scoring pass
    on the test split that keeps every image's prediction.

    Returns:
        The scores (with ``top1_before_bn_recalibration`` when re-estimated) and the images the
        statistics were re-estimated over (0: not done).
    """
    before = None
    recalibrated = 0
    if cfg.epochs and needs_recalibration(model, cfg):
        before = evaluate(model, test, device, f"{desc} eval")["top1"]
        recalibrated = recalibrate_if_needed(model, cfg, lambda: image_batches(ctx, "train", 256, shuffle=True,
                                                                             seed=cfg.seed), device, desc)
    metrics = evaluate(model, test, device, f"{desc} eval", save_predictions=predictions)
    if before is not None:
        metrics["top1_before_bn_recalibration"] = before
    return metrics, recalibrated


def batchnorm_is_stale(model: nn.Module) -> bool:
    """True when a BatchNorm layer's running statistics move too slowly to follow training.

    torchvision's MobileNetV3 and EfficientNet use momentum 0.01: after a short run their
    eval-mode statistics still describe the first batches, and the model predicts one class.
    """
    return any(isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats
               and m.momentum is not None and m.momentum < 0.1 for m in model.modules())


def needs_recalibration(model: nn.Module, cfg: TrainConfig) -> bool:
    """Whether the recipe's ``bn_recalibration`` asks for re-estimation on this model."""
    return cfg.bn_recalibration == "on" or (cfg.bn_recalibration == "auto" and batchnorm_is_stale(model))


def class_weights(ctx, device: torch.device) -> torch.Tensor | None:
    """Class-balanced loss weights when the recipe asks for them (``data.class_balance: loss_weights``).

    Each class weighs ``n / (classes · n_class)`` over the training split, so a class with a tenth of
    the images counts as much in the loss as the others; None (plain loss) by default.
    """
    if ctx.recipe.data.class_balance != "loss_weights":
        return None
    cached = getattr(ctx, "_class_weights", None)
    if cached is None:
        import numpy as np

        dataset = data_set(ctx)
        counts = np.bincount(dataset.train.labels[recorded_splits(ctx)["train"]], minlength=dataset.num_classes)
        weights = len(recorded_splits(ctx)["train"]) / (dataset.num_classes * np.maximum(counts, 1))
        cached = ctx._class_weights = torch.tensor(weights, dtype=torch.float32)
    return cached.to(device)


def recalibrate_if_needed(model: nn.Module, cfg: TrainConfig, batches: Callable[[], Batches], device: torch.device,
                          desc: str) -> int:
    """Applies the recipe's ``bn_recalibration`` after training; returns the images used (0: not done).

    Args:
        batches: Makes shuffled, un-augmented training batches: an image folder lists its files by
            class, and statistics over the first classes alone would be as wrong as stale ones.
    """
    if not needs_recalibration(model, cfg):
        return 0
    seen = recalibrate_batchnorm(model, batches(), device, cfg.bn_recalibration_images, f"{desc} BatchNorm statistics")
    if seen and distributed.world().main:
        log(f"{desc}: BatchNorm statistics re-estimated over {seen} training images")
    return seen


@torch.no_grad()
def recalibrate_batchnorm(model: nn.Module, batches: Batches, device: torch.device, max_images: int,
                          desc: str = "BatchNorm statistics") -> int:
    """Re-estimates every BatchNorm layer's running mean and variance over training images.

    The statistics are reset and accumulated as an exact average (momentum None) over up to
    ``max_images`` un-augmented images in train mode; the weights are untouched.

    Returns:
        The number of images the statistics were computed over (0: the model has no BatchNorm).
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) and m.track_running_stats]
    if not norms:
        return 0
    momenta = [m.momentum for m in norms]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    was_training = model.training
    model.train().to(device)
    seen = 0
    bar = tqdm(total=min(max_images, len(batches.indices)), desc=desc, unit="img", disable=progress_disabled(),
               leave=False, file=sys.stderr)
    try:
        for x, *_ in batches:
            if seen >= max_images:
                break
            model(x.to(device))
            seen += len(x)
            bar.update(len(x))
    finally:
        bar.close()
        for norm, momentum in zip(norms, momenta):
            norm.momentum = momentum
        model.train(was_training)
    return seen


@torch.no_grad()
def predict(model: nn.Module, batches: Batches, device: torch.device, desc: str = "eval",
            flip: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits and labels of every image of ``batches`` (in subset order), model in eval mode."""
    model.eval().to(device, memory_format=torch.channels_last)
    outputs = torch.empty(len(batches.indices), 0)
    labels = torch.empty(len(batches.indices), dtype=torch.long)
    bar = tqdm(total=len(batches), desc=desc, unit="batch", disable=progress_disabled(), leave=False, file=sys.stderr)
    for x, y, positions, _ in batches:
        x = x.flip(3) if flip else x
        logits = model(x.to(device).contiguous(memory_format=torch.channels_last)).float().cpu()
        if outputs.shape[1] == 0:
            outputs = torch.empty(len(batches.indices), logits.shape[1])
        outputs[positions] = logits
        labels[positions] = y
        bar.update()
    bar.close()
    model.to(memory_format=torch.contiguous_format)
    return outputs, labels


def evaluate(model: nn.Module, batches: Batches, device: torch.device, desc: str = "eval",
             save_predictions: Path | None = None) -> dict:
    """Top-1/top-5 of ``model`` on ``batches``, with the counts behind them (see :func:`accuracy`).

    Args:
        save_predictions: Where to keep every image's top-1 class (``.npy``, in split order): the
            evaluate stage computes per-class results and paired tests between rungs from them.
    """
    logits, labels = predict(model, batches, device, desc)
    if save_predictions is not None and distributed.world().main:  # one writer under torchrun
        save_top1(save_predictions, logits)
    return accuracy(logits, labels)


