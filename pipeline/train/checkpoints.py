"""A task's model checkpoint, written once for the tasks that record an input size beside the class count (detection,
segmentation): state and layer structure under a format name, never a pickled module, so a pruned model reloads with
``torch.load(weights_only=True)`` into a freshly built one of its architecture (:mod:`device.uploads.torch_checkpoint`).
Classification's, which the device also reads, is :mod:`pipeline.checkpoint`."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable

from torch import nn


def save_model(path: str | os.PathLike, model: nn.Module, fmt: str, arch: str, num_classes: int, input_size: int,
               meta: dict[str, Any]) -> Path:
    """Writes the checkpoint atomically; under DDP only rank 0 writes."""
    import torch

    from device.files import atomic_writer
    from device.uploads.torch_checkpoint import capture_structure
    from pipeline.core import distributed

    path = Path(path)
    if not distributed.world().main:
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": fmt, "arch": arch, "num_classes": int(num_classes), "input_size": int(input_size),
               "structure": capture_structure(model),
               "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, "meta": meta}
    with atomic_writer(path) as handle:
        torch.save(payload, handle)
    return path


def load_model(path: str | os.PathLike, fmt: str, what: str, registry,
               build: Callable[[str, int, int], nn.Module]) -> tuple[nn.Module, dict[str, Any]]:
    """A checkpoint :func:`save_model` wrote (eval mode, CPU) and its header (``arch``, ``num_classes``,
    ``input_size``, ``meta``).

    Args:
        what: The model's kind in messages (``detector``, ``segmenter``).
        registry: The task's architectures (an unknown key is refused with the nearest).
        build: ``build(arch, num_classes, input_size)``: the architecture, untrained.

    Raises:
        CheckpointError: Missing, not this format, unknown architecture, or shapes that do not fit.
    """
    from device.errors import CheckpointError
    from device.uploads.torch_checkpoint import apply_structure, load_state_strict, torch_load

    path, fix = Path(path), "re-run the stage that produces it (--force STAGE)"
    if not path.is_file():
        raise CheckpointError(f"{what} checkpoint {path} does not exist", fix=fix)
    payload = torch_load(path, f"{what} checkpoint {path}", fix_unsafe=fix, fix_corrupt=fix)
    if not isinstance(payload, dict) or payload.get("format") != fmt:
        raise CheckpointError(f"{path} is not an EdgeFold {what} checkpoint ({fmt})", fix=fix)
    if payload["arch"] not in registry:
        raise CheckpointError(f"{path} names unknown {what} {payload['arch']!r}", fix=registry.suggest(payload["arch"]))
    model = build(payload["arch"], payload["num_classes"], payload["input_size"])
    apply_structure(model, payload.get("structure") or {}, payload["state_dict"])
    load_state_strict(model, payload["state_dict"], str(path))
    return model.eval(), {k: payload[k] for k in ("arch", "num_classes", "input_size", "meta")}
