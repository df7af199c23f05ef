"""teacher stage: the data-center model, loaded from weights or trained on the data."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F

from device.errors import CheckpointError
from pipeline.checkpoint import apply_torchvision_state, load_weights, save_checkpoint
from device.files import sha256_file
from pipeline.models import ARCHITECTURES, build_model, checked_model, size_metrics
from pipeline.core.stage import Stage, StageResult
from pipeline.tasks.classification.scores import recorded_scores, require_sane
from pipeline.tasks.classification.train import class_weights, evaluate, finish_and_score, fit
from pipeline.core.log import log
from pipeline.core.stage import started_without_torch


def _imagenet_weights(arch: str, num_classes: int, in_channels: int) -> tuple[torch.nn.Module, list[str]]:
    """torchvision's pretrained weights (needs internet), head replaced for ``num_classes``, the stem folded to grey
    for ``in_channels=1``."""
    import torchvision

    entry = _imagenet_entry(arch)
    try:
        pretrained = torchvision.models.get_model(entry.torchvision_name, weights="DEFAULT")
    except Exception as err:  # URLError, HTTPError, hash mismatch …
        raise CheckpointError(
            f"could not download torchvision's ImageNet weights for {arch}: {err}",
            fix="WEIGHTS=imagenet needs internet; download the file elsewhere and pass WEIGHTS=/path/to/state_dict.pth",
        ) from None
    model = build_model(arch, num_classes, in_channels)
    replaced = apply_torchvision_state(model, arch, pretrained.state_dict(), f"torchvision's ImageNet weights for {arch}")
    return model, replaced


def _probe_weights(ctx, model: torch.nn.Module) -> dict | None:
    """Weights that keep their head answer for the data as given: probed under the declared preprocessing and the
    plausible others before any training (:func:`pipeline.tasks.classification.preprocess_probe.check_model`)."""
    from pipeline.tasks.classification.preprocess_probe import check_model

    model.eval().to(ctx.device)

    @torch.no_grad()
    def score(batch):
        return model(torch.from_numpy(batch).to(ctx.device)).float().cpu().numpy()

    try:
        return check_model(ctx, score, ctx.recipe.teacher.preprocess_check, "teacher", "teacher.preprocess_check")
    finally:
        model.cpu()


def _imagenet_entry(arch: str):
    """The registry entry of ``arch`` if torchvision has ImageNet weights for it; otherwise what to do instead."""
    entry = ARCHITECTURES.get(arch)
    if entry.torchvision_name:
        return entry
    if arch.startswith("timm/"):
        raise CheckpointError(f"WEIGHTS=imagenet: timm's weights for {arch} are not downloaded during a run",
                              fix=f"download them once (timm.create_model({arch[5:]!r}, pretrained=True), or the "
                                  "model.safetensors of its Hugging Face repo) and pass WEIGHTS=/path/to/that file")
    raise CheckpointError(f"{arch} has no ImageNet weights", fix="train it (weights: null) or pass WEIGHTS=path")


class TeacherStage(Stage):
    name = "teacher"
    distributed = True  # trains under torchrun on every rank (DDP); rank 0 writes the checkpoint

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def preflight(self, ctx):
        """Weights that do not fit the architecture are refused before any stage: the file is read and loaded into
        an untrained model (a second or two), so a wrong file, head or key names it here, not after the data."""
        cfg = ctx.recipe.teacher
        # Any class count: the head is replaced when weights are loaded.
        model = checked_model(cfg.arch, 10, ctx.preprocess.channels, ctx.preprocess.input_size)
        if cfg.weights == "imagenet":
            _imagenet_entry(cfg.arch)
        elif cfg.weights:
            load_weights(model, cfg.arch, cfg.weights)

    def needs(self, ctx):
        return ("data",)

    def config(self, ctx):
        cfg = ctx.recipe.section("teacher")
        cfg.pop("preprocess_check")  # a check, not the teacher: switching it to warn must not train it again
        weights = ctx.recipe.teacher.weights
        if weights and weights != "imagenet":
            cfg["weights_sha256"] = sha256_file(weights) if Path(weights).is_file() else None
        fingerprint = ARCHITECTURES.get(ctx.recipe.teacher.arch).fingerprint  # timm's version, a package's code
        if fingerprint:
            cfg["arch_fingerprint"] = fingerprint
        return {"teacher": cfg, "preprocess": ctx.preprocess.to_dict()}

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.teacher
        num_classes = ctx.dataset().num_classes
        torch.manual_seed(cfg.train.seed)
        replaced: list[str] = []
        channels = ctx.preprocess.channels
        if cfg.weights == "imagenet":
            model, replaced = _imagenet_weights(cfg.arch, num_classes, channels)
        else:
            model = build_model(cfg.arch, num_classes, channels, ctx.preprocess.input_size)
            if cfg.weights:
                replaced = load_weights(model, cfg.arch, cfg.weights)
        probe = _probe_weights(ctx, model) if cfg.weights and not replaced else None
        test = ctx.batches("test", ctx.recipe.evaluate.batch_size)
        history = []
        if cfg.train.epochs:
            train = ctx.batches("train", cfg.train.batch_size, shuffle=True, augment=cfg.train.augment,
                                seed=cfg.train.seed, drop_last=True)

            def loss_fn(logits, batch):
                return F.cross_entropy(logits, batch.labels, label_smoothing=cfg.train.label_smoothing,
                                       weight=class_weights(ctx, logits.device))

            # The final scores come from one pass below (with each image's prediction kept).
            history = fit(model, train, cfg.train, loss_fn, ctx.device, "teacher",
                          evaluate_fn=lambda: evaluate(model, test, ctx.device, "teacher eval"), resume=ctx.resume)
        metrics, recalibrated = finish_and_score(model, cfg.train, ctx, test, ctx.device, "teacher",
                                                 workdir / "predictions.npy")
        # A teacher at chance makes every later comparison meaningless ("0.00 points lost"): stop here.
        sanity = require_sane(
            "the teacher", metrics, ctx.dataset().classes,
            causes="too few epochs or too high a learning rate; stale BatchNorm statistics (set "
                   "teacher.train.bn_recalibration: on); WEIGHTS for another task; labels that do not match the images",
            fix="train longer (teacher.train.epochs), lower teacher.train.lr, or check the data and WEIGHTS")
        model.cpu()
        path = save_checkpoint(workdir / "model.pt", model, cfg.arch, num_classes, ctx.preprocess.input_size,
                               weights=cfg.weights,
                               replaced_head=bool(replaced))
        if replaced:
            log(f"teacher: classifier re-initialised for {num_classes} classes ({', '.join(replaced)})")
        return StageResult(
            outputs={"model": path, "predictions": workdir / "predictions.npy"},
            metrics={**recorded_scores(metrics), "sanity": sanity, "bn_recalibrated_images": recalibrated,
                     **size_metrics(model, ctx.preprocess.input_shape(1)), "history": history,
                     **({"preprocess_probe": probe} if probe is not None else {})},
        )

    def summary(self, metrics):
        return f"top-1 {100 * metrics['top1']:.2f}%, {metrics['params_m']:.2f} M params, {metrics['macs_g']:.3f} GMACs"
