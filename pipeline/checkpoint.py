"""Checkpoints are state, never pickled modules.

A checkpoint holds the architecture key, the class count, the layer *structure* (channel
counts changed by pruning) and the state_dict, all plain tensors and numbers, so it loads
with ``torch.load(weights_only=True)`` and is validated against the architecture it names.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import torch
from torch import nn

from device.errors import CheckpointError
from device.files import atomic_writer
from pipeline import distributed
from pipeline.models import ARCHITECTURES, build_model

FORMAT = "edgefold.checkpoint/1"

# Attributes that describe a layer's shape; pruning rewrites exactly these.
_STRUCTURE_ATTRS = {
    nn.Conv2d: ("in_channels", "out_channels", "groups"),
    nn.BatchNorm2d: ("num_features",),
    nn.Linear: ("in_features", "out_features"),
    nn.LayerNorm: ("normalized_shape",),
}


def capture_structure(model: nn.Module) -> dict[str, dict[str, Any]]:
    """The shape-defining attributes of every conv, norm and linear layer."""
    structure = {}
    for name, module in model.named_modules():
        for kind, attrs in _STRUCTURE_ATTRS.items():
            if type(module) is kind:
                structure[name] = {"type": kind.__name__}
                for attr in attrs:
                    value = getattr(module, attr)
                    structure[name][attr] = list(value) if isinstance(value, tuple) else value
    return structure


def apply_structure(model: nn.Module, structure: dict[str, dict[str, Any]], state_dict: dict[str, torch.Tensor]) -> None:
    """Reshapes ``model`` in place to the recorded (pruned) structure.

    Raises:
        CheckpointError: If a recorded layer is missing or of another type.
    """
    modules = dict(model.named_modules())
    for name, attrs in structure.items():
        module = modules.get(name)
        if module is None or type(module).__name__ != attrs.get("type"):
            found = type(module).__name__ if module is not None else "nothing"
            raise CheckpointError(
                f"checkpoint layer {name!r} is a {attrs.get('type')} but the architecture has {found} there",
                fix="the checkpoint was made for another architecture; check the recipe's arch",
            )
        for attr, value in attrs.items():
            if attr != "type":
                setattr(module, attr, tuple(value) if isinstance(value, list) else value)
    # Tensors whose saved shape differs are replaced by empty ones of that shape, then filled
    # by load_state_dict; parameters stay parameters so the model still trains.
    for key, saved in state_dict.items():
        module_name, _, tensor_name = key.rpartition(".")
        if module_name not in structure:
            continue  # layers pruning never reshapes keep their shapes; _load_state_strict checks them
        module = modules[module_name]
        current = getattr(module, tensor_name, None)
        if isinstance(current, torch.Tensor) and current.shape != saved.shape:
            replacement = torch.empty(saved.shape, dtype=current.dtype)
            if isinstance(current, nn.Parameter):
                setattr(module, tensor_name, nn.Parameter(replacement, requires_grad=current.requires_grad))
            else:
                module.register_buffer(tensor_name, replacement)
    for name in structure:
        _check_layer(name, modules[name])


def _expected_shapes(module: nn.Module) -> dict[str, tuple[int, ...]]:
    if isinstance(module, nn.Conv2d):
        shapes = {"weight": (module.out_channels, module.in_channels // module.groups, *module.kernel_size)}
        return {**shapes, "bias": (module.out_channels,)} if module.bias is not None else shapes
    if isinstance(module, nn.BatchNorm2d):
        return {k: (module.num_features,) for k in ("weight", "bias", "running_mean", "running_var")
                if getattr(module, k, None) is not None}
    if isinstance(module, nn.Linear):
        shapes = {"weight": (module.out_features, module.in_features)}
        return {**shapes, "bias": (module.out_features,)} if module.bias is not None else shapes
    return {}


def _check_layer(name: str, module: nn.Module) -> None:
    """A layer's tensors must agree with its recorded channel counts (catches tampered files)."""
    for tensor_name, shape in _expected_shapes(module).items():
        actual = tuple(getattr(module, tensor_name).shape)
        if actual != shape:
            raise CheckpointError(
                f"checkpoint layer {name}.{tensor_name} has shape {actual} but its recorded structure says {shape}",
                fix="the checkpoint is corrupt or was edited; re-run the stage that produced it (--force STAGE)",
            )


def save_checkpoint(path: str | os.PathLike, model: nn.Module, arch: str, num_classes: int, **meta: Any) -> Path:
    """Writes a checkpoint atomically (a crash leaves no half-written file); under DDP only rank 0 writes."""
    path = Path(path)
    if not distributed.world().main:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "format": FORMAT,
        "arch": arch,
        "num_classes": int(num_classes),
        "structure": capture_structure(model),
        "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()},
        "meta": meta,
    }
    with atomic_writer(path) as handle:
        torch.save(payload, handle)
    return path


