"""Distillation terms for single-stage detectors: KD on matched anchors' class scores + feature imitation.

The method follows Chen et al., "Learning Efficient Object Detection Models with Knowledge Distillation"
(NeurIPS 2017): the student's class scores are pulled towards the teacher's softened scores, and its feature maps
towards the teacher's through a trainable 1×1 adaptation layer (FitNets' hint, Romero et al., ICLR 2015). Two
choices are made for single-stage detectors, where most anchors are background:

* class KD only on *matched* anchors — those whose centre lies inside a ground-truth box (the region FCOS and
  RetinaNet assign positives from); averaging over every anchor would drown the objects in easy background, the
  imbalance Wang et al. (CVPR 2019, "Distilling Object Detectors with Fine-grained Feature Imitation") point out;
* feature imitation on every level of the multi-scale maps the head reads (FPN levels, or SSDlite's extra layers),
  unmasked: each level's MSE averaged over its elements, then over levels, so no level dominates by its size.

The student is the pruned teacher (the head is kept whole, :mod:`pipeline.tasks.detection.pruning`), so both predict
for the same anchors in the same order; only the feature widths differ, which the adapters bridge. The student's
own detection loss is the detector's (``model(images, targets)``); the caller adds it. A library.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, Sequence

import torch
import torch.nn.functional as F
from torch import nn

from device.errors import StageError


@dataclass
class DetectorParts:
    """One forward pass of a single-stage torchvision detector up to its raw head outputs.

    Attributes:
        features: The maps the head reads, finest first (FPN levels, SSD's backbone + extra layers).
        head: ``cls_logits`` (N × anchors × classes) and ``bbox_regression`` (and FCOS's ``bbox_ctrness``).
        anchors: Per image, anchors × 4 xyxy in the transformed image's pixels.
        boxes: Per image, the ground-truth boxes rescaled as the transform rescaled the image (when given).
    """

    features: list[torch.Tensor]
    head: dict[str, torch.Tensor]
    anchors: list[torch.Tensor]
    boxes: list[torch.Tensor] | None


def detector_parts(model: nn.Module, images: torch.Tensor | Sequence[torch.Tensor],
                   targets: list[dict[str, torch.Tensor]] | None = None) -> DetectorParts:
    """Runs ``model``'s transform, backbone, head and anchor generator (no decoding, no NMS).

    Works for torchvision's FCOS, RetinaNet and SSD/SSDlite, which share these four attributes.
    """
    image_list, scaled = model.transform(list(images), [dict(t) for t in targets] if targets is not None else None)
    features = list(model.backbone(image_list.tensors).values())
    head = model.head(features)
    anchor_generator = getattr(model, "anchor_generator", None)
    if anchor_generator is None:
        raise StageError(f"{type(model).__name__} has no anchor generator: not a single-stage torchvision detector",
                         fix="distill FCOS, RetinaNet or SSD/SSDlite detectors")
    anchors = anchor_generator(image_list, features)
    return DetectorParts(features, head, anchors, [t["boxes"] for t in scaled] if scaled is not None else None)


def matched_anchors(anchors: Sequence[torch.Tensor], boxes: Sequence[torch.Tensor]) -> torch.Tensor:
    """N × anchors mask: the anchor's centre lies inside one of its image's ground-truth boxes."""
    masks = []
    for a, b in zip(anchors, boxes):
        centre = (a[:, :2] + a[:, 2:]) / 2
        if not len(b):
            masks.append(torch.zeros(len(a), dtype=torch.bool, device=a.device))
            continue
        inside = ((centre[:, None, 0] >= b[None, :, 0]) & (centre[:, None, 0] <= b[None, :, 2])
                  & (centre[:, None, 1] >= b[None, :, 1]) & (centre[:, None, 1] <= b[None, :, 3]))
        masks.append(inside.any(dim=1))
    return torch.stack(masks)


def class_kd(student: torch.Tensor, teacher: torch.Tensor, mask: torch.Tensor, temperature: float,
             activation: Literal["sigmoid", "softmax"]) -> torch.Tensor:
    """KL divergence from the teacher's softened class scores to the student's, on the masked anchors, × T².

    ``sigmoid`` (FCOS, RetinaNet: one independent score per class) sums the Bernoulli KL over classes;
    ``softmax`` (SSD: classes and background compete) is Hinton's KD. Zero when the logits agree; zero (with a
    gradient graph) when no anchor is matched, so a batch without objects adds nothing.
    """
    if student.shape != teacher.shape:
        raise StageError(f"class KD: student logits {tuple(student.shape)} vs teacher {tuple(teacher.shape)}",
                         fix="distill a student with the teacher's head and anchors (the pruned teacher)")
    s, t = student[mask] / temperature, teacher.detach()[mask] / temperature
    if not len(s):
        return student.sum() * 0.0
    if activation == "sigmoid":
        p = torch.sigmoid(t)
        # BCE(s, p) − BCE(t, p) = KL(Bernoulli(p) ‖ Bernoulli(σ(s))): the teacher's own entropy removed.
        per_anchor = (F.binary_cross_entropy_with_logits(s, p, reduction="none")
                      - F.binary_cross_entropy_with_logits(t, p, reduction="none")).sum(-1)
    else:
        per_anchor = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t, -1), reduction="none", log_target=True).sum(-1)
    return per_anchor.mean() * temperature ** 2


class FeatureImitation(nn.Module):
    """Mean squared error between adapted student maps and the teacher's, averaged over levels.

    Args:
        student_channels: Channels of each student level (a pruned FPN is narrower than the teacher's).
        teacher_channels: Channels of each teacher level.
    """

    def __init__(self, student_channels: Sequence[int], teacher_channels: Sequence[int]):
        super().__init__()
        if len(student_channels) != len(teacher_channels):
            raise StageError(f"feature imitation: the student has {len(student_channels)} levels, the teacher "
                             f"{len(teacher_channels)}", fix="distill a student with the teacher's levels")
        # 1×1 adapters (FitNets' regressor) even when the widths agree: the pruned student's channels are a
        # subset of the teacher's in another order of importance, not the same features.
        self.adapters = nn.ModuleList(nn.Conv2d(s, t, 1) for s, t in zip(student_channels, teacher_channels))

    def forward(self, student: Sequence[torch.Tensor], teacher: Sequence[torch.Tensor]) -> torch.Tensor:
        losses = []
        for adapter, s, t in zip(self.adapters, student, teacher):
            if s.shape[-2:] != t.shape[-2:]:
                raise StageError(f"feature imitation: a student level is {tuple(s.shape[-2:])}, the teacher's "
                                 f"{tuple(t.shape[-2:])}", fix="run student and teacher at the same input size")
            losses.append(F.mse_loss(adapter(s), t.detach()))
        return torch.stack(losses).mean()


class DetectionDistillLoss(nn.Module):
    """The distillation terms of one batch: ``class_kd`` and ``feature`` (weighted), and their ``total``.

    Args:
        student: The student detector (its adapters' widths are read from one forward pass).
        teacher: The teacher detector (kept in eval mode, no gradients).
        activation: ``sigmoid`` for FCOS/RetinaNet, ``softmax`` for SSD.
        temperature: KD temperature.
        kd_weight: Weight of the class KD term.
        feature_weight: Weight of the feature-imitation term.
        input_size: Square side of the probe pass that reads the widths.
    """

    def __init__(self, student: nn.Module, teacher: nn.Module, activation: Literal["sigmoid", "softmax"],
                 temperature: float = 2.0, kd_weight: float = 1.0, feature_weight: float = 1.0, input_size: int = 64):
        super().__init__()
        probe = torch.zeros(1, 3, input_size, input_size)
        with torch.no_grad():
            widths = [[f.shape[1] for f in detector_parts(m.eval(), probe).features] for m in (student, teacher)]
        self.imitation = FeatureImitation(*widths)
        self.activation, self.temperature = activation, temperature
        self.kd_weight, self.feature_weight = kd_weight, feature_weight

    def forward(self, student: nn.Module, teacher: nn.Module, images: torch.Tensor,
                targets: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        mine = detector_parts(student, images, targets)
        with torch.no_grad():
            theirs = detector_parts(teacher.eval(), images, targets)
        mask = matched_anchors(mine.anchors, mine.boxes)
        kd = class_kd(mine.head["cls_logits"], theirs.head["cls_logits"], mask, self.temperature, self.activation)
        feature = self.imitation(mine.features, theirs.features)
        return {"class_kd": kd, "feature": feature, "matched_anchors": mask.sum(),
                "total": self.kd_weight * kd + self.feature_weight * feature}
