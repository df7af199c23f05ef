"""Architecture registry: torchvision models and tiny test models under one set of keys.

Every factory takes ``num_classes`` and ``in_channels`` and returns an untrained ``nn.Module``;
``classifier`` names the head that pruning must never touch and that is replaced when loaded
weights were trained for another class count.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.fx
from torch import nn

from device.registry import Registry


@dataclass(frozen=True)
class Architecture:
    """A registered architecture.

    Attributes:
        name: Registry key.
        build: ``build(num_classes) -> nn.Module`` (3-channel input unless stated).
        classifier: Dotted module name of the final classification layer.
        torchvision_name: The torchvision builder whose ImageNet weights fit, if any.
        in_channels: Input channels the architecture expects.
    """

    name: str
    build: Callable[[int], nn.Module]
    classifier: str
    torchvision_name: str | None = None
    in_channels: int = 3


ARCHITECTURES: Registry[Architecture] = Registry("architecture")


def _torchvision(name: str, classifier: str) -> None:
    def build(num_classes: int) -> nn.Module:
        import torchvision

        return torchvision.models.get_model(name, weights=None, num_classes=num_classes)

    ARCHITECTURES.add(name, Architecture(name, build, classifier, torchvision_name=name))


for _name, _classifier in [
    ("resnet18", "fc"),
    ("resnet34", "fc"),
    ("resnet50", "fc"),
    ("resnet101", "fc"),
    ("mobilenet_v2", "classifier.1"),
    ("mobilenet_v3_small", "classifier.3"),
    ("mobilenet_v3_large", "classifier.3"),
    ("efficientnet_b0", "classifier.1"),
    ("regnet_y_400mf", "fc"),
]:
    _torchvision(_name, _classifier)


class TinyResNet(nn.Module):
    """A three-stage residual net made of torchvision's own ``BasicBlock``.

    The test model of the registry (timm keeps ``test_*`` models the same way): residual adds
    and downsample branches exercise DepGraph's coupled channels, yet a whole pipeline run on
    ``digits`` takes seconds on two cores.
    """

    def __init__(self, num_classes: int = 10, in_channels: int = 3, widths: tuple[int, ...] = (16, 32, 64)):
        super().__init__()
        from torchvision.models.resnet import BasicBlock

        self.stem = nn.Sequential(
            nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False), nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True)
        )
        blocks, channels = [], widths[0]
        for index, width in enumerate(widths):
            stride = 1 if index == 0 else 2
            downsample = None
            if stride != 1 or channels != width:
                downsample = nn.Sequential(nn.Conv2d(channels, width, 1, stride=stride, bias=False), nn.BatchNorm2d(width))
            blocks.append(BasicBlock(channels, width, stride=stride, downsample=downsample))
            channels = width
        self.layers = nn.Sequential(*blocks)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(channels, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))


ARCHITECTURES.add("tiny_resnet", Architecture("tiny_resnet", lambda n: TinyResNet(n), "fc"))


def build_model(arch: str, num_classes: int) -> nn.Module:
    """Builds an untrained model of a registered architecture."""
    return ARCHITECTURES.get(arch).build(num_classes)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def _count_ops(model: nn.Module, input_shape: tuple[int, ...], layer_wise: bool) -> tuple:
    """Torch-Pruning's operation counter over one forward pass in eval mode (on a copy it makes itself)."""
    import torch_pruning as tp

    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            return tp.utils.count_ops_and_params(model, torch.zeros(input_shape), layer_wise=layer_wise)
    finally:
        model.train(was_training)


def count_macs(model: nn.Module, input_shape: tuple[int, ...]) -> int:
    """Multiply-accumulates of one forward pass per image (Torch-Pruning's counter: conv, linear, BN)."""
    return int(_count_ops(model, input_shape, layer_wise=False)[0])


def layer_macs(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, int]:
    """Multiply-accumulates per image of every convolution and linear layer that runs, by module name.

    Torch-Pruning's per-layer count, so the layers add up with :func:`count_macs` (bias adds included,
    one per output element).
    """
    layers = _count_ops(model, input_shape, layer_wise=True)[2]
    batch = int(input_shape[0])  # the per-layer counts are of the whole batch; count_macs divides its total too
    return {name: int(layers[module]) // batch for name, module in model.named_modules()
            if isinstance(module, (nn.Conv2d, nn.Linear)) and layers.get(module)}


def size_metrics(model: nn.Module, input_shape: tuple[int, ...]) -> dict[str, float]:
    """Parameters (millions) and MACs (billions) of one forward pass, as recorded in the manifest."""
    return {"params_m": count_parameters(model) / 1e6, "macs_g": count_macs(model, input_shape) / 1e9}


def fold_batchnorm(model: nn.Module) -> nn.Module:
    """A copy of ``model`` (eval mode) with every BatchNorm that directly follows a Conv folded into it.

    Needed before fake quantization: otherwise the quantizers see unfolded weights and the
    exported graph keeps its BatchNorm nodes.
    """
    import copy

    from torch.nn.utils.fusion import fuse_conv_bn_eval

    traced = torch.fx.symbolic_trace(copy.deepcopy(model).eval())
    modules = dict(traced.named_modules())
    for node in list(traced.graph.nodes):
        if node.op != "call_module" or not isinstance(modules[node.target], nn.BatchNorm2d):
            continue
        conv = node.args[0]
        if conv.op == "call_module" and isinstance(modules[conv.target], nn.Conv2d) and len(conv.users) == 1:
            parent, _, name = conv.target.rpartition(".")
            setattr(traced.get_submodule(parent), name, fuse_conv_bn_eval(modules[conv.target], modules[node.target]))
            node.replace_all_uses_with(conv)
            traced.graph.erase_node(node)
            bn_parent, _, bn_name = node.target.rpartition(".")
            delattr(traced.get_submodule(bn_parent), bn_name)
    traced.graph.lint()
    traced.recompile()
    return traced
