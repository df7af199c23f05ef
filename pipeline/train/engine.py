"""One training loop for every task: teacher training, fine-tuning, distillation.

SGD or AdamW (norm and bias parameters without weight decay, one fused kernel per step), cosine (with linear warm-up),
constant or one-cycle schedules stepped per batch, gradient clipping, channels_last by input size; mixed precision on
CUDA (bf16, or fp16 with a grad scaler) and, where the recipe asks for bf16, on a CPU that computes it natively (AMX or
AVX-512-BF16); DDP under ``torchrun``; a state saved after every epoch that a killed run resumes from; progress with
loss, images/s and the ETA.

A task supplies its batches (:class:`TrainBatches`) and a :data:`StepFn` that turns one batch into a loss; everything
else is the same for every task, the way Ultralytics' ``engine/trainer.py`` runs every task of theirs.
"""

from __future__ import annotations

import math
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, Iterator, NamedTuple, Protocol

import torch
from torch import nn
from tqdm import tqdm

from device.files import atomic_writer
from pipeline.core import distributed
from pipeline.core.distributed import all_reduce_sum
from pipeline.core.recipe import TrainConfig
from pipeline.core.log import log, progress_lines


class TrainBatches(Protocol):
    """What the engine iterates: one epoch per ``iter``, reshuffled by ``epoch`` (saved with the resume state, so a
    resumed run draws the batches the uninterrupted one would), split across ranks by :meth:`shard`."""

    epoch: int
    input_size: int

    def __len__(self) -> int: ...

    def __iter__(self) -> Iterator[Any]: ...

    def shard(self, rank: int, world: int) -> "TrainBatches": ...


