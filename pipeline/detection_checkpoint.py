"""Detector checkpoints: the same state-only format as classifiers', keyed by the detection registry.

Pruned widths travel as the recorded layer structure (:func:`pipeline.checkpoint.capture_structure`), so a pruned
detector reloads with ``torch.load(weights_only=True)`` into a freshly built one of its architecture.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from device.errors import CheckpointError
from device.files import atomic_writer
from pipeline.checkpoint import _load_state_strict, _torch_load, apply_structure, capture_structure
from pipeline.detection_models import DETECTORS, build_detector

FORMAT = "edgefold.detector/1"


def save_detector(path: str | os.PathLike, model: nn.Module, arch: str, num_classes: int, input_size: int,
                  **meta: Any) -> Path:
    """Writes a detector checkpoint atomically (state and structure, never a pickled module)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {"format": FORMAT, "arch": arch, "num_classes": int(num_classes), "input_size": int(input_size),
               "structure": capture_structure(model),
               "state_dict": {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}, "meta": meta}
    with atomic_writer(path) as handle:
        torch.save(payload, handle)
    return path


def load_detector(path: str | os.PathLike) -> tuple[nn.Module, dict[str, Any]]:
    """Loads a checkpoint written by :func:`save_detector` (eval mode, CPU) and its metadata.

    Raises:
        CheckpointError: Missing, not a detector checkpoint, unknown architecture, or shapes that do not fit.
    """
    path = Path(path)
    fix = "re-run the stage that produces it (--force STAGE)"
    if not path.is_file():
        raise CheckpointError(f"detector checkpoint {path} does not exist", fix=fix)
    payload = _torch_load(path, f"detector checkpoint {path}", fix_unsafe=fix, fix_corrupt=fix)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not an EdgeFold detector checkpoint ({FORMAT})", fix=fix)
    if payload["arch"] not in DETECTORS:
        raise CheckpointError(f"{path} names unknown detector {payload['arch']!r}", fix=DETECTORS.suggest(payload["arch"]))
    model = build_detector(payload["arch"], payload["num_classes"], payload["input_size"])
    apply_structure(model, payload.get("structure") or {}, payload["state_dict"])
    _load_state_strict(model, payload["state_dict"], str(path))
    return model.eval(), {k: payload[k] for k in ("arch", "num_classes", "input_size", "meta")}
