"""Inference runners behind one interface: load, infer, close (a context manager).

Each runner imports its framework lazily, so ``device`` imports without any of them.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np


class Runner(ABC):
    """Runs one model on one backend.

    Use as a context manager::

        with OnnxRuntimeRunner("model.onnx") as runner:
            logits = runner.infer(batch)
    """

    name: str = "runner"

    def __enter__(self) -> "Runner":
        self.load()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @abstractmethod
    def load(self) -> None:
        """Prepares the model (parses it, builds or loads the engine)."""

    @abstractmethod
    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Runs one batch (float32 NCHW) and returns the first output."""

    def close(self) -> None:
        """Releases the model."""
