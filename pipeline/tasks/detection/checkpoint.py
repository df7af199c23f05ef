"""Detector checkpoints (:mod:`pipeline.train.checkpoints`, keyed by the detection registry), and a user's torchvision
detector weights loaded into a prunable detector.

Pruned widths travel as the recorded layer structure, so a pruned detector reloads with
``torch.load(weights_only=True)`` into a freshly built one of its architecture.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from device.errors import CheckpointError
from device.uploads.torch_checkpoint import torch_load
from pipeline.tasks.detection.models import DETECTORS, build_detector
from pipeline.train.checkpoints import load_model, save_model

FORMAT = "edgefold.detector/1"


def save_detector(path: str | os.PathLike, model: nn.Module, arch: str, num_classes: int, input_size: int,
                  **meta: Any) -> Path:
    """Writes a detector checkpoint atomically (state and structure, never a pickled module); under DDP only rank 0
    writes."""
    return save_model(path, model, FORMAT, arch, num_classes, input_size, meta)


def load_detector(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """Loads a checkpoint written by :func:`save_detector` (eval mode, CPU) and its metadata.

    Raises:
        CheckpointError: Missing, not a detector checkpoint, unknown architecture, or shapes that do not fit.
    """
    return load_model(path, FORMAT, "detector", DETECTORS, build_detector)


def load_detector_weights(model: nn.Module, arch: str, path: str | os.PathLike) -> list[str]:
    """Loads a user's torchvision detector ``state_dict`` (or torchvision's reference-script ``{"model": …}``).

    A detector trained with a pretrained backbone had ``FrozenBatchNorm2d``: its state has the same four tensors
    per layer as ``BatchNorm2d`` but no ``num_batches_tracked``, so it loads into the (prunable) BatchNorm model
    built here. Head layers sized by another class count are left freshly initialised, and named.

    Returns:
        The head tensors that were not loaded because the class count differs.

    Raises:
        CheckpointError: Not a torch state, or tensors that do not fit the architecture outside the head.
    """
    path = Path(path)
    fix = "pass the file written by torch.save(detector.state_dict(), path) for this architecture"
    if not path.is_file():
        raise CheckpointError(f"detector weights {path} do not exist", fix=fix)
    state = torch_load(path, f"detector weights {path}", fix_unsafe=fix, fix_corrupt=fix)
    if isinstance(state, dict) and isinstance(state.get("model"), dict):
        state = state["model"]
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise CheckpointError(f"{path} is not a state_dict of tensors", fix=fix)
    from pipeline.tasks.detection.models import kept_whole

    head = tuple(k.module + "." for k in kept_whole(arch, model))
    expected = model.state_dict()
    replaced = [k for k, v in state.items() if k in expected and k.startswith(head) and v.shape != expected[k].shape]
    missing = [k for k in expected if k not in state and not k.endswith("num_batches_tracked")]
    unexpected = [k for k in state if k not in expected]
    wrong = [k for k, v in state.items() if k in expected and k not in replaced and v.shape != expected[k].shape]
    if missing or unexpected or wrong:
        raise CheckpointError(f"{path} does not fit {arch}: missing {missing[:3]}, unexpected {unexpected[:3]}, "
                              f"other shapes {wrong[:3]}", fix=f"check teacher.arch ({arch}); {fix}")
    model.load_state_dict({k: v for k, v in state.items() if k not in replaced}, strict=False)
    return replaced
