"""Checkpoints are state, never pickled modules.

A checkpoint holds the architecture key, the class count, the layer *structure* (channel
counts changed by pruning) and the state_dict, all plain tensors and numbers, so it loads
with ``torch.load(weights_only=True)`` and is validated against the architecture it names.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from device.models.architectures import fold_stem_weight, stem_name
from device.errors import CheckpointError
from device.files import atomic_writer
# The format and its reading live in device/: the device rebuilds a rung from its checkpoint on its own torch.
from device.uploads.torch_checkpoint import FORMAT, capture_structure, load_checkpoint, torch_load  # noqa: F401
from pipeline.core import distributed
from pipeline.models import ARCHITECTURES


_REDOWNLOAD = "copy or download the file again (compare its size and checksum with the source)"


def save_checkpoint(path: str | os.PathLike, model: nn.Module, arch: str, num_classes: int,
                    input_size: int | None = None, folded: bool = False, **meta: Any) -> Path:
    """Writes a checkpoint atomically (a crash leaves no half-written file); under DDP only rank 0 writes.

    ``input_size`` is recorded for an architecture built for one input size (a timm ViT), to rebuild it so;
    ``folded`` for a model in its architecture's inference form (pruned after ``reparameterize_model``)."""
    path = Path(path)
    if not distributed.world().main:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "arch": arch,
        "num_classes": int(num_classes),
        "in_channels": int(model.get_submodule(stem_name(model)).in_channels),
        **({"input_size": int(input_size)} if input_size and ARCHITECTURES.get(arch).sized else {}),
        **({"folded": True} if folded else {}),
        "structure": capture_structure(model),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        "meta": meta,
    }
    with atomic_writer(path) as handle:
        torch.save(payload, handle)
    return path


def load_weights(model: nn.Module, arch: str, path: str | os.PathLike) -> list[str]:
    """Loads a user's weights file into ``model`` (:func:`apply_torchvision_state`): a ``torch.save``'d state_dict
    (bare, or under ``state_dict`` or ``model`` as timm's and torchvision's training scripts save it) or a
    ``.safetensors`` file; either is read as tensors only, never as pickled code.

    Returns:
        The state_dict keys that were left at their fresh initialisation (the replaced head).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"WEIGHTS={path} does not exist",
                              fix=f"pass a state_dict or .safetensors file of {arch}, or WEIGHTS=imagenet")
    if path.suffix == ".safetensors":
        state = _safetensors(path)
    else:
        state = torch_load(path, f"WEIGHTS={path}", fix_unsafe="save it with torch.save(model.state_dict(), path); "
                                                                "pickled modules are refused",
                           fix_corrupt=_REDOWNLOAD)
    if isinstance(state, dict) and state.get("format") == FORMAT:
        state = state["state_dict"]
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"WEIGHTS={path} is not a state_dict of tensors", fix="save model.state_dict(), not the model")
    return apply_torchvision_state(model, arch, state, f"WEIGHTS={path}")


def _safetensors(path: Path) -> dict[str, torch.Tensor]:
    from device.errors import require

    safetensors_torch = require("safetensors.torch", "safetensors", "pip install safetensors (timm brings it)")
    try:
        return safetensors_torch.load_file(str(path))
    except Exception as err:  # SafetensorError: a header or size that does not add up
        raise CheckpointError(f"WEIGHTS={path} is not a readable .safetensors file: {err}",
                              fix=_REDOWNLOAD) from None


def apply_torchvision_state(model: nn.Module, arch: str, state: dict[str, torch.Tensor], source: str) -> list[str]:
    """The one way teacher weights are loaded (a user's file, torchvision's ImageNet weights, a timm checkpoint).

    The classifier (the registry's ``classifier`` of ``arch``, and a distilled model's second head) is kept fresh when the weights were
    trained for another class count; any other missing, unexpected or misshapen layer is refused,
    naming it.

    Returns:
        The state_dict keys left at their fresh initialisation (the replaced head).
    """
    state = {k.removeprefix("module."): v for k, v in state.items()}
    heads = ARCHITECTURES.get(arch).heads
    expected = model.state_dict()
    stem = f"{stem_name(model)}.weight"
    if stem in state and stem in expected and state[stem].shape[1] != expected[stem].shape[1]:
        try:  # RGB weights for a grey model: the stem's kernels summed over RGB
            state[stem] = fold_stem_weight(state[stem], expected[stem].shape[1])
        except ValueError as err:
            raise CheckpointError(f"{source}: {err}", fix="set preprocess.channels to the weights' channels") from None
    replaced = []
    for key, tensor in list(state.items()):
        if key in expected and expected[key].shape != tensor.shape:
            if key.startswith(tuple(f"{head}." for head in heads)):
                replaced.append(key)
                del state[key]
            else:
                sized = ("; or they were trained at another input size, which fixes this architecture's shape: set "
                         "preprocess.input_size to theirs") if ARCHITECTURES.get(arch).sized else ""
                raise CheckpointError(
                    f"{source}: layer {key} has shape {tuple(tensor.shape)}, "
                    f"but {arch} expects {tuple(expected[key].shape)}",
                    fix=f"these weights are not a {arch}; choose the matching teacher.arch{sized}",
                )
    missing = [k for k in expected if k not in state and k not in replaced]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not match {arch}: missing {missing[:3]}, unexpected {unexpected[:3]}",
            fix=f"pass a state_dict saved from {arch} ({ARCHITECTURES.get(arch).source}), or the teacher.arch these "
                f"weights were trained as",
        )
    for key in replaced:
        state[key] = expected[key]
    model.load_state_dict(state)
    return replaced
