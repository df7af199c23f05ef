"""Where the build host computes: the run context reads it, and a stage that does not train must not hash the
training code for it (:mod:`pipeline.core.codehash`)."""

from __future__ import annotations

import os


def pick_device():
    """CUDA when present, unless ``EDGEFOLD_DEVICE`` says otherwise (a ``torch.device``)."""
    import torch

    wanted = os.environ.get("EDGEFOLD_DEVICE")
    if wanted:
        return torch.device(wanted)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")
