"""The interface every inference runner has: load, infer, close (a context manager).

Apart from the factories in :mod:`device.runners`: a runner module imports this, never the package, so a stage that
runs ONNX Runtime hashes ONNX Runtime's runner and not every other runtime the factories name.
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

    A runner that can say where an inference's time goes also has ``profile_batch(batch, iterations,
    warmup)`` (a :class:`device.profile.BatchProfile`, from a pass separate from the timed one) and
    ``profile_meta()``; :func:`device.profile.profile_runner` drives both.
    """

    name: str = "runner"
    input_chw: tuple[int | None, ...] = ()  # set by load(); None where an axis is dynamic
    # The batch sizes infer() accepts (TensorRT: one engine per measured batch); None: any.
    batch_sizes: tuple[int, ...] | None = None

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
