"""Detection distillation terms: KD on matched anchors' class scores and feature imitation on the head's maps."""

import copy

import pytest
import torch

from device.errors import StageError
from pipeline.tasks.detection.distill import (DetectionDistillLoss, FeatureImitation, class_kd, detector_parts,
                                        matched_anchors)
from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.pruning import prune_with_ratio


@pytest.mark.parametrize("activation", ["sigmoid", "softmax"])
def test_class_kd_is_zero_when_the_scores_agree_and_positive_when_not(activation):
    torch.manual_seed(0)
    teacher = torch.randn(2, 6, 4)
    mask = torch.ones(2, 6, dtype=torch.bool)
    assert float(class_kd(teacher.clone(), teacher, mask, 2.0, activation)) == pytest.approx(0.0, abs=1e-6)
    student = torch.randn(2, 6, 4, requires_grad=True)
    loss = class_kd(student, teacher, mask, 2.0, activation)
    assert float(loss) > 0
    loss.backward()
    assert student.grad is not None and float(student.grad.abs().sum()) > 0


def test_class_kd_looks_only_at_matched_anchors():
    teacher, student = torch.randn(1, 5, 3), torch.randn(1, 5, 3)
    mask = torch.tensor([[True, False, True, False, False]])
    changed = student.clone()
    changed[0, 1] += 10.0  # an unmatched anchor: no effect
    assert torch.equal(class_kd(student, teacher, mask, 1.0, "sigmoid"), class_kd(changed, teacher, mask, 1.0, "sigmoid"))
    changed[0, 2] += 10.0  # a matched one: an effect
    assert not torch.equal(class_kd(student, teacher, mask, 1.0, "sigmoid"), class_kd(changed, teacher, mask, 1.0, "sigmoid"))
    none = torch.zeros_like(mask)
    assert float(class_kd(student, teacher, none, 1.0, "sigmoid")) == 0.0


def test_class_kd_refuses_different_anchor_sets():
    with pytest.raises(StageError, match="student logits"):
        class_kd(torch.zeros(1, 4, 3), torch.zeros(1, 5, 3), torch.ones(1, 4, dtype=torch.bool), 1.0, "sigmoid")


def test_an_anchor_is_matched_when_its_centre_is_inside_a_box():
    anchors = [torch.tensor([[0.0, 0, 4, 4], [8, 8, 12, 12], [20, 20, 24, 24]])]
    boxes = [torch.tensor([[1.0, 1, 11, 11]])]
    assert matched_anchors(anchors, boxes).tolist() == [[True, True, False]]
    assert matched_anchors(anchors, [torch.zeros(0, 4)]).tolist() == [[False, False, False]]


def test_feature_imitation_is_zero_for_identical_maps_through_identity_adapters():
    imitation = FeatureImitation([3, 3], [3, 3])
    for adapter in imitation.adapters:
        torch.nn.init.dirac_(adapter.weight)
        torch.nn.init.zeros_(adapter.bias)
    maps = [torch.randn(2, 3, 8, 8), torch.randn(2, 3, 4, 4)]
    assert float(imitation(maps, maps)) == pytest.approx(0.0, abs=1e-10)
    assert float(imitation(maps, [m + 1 for m in maps])) == pytest.approx(1.0, rel=1e-5)
    with pytest.raises(StageError, match="levels"):
        FeatureImitation([3], [3, 3])


def test_a_pruned_tiny_student_distills_from_its_teacher():
    torch.manual_seed(0)
    teacher = build_detector("tiny_fcos", 3).eval()
    student = prune_with_ratio(copy.deepcopy(teacher), "tiny_fcos", 0.5, 64, round_to=4).train()
    loss = DetectionDistillLoss(student, teacher, "sigmoid", input_size=64)
    s_widths = [a.in_channels for a in loss.imitation.adapters]
    t_widths = [a.out_channels for a in loss.imitation.adapters]
    assert s_widths == [16, 16] and t_widths == [32, 32]  # the pruned FPN is narrower; adapters bridge it
    images = torch.rand(2, 3, 64, 64)
    targets = [{"boxes": torch.tensor([[8.0, 8, 40, 40]]), "labels": torch.tensor([1])},
               {"boxes": torch.tensor([[20.0, 10, 60, 30]]), "labels": torch.tensor([2])}]
    terms = loss(student, teacher, images, targets)
    assert int(terms["matched_anchors"]) > 0
    assert float(terms["class_kd"]) > 0 and float(terms["feature"]) > 0
    terms["total"].backward()
    assert student.backbone.stages[0][0].weight.grad is not None
    assert loss.imitation.adapters[0].weight.grad is not None
    assert all(p.grad is None for p in teacher.parameters())  # the teacher only teaches


@pytest.mark.slow
def test_ssdlite_parts_feed_softmax_kd():
    torch.manual_seed(0)
    teacher = build_detector("ssdlite320_mobilenet_v3_large", 3).eval()
    student = copy.deepcopy(teacher).train()
    parts = detector_parts(teacher, torch.rand(1, 3, 320, 320))
    assert parts.head["cls_logits"].shape[-1] == 4  # three classes and the background
    assert len(parts.features) == 6 and parts.anchors[0].shape[0] == parts.head["cls_logits"].shape[1]
    loss = DetectionDistillLoss(student, teacher, "softmax", input_size=320)
    terms = loss(student, teacher, torch.rand(1, 3, 320, 320),
                 [{"boxes": torch.tensor([[50.0, 50, 200, 220]]), "labels": torch.tensor([1])}])
    assert int(terms["matched_anchors"]) > 0 and torch.isfinite(terms["total"])
