"""One training loop for teacher training, fine-tuning and distillation.

SGD or AdamW, cosine (with linear warm-up) or one-cycle schedules stepped per batch,
gradient clipping, label smoothing, channels_last; mixed precision on CUDA (bf16, or fp16 with a grad scaler) and,
where the recipe asks for bf16, on a CPU that computes it natively (AMX or AVX-512-BF16). Progress bars show loss,
accuracy, images/s and the ETA.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Callable, NamedTuple

import torch
from torch import nn
from tqdm import tqdm

from device.files import atomic_writer
from pipeline.core import distributed
from pipeline.core.data.batches import Batches
from pipeline.core.distributed import all_reduce_sum
from pipeline.core.recipe import TrainConfig
from pipeline.scores import accuracy, save_top1  # noqa: F401 (training scores with them; re-exported)
from pipeline.core.log import log, progress_lines

class Batch(NamedTuple):
    """One training batch as the loss sees it."""

    x: torch.Tensor
    labels: torch.Tensor
    positions: torch.Tensor
    flipped: torch.Tensor


LossFn = Callable[[torch.Tensor, Batch], torch.Tensor]


def progress_disabled() -> bool | None:
    """tqdm's ``disable``: ``EDGEFOLD_PROGRESS=0`` hides bars, ``=1`` forces them; default: on a terminal."""
    value = os.environ.get("EDGEFOLD_PROGRESS")
    if value is None:
        return None
    return value in ("0", "false", "no")


def cpu_bf16() -> str | None:
    """The CPU's native bf16 instructions (``amx_bf16``, ``avx512_bf16``), or None: without them oneDNN emulates
    bf16, slower than fp32, so a recipe's ``amp: bf16`` trains in fp32 there."""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            flags = set(next(line for line in cpuinfo if line.startswith("flags")).split(":", 1)[1].split())
    except (OSError, StopIteration):
        return None
    return next((flag for flag in ("amx_bf16", "avx512_bf16") if flag in flags), None)


def amp_dtype(cfg: TrainConfig, device: torch.device) -> torch.dtype | None:
    """The autocast dtype of a training run, or None (fp32): CUDA's AMP by ``cfg.amp``; on a CPU only an explicit
    ``amp: bf16``, and only where the CPU computes bf16 natively (:func:`cpu_bf16`)."""
    if device.type == "cpu":
        return torch.bfloat16 if cfg.amp == "bf16" and cpu_bf16() else None
    if device.type != "cuda" or cfg.amp == "off":
        return None
    if cfg.amp == "fp16":
        return torch.float16
    if cfg.amp == "bf16" or torch.cuda.is_bf16_supported():
        return torch.bfloat16
    return torch.float16


CHANNELS_LAST_MIN_PX = 64
"""From this input size a CPU trains faster in NHWC (ResNet-50 on this project's CPUs: 9% slower at 32 px, the same at
64 (2%), 12% faster at 224 with the fused step; bench/results/train-speed-resnet50-*)."""


def channels_last(cfg: TrainConfig, device: torch.device, input_size: int) -> bool:
    """Whether a training run uses the NHWC memory format: the recipe's choice, else on CUDA and on a CPU for inputs
    of :data:`CHANNELS_LAST_MIN_PX` or more."""
    if cfg.channels_last is not None:
        return cfg.channels_last
    return device.type == "cuda" or input_size >= CHANNELS_LAST_MIN_PX


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    # Norm and bias parameters get no weight decay: decaying them only hurts accuracy.
    decay, no_decay = [], []
    for param in model.parameters():
        if param.requires_grad:
            (no_decay if param.ndim <= 1 else decay).append(param)
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    # One fused kernel per step instead of a dozen passes over every parameter: the same update, and on a CPU
    # ResNet-50's AdamW step fell from about 60 to 15 ms of a 380 ms step (bench/train_speed.py).
    fused = all(param.device.type in ("cpu", "cuda") for group in groups for param in group["params"])
    if cfg.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov and cfg.momentum > 0,
                               fused=fused)
    return torch.optim.AdamW(groups, lr=cfg.lr, fused=fused)


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


