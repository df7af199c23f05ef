"""Classification's part of the teacher stage, and what its distill stage shares with it
(:class:`pipeline.train.hooks.ModelHooks`): classifiers from the architecture registry, torchvision's or the user's
weights (probed under the declared preprocessing), cross-entropy, top-1 with its interval, gated against chance. The
student and the distillation loss are in :mod:`pipeline.tasks.classification.distilling`."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from device.errors import CheckpointError
from pipeline.checkpoint import apply_torchvision_state, load_checkpoint, load_weights, save_checkpoint
from pipeline.models import ARCHITECTURES, build_model, checked_model, size_metrics
from pipeline.tasks.classification.scores import recorded_scores, require_sane
from pipeline.tasks.classification.train import class_weights, evaluate, finish_and_score, fit
from pipeline.train.hooks import ModelHooks, Scored, Start
from pipeline.tasks.classification.images import data_set, image_batches, preprocess_of

# Why a trained model can sit at chance, and what to change, per stage (the gate's message).
_CAUSES = {
    "teacher": ("too few epochs or too high a learning rate; stale BatchNorm statistics (set "
                "teacher.train.bn_recalibration: on); WEIGHTS for another task; labels that do not match the images",
                "train longer (teacher.train.epochs), lower teacher.train.lr, or check the data and WEIGHTS"),
    "distill": ("too few distillation epochs for the pruned width; stale BatchNorm statistics (set "
                "distill.train.bn_recalibration: on); too high a learning rate; a teacher that is itself weak",
                "raise distill.train.epochs, lower distill.train.lr, or prune less (prune.macs_target)"),
}


class ClassificationModels(ModelHooks):
    """Classification's teacher, and what its student shares with it: see the module's docstring."""

    # A check, not the teacher: switching it to warn must not train the teacher again.
    unkeyed = {"teacher": ("preprocess_check",)}

    def check_teacher(self, ctx):
        """The weights file is read and loaded into an untrained model (a second or two), so a wrong file, head or
        key names itself before the data stage."""
        cfg = ctx.recipe.teacher
        model = checked_model(cfg.arch, 10, preprocess_of(ctx).channels, preprocess_of(ctx).input_size)  # head replaced later
        if cfg.weights == "imagenet":
            _imagenet_entry(cfg.arch)
        elif cfg.weights:
            load_weights(model, cfg.arch, cfg.weights)

    def keys(self, ctx, stage):
        arch = ctx.recipe.teacher.arch if stage == "teacher" else ctx.recipe.distill.student
        # timm's version, a user package's code: a new one builds another network under the same name.
        fingerprint = ARCHITECTURES.get(arch).fingerprint if arch != "pruned" else ""
        return {"preprocess": preprocess_of(ctx).to_dict(), **({"arch_fingerprint": fingerprint} if fingerprint else {})}

    def teacher(self, ctx):
        cfg, num_classes, channels = ctx.recipe.teacher, data_set(ctx).num_classes, preprocess_of(ctx).channels
        replaced: list[str] = []
        if cfg.weights == "imagenet":
            model, replaced = _imagenet_weights(cfg.arch, num_classes, channels)
        else:
            model = build_model(cfg.arch, num_classes, channels, preprocess_of(ctx).input_size)
            if cfg.weights:
                replaced = load_weights(model, cfg.arch, cfg.weights)
        probe = _probe_weights(ctx, model) if cfg.weights and not replaced else None
        saved = {"arch": cfg.arch, "num_classes": num_classes, "input_size": preprocess_of(ctx).input_size,
                 "weights": cfg.weights, "replaced_head": bool(replaced)}
        return Start(model, saved, replaced, {"preprocess_probe": probe} if probe is not None else {})

    def checkpoint(self, ctx, stage):
        model, info = load_checkpoint(ctx.manifest.output(stage, "model"))
        return Start(model, {"arch": info["arch"], "num_classes": info["num_classes"],
                             "input_size": preprocess_of(ctx).input_size, "folded": info["folded"]})

    def train(self, ctx, start, cfg, stage, teacher=None):
        model, device = start.model, ctx.device
        batches = image_batches(ctx, "train", cfg.batch_size, shuffle=True, augment=cfg.augment, seed=cfg.seed,
                              drop_last=True)
        test = image_batches(ctx, "test", ctx.recipe.evaluate.batch_size)
        loss_fn = self.loss(ctx, cfg, teacher)
        role = "teacher" if stage == "teacher" else "student"
        return fit(model, batches, cfg, loss_fn, device, stage,
                   evaluate_fn=lambda: evaluate(model, test, device, f"{role} eval"), resume=ctx.resume)

    def loss(self, ctx, cfg, teacher=None):
        """The training loss, ``loss(logits, batch)``: cross-entropy with the recipe's smoothing and class weights."""
        def cross_entropy(logits, batch):
            return F.cross_entropy(logits, batch.labels, label_smoothing=cfg.label_smoothing,
                                   weight=class_weights(ctx, logits.device))
        return cross_entropy

    def finish(self, ctx, start, cfg, stage, workdir, teacher=None):
        test = image_batches(ctx, "test", ctx.recipe.evaluate.batch_size)
        predictions = workdir / "predictions.npy"
        role = "teacher" if stage == "teacher" else "student"
        metrics, recalibrated = finish_and_score(start.model, cfg, ctx, test, ctx.device, role, predictions)
        # A model at chance makes every later comparison meaningless ("0.00 points lost"): stop here.
        causes, fix = _CAUSES[stage]
        sanity = require_sane("the teacher" if stage == "teacher" else "the distilled student", metrics,
                              data_set(ctx).classes, causes=causes, fix=fix)
        start.model.cpu()
        return Scored({**recorded_scores(metrics), "sanity": sanity, "bn_recalibrated_images": recalibrated},
                      {"predictions": predictions})

    def save(self, path, start):
        saved = dict(start.saved)
        return save_checkpoint(path, start.model, saved.pop("arch"), saved.pop("num_classes"), saved.pop("input_size"),
                               **saved)

    def size(self, ctx, start):
        return size_metrics(start.model, preprocess_of(ctx).input_shape(1))

    def summary(self, stage, metrics):
        if stage == "teacher":
            return (f"top-1 {100 * metrics['top1']:.2f}%, {metrics['params_m']:.2f} M params, "
                    f"{metrics['macs_g']:.3f} GMACs")
        return f"student top-1 {100 * metrics['top1']:.2f}%, {metrics['params_m']:.2f} M params"


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
    return model, apply_torchvision_state(model, arch, pretrained.state_dict(),
                                          f"torchvision's ImageNet weights for {arch}")


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
