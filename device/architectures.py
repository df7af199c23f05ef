"""Architecture registry: torchvision models and tiny test models under one set of keys, for both sides.

The build side trains these; the device rebuilds them from a checkpoint (state + architecture key) when it must
export on its own torch (the Torch-TensorRT road, :mod:`device.torch_checkpoint`). So the registry lives here and
the pipeline imports it (``pipeline`` → ``device``, never back). ``device`` imports without torch: every factory
imports torch and torchvision when it is called, never at import.

Every factory takes ``num_classes`` and returns an untrained ``nn.Module``; ``classifier`` names the head that
pruning must never touch and that is replaced when loaded weights were trained for another class count.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable

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
    build: Callable[[int], Any]
    classifier: str
    torchvision_name: str | None = None
    in_channels: int = 3


ARCHITECTURES: Registry[Architecture] = Registry("architecture")


def _torchvision(name: str, classifier: str) -> None:
    def build(num_classes: int):
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


@functools.cache
def tiny_resnet_class():
    """``TinyResNet``: a three-stage residual net made of torchvision's own ``BasicBlock``.

    The test model of the registry (timm keeps ``test_*`` models the same way): residual adds and downsample
    branches exercise DepGraph's coupled channels, yet a whole pipeline run on ``digits`` takes seconds on two
    cores. Defined on first use, so that this module imports without torch.
    """
    import torch
    from torch import nn
    from torchvision.models.resnet import BasicBlock

    class TinyResNet(nn.Module):
        def __init__(self, num_classes: int = 10, in_channels: int = 3, widths: tuple[int, ...] = (16, 32, 64)):
            super().__init__()
            self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                      nn.BatchNorm2d(widths[0]), nn.ReLU(inplace=True))
            blocks, channels = [], widths[0]
            for index, width in enumerate(widths):
                stride = 1 if index == 0 else 2
                downsample = None
                if stride != 1 or channels != width:
                    downsample = nn.Sequential(nn.Conv2d(channels, width, 1, stride=stride, bias=False),
                                               nn.BatchNorm2d(width))
                blocks.append(BasicBlock(channels, width, stride=stride, downsample=downsample))
                channels = width
            self.layers = nn.Sequential(*blocks)
            self.pool = nn.AdaptiveAvgPool2d(1)
            self.fc = nn.Linear(channels, num_classes)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.fc(torch.flatten(self.pool(self.layers(self.stem(x))), 1))

    # Found by pickle and copy as device.architectures.TinyResNet (the module's __getattr__ below).
    TinyResNet.__module__, TinyResNet.__qualname__ = __name__, "TinyResNet"
    return TinyResNet


def __getattr__(name: str):
    if name == "TinyResNet":
        return tiny_resnet_class()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


ARCHITECTURES.add("tiny_resnet", Architecture("tiny_resnet", lambda n: tiny_resnet_class()(n), "fc"))


def build_model(arch: str, num_classes: int):
    """Builds an untrained model of a registered architecture.

    Raises:
        UnknownKeyError: ``arch`` is not registered (the error suggests near names).
    """
    return ARCHITECTURES.get(arch).build(num_classes)


def fold_batchnorm(model):
    """A copy of ``model`` (eval mode) with every BatchNorm that directly follows a Conv folded into it.

    Needed before fake quantization, on both sides alike (the build host calibrates, the device restores):
    otherwise the quantizers see unfolded weights and the exported graph keeps its BatchNorm nodes.
    """
    import copy

    import torch.fx
    from torch import nn
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
