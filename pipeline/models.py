"""Model arithmetic for the build side: parameters, MACs (total and per layer), size metrics.

The architecture registry itself is :mod:`device.models.architectures` (re-exported here for the stages).
"""

from __future__ import annotations

import torch
from torch import nn

# The registry lives in device/: the device rebuilds a student from its checkpoint to export it on its own torch.
from device.models.architectures import (  # noqa: F401 (re-exported)
    ARCHITECTURES, Architecture, build_model, fold_batchnorm)


def checked_model(arch: str, num_classes: int, in_channels: int, input_size: int) -> nn.Module:
    """Builds ``arch`` and checks what the stages will rely on, before any stage: a convolution to take the input
    (grey input and RGB weights are folded there), the classifier the registry names, and one forward pass at the
    recipe's input size giving ``num_classes`` scores.

    Raises:
        ConfigError: Naming the architecture, what failed and what to change.
    """
    from device.models.architectures import stem_name
    from device.errors import ConfigError

    model = build_model(arch, num_classes, in_channels, input_size).eval()
    entry = ARCHITECTURES.get(arch)
    try:
        stem_name(model)
        entry.head_modules(model, exact=True)
    except (ValueError, AttributeError) as err:
        raise ConfigError(f"{arch} ({entry.source}) cannot enter the ladder: {err}",
                          fix="register it with 'classifier' naming its final layer, and a Conv2d taking the image "
                              "first") from None
    try:
        with torch.no_grad():
            shape = tuple(model(torch.zeros(1, in_channels, input_size, input_size)).shape)
    except Exception as err:  # the model's own code: any error is a size or channel count it does not take
        raise ConfigError(f"{arch} does not run on {in_channels}×{input_size}×{input_size} input: "
                          f"{type(err).__name__}: {str(err)[:200]}",
                          fix="set preprocess.input_size to a size it takes (a timm model's pretrained_cfg names "
                              "its own; leave preprocess out to use it)") from None
    if shape != (1, num_classes):
        raise ConfigError(f"{arch} gives outputs of shape {shape} for one image, not {num_classes} class scores",
                          fix="register a builder whose model ends in the classifier it names")
    return model


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


def as_exported(model: nn.Module, arch: str, folded: bool = False) -> tuple[nn.Module, bool]:
    """``model`` in the form it is exported in (:attr:`Architecture.inference_form`: timm's ``reparameterize_model``
    folds RepVGG's, MobileOne's, FastViT's and RepViT's parallel branches into one convolution), and whether folding
    changed it. A model already ``folded`` (its checkpoint says so) is returned as it is. The fold runs on a copy, so
    an ``inference_form`` that folds in place (a package's) leaves ``model`` as trained."""
    import copy

    fold = ARCHITECTURES.get(arch).inference_form
    if folded or fold is None:
        return model, False
    inference = fold(copy.deepcopy(model))
    changed = set(inference.state_dict()) != set(model.state_dict())
    return (inference.eval(), True) if changed else (model, False)

