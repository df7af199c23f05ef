"""Distillation loss."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def kd_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, labels: torch.Tensor,
            temperature: float, alpha: float, label_smoothing: float = 0.0,
            weight: torch.Tensor | None = None) -> torch.Tensor:
    """Hinton's knowledge-distillation loss.

    ``alpha · T² · KL(p_t ‖ p_s) + (1 − alpha) · CE(s, y)`` with ``p = softmax(logits / T)``,
    the KL summed over classes and averaged over the batch. The T² keeps the soft term's
    gradient scale independent of the temperature.

    Args:
        student_logits: N×C logits of the student (with gradient).
        teacher_logits: N×C logits of the teacher (no gradient needed).
        labels: N class indices.
        temperature: Softening temperature T > 0.
        alpha: Weight of the soft-target term in [0, 1].
        label_smoothing: Label smoothing of the hard-label cross-entropy.
        weight: Per-class weights of the hard-label term (class-balanced loss), or None.
    """
    log_p_student = F.log_softmax(student_logits / temperature, dim=1)
    p_teacher = F.softmax(teacher_logits.detach() / temperature, dim=1)
    soft = F.kl_div(log_p_student, p_teacher, reduction="batchmean") * temperature**2
    hard = F.cross_entropy(student_logits, labels, label_smoothing=label_smoothing, weight=weight)
    return alpha * soft + (1.0 - alpha) * hard
