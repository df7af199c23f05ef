import math

import pytest
import torch

from pipeline.tasks.classification.losses import kd_loss


def _softmax(values, temperature):
    exps = [math.exp(v / temperature) for v in values]
    return [e / sum(exps) for e in exps]


def test_kd_loss_matches_a_hand_computed_value():
    student, teacher, label, t, alpha = [2.0, 0.5, -1.0], [1.0, 1.5, -0.5], 0, 2.0, 0.6
    p_s, p_t = _softmax(student, t), _softmax(teacher, t)
    kl = sum(pt * math.log(pt / ps) for pt, ps in zip(p_t, p_s))
    ce = -math.log(_softmax(student, 1.0)[label])
    expected = alpha * t * t * kl + (1 - alpha) * ce
    got = kd_loss(torch.tensor([student]), torch.tensor([teacher]), torch.tensor([label]), t, alpha)
    assert got.item() == pytest.approx(expected, rel=1e-6)


def test_batch_mean_and_pure_terms():
    torch.manual_seed(0)
    s, t, y = torch.randn(4, 5), torch.randn(4, 5), torch.tensor([0, 1, 2, 3])
    # alpha = 0 is plain cross-entropy; identical logits give zero soft loss.
    assert kd_loss(s, t, y, 3.0, 0.0).item() == pytest.approx(torch.nn.functional.cross_entropy(s, y).item())
    assert kd_loss(s, s.clone(), y, 3.0, 1.0).item() == pytest.approx(0.0, abs=1e-6)
    # The batch loss is the mean of per-sample losses.
    per_sample = torch.stack([kd_loss(s[i : i + 1], t[i : i + 1], y[i : i + 1], 3.0, 0.5) for i in range(4)])
    assert kd_loss(s, t, y, 3.0, 0.5).item() == pytest.approx(per_sample.mean().item(), rel=1e-6)


def test_gradient_flows_to_the_student_only():
    s = torch.randn(2, 3, requires_grad=True)
    t = torch.randn(2, 3, requires_grad=True)
    kd_loss(s, t, torch.tensor([0, 2]), 4.0, 0.9).backward()
    assert s.grad is not None and s.grad.abs().sum() > 0
    assert t.grad is None
