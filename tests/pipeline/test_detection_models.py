"""Detection architectures: built untrained from the registry, heads sized by the data, FrozenBatchNorm converted."""

import pytest
import torch
from torch import nn

from device.errors import ConfigError, UnknownKeyError
from pipeline.tasks.detection.models import DETECTORS, build_detector, kept_whole, unfreeze_batchnorm


def test_registry_holds_the_torchvision_teachers_and_a_test_detector():
    assert {"ssdlite320_mobilenet_v3_large", "fcos_resnet50_fpn", "retinanet_resnet50_fpn_v2",
            "tiny_fcos"} <= set(DETECTORS.names())


def test_an_unknown_detector_names_the_near_keys():
    with pytest.raises(UnknownKeyError) as err:
        DETECTORS.get("ssdlite320_mobilenet_v3")
    assert "ssdlite320_mobilenet_v3_large" in err.value.fix


def test_a_duplicate_detector_key_is_refused():
    with pytest.raises(ConfigError, match="already registered"):
        DETECTORS.add("tiny_fcos", DETECTORS.get("tiny_fcos"))


def test_tiny_detector_predicts_boxes_scores_labels_for_a_batch():
    model = build_detector("tiny_fcos", 5).eval()
    with torch.no_grad():
        out = model(torch.rand(3, 3, 64, 64))
    assert len(out) == 3 and set(out[0]) == {"boxes", "scores", "labels"}
    assert model.head.classification_head.cls_logits.out_channels == 5


@pytest.mark.parametrize("arch,classes,width", [
    ("ssdlite320_mobilenet_v3_large", 7, None), ("fcos_resnet50_fpn", 7, 7), ("retinanet_resnet50_fpn_v2", 7, 9 * 7)])
def test_teachers_are_untrained_batchnorm_and_sized_by_the_data(arch, classes, width):
    from torchvision.ops.misc import FrozenBatchNorm2d

    model = build_detector(arch, classes, 320 if arch.startswith("ssd") else 128)
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())  # prunable as built
    if width is None:  # SSD: softmax over the classes and background, the last channel block of each level
        conv = model.head.classification_head.module_list[0][-1]
        assert conv.out_channels % (classes + 1) == 0
    else:
        assert model.head.classification_head.cls_logits.out_channels == width
    for kept in kept_whole(arch, model):
        model.get_submodule(kept.module)  # every name resolves
        assert kept.reason


def test_a_fixed_size_detector_refuses_another_size():
    with pytest.raises(ConfigError, match="320"):
        build_detector("ssdlite320_mobilenet_v3_large", 3, 256)


def test_frozen_batchnorm_becomes_batchnorm_with_the_same_outputs():
    from torchvision.ops.misc import FrozenBatchNorm2d

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3), FrozenBatchNorm2d(8, eps=1e-3), nn.ReLU(),
                          nn.Sequential(nn.Conv2d(8, 4, 1), FrozenBatchNorm2d(4)))
    for frozen in (model[1], model[3][1]):
        n = frozen.weight.numel()
        frozen.weight.copy_(torch.rand(n) + 0.5)
        frozen.bias.copy_(torch.randn(n))
        frozen.running_mean.copy_(torch.randn(n))
        frozen.running_var.copy_(torch.rand(n) + 0.1)
    x = torch.randn(2, 3, 12, 12)
    before = model(x)
    assert unfreeze_batchnorm(model) == 2
    assert not any(isinstance(m, FrozenBatchNorm2d) for m in model.modules())
    assert isinstance(model[3][1], nn.BatchNorm2d) and model[1].eps == 1e-3
    model.eval()
    torch.testing.assert_close(model(x), before, rtol=1e-5, atol=1e-5)
