"""Detection architecture registry: torchvision detectors and a tiny test detector, chosen by key.

A sibling of :mod:`pipeline.models` (whose keys are classifiers with one ``Linear`` head): a detector has a
head of several layers whose output widths are fixed by the anchors and the classes, and a fixed input size
its anchors were laid out for, so it needs its own record. Every detector is built untrained —
``weights=None, weights_backbone=None`` — which is also what keeps torchvision from putting
``FrozenBatchNorm2d`` in the backbone (Torch-Pruning cannot prune it; a user's pretrained detector goes
through :func:`unfreeze_batchnorm` first).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from device.registry import Registry


@dataclass(frozen=True)
class KeptWhole:
    """A module that pruning leaves whole, and why (recorded in the manifest and the report)."""

    module: str
    reason: str


@dataclass(frozen=True)
class Detector:
    """A registered detection architecture.

    Attributes:
        name: Registry key.
        build: ``build(num_classes, input_size) -> nn.Module``; ``num_classes`` counts the data's classes, never a
            background class (the builder adds one where the architecture wants it).
        kept_whole: ``kept_whole(model) -> [KeptWhole]``: the head layers whose widths the anchors and classes fix.
        input_size: The square side the detector's transform resizes to by default.
        fixed_size: True when the anchors only fit ``input_size`` (SSDlite's 320).
        label_offset: Added to a data class index to get the model's label (1 where label 0 is background).
        torchvision_name: The torchvision builder whose weights fit, if any.
    """

    name: str
    build: Callable[[int, int], nn.Module]
    kept_whole: Callable[[nn.Module], list[KeptWhole]]
    input_size: int
    fixed_size: bool = False
    label_offset: int = 0
    torchvision_name: str | None = None


DETECTORS: Registry[Detector] = Registry("detection architecture")

_ANCHOR_WIDTH = "its output width is anchors × classes (or × 4 box deltas): pruning it would change what the " \
                "detector predicts, not how cheaply"


def _fpn_head_kept(model: nn.Module, centerness: bool) -> list[KeptWhole]:
    kept = [KeptWhole("head.classification_head.cls_logits", f"class logits per anchor: {_ANCHOR_WIDTH}"),
            KeptWhole("head.regression_head.bbox_reg", f"box deltas per anchor: {_ANCHOR_WIDTH}")]
    if centerness:
        kept.append(KeptWhole("head.regression_head.bbox_ctrness", "FCOS centerness, one per anchor: its width is "
                                                                   "the anchor count"))
    return kept


def _ssd_head_kept(model: nn.Module) -> list[KeptWhole]:
    # Torch-Pruning's torchvision example ignores SSD's whole head: each level's classification and regression
    # branches share their input with nothing, and their widths are anchors × (classes + 1) and anchors × 4.
    return [KeptWhole("head", "SSDlite's head (every level's class and box branches), kept whole as in "
                              f"Torch-Pruning's torchvision example: {_ANCHOR_WIDTH}")]


def _ssdlite(num_classes: int, input_size: int) -> nn.Module:
    from torchvision.models.detection import ssdlite320_mobilenet_v3_large

    # SSD scores with a softmax over classes + background (label 0).
    return ssdlite320_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=num_classes + 1)


def _fcos_resnet50(num_classes: int, input_size: int) -> nn.Module:
    from torchvision.models.detection import fcos_resnet50_fpn

    return fcos_resnet50_fpn(weights=None, weights_backbone=None, num_classes=num_classes,
                             min_size=input_size, max_size=input_size)


def _retinanet_resnet50_v2(num_classes: int, input_size: int) -> nn.Module:
    from torchvision.models.detection import retinanet_resnet50_fpn_v2

    return retinanet_resnet50_fpn_v2(weights=None, weights_backbone=None, num_classes=num_classes,
                                     min_size=input_size, max_size=input_size)


def _fcos_resnet18(num_classes: int, input_size: int) -> nn.Module:
    """FCOS on a ResNet-18 FPN: the FPN teacher that trains on two CPU cores (ResNet-50 at 800 px takes seconds
    per image here); built exactly as torchvision's ``fcos_resnet50_fpn`` builds its backbone."""
    from torchvision.models import resnet18
    from torchvision.models.detection.backbone_utils import _resnet_fpn_extractor
    from torchvision.models.detection.fcos import FCOS
    from torchvision.ops.feature_pyramid_network import LastLevelP6P7

    backbone = _resnet_fpn_extractor(resnet18(weights=None, norm_layer=nn.BatchNorm2d), 5, returned_layers=[2, 3, 4],
                                     extra_blocks=LastLevelP6P7(256, 256))
    return FCOS(backbone, num_classes, min_size=input_size, max_size=input_size)


class TinyBackbone(nn.Module):
    """Four stride-2 conv stages and a two-level FPN (strides 8 and 16): the test detector's backbone.

    Small enough that a forward pass at 64 px takes milliseconds, yet it has what pruning must respect in a real
    detector: BatchNorm, a top-down FPN whose additions couple channels, and a head shared across levels.
    """

    def __init__(self, in_channels: int = 3, widths: tuple[int, ...] = (16, 24, 32, 48), out_channels: int = 32):
        super().__init__()
        from torchvision.ops import FeaturePyramidNetwork

        stages, channels = [], in_channels
        for width in widths:
            stages.append(nn.Sequential(nn.Conv2d(channels, width, 3, stride=2, padding=1, bias=False),
                                        nn.BatchNorm2d(width), nn.ReLU(inplace=True)))
            channels = width
        self.stages = nn.ModuleList(stages)
        self.fpn = FeaturePyramidNetwork(list(widths[-2:]), out_channels)
        self.out_channels = out_channels  # what torchvision's detection heads read

    def forward(self, x: torch.Tensor) -> "OrderedDict[str, torch.Tensor]":
        features = []
        for stage in self.stages:
            x = stage(x)
            features.append(x)
        return self.fpn(OrderedDict((str(i), f) for i, f in enumerate(features[-2:])))


def _tiny_fcos(num_classes: int, input_size: int) -> nn.Module:
    from torchvision.models.detection.anchor_utils import AnchorGenerator
    from torchvision.models.detection.fcos import FCOS, FCOSHead

    backbone = TinyBackbone()
    # FCOS places one anchor point per location, sized as its level's stride (as fcos_resnet50_fpn does): a box
    # goes to the level whose [4, 8] × size range holds its largest point-to-edge distance.
    anchors = AnchorGenerator(sizes=((8,), (16,)), aspect_ratios=((1.0,), (1.0,)))
    head = FCOSHead(backbone.out_channels, 1, num_classes, num_convs=1)
    return FCOS(backbone, num_classes, min_size=input_size, max_size=input_size, anchor_generator=anchors, head=head,
                image_mean=[0.0] * 3, image_std=[1.0] * 3, score_thresh=0.05)  # COCO scoring keeps low scores


DETECTORS.add("ssdlite320_mobilenet_v3_large", Detector(
    "ssdlite320_mobilenet_v3_large", _ssdlite, _ssd_head_kept, 320, fixed_size=True, label_offset=1,
    torchvision_name="ssdlite320_mobilenet_v3_large"))
DETECTORS.add("fcos_resnet50_fpn", Detector(
    "fcos_resnet50_fpn", _fcos_resnet50, lambda m: _fpn_head_kept(m, centerness=True), 800,
    torchvision_name="fcos_resnet50_fpn"))
DETECTORS.add("retinanet_resnet50_fpn_v2", Detector(
    "retinanet_resnet50_fpn_v2", _retinanet_resnet50_v2, lambda m: _fpn_head_kept(m, centerness=False), 800,
    torchvision_name="retinanet_resnet50_fpn_v2"))
DETECTORS.add("fcos_resnet18_fpn", Detector(
    "fcos_resnet18_fpn", _fcos_resnet18, lambda m: _fpn_head_kept(m, centerness=True), 320))
DETECTORS.add("tiny_fcos", Detector(
    "tiny_fcos", _tiny_fcos, lambda m: _fpn_head_kept(m, centerness=True), 64))


def build_detector(arch: str, num_classes: int, input_size: int | None = None) -> nn.Module:
    """Builds an untrained detector of a registered architecture.

    Args:
        arch: Registry key.
        num_classes: The data's classes (no background class).
        input_size: Square input side; default the architecture's own.

    Raises:
        UnknownKeyError: ``arch`` is not registered (naming the near keys).
        ConfigError: A size other than 320 for a fixed-size detector.
    """
    from device.errors import ConfigError

    spec = DETECTORS.get(arch)
    size = input_size or spec.input_size
    if spec.fixed_size and size != spec.input_size:
        raise ConfigError(f"{arch} is laid out for {spec.input_size}×{spec.input_size} inputs, got {size}",
                          fix=f"set the input size to {spec.input_size} or choose an FPN detector, whose size is free")
    return spec.build(num_classes, size)


def kept_whole(arch: str, model: nn.Module) -> list[KeptWhole]:
    """The layers of ``model`` (an ``arch`` detector) that pruning must leave whole, each with the reason."""
    return DETECTORS.get(arch).kept_whole(model)


def unfreeze_batchnorm(model: nn.Module) -> int:
    """Replaces every ``FrozenBatchNorm2d`` in ``model`` with an equivalent ``BatchNorm2d``, in place.

    torchvision freezes the BatchNorm of a detector built with pretrained backbone weights; Torch-Pruning has no
    pruner for the frozen kind, so a user's pretrained detector is converted first. In eval mode the two compute
    the same affine map, ``(x − mean) · weight / sqrt(var + eps) + bias``.

    Returns:
        How many layers were converted.
    """
    from torchvision.ops.misc import FrozenBatchNorm2d

    converted = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            if not isinstance(child, FrozenBatchNorm2d):
                continue
            bn = nn.BatchNorm2d(child.weight.numel(), eps=child.eps).to(child.weight.device, child.weight.dtype)
            with torch.no_grad():
                bn.weight.copy_(child.weight)
                bn.bias.copy_(child.bias)
                bn.running_mean.copy_(child.running_mean)
                bn.running_var.copy_(child.running_var)
            bn.train(child.training)
            setattr(parent, name, bn)
            converted += 1
    return converted


def detector_size_metrics(model: nn.Module, input_size: int) -> dict[str, float]:
    """Parameters (millions) and MACs (billions) per image at the detector's input size, as the manifest records."""
    from pipeline.models import count_macs, count_parameters

    return {"params_m": count_parameters(model) / 1e6,
            "macs_g": count_macs(model, (1, 3, input_size, input_size)) / 1e9, "input_size": input_size}
