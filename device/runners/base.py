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
    warmup)`` (a :class:`device.jobs.profile.BatchProfile`, from a pass separate from the timed one) and
    ``profile_meta()``; :func:`device.jobs.profile.profile_runner` drives both.
    """

    name: str = "runner"
    input_chw: tuple[int | None, ...] = ()  # set by load(); None where an axis is dynamic
    # The batch sizes infer() accepts (TensorRT: one engine per measured batch); None: any.
    batch_sizes: tuple[int, ...] | None = None

    def __enter__(self) -> "Runner":
        try:
            self.load()
        except BaseException:  # a half-built runner (an engine, pinned buffers) is freed, not left to the next
            self.close()
            raise
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

    def runtime_facts(self) -> dict[str, Any]:
        """What this runtime adds to the result's :class:`device.schema.RuntimeInfo` beyond the shared fields (its
        providers, its device, what it built): each runner reports its own, nothing is copied by attribute name."""
        return {}


def engine_facts(runner: Any, **extension: Any) -> dict[str, Any]:
    """The runtime facts of a runner that builds engines on the device: what it built, where it ran, and the
    runtime's own extension (Torch-TensorRT's ``torch_tensorrt``), each only when it has one."""
    facts = {"built": build_facts(runner), **{key: value for key, value in extension.items() if value}}
    if getattr(runner, "device", None) is not None:
        facts["device"] = str(runner.device)
    return facts


def build_facts(runner: Any) -> dict[str, Any]:
    """The :class:`device.schema.BuildFacts` of a runner that builds engines on the device, its unset ones left out."""
    facts = {"engine_path": None if runner.engine_path is None else str(runner.engine_path),
             "built_now": runner.built_now, "precision_built": runner.precision_built,
             "trtexec": getattr(runner, "trtexec", None) or None,
             "dla_unsupported_layers": getattr(runner, "dla_unsupported_layers", None) or None,
             "engines": getattr(runner, "engine_keys", None) or None,
             "host_wait": getattr(runner, "host_wait", None)}
    return {key: value for key, value in facts.items() if value is not None}
