"""Segmentation architectures by key, and their checkpoints: a tiny test segmenter beside torchvision's.

Every model takes N×3×H×W and returns the class logits N×classes×H×W at the input's size (torchvision's segmenters
return a dict; the wrapper returns its ``out``, which is what the ONNX graph and the device see). Pruned widths
travel as the recorded layer structure, so a checkpoint reloads with ``torch.load(weights_only=True)`` into a freshly
built model of its architecture, as every task's does.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from device.registry import Registry

FORMAT = "edgefold.segmenter/1"


@dataclass(frozen=True)
class Segmenter:
    """A registered architecture: ``build(num_classes) -> nn.Module`` and the layers pruning keeps whole (the ones
    whose output width is the class count)."""

    name: str
    build: Callable[[int], nn.Module]
    classifiers: Callable[[nn.Module], list[nn.Module]]


SEGMENTERS: Registry[Segmenter] = Registry("segmentation architecture")


class TinySeg(nn.Module):
    """A small encoder (three strided convs) and a decoder that adds the stride-2 features back before the classifier:
    the test segmenter (tens of thousands of parameters; trains in seconds on two cores)."""

    def __init__(self, num_classes: int, width: int = 32):
        super().__init__()

        def block(cin: int, cout: int, stride: int) -> nn.Sequential:
            return nn.Sequential(nn.Conv2d(cin, cout, 3, stride, 1, bias=False), nn.BatchNorm2d(cout), nn.ReLU())

        self.stem = block(3, width // 2, 2)
        self.down = nn.Sequential(block(width // 2, width, 2), block(width, width, 1))
        self.deep = nn.Sequential(block(width, width, 2), block(width, width, 1))
        self.lateral = nn.Conv2d(width // 2, width, 1)
        self.classifier = nn.Conv2d(width, num_classes, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        stem = self.stem(x)
        deep = self.deep(self.down(stem))
        fused = nn.functional.interpolate(deep, size=stem.shape[-2:], mode="bilinear", align_corners=False)
        fused = torch.relu(fused + self.lateral(stem))
        return nn.functional.interpolate(self.classifier(fused), size=x.shape[-2:], mode="bilinear",
                                         align_corners=False)


class TorchvisionOut(nn.Module):
    """A torchvision segmenter returning its ``out`` logits alone (no auxiliary head)."""

    def __init__(self, model: nn.Module):
        super().__init__()
        self.model = model

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.model(x)["out"]


def _torchvision(name: str) -> Callable[[int], nn.Module]:
    def build(num_classes: int) -> nn.Module:
        import torchvision

        builder = getattr(torchvision.models.segmentation, name)
        # Untrained: no download here, and no auxiliary head (the ladder deploys the main output alone).
        kwargs = {} if name.startswith("lraspp") else {"aux_loss": False}
        return TorchvisionOut(builder(weights=None, weights_backbone=None, num_classes=num_classes, **kwargs))

    return build


def _lraspp_classifiers(model: nn.Module) -> list[nn.Module]:
    head = model.model.classifier
    return [head.low_classifier, head.high_classifier]


def _deeplab_classifiers(model: nn.Module) -> list[nn.Module]:
    return [model.model.classifier[-1]]


SEGMENTERS.add("tiny_seg", Segmenter("tiny_seg", TinySeg, lambda model: [model.classifier]))
SEGMENTERS.add("lraspp_mobilenet_v3_large", Segmenter("lraspp_mobilenet_v3_large",
                                                      _torchvision("lraspp_mobilenet_v3_large"), _lraspp_classifiers))
for _name in ("deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50"):
    SEGMENTERS.add(_name, Segmenter(_name, _torchvision(_name), _deeplab_classifiers))


def build_segmenter(arch: str, num_classes: int) -> nn.Module:
    return SEGMENTERS.get(arch).build(num_classes)


def size_metrics(model: nn.Module, input_size: int) -> dict[str, float]:
    """Parameters (millions) and MACs (billions) per image at the input size, as the manifest records."""
    from pipeline.models import count_macs, count_parameters

    return {"params_m": count_parameters(model) / 1e6,
            "macs_g": count_macs(model, (1, 3, input_size, input_size)) / 1e9, "input_size": input_size}


def save_segmenter(path: str | os.PathLike, model: nn.Module, arch: str, num_classes: int, input_size: int,
                   **meta: Any) -> Path:
    """Writes a checkpoint atomically (state and structure, never a pickled module); under DDP only rank 0 writes."""
    from pipeline.train.checkpoints import save_model

    return save_model(path, model, FORMAT, arch, num_classes, input_size, meta)


def load_segmenter(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """A checkpoint written by :func:`save_segmenter` (eval mode, CPU) and its metadata.

    Raises:
        CheckpointError: Missing, not a segmenter checkpoint, unknown architecture, or shapes that do not fit.
    """
    from pipeline.train.checkpoints import load_model

    return load_model(path, FORMAT, "segmenter", SEGMENTERS, lambda arch, classes, _: build_segmenter(arch, classes))


def load_segmenter_weights(model: nn.Module, path: str | os.PathLike) -> None:
    """Loads a user's ``state_dict`` into a freshly built segmenter (a torchvision segmenter's own keys, or this
    wrapper's); every tensor must fit: another class count is refused, not silently re-initialised.

    Raises:
        CheckpointError: Not a state of tensors, or tensors that do not fit the architecture.
    """
    from device.errors import CheckpointError
    from device.uploads.torch_checkpoint import load_state_strict, torch_load

    fix = "pass the file written by torch.save(model.state_dict(), path) for this architecture and class count"
    state = torch_load(Path(path), f"segmenter weights {path}", fix_unsafe=fix, fix_corrupt=fix)
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} is not a state_dict of tensors", fix=fix)
    target = model.model if isinstance(model, TorchvisionOut) and not any(k.startswith("model.") for k in state) \
        else model
    load_state_strict(target, {k: v for k, v in state.items() if not k.startswith("aux_classifier.")}, str(path))
