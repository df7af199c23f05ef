"""Classification's part of the distill stage (:class:`pipeline.train.hooks.DistillHooks`): the pruned teacher or a
smaller architecture as the student, and logit distillation (soft targets at the recipe's temperature, mixed with the
labels by ``alpha``), the teacher's logits cached once per image where the recipe asks."""

from __future__ import annotations

import torch

from device.errors import ConfigError
from pipeline.models import build_model, checked_model, count_macs, count_parameters
from pipeline.tasks.classification.losses import kd_loss
from pipeline.tasks.classification.train import class_weights, predict
from pipeline.tasks.classification.training import ClassificationModels
from pipeline.train.hooks import DistillHooks, Start
from pipeline.tasks.classification.images import data_set, image_batches, preprocess_of


class ClassificationDistill(ClassificationModels, DistillHooks):
    """Classification's student and distillation loss: see the module's docstring."""

    def check_student(self, ctx):
        """A student architecture that does not run at the recipe's size, or is not smaller than the teacher."""
        cfg = ctx.recipe.distill
        if cfg.student == "pruned":
            return
        shape, channels, size = preprocess_of(ctx).input_shape(1), preprocess_of(ctx).channels, preprocess_of(ctx).input_size
        # Ten classes stand in for the data's: the head is a rounding error next to the body.
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

    def from_pruned(self, ctx):
        return ctx.recipe.distill.student == "pruned"

    def student(self, ctx):
        cfg = ctx.recipe.distill
        if cfg.student == "pruned":
            start = self.checkpoint(ctx, "prune")
        else:
            torch.manual_seed(cfg.train.seed)
            num_classes, size = data_set(ctx).num_classes, preprocess_of(ctx).input_size
            start = Start(build_model(cfg.student, num_classes, preprocess_of(ctx).channels, size),
                          {"arch": cfg.student, "num_classes": num_classes, "input_size": size, "folded": False})
        start.saved["distilled_from"] = "teacher"
        return start

    def loss(self, ctx, cfg, teacher=None):
        if teacher is None:
            return super().loss(ctx, cfg)
        teacher_logits, distill = _teacher_logits(ctx, teacher, cfg), ctx.recipe.distill

        def distillation(logits, batch):
            return kd_loss(logits, teacher_logits(batch), batch.labels, distill.temperature, distill.alpha,
                           cfg.label_smoothing, weight=class_weights(ctx, logits.device))
        return distillation


def _teacher_logits(ctx, teacher: torch.nn.Module, cfg):
    """The teacher's logits for a training batch: cached once per image (and its mirror, if flips are on) where the
    recipe asks, instead of once per epoch: with a ResNet-50 teacher this halves the cost of distillation."""
    device = ctx.device
    teacher.eval().to(device)
    if not ctx.recipe.distill.cache_teacher_logits:
        def live(batch):
            with torch.no_grad():
                return teacher(batch.x).float()
        return live
    ordered = image_batches(ctx, "train", ctx.recipe.evaluate.batch_size)
    cached, _ = predict(teacher, ordered, device, "teacher logits")
    flipped = predict(teacher, ordered, device, "teacher logits (flipped)", flip=True)[0] \
        if cfg.augment.hflip else cached
    teacher.cpu()

    def from_cache(batch):
        return torch.where(batch.flipped.view(-1, 1), flipped[batch.positions], cached[batch.positions]).to(device)
    return from_cache
