"""One training loop for teacher training, fine-tuning and distillation.

SGD or AdamW, cosine (with linear warm-up) or one-cycle schedules stepped per batch,
gradient clipping, label smoothing; on CUDA also AMP (bf16, or fp16 with a grad scaler) and
channels_last. Progress bars show loss, accuracy, images/s and the ETA.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from typing import Callable, NamedTuple

import torch
from torch import nn
from tqdm import tqdm

from pipeline.data.batches import Batches
from pipeline.recipe import TrainConfig

class Batch(NamedTuple):
    """One training batch as the loss sees it."""

    x: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    flipped: torch.Tensor


LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]


def pick_device() -> torch.device:
    """CUDA when present, unless ``EDGEFOLD_DEVICE`` says otherwise."""
    wanted = os.environ.get("EDGEFOLD_DEVICE")
    if wanted:
        return torch.device(wanted)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def progress_disabled() -> bool | None:
    """tqdm's ``disable``: ``EDGEFOLD_PROGRESS=0`` hides bars, ``=1`` forces them; default: on a terminal."""
    value = os.environ.get("EDGEFOLD_PROGRESS")
    if value is None:
        return None
    return value in ("0", "false", "no")


def _amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    if device.type != "cuda" or cfg.amp == "off":
        return None
    if cfg.amp == "fp16":
        return torch.float16
    if cfg.amp == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    # Norm and bias parameters get no weight decay: decaying them only hurts accuracy.
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0)
    return torch.optim.AdamW(groups, lr=cfg.lr)


def make_scheduler(optimizer: torch.optim.Optimizer, cfg: TrainConfig, total_steps: int, steps_per_epoch: int):
    total_steps = max(1, total_steps)
    if cfg.schedule == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=cfg.lr, total_steps=total_steps,
                                                   pct_start=0.25, div_factor=25.0, final_div_factor=1e3)
    warmup = min(int(cfg.warmup_epochs * steps_per_epoch), total_steps - 1)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if cfg.schedule == "constant":
            return 1.0
        progress = (step - warmup) / max(1, total_steps - warmup)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))

    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def fit(model: nn.Module, batches: Batches, cfg: TrainConfig, loss_fn: LossFn, device: torch.device,
        desc: str, evaluate_fn: Callable[[], dict] | None = None) -> list[dict]:
    """Trains ``model`` in place.

    Args:
        model: The model to train (moved to ``device``).
        batches: Training batches (shuffled, augmented).
        cfg: The recipe's training section.
        loss_fn: ``loss_fn(logits, batch)`` → scalar loss.
        device: Where to train.
        desc: Label of the progress bar ("teacher", "distill").
        evaluate_fn: Called after each epoch; its metrics join the history.

    Returns:
        One dict per epoch: mean loss, train accuracy, images/s and what ``evaluate_fn`` returned.
    """
    steps_per_epoch = len(batches)
    total_steps = math.ceil(cfg.epochs * steps_per_epoch)
    if total_steps == 0:
        return []
    torch.manual_seed(cfg.seed)
    model.to(device)
    channels_last = cfg.channels_last
    if channels_last:
        model.to(memory_format=torch.channels_last)
    optimizer = make_optimizer(model, cfg)
    scheduler = make_scheduler(optimizer, cfg, total_steps, steps_per_epoch)
    amp_dtype = _amp_dtype(cfg, device)
    scaler = torch.amp.GradScaler("cuda") if amp_dtype == torch.float16 else None
    history, step, epochs = [], 0, math.ceil(cfg.epochs)
    for epoch in range(epochs):
        model.train()
        seen = correct = 0
        loss_sum = 0.0
        epoch_steps, first_step = min(steps_per_epoch, total_steps - step), step
        started = time.perf_counter()
        last_line = (0, started)  # (steps, time) of the last plain-text progress line
        bar = tqdm(total=epoch_steps, desc=f"{desc} {epoch + 1}/{epochs}", unit="batch",
                   disable=progress_disabled(), leave=False, file=sys.stderr, dynamic_ncols=True)
        for x, labels, positions, flipped in batches:
            if step >= total_steps:
                break
            x, labels = x.to(device, non_blocking=True), labels.to(device, non_blocking=True)
            if channels_last:
                x = x.contiguous(memory_format=torch.channels_last)
            autocast = torch.autocast("cuda", dtype=amp_dtype) if amp_dtype else nullcontext()
            with autocast:
                logits = model(x)
                loss = loss_fn(logits.float(), Batch(x, labels, positions, flipped))
            if not torch.isfinite(loss):
                from device.errors import StageError

                raise StageError(f"{desc}: loss became {loss.item()} at step {step}",
                                 fix="lower the learning rate or enable grad_clip in the recipe")
            optimizer.zero_grad(set_to_none=True)
            if scaler:
                scaler.scale(loss).backward()
                scaler.unscale_(optimizer)
            else:
                loss.backward()
            if cfg.grad_clip:
                nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
            if scaler:
                scaler.step(optimizer)
                scaler.update()
            else:
                optimizer.step()
            scheduler.step()
            step += 1
            seen += len(labels)
            correct += int((logits.argmax(1) == labels).sum())
            loss_sum += float(loss.detach()) * len(labels)
            rate = seen / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{100 * correct / seen:.1f}%", img_s=f"{rate:.0f}")
            bar.update()
            done_steps = step - first_step
            now = time.perf_counter()
            if bar.disable and done_steps - last_line[0] >= epoch_steps / 10 and now - last_line[1] >= 15:
                # No terminal (a log file, CI): a line every 10% (at most every 15 s), with the bar's numbers.
                last_line = (done_steps, now)
                done = done_steps / epoch_steps
                eta = (time.perf_counter() - started) * (1 - done) / max(done, 1e-9)
                print(f"{desc} {epoch + 1}/{epochs}: {100 * done:3.0f}% ({done_steps}/{epoch_steps} batches), "
                      f"loss {loss_sum / seen:.3f}, acc {100 * correct / seen:.1f}%, {rate:.0f} img/s, "
                      f"ETA {eta:.0f} s", file=sys.stderr, flush=True)
        bar.close()
        seconds = time.perf_counter() - started
        record = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_top1": correct / max(seen, 1),
                  "images_per_s": seen / max(seconds, 1e-9), "seconds": seconds}
        if evaluate_fn is not None and (cfg.eval_every_epoch or epoch == epochs - 1):
            record.update(evaluate_fn())
        history.append(record)
        extra = f", test top-1 {100 * record['top1']:.2f}%" if "top1" in record else ""
        print(f"{desc} epoch {epoch + 1}/{epochs}: loss {record['loss']:.4f}, train top-1 "
              f"{100 * record['train_top1']:.2f}%, {record['images_per_s']:.0f} img/s{extra}", file=sys.stderr)
    if channels_last:
        model.to(memory_format=torch.contiguous_format)
    return history


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


def accuracy(logits: torch.Tensor, labels: torch.Tensor, topk: tuple[int, ...] = (1, 5)) -> dict[str, float]:
    """Top-k accuracies as fractions (``top1``, ``top5``); k is capped at the class count."""
    result = {}
    for k in topk:
        kk = min(k, logits.shape[1])
        hits = (logits.topk(kk, dim=1).indices == labels.view(-1, 1)).any(dim=1)
        result[f"top{k}"] = float(hits.float().mean()) if len(labels) else 0.0
    return result


def evaluate(model: nn.Module, batches: Batches, device: torch.device, desc: str = "eval") -> dict[str, float]:
    """Top-1/top-5 of ``model`` on ``batches``."""
    logits, labels = predict(model, batches, device, desc)
    return accuracy(logits, labels)
