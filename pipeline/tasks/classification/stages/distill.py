"""distill stage: knowledge distillation from the teacher into the (pruned) student."""

from __future__ import annotations

from pathlib import Path

import torch

from pipeline.checkpoint import load_checkpoint, save_checkpoint
from pipeline.tasks.classification.losses import kd_loss
from pipeline.models import ARCHITECTURES, build_model, checked_model, count_macs, count_parameters, size_metrics
from pipeline.core.stage import Stage, StageResult
from pipeline.tasks.classification.scores import recorded_scores, require_sane
from pipeline.tasks.classification.train import class_weights, evaluate, finish_and_score, fit, predict
from pipeline.core.stage import started_without_torch


class DistillStage(Stage):
    name = "distill"
    distributed = True  # trains under torchrun on every rank (DDP); rank 0 writes the checkpoint

    def absent(self, ctx):
        return started_without_torch(ctx.recipe)

    def needs(self, ctx):
        if ctx.recipe.distill.student == "pruned":
            return ("data", "teacher", "prune")
        return ("data", "teacher")

    def preflight(self, ctx):
        """A student architecture that does not run at the recipe's size, or is not smaller than the teacher, is
        refused before any training."""
        cfg = ctx.recipe.distill
        if cfg.student == "pruned":
            return
        from device.errors import ConfigError

        shape = ctx.preprocess.input_shape(1)
        # Ten classes stand in for the data's: the head is a rounding error next to the body.
        channels = ctx.preprocess.channels
        size = ctx.preprocess.input_size
        student = checked_model(cfg.student, 10, channels, size)
        if cfg.allow_larger_student:
            return
        teacher = build_model(ctx.recipe.teacher.arch, 10, channels, size)
        t_macs, s_macs = count_macs(teacher, shape), count_macs(student, shape)
        t_params, s_params = count_parameters(teacher), count_parameters(student)
        if s_macs >= t_macs or s_params >= t_params:
            raise ConfigError(
                f"distill.student {cfg.student} is not smaller than teacher {ctx.recipe.teacher.arch}: "
                f"{s_macs / t_macs:.2f}× its MACs ({s_macs / 1e6:.1f} M vs {t_macs / 1e6:.1f} M at "
                f"{shape[2]}×{shape[3]}), {s_params / t_params:.2f}× its parameters ({s_params / 1e6:.2f} M vs "
                f"{t_params / 1e6:.2f} M)",
                fix="choose a smaller student (or distill.student: pruned), or set distill.allow_larger_student: true")

    def config(self, ctx):
        config = {"distill": ctx.recipe.section("distill"), "preprocess": ctx.preprocess.to_dict()}
        student = ctx.recipe.distill.student
        fingerprint = ARCHITECTURES.get(student).fingerprint if student != "pruned" else ""
        if fingerprint:  # timm's version, a user package's code
            config["student_fingerprint"] = fingerprint
        return config

    def run(self, ctx, workdir: Path) -> StageResult:
        cfg = ctx.recipe.distill
        teacher, teacher_info = load_checkpoint(ctx.manifest.output("teacher", "model"))
        num_classes = teacher_info["num_classes"]
        if cfg.student == "pruned":
            student, info = load_checkpoint(ctx.manifest.output("prune", "model"))
            arch, folded = info["arch"], info["folded"]
        else:
            folded = False
            torch.manual_seed(cfg.train.seed)
            arch, student = cfg.student, build_model(cfg.student, num_classes, ctx.preprocess.channels,
                                                            ctx.preprocess.input_size)
        device = ctx.device
        train = ctx.batches("train", cfg.train.batch_size, shuffle=True, augment=cfg.train.augment,
                            seed=cfg.train.seed, drop_last=True)
        test = ctx.batches("test", ctx.recipe.evaluate.batch_size)
        teacher.eval().to(device)
        if cfg.cache_teacher_logits:
            # The teacher sees each image (and its mirror, if flips are on) once instead of
            # once per epoch: with a ResNet-50 teacher this halves the cost of distillation.
            ordered = ctx.batches("train", ctx.recipe.evaluate.batch_size)
            cached, _ = predict(teacher, ordered, device, "teacher logits")
            cached_flipped = predict(teacher, ordered, device, "teacher logits (flipped)", flip=True)[0] \
                if cfg.train.augment.hflip else cached
            teacher.cpu()

            def teacher_logits(batch):
                picked = torch.where(batch.flipped.view(-1, 1), cached_flipped[batch.positions], cached[batch.positions])
                return picked.to(device)
        else:
            def teacher_logits(batch):
                with torch.no_grad():
                    return teacher(batch.x).float()

        def loss_fn(logits, batch):
            return kd_loss(logits, teacher_logits(batch), batch.labels, cfg.temperature, cfg.alpha,
                           cfg.train.label_smoothing, weight=class_weights(ctx, logits.device))

        history = fit(student, train, cfg.train, loss_fn, device, "distill",
                      evaluate_fn=lambda: evaluate(student, test, device, "student eval"), resume=ctx.resume)
        metrics, recalibrated = finish_and_score(student, cfg.train, ctx, test, device, "student",
                                                 workdir / "predictions.npy")
        sanity = require_sane(
            "the distilled student", metrics, ctx.dataset().classes,
            causes="too few distillation epochs for the pruned width; stale BatchNorm statistics (set "
                   "distill.train.bn_recalibration: on); too high a learning rate; a teacher that is itself weak",
            fix="raise distill.train.epochs, lower distill.train.lr, or prune less (prune.macs_target)")
        student.cpu()
        path = save_checkpoint(workdir / "model.pt", student, arch, num_classes, ctx.preprocess.input_size,
                               folded=folded, distilled_from="teacher")
        return StageResult(
            outputs={"model": path, "predictions": workdir / "predictions.npy"},
            metrics={**recorded_scores(metrics), "sanity": sanity, "bn_recalibrated_images": recalibrated,
                     **size_metrics(student, ctx.preprocess.input_shape(1)), "history": history},
        )

    def summary(self, metrics):
        return f"student top-1 {100 * metrics['top1']:.2f}%, {metrics['params_m']:.2f} M params"