def _torch_load(path: Path, what: str, fix_unsafe: str, fix_corrupt: str) -> Any:
    """``torch.load(weights_only=True)`` with the failure named for what it is.

    torch's own messages for a text file ("101"), a truncated archive ("failed finding central
    directory") and a pickled module ("Weights only load failed") all need different fixes.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as err:  # torch raises many types for corrupt or unsafe files
        head = path.read_bytes()[:64] if path.stat().st_size else b""
        text = str(err)
        if not head:
            problem, fix = "is empty", fix_corrupt
        elif zipfile.is_zipfile(path) or head[:2] == b"PK":
            if "Weights only load failed" in text or "Unsupported global" in text:
                problem, fix = "holds pickled Python objects, not only tensors (refused: loading runs code)", fix_unsafe
            else:
                problem, fix = f"is a damaged torch archive ({text.splitlines()[0][:160]}): truncated or corrupt", \
                    fix_corrupt
        elif head[:1] == b"\x80":  # a legacy (non-zip) torch pickle
            if "Weights only load failed" in text or "Unsupported global" in text:
                problem, fix = "holds pickled Python objects, not only tensors (refused: loading runs code)", fix_unsafe
            else:
                problem, fix = f"is a damaged legacy torch file ({text.splitlines()[0][:160]})", fix_corrupt
        else:
            sample = head[:24].decode("utf-8", "replace")
            problem = f"is not a torch file (it starts with {sample!r})"
            fix = "pass the file written by torch.save(model.state_dict(), path)"
        raise CheckpointError(f"{what} {problem}", fix=fix) from None


def load_checkpoint(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """Loads and validates a checkpoint written by :func:`save_checkpoint`.

    Returns:
        The model (eval mode, on CPU) and the checkpoint's metadata
        (``arch``, ``num_classes``, ``meta``).

    Raises:
        CheckpointError: Missing file, not a checkpoint, unknown architecture, or shapes
            that do not fit the recorded structure.
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist", fix="re-run the stage that produces it (--force STAGE)")
    payload = _torch_load(path, f"checkpoint {path}", fix_unsafe="re-run the stage that produces it (--force STAGE)",
                          fix_corrupt="re-run the stage that produces it (--force STAGE)")
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an EdgeFold checkpoint ({FORMAT})",
                              fix="torchvision state_dicts are passed as WEIGHTS=path, not as a stage checkpoint")
    arch = payload["arch"]
    if arch not in ARCHITECTURES:
        raise CheckpointError(f"{path} names unknown architecture {arch!r}", fix=ARCHITECTURES.suggest(arch))
    model = build_model(arch, payload["num_classes"])
    state_dict = payload["state_dict"]
    apply_structure(model, payload.get("structure") or {}, state_dict)
    _load_state_strict(model, state_dict, str(path))
    model.eval()
    return model, {"arch": arch, "num_classes": payload["num_classes"], "meta": payload.get("meta", {})}


def _load_state_strict(model: nn.Module, state_dict: dict[str, torch.Tensor], source: str) -> None:
    expected = model.state_dict()
    missing = [k for k in expected if k not in state_dict]
    unexpected = [k for k in state_dict if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not fit the architecture: missing {missing[:3]}, unexpected {unexpected[:3]}",
            fix="the weights were saved from another architecture; check the recipe's arch",
        )
    for key, tensor in state_dict.items():
        if expected[key].shape != tensor.shape:
            raise CheckpointError(
                f"{source}: layer {key} has shape {tuple(tensor.shape)} but the model expects {tuple(expected[key].shape)}",
                fix="the weights were saved from another architecture or width; check the recipe's arch",
            )
    model.load_state_dict(state_dict)


def load_torchvision_weights(model: nn.Module, arch: str, path: str | os.PathLike) -> list[str]:
    """Loads a torchvision-style state_dict from a user's file into ``model`` (:func:`apply_torchvision_state`).

    Returns:
        The state_dict keys that were left at their fresh initialisation (the replaced head).
    """
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"WEIGHTS={path} does not exist", fix="pass a torchvision state_dict file, or WEIGHTS=imagenet")
    state = _torch_load(path, f"WEIGHTS={path}", fix_unsafe="save it with torch.save(model.state_dict(), path); pickled "
                                                    "modules are refused",
                        fix_corrupt="copy or download the file again (compare its size and checksum with the source)")
    if isinstance(state, dict) and state.get("format") == FORMAT:
        state = state["state_dict"]
    for wrapper in ("state_dict", "model"):
        if isinstance(state, dict) and isinstance(state.get(wrapper), dict):
            state = state[wrapper]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"WEIGHTS={path} is not a state_dict of tensors", fix="save model.state_dict(), not the model")
    return apply_torchvision_state(model, arch, state, f"WEIGHTS={path}")


def apply_torchvision_state(model: nn.Module, arch: str, state: dict[str, torch.Tensor], source: str) -> list[str]:
    """The one way teacher weights are loaded (a user's file or torchvision's ImageNet weights).

    The classifier (the registry's ``classifier`` of ``arch``) is kept fresh when the weights were
    trained for another class count; any other missing, unexpected or misshapen layer is refused,
    naming it.

    Returns:
        The state_dict keys left at their fresh initialisation (the replaced head).
    """
    state = {k.removeprefix("module."): v for k, v in state.items()}
    classifier = ARCHITECTURES.get(arch).classifier
    expected = model.state_dict()
    replaced = []
    for key, tensor in list(state.items()):
        if key in expected and expected[key].shape != tensor.shape:
            if key.startswith(classifier + "."):
                replaced.append(key)
                del state[key]
            else:
                raise CheckpointError(
                    f"{source}: layer {key} has shape {tuple(tensor.shape)}, "
                    f"but {arch} expects {tuple(expected[key].shape)}",
                    fix=f"these weights are not a {arch}; choose the matching teacher.arch",
                )
    missing = [k for k in expected if k not in state and k not in replaced]
    unexpected = [k for k in state if k not in expected]
    if missing or unexpected:
        raise CheckpointError(
            f"{source} does not match {arch}: missing {missing[:3]}, unexpected {unexpected[:3]}",
            fix=f"pass a state_dict saved from torchvision's {arch}",
        )
    for key in replaced:
        state[key] = expected[key]
    model.load_state_dict(state)
    return replaced
