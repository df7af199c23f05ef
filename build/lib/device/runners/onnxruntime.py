"""ONNX Runtime runner (CPU, or CUDA where the GPU build is installed)."""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from device.errors import StageError, require
from device.runners import Runner


class OnnxRuntimeRunner(Runner):
    """Runs an ONNX model (FP32 or Q/DQ INT8) with ONNX Runtime.

    Args:
        path: The ONNX file.
        providers: Execution providers in order of preference; those not available are skipped.
        threads: Intra-op threads (0 = ONNX Runtime's default).
    """

    name = "onnxruntime"

    def __init__(self, path: str | os.PathLike, providers: Sequence[str] = ("CPUExecutionProvider",), threads: int = 0):
        self.path, self.wanted, self.threads = str(path), tuple(providers), threads
        self.session = None

    def load(self) -> None:
        ort = require("onnxruntime", "ONNX Runtime", "pip install 'edgefold[device]'")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.log_severity_level = 3
        available = set(ort.get_available_providers())
        providers = [p for p in self.wanted if p in available] or ["CPUExecutionProvider"]
        try:
            self.session = ort.InferenceSession(self.path, options, providers=providers)
        except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph types
            raise StageError(f"ONNX Runtime cannot load {self.path}: {err}", fix="re-export the model") from None
        first = self.session.get_inputs()[0]
        self.input_name = first.name
        self.input_chw = tuple(d if isinstance(d, int) else None for d in first.shape[1:])

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers() if self.session else []

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: np.ascontiguousarray(batch, dtype=np.float32)})[0]

    def close(self) -> None:
        self.session = None
