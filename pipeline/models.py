"""Model arithmetic for the build side: parameters, MACs (total and per layer), size metrics.

The architecture registry itself is :mod:`device.architectures` (re-exported here for the stages).
"""

from __future__ import annotations

import torch
from torch import nn

# The registry lives in device/: the device rebuilds a student from its checkpoint to export it on its own torch.
from device.architectures import ARCHITECTURES, Architecture, build_model, fold_batchnorm  # noqa: F401 (re-exported)


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
