"""Detection pruning: backbone and FPN pruned to a MACs target, the head's anchor-sized layers kept whole."""

import pytest
import torch

from pipeline.tasks.detection.models import build_detector
from pipeline.tasks.detection.pruning import prune_detector, prune_with_ratio
from pipeline.models import count_macs


def _run(model, size, images=2):
    model.eval()
    with torch.no_grad():
        return model(torch.rand(images, 3, size, size))


def test_tiny_detector_prunes_towards_the_target_with_its_head_whole():
    torch.manual_seed(0)
    model = build_detector("tiny_fcos", 4)
    head = model.head
    widths = (head.classification_head.cls_logits.weight.shape, head.regression_head.bbox_reg.weight.shape,
              head.regression_head.bbox_ctrness.weight.shape)
    result = prune_detector(model, "tiny_fcos", macs_target=0.6, input_size=64, round_to=4, tolerance=0.1)
    assert result.base_macs == count_macs(build_detector("tiny_fcos", 4).eval(), (1, 3, 64, 64))
    assert result.macs == count_macs(model, (1, 3, 64, 64)) and result.macs < result.base_macs
    assert abs(result.fraction - 0.6) <= 0.1 * 0.6, result  # within the tolerance asked for
    assert (head.classification_head.cls_logits.weight.shape, head.regression_head.bbox_reg.weight.shape,
            head.regression_head.bbox_ctrness.weight.shape) == widths
    assert [k["module"] for k in result.kept_whole] == ["head.classification_head.cls_logits",
                                                        "head.regression_head.bbox_reg",
                                                        "head.regression_head.bbox_ctrness"]
    assert all(k["reason"] for k in result.kept_whole)
    assert model.backbone.stages[-1][0].out_channels < 48  # the backbone did lose channels
    out = _run(model, 64, images=3)
    assert len(out) == 3 and set(out[0]) == {"boxes", "scores", "labels"}


def test_a_ratio_of_zero_changes_nothing():
    model = build_detector("tiny_fcos", 3)
    before = count_macs(model, (1, 3, 64, 64))
    prune_with_ratio(model, "tiny_fcos", 0.0, 64)
    assert count_macs(model, (1, 3, 64, 64)) == before


@pytest.mark.slow
def test_ssdlite_prunes_its_backbone_and_keeps_the_whole_head():
    torch.manual_seed(0)
    model = build_detector("ssdlite320_mobilenet_v3_large", 5).eval()
    shapes = {n: p.shape for n, p in model.head.named_parameters()}
    result = prune_detector(model, "ssdlite320_mobilenet_v3_large", macs_target=0.7, tolerance=0.1, iterations=6)
    assert result.input_size == 320 and result.fraction < 0.85
    assert {n: p.shape for n, p in model.head.named_parameters()} == shapes
    assert [k["module"] for k in result.kept_whole] == ["head"]
    out = _run(model, 320)
    assert len(out) == 2 and out[0]["boxes"].shape[1] == 4