class InputBatches:
    """Network inputs already made (N×C×H×W float) as the engine's batches: reshuffled each epoch from
    ``(seed, epoch)``, the last incomplete batch dropped (a fine-tuning over inputs, QAT's)."""

    def __init__(self, inputs: torch.Tensor, batch_size: int, seed: int):
        self.inputs, self.batch_size, self.seed = inputs, batch_size, seed
        self.input_size = int(inputs.shape[-1])
        self.epoch, self.rank, self.world = 0, 0, 1

    def __len__(self) -> int:
        return max(1, len(self.inputs) // self.batch_size)

    def shard(self, rank: int, world: int) -> "InputBatches":
        distributed.require_divisible(self.batch_size, world)
        self.rank, self.world = rank, world
        return self

    def __iter__(self) -> Iterator[torch.Tensor]:
        generator = torch.Generator().manual_seed(self.seed * 100003 + self.epoch)
        order = torch.randperm(len(self.inputs), generator=generator)
        self.epoch += 1
        for batch in range(len(self)):
            yield self.inputs[order[batch * self.batch_size:(batch + 1) * self.batch_size][self.rank::self.world]]


class Step(NamedTuple):
    """One batch through the model, as the engine needs it."""

    loss: torch.Tensor
    images: int
    correct: int | None = None  # right top-1 answers among them, for a task that has a training accuracy


StepFn = Callable[[nn.Module, Any, torch.device, torch.memory_format], Step]
"""``step(model, batch, device, memory_format)``: the batch moved to ``device`` (inputs in ``memory_format``), run
through ``model`` (DDP-wrapped under torchrun) and scored by the task's loss; called inside autocast."""


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


def fit(model: nn.Module, batches: TrainBatches, cfg: TrainConfig, step: StepFn, device: torch.device, desc: str,
        evaluate_fn: Callable[[], dict] | None = None, resume: Path | None = None,
        extra: nn.Module | None = None, frozen_norms: bool = False) -> list[dict]:
    """Trains ``model`` in place, on one process or on every rank of a ``torchrun`` world (DDP).

    Under DDP the global batch ``cfg.batch_size`` is split across the ranks, BatchNorm becomes
    synchronized while training (SyncBatchNorm on CUDA, :class:`~pipeline.core.distributed.CpuSyncBatchNorm`
    on CPU), so its statistics are the global batch's as on one process,
    gradients are averaged by DDP, and the epoch's loss and accuracy are summed over the ranks.

    Args:
        model: The model to train (moved to ``device``).
        batches: Training batches (shuffled, augmented).
        cfg: The recipe's training section.
        step: The task's :data:`StepFn`: one batch to its loss.
        device: Where to train.
        desc: Label of the progress bar ("teacher", "distill").
        evaluate_fn: Called after each epoch when ``cfg.eval_every_epoch``; its metrics join the history
            (the stages score the final model themselves, once: :func:`finish_and_score`).
        resume: A state file written after every epoch (by rank 0); when it exists, training
            continues after its epoch instead of starting over (a crash, a killed rank).
        extra: Trained alongside the model, outside its forward (distillation adapters): in the optimizer, the
            gradient clipping and the resume state; under DDP its gradients are averaged over the ranks.
        frozen_norms: BatchNorm layers stay in eval mode while the rest trains (their statistics are kept, as a
            QAT that recovers a network's function needs).

    Returns:
        One dict per epoch: mean loss, train accuracy (where the step counts it), images/s and what ``evaluate_fn``
        returned.
    """
    trainer = _Trainer(model, batches, cfg, step, device, desc, extra, frozen_norms)
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

    def __init__(self, model: nn.Module, batches: TrainBatches, cfg: TrainConfig, step: StepFn, device: torch.device,
                 desc: str, extra: nn.Module | None = None, frozen_norms: bool = False):
        self.me = distributed.world()
        self.batches, self.cfg, self.step_fn, self.device, self.desc = batches, cfg, step, device, desc
        if self.me.distributed:
            batches.shard(self.me.rank, self.me.size)
        self.steps_per_epoch = len(batches)
        self.total_steps = math.ceil(cfg.epochs * self.steps_per_epoch)
        self.epochs, self.first_epoch, self.step, self.history = math.ceil(cfg.epochs), 0, 0, []
        self.frozen_norms = frozen_norms
        if self.total_steps == 0:
            return
        torch.manual_seed(cfg.seed)
        model.to(device)
        self.channels_last = channels_last(cfg, device, batches.input_size)
        if self.channels_last:
            model.to(memory_format=torch.channels_last)
        self.train_model = model
        if self.me.distributed:
            model = distributed.convert_sync_batchnorm(model, device)
            self.train_model = nn.parallel.DistributedDataParallel(
                model, device_ids=[device.index] if device.type == "cuda" else None)
        self.model, self.extra = model, extra
        if extra is not None and self.me.distributed:  # DDP broadcasts the model's start, not these: rank 0's
            _broadcast_parameters(extra.to(device))
        # What the optimizer steps and the resume state holds: the model alone (its state_dict's keys unchanged), or
        # the model and the modules trained beside it.
        self.trained = model if extra is None else nn.ModuleList([model, extra.to(device)])
        self.optimizer = make_optimizer(self.trained, cfg)
        self.scheduler = make_scheduler(self.optimizer, cfg, self.total_steps, self.steps_per_epoch)
        self.amp_dtype = amp_dtype(cfg, device)
        self.scaler = torch.amp.GradScaler("cuda") if self.amp_dtype == torch.float16 else None
        self.hide_bar = progress_disabled() if self.me.main else True  # one bar, rank 0's
        # channels_last on a CPU is tried on the first batch in a forked child before the run commits to it
        # (pipeline.train.trial): PyTorch 2.14.1 crashes some models there. Under DDP every rank would have to agree.
        self.format_tried = not (self.channels_last and device.type == "cpu" and not self.me.distributed)
        self.marked_at = 0.0

    def resume_from(self, path: Path) -> None:
        # The saved state carries its own kernel choice (a state from before the fused step, or another device's):
        # the choice made for this run stands.
        kernels = [(group.get("fused"), group.get("foreach")) for group in self.optimizer.param_groups]
        state = _load_resume(path, self.trained, self.optimizer, self.scheduler, self.scaler, self.device, self.desc,
                             self.me.main)
        for group, (fused, foreach) in zip(self.optimizer.param_groups, kernels):
            group["fused"], group["foreach"] = fused, foreach
        if state is not None:
            self.history, self.step, self.first_epoch = state["history"], state["step"], state["epoch"]
            self.batches.epoch = state["batches_epoch"]

    def save(self, path: Path, epoch: int) -> None:
        _save_resume(path, {"model": self.trained.state_dict(), "optimizer": self.optimizer.state_dict(),
                            "scheduler": self.scheduler.state_dict(),
                            "scaler": self.scaler.state_dict() if self.scaler else None, "history": self.history,
                            "step": self.step, "epoch": epoch + 1, "batches_epoch": self.batches.epoch,
                            "rng": torch.get_rng_state()})

    def _try_format(self, batch) -> None:
        """One step of ``batch`` in channels_last in a forked child (:func:`pipeline.train.trial.crashes`); where it
        dies of a signal, the run trains contiguous when the engine chose channels_last itself (said), and stops
        with the key when the recipe asked for it, or when contiguous dies too.

        Raises:
            StageError: The format the recipe asked for, or both formats, crash PyTorch on this model here.
        """
        from device.errors import StageError
        from pipeline.core.crash import TRAIN_KEYS, current, signal_name
        from pipeline.train.trial import crashes

        self.format_tried = True

        def step_in(memory_format: torch.memory_format):
            def step() -> None:
                self.model.to(memory_format=memory_format)
                autocast = torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()
                with autocast:
                    done = self.step_fn(self.train_model, batch, self.device, memory_format)
                done.loss.backward()
            return step

        died = crashes(step_in(torch.channels_last))
        if died is None:
            return
        key = current().get("train_key") or TRAIN_KEYS.get(self.desc, "teacher.train")
        said = (f"{self.desc}: a trial training step in channels_last died of {signal_name(died)} in a child process "
                f"(PyTorch {torch.__version__} crashes some models in channels_last on a CPU: timm's fastvit_t8)")
        if self.cfg.channels_last:
            raise StageError(said + f"; the recipe asks for channels_last ({key}.channels_last: true)",
                             fix=f"SET='{key}.channels_last=false' (edgefold run … --set {key}.channels_last=false)")
        other = crashes(step_in(torch.contiguous_format))
        if other is not None:
            raise StageError(said + f", and contiguous died of {signal_name(other)} too: a crash inside PyTorch on "
                                    "this model, whatever the memory format",
                             fix="try OMP_NUM_THREADS=1, another architecture, or report it with the model")
        log(said + f"; training contiguous instead ({key}.channels_last: false skips this trial)")
        self.channels_last = False
        self.model.to(memory_format=torch.contiguous_format)

    def _mark(self, epoch: int) -> None:
        """What a supervising ``edgefold`` says when the process dies of a signal (pipeline.core.crash): the first
        steps of each epoch, then at most every half second."""
        from pipeline.core.crash import mark

        now = time.monotonic()
        if self.step % self.steps_per_epoch < 3 or now - self.marked_at > 0.5:
            self.marked_at = now
            mark(step=self.step + 1, epoch=epoch + 1, desc=self.desc,
                 memory_format="channels_last" if self.channels_last else "contiguous",
                 autocast=str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else "fp32",
                 threads=torch.get_num_threads())

    def _update(self, batch) -> Step:
        """One optimizer step over ``batch``; returns what the task's step counted."""
        memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        autocast = torch.autocast(self.device.type, dtype=self.amp_dtype) if self.amp_dtype else nullcontext()
        with autocast:
            done = self.step_fn(self.train_model, batch, self.device, memory_format)
        loss = done.loss
        if not _finite_everywhere(loss, self.me.distributed):  # every rank stops, none waits in backward
            from device.errors import StageError

            where = "" if not torch.isfinite(loss) else " on another rank"
            raise StageError(f"{self.desc}: loss became {loss.item() if not where else 'not finite'} at step "
                             f"{self.step}{where}", fix="lower the learning rate or enable grad_clip in the recipe")
        self.optimizer.zero_grad(set_to_none=True)
        (self.scaler.scale(loss) if self.scaler else loss).backward()
        if self.extra is not None and self.me.distributed:  # DDP averages the model's gradients, not these
            _average_gradients(self.extra, self.me.size)  # before unscale_: every rank sees the same inf check
        if self.scaler:
            self.scaler.unscale_(self.optimizer)
        if self.cfg.grad_clip:
            nn.utils.clip_grad_norm_(self.trained.parameters(), self.cfg.grad_clip)
        if self.scaler:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.scheduler.step()
        self.step += 1
        return done

    def train_epoch(self, epoch: int) -> dict:
        """One epoch with a progress bar (or a log line every 10% and 15 s without a terminal); its record."""
        self.train_model.train()
        if self.frozen_norms:
            for module in self.model.modules():
                if isinstance(module, nn.modules.batchnorm._BatchNorm):
                    module.eval()
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
        counts_correct = True
        for batch in self.batches:
            data_s += time.perf_counter() - waited
            if self.step >= self.total_steps:
                break
            if not self.format_tried:
                self._try_format(batch)
            self._mark(epoch)
            done = self._update(batch)
            seen += done.images
            counts_correct = counts_correct and done.correct is not None
            correct += done.correct or 0
            loss_sum += float(done.loss.detach()) * done.images
            rate = seen / max(time.perf_counter() - started, 1e-9)
            shown = {"loss": f"{loss_sum / seen:.3f}", "img/s": f"{rate:.0f}"}
            if counts_correct:
                shown["acc"] = f"{100 * correct / seen:.1f}%"
            bar.set_postfix(shown, refresh=False)  # shown with the next update, not per batch
            bar.update()
            waited = time.perf_counter()
        bar.close()
        seconds = time.perf_counter() - started
        seen, correct, loss_sum = all_reduce_sum([seen, correct, loss_sum], self.device)
        record = {"epoch": epoch + 1, "loss": loss_sum / max(seen, 1),
                  **({"train_top1": correct / max(seen, 1)} if counts_correct else {}),
                  "images_per_s": seen / max(seconds, 1e-9), "seconds": seconds, "processes": self.me.size,
                  # What the input pipeline alone delivered (per process): well above the training
                  # rate means compute bounds the run; close to it means the data path does.
                  "data_images_per_s": seen / self.me.size / max(data_s, 1e-9),
                  "data_wait_fraction": data_s / seconds,
                  "autocast": str(self.amp_dtype).removeprefix("torch.") if self.amp_dtype else "fp32"}
        self.history.append(record)
        return record

    def log_epoch(self, record: dict) -> None:
        tested = f", test top-1 {100 * record['top1']:.2f}%" if "top1" in record else ""
        bound = "input-bound" if record["data_wait_fraction"] > 0.3 else "compute-bound"
        trained = f", train top-1 {100 * record['train_top1']:.2f}%" if "train_top1" in record else ""
        log(f"{self.desc} epoch {record['epoch']}/{self.epochs}: loss {record['loss']:.4f}{trained}, "
            f"{record['images_per_s']:.0f} img/s on {self.me.size} "
            f"process(es) in {record['autocast']}, data path {record['data_images_per_s']:.0f} img/s ({bound}){tested}")

    def finish(self) -> None:
        """Back to a plain model: BatchNorm unsynchronized, contiguous memory (what the checkpoint saves)."""
        if self.me.distributed:
            revert_sync_batchnorm(self.model)
        if self.channels_last:
            self.model.to(memory_format=torch.contiguous_format)


def _average_gradients(module: nn.Module, world_size: int) -> None:
    """Each gradient of ``module`` replaced by its mean over the ranks (what DDP does for the model it wraps); a
    parameter without a gradient on this rank takes part with zeros, so every rank makes the same calls."""
    import torch.distributed as dist

    for param in module.parameters():
        if param.requires_grad:
            if param.grad is None:
                param.grad = torch.zeros_like(param)
            dist.all_reduce(param.grad)
            param.grad.div_(world_size)


def _broadcast_parameters(module: nn.Module) -> None:
    """Rank 0's parameters and buffers on every rank (what DDP does for the model it wraps at construction)."""
    import torch.distributed as dist

    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)


def _finite_everywhere(loss: torch.Tensor, distributed_run: bool) -> bool:
    """Whether the loss is finite on every rank (one all-reduce under DDP: a rank that stopped alone would leave
    the others waiting in backward)."""
    finite = bool(torch.isfinite(loss))
    if not distributed_run:
        return finite
    return all_reduce_sum([0.0 if finite else 1.0], loss.device)[0] == 0.0


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