def revert_sync_batchnorm(module: nn.Module) -> nn.Module:
    """Synchronized BatchNorm layers back to BatchNorm2d (same parameters and statistics), for the checkpoint."""
    if isinstance(module, (nn.SyncBatchNorm, distributed.CpuSyncBatchNorm)):
        plain = nn.BatchNorm2d(module.num_features, module.eps, module.momentum, module.affine,
                               module.track_running_stats)
        plain.load_state_dict(module.state_dict())
        plain.train(module.training)
        return plain
    for name, child in module.named_children():
        replaced = revert_sync_batchnorm(child)
        if replaced is not child:
            setattr(module, name, replaced)
    return module


def _save_resume(path: Path, state: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_writer(path) as handle:  # a crash mid-save leaves the previous epoch's state intact
        torch.save(state, handle)


def fit(model: nn.Module, batches: Batches, cfg: TrainConfig, loss_fn: LossFn, device: torch.device,
        desc: str, evaluate_fn: Callable[[], dict] | None = None, resume: Path | None = None) -> list[dict]:
    """Trains ``model`` in place, on one process or on every rank of a ``torchrun`` world (DDP).

    Under DDP the global batch ``cfg.batch_size`` is split across the ranks, BatchNorm becomes
    synchronized while training (SyncBatchNorm on CUDA, :class:`~pipeline.core.distributed.CpuSyncBatchNorm`
    on CPU), so its statistics are the global batch's as on one process,
    gradients are averaged by DDP, and the epoch's loss and accuracy are summed over the ranks.

    Args:
        model: The model to train (moved to ``device``).
        batches: Training batches (shuffled, augmented).
        cfg: The recipe's training section.
        loss_fn: ``loss_fn(logits, batch)`` → scalar loss.
        device: Where to train.
        desc: Label of the progress bar ("teacher", "distill").
        evaluate_fn: Called after each epoch when ``cfg.eval_every_epoch``; its metrics join the history
            (the stages score the final model themselves, once: :func:`finish_and_score`).
        resume: A state file written after every epoch (by rank 0); when it exists, training
            continues after its epoch instead of starting over (a crash, a killed rank).

    Returns:
        One dict per epoch: mean loss, train accuracy, images/s and what ``evaluate_fn`` returned.
    """
    trainer = _Trainer(model, batches, cfg, loss_fn, device, desc)
    if trainer.total_steps == 0:
        return []
    if resume is not None and resume.is_file():
        trainer.resume_from(resume)
    for epoch in range(trainer.first_epoch, trainer.epochs):
        record = trainer.train_epoch(epoch)
        if trainer.me.main and resume is not None:
            # Saved before the evaluation, the last epoch included: an evaluation that fails (a corrupt
            # test image) must not throw the trained weights away.
            trainer.save(resume, epoch)
        if evaluate_fn is not None and cfg.eval_every_epoch:
            record.update(evaluate_fn())
        trainer.log_epoch(record)
        distributed.barrier()
    trainer.finish()
    return trainer.history


class _Trainer:
    """The state of one :func:`fit`: model (DDP-wrapped under torchrun), optimizer, schedule, AMP, history."""

    def __init__(self, model: nn.Module, batches: Batches, cfg: TrainConfig, loss_fn: LossFn, device: torch.device,
                 desc: str):
        self.me = distributed.world()
        self.batches, self.cfg, self.loss_fn, self.device, self.desc = batches, cfg, loss_fn, device, desc
        if self.me.distributed:
            batches.shard(self.me.rank, self.me.size)
        self.steps_per_epoch = len(batches)
        self.total_steps = math.ceil(cfg.epochs * self.steps_per_epoch)
        self.epochs, self.first_epoch, self.step, self.history = math.ceil(cfg.epochs), 0, 0, []
        if self.total_steps == 0:
            return
        torch.manual_seed(cfg.seed)
        model.to(device)
        self.channels_last = channels_last(cfg, device, batches.preprocess.input_size)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        self.train_model = model
        if self.me.distributed:
            model = distributed.convert_sync_batchnorm(model, device)
            self.train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model = model
        self.optimizer = make_optimizer(model, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps, self.steps_per_epoch)
        self.amp_dtype = amp_dtype(cfg, device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.hide_bar = progress_disabled() if self.me.main else True  # one bar, rank 0's

    def resume_from(self, path: Path) -> None:
        # The saved state carries its own kernel choice (a state from before the fused step, or another device's):
        # the choice made for this run stands.
        kernels = [(group.get("fused"), group.get("foreach")) for group in self.optimizer.param_groups]
        state = _load_resume(path, self.model, self.optimizer, self.scheduler, self.scaler, self.device, self.desc,
                             self.me.main)
        for group, (fused, foreach) in zip(self.optimizer.param_groups, kernels):
            group["fused"], group["foreach"] = fused, foreach
        if state is not None:
            self.history, self.step, self.first_epoch = state["history"], state["step"], state["epoch"]
            self.batches.epoch = state["batches_epoch"]

    def save(self, path: Path, epoch: int) -> None:
        _save_resume(path, {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "scheduler": self.scheduler.state_dict(),
                            "scaler": self.scaler.state_dict() if self.scaler else None, "history": self.history,
                            "step": self.step, "epoch": epoch + 1, "batches_epoch": self.batches.epoch,
                            "rng": torch.get_rng_state()})

    def _update(self, x, labels, positions, flipped) -> tuple[torch.Tensor, torch.Tensor]:
        """One optimizer step; returns the logits and the loss."""
        x, labels = x.to(self.device, non_blocking=True), labels.to(self.device, non_blocking=True)
        # Batches come from HWC images (NHWC strides): left so, the convolutions would run channels_last whatever was
        # chosen, and on a CPU some networks' backward then crawls (timm's FastViT: over 60 s a step against 0.4 s).
        x = x.contiguous(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        autocast = torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()
        with autocast:
            logits = self.train_model(x)
            loss = self.loss_fn(logits.float(), Batch(x, labels, positions, flipped))
        if not torch.isfinite(loss):
            from device.errors import StageError

            raise StageError(f"{self.desc}: loss became {loss.item()} at step {self.step}",
                             fix="lower the learning rate or enable grad_clip in the recipe")
        self.optimizer.zero_grad(set_to_none=True)
        if self.scaler:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.optimizer)
        else:
            loss.backward()
        if self.cfg.grad_clip:
            nn.utils.clip_grad_norm_(self.model.parameters(), self.cfg.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return logits, loss

    def train_epoch(self, epoch: int) -> dict:
        """One epoch with a progress bar (or a log line every 10% and 15 s without a terminal); its record."""
        self.train_model.train()
        # predict() (the evaluation between epochs) changes the weights' format: back to this run's
        self.model.to(memory_format=torch.channels_last if self.channels_last else torch.contiguous_format)
        seen = correct = 0
        loss_sum = data_s = 0.0  # data_s: time spent waiting for the next batch, the input pipeline's share
        epoch_steps = min(self.steps_per_epoch, self.total_steps - self.step)
        started = time.perf_counter()
        desc = f"{self.desc} {epoch + 1}/{self.epochs}"
        bar = tqdm(total=epoch_steps, desc=desc, unit="batch", disable=self.hide_bar, leave=False, file=sys.stderr,
                   dynamic_ncols=True)
        if bar.disable:  # no terminal, or EDGEFOLD_PROGRESS=0: the same progress as a log line every 10% and 15 s
            bar = progress_lines(epoch_steps, desc, "batches", every=epoch_steps / 10, disable=not self.me.main)
        waited = time.perf_counter()
        for x, labels, positions, flipped in self.batches:
            data_s += time.perf_counter() - waited
            if self.step >= self.total_steps:
                break
            logits, loss = self._update(x, labels, positions, flipped)
            seen += len(labels)
            correct += int((logits.argmax(1) == labels.to(logits.device)).sum())
            loss_sum += float(loss.detach()) * len(labels)
            rate = seen / max(time.perf_counter() - started, 1e-9)
            bar.set_postfix({"loss": f"{loss_sum / seen:.3f}", "acc": f"{100 * correct / seen:.1f}%",
                             "img/s": f"{rate:.0f}"}, refresh=False)  # shown with the next update, not per batch
            bar.update()
            waited = time.perf_counter()
        bar.close()
        seconds = time.perf_counter() - started
        seen, correct, loss_sum = all_reduce_sum([seen, correct, loss_sum], self.device)
        record = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1), "train_top1": correct / max(seen, 1),
                  "images_per_s": seen / max(seconds, 1e-9), "seconds": seconds, "processes": self.me.size,
                  # What the input pipeline alone delivered (per process): well above the training
                  # rate means compute bounds the run; close to it means the data path does.
                  "data_images_per_s": seen / self.me.size / max(data_s, 1e-9),
                  "data_wait_fraction": data_s / seconds,
                  "autocast": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else "fp32"}
        self.history.append(record)
        return record

    def log_epoch(self, record: dict) -> None:
        extra = f", test top-1 {100 * record['top1']:.2f}%" if "top1" in record else ""
        bound = "input-bound" if record["data_wait_fraction"] > 0.3 else "compute-bound"
        log(f"{self.desc} epoch {record['epoch']}/{self.epochs}: loss {record['loss']:.4f}, train top-1 "
            f"{100 * record['train_top1']:.2f}%, {record['images_per_s']:.0f} img/s on {self.me.size} "
            f"process(es) in {record['autocast']}, data path {record['data_images_per_s']:.0f} img/s ({bound}){extra}")

    def finish(self) -> None:
        """Back to a plain model: BatchNorm unsynchronized, contiguous memory (what the checkpoint saves)."""
        if self.me.distributed:
            revert_sync_batchnorm(self.model)
        if self.channels_last:
            self.model.to(memory_format=torch.contiguous_format)


def _load_resume(path: Path, model: nn.Module, optimizer, scheduler, scaler, device: torch.device, desc: str,
                 main: bool) -> dict | None:
    """Restores the state saved after an epoch, or discards a state that does not fit this run.

    The file is keyed by the stage's config and input hashes, so a mismatch means an older format
    or a hand-copied file: it is reported and training starts over, never a crash.
    """
    try:
        state = torch.load(path, map_location=device, weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        if scaler and state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
        missing = [key for key in ("history", "step", "epoch", "batches_epoch") if key not in state]
        if missing:
            raise KeyError(f"no {', '.join(missing)}")
        if state.get("rng") is not None:
            torch.set_rng_state(state["rng"].cpu())
    except Exception as err:  # a shape mismatch, a truncated file, a missing key: all mean "start over"
        if main:
            log(f"{desc}: discarding the saved training state {path} ({type(err).__name__}: "
                  f"{str(err).splitlines()[0][:200] if str(err) else 'unreadable'}); training from the start")
        path.unlink(missing_ok=True)
        return None
    if main:
        log(f"{desc}: resuming after epoch {state['epoch']} from {path}")
    return state


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
        recalibrated = recalibrate_if_needed(model, cfg, lambda: ctx.batches("train", 256, shuffle=True,
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

        dataset = ctx.dataset()
        counts = np.bincount(dataset.train.labels[ctx.splits()["train"]], minlength=dataset.num_classes)
        weights = len(ctx.splits()["train"]) / (dataset.num_classes * np.maximum(counts, 1))
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


