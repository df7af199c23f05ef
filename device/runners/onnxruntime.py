"""ONNX Runtime runner (CPU, or CUDA where the GPU build is installed)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from device.errors import EdgeFoldError, RunnerError, require
from device.runners.base import Runner


class OnnxRuntimeRunner(Runner):
    """Runs an ONNX model (FP32 or Q/DQ INT8) with ONNX Runtime.

    Args:
        path: The ONNX file.
        providers: Execution providers in order of preference; those not available are skipped.
        threads: Intra-op threads (0 = ONNX Runtime's default).
        marked: Tensors of the graph returned by :meth:`run_marked` besides its outputs (a debug job's).
    """

    name = "onnxruntime"

    def __init__(self, path: str | os.PathLike, providers: Sequence[str] = ("CPUExecutionProvider",), threads: int = 0,
                 marked: Sequence[str] = ()):
        self.path, self.wanted, self.threads = str(path), tuple(providers), threads
        self.marked = tuple(marked)
        self.session = None

    def _session(self, profile_prefix: str | None = None):
        ort = require("onnxruntime", "ONNX Runtime", "pip install 'edgefold[device]'")
        options = ort.SessionOptions()
        options.intra_op_num_threads = self.threads
        options.log_severity_level = 3
        if profile_prefix is not None:
            options.enable_profiling = True
            options.profile_file_prefix = profile_prefix
        available = set(ort.get_available_providers())
        providers = [p for p in self.wanted if p in available] or ["CPUExecutionProvider"]
        if self.marked:
            from device.jobs.marked import with_outputs

            return ort.InferenceSession(with_outputs(self.path, self.marked), options, providers=providers)
        return ort.InferenceSession(self.path, options, providers=providers)

    def load(self) -> None:
        try:
            self.session = self._session()
        except EdgeFoldError:
            raise
        except Exception as err:  # onnxruntime raises its own Fail/InvalidGraph types
            raise RunnerError(f"ONNX Runtime cannot load {self.path}: {err}", fix="re-export the model") from None
        first = self.session.get_inputs()[0]
        self.input_name = first.name
        # A float network takes float32; the frame job's in-graph form (pipeline.deploy.frame_prefix) takes uint8 pixels.
        self.input_dtype = np.uint8 if first.type == "tensor(uint8)" else np.float32
        self.input_chw = tuple(d if isinstance(d, int) else None for d in first.shape[1:])

    @property
    def providers(self) -> list[str]:
        return self.session.get_providers() if self.session else []

    def runtime_facts(self) -> dict[str, Any]:
        return {"providers": self.providers}

    def infer(self, batch: np.ndarray) -> np.ndarray:
        return self.session.run(None, {self.input_name: np.ascontiguousarray(batch, dtype=self.input_dtype)})[0]

    def run_marked(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """The marked tensors' values for ``batch`` (float32), by name."""
        values = self.session.run(list(self.marked), {self.input_name: np.ascontiguousarray(batch, dtype=np.float32)})
        return {name: np.asarray(value, dtype=np.float32) for name, value in zip(self.marked, values)}

    def marked_layers(self) -> dict[str, str]:
        """Each marked tensor → the ONNX node that writes it."""
        import onnx

        from device.jobs.marked import produced

        writers = produced(onnx.load(self.path, load_external_data=False))
        return {name: writers.get(name, "") for name in self.marked}

    def profile_batch(self, batch: np.ndarray, iterations: int, warmup: int):
        """Per-node times from ONNX Runtime's profiler, on a second session (profiling is a session
        option, and the timed session must not carry its overhead).

        Returns:
            A :class:`device.jobs.profile.BatchProfile` (the warm-up runs left out).
        """
        from device.jobs.profile import from_onnxruntime_trace

        feed = {self.input_name: np.ascontiguousarray(batch, dtype=np.float32)}
        with tempfile.TemporaryDirectory(prefix="edgefold-ortprof-") as folder:
            session = self._session(profile_prefix=str(Path(folder) / "profile"))
            for _ in range(warmup + iterations):
                session.run(None, feed)
            trace = Path(session.end_profiling())
            events = json.loads(trace.read_text())
        gpu = "CUDAExecutionProvider" in session.get_providers()
        return from_onnxruntime_trace(events, batch.shape[0], skip_runs=warmup, device="gpu" if gpu else "cpu")

    def profile_meta(self) -> dict[str, Any]:
        gpu = "CUDAExecutionProvider" in self.providers
        return {"source": "onnxruntime profiler (SessionOptions.enable_profiling, a separate session)",
                "requested_device": "gpu" if gpu else "cpu",
                "notes": [] if gpu else ["CPU kernels: ONNX Runtime fuses Q/DQ pairs into QLinear* int8 kernels"]}

    def close(self) -> None:
        self.session = None
