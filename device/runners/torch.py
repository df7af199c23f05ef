"""Torch runner for data-center baselines where TensorRT is not installed.

Runs a float rung's device checkpoint (``.device.pt``: state, architecture key, input C×H×W), rebuilt by this device's
own architecture registry; or, only on an agent that trusts programs, a ``torch.export`` program (``.pt2``). Both load
through :mod:`device.runners.export_load`. On CUDA it supports fp32/bf16/fp16, channels_last, and replaying a captured
CUDA graph (what a serving stack does to hide launch overhead at batch 1). torch is imported only when this runner
loads.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from device.errors import ConfigError, RunnerError, require
from device.uploads.artifacts import UnsafeArtifactError
from device.runners.base import Runner
from device.runners.export_load import artifact_kind, load_checkpoint_module, load_program, program_module

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class TorchRunner(Runner):
    """Runs a device checkpoint (or, trusted, a ``torch.export`` program) with PyTorch.

    Args:
        path: The ``.device.pt`` (or ``.pt2``) file.
        precision: ``fp32``, ``fp16`` or ``bf16`` (the half types on CUDA only).
        channels_last: NHWC memory format (Tensor Cores want it).
        cuda_graphs: Capture one CUDA graph per input shape and replay it.
        threads: CPU intra-op threads (0 = torch's default).
        trust_programs: Load a ``.pt2`` (the agent's ``--trust-programs``); off, only device checkpoints load.
    """

    name = "torch"

    def __init__(self, path: str | os.PathLike, precision: str = "fp32", channels_last: bool = True,
                 cuda_graphs: bool = False, threads: int = 0, trust_programs: bool = False):
        if precision not in DTYPES:
            raise ConfigError(f"the torch runner runs fp32, fp16 or bf16, not {precision!r}",
                              fix="use runtime 'tensorrt' or 'onnxruntime' with an INT8 Q/DQ model")
        self.path, self.precision, self.channels_last = str(path), precision, channels_last
        self.cuda_graphs, self.threads, self.trust_programs = cuda_graphs, threads, trust_programs
        self.source: dict[str, Any] = {}
        self._graphs: dict[tuple[int, ...], tuple] = {}

    def load(self) -> None:
        torch = require("torch", "PyTorch", "pip install torch (the data-center agent's image has it)")
        self.torch = torch
        self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if self.device.type == "cpu" and (self.precision != "fp32" or self.cuda_graphs):
            raise ConfigError(f"{self.precision}{' with CUDA graphs' if self.cuda_graphs else ''} needs a CUDA GPU",
                              fix="use precision fp32 without cuda_graphs on a CPU-only host")
        if self.threads:
            torch.set_num_threads(self.threads)
        # The GPU this process computes on, by PCI bus id: the NVML sampler then reads this GPU's power.
        self.pci_bus_id = None
        if self.device.type == "cuda":
            props = torch.cuda.get_device_properties(0)
            self.pci_bus_id = f"{props.pci_domain_id:08X}:{props.pci_bus_id:02X}:{props.pci_device_id:02X}.0"
        module = self._checkpoint() if artifact_kind(self.path) == "torch-checkpoint" else self._program(torch)
        self.dtype = getattr(torch, DTYPES[self.precision])
        self.model = module.to(self.device, self.dtype)
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)

    def _checkpoint(self):
        """The float rung rebuilt from its device checkpoint by this device's architecture registry."""
        module, facts = load_checkpoint_module(self.path)
        if facts["quantized"]:
            raise ConfigError(f"{os.path.basename(self.path)} carries ModelOpt's INT8 quantizers: the torch runner runs "
                              "float rungs", fix="measure the INT8 rung on runtime tensorrt (its Q/DQ ONNX) or "
                                                 "torch_tensorrt (a CUDA device)")
        self.input_chw = facts["input_chw"] or (None,)
        self.source = {"artifact": "device checkpoint", "arch": facts["arch"], "architecture": facts["source"]}
        return module

    def _program(self, torch):
        """A ``torch.export`` program's module (refused unless programs are trusted)."""
        try:
            program = load_program(torch, self.path, self.trust_programs)
        except UnsafeArtifactError:
            raise
        except Exception as err:  # torch raises several types for a foreign or truncated archive
            raise RunnerError(f"{self.path} is not a torch.export program: {err}",
                              fix="send the rung's device checkpoint (<rung>.device.pt) the pipeline wrote") from None
        example = program.example_inputs[0][0] if program.example_inputs else None
        self.input_chw = tuple(example.shape[1:]) if example is not None else (None,)
        self.source = {"artifact": "torch.export program"}
        return program_module(program, self.path)

    def _tensor(self, batch: np.ndarray):
        return self.torch.from_numpy(np.ascontiguousarray(batch, dtype=np.float32)).to(
            self.device, self.dtype).contiguous(memory_format=self.memory_format)

    def _graph(self, shape: tuple[int, ...]):
        torch = self.torch
        if shape not in self._graphs:
            static_in = torch.zeros(shape, device=self.device, dtype=self.dtype).contiguous(
                memory_format=self.memory_format)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side), torch.inference_mode():
                for _ in range(3):  # warm up on a side stream before capture, as torch.cuda.graphs requires
                    self.model(static_in)
            torch.cuda.current_stream().wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.inference_mode():
                static_out = self.model(static_in)
            self._graphs[shape] = (graph, static_in, static_out)
        return self._graphs[shape]

    def infer(self, batch: np.ndarray) -> np.ndarray:
        torch = self.torch
        with torch.inference_mode():
            if self.cuda_graphs:
                graph, static_in, static_out = self._graph(tuple(batch.shape))
                static_in.copy_(self._tensor(batch))
                graph.replay()
                out = static_out
            else:
                out = self.model(self._tensor(batch))
            if isinstance(out, (tuple, list)):
                out = out[0]
            result = out.float().cpu().numpy()  # .cpu() synchronizes: the latency includes the GPU's work
        return result

    def runtime_facts(self) -> dict[str, Any]:
        if getattr(self, "device", None) is None:
            return {}
        return {"device": str(self.device), "loaded_from": self.source or None}

    def close(self) -> None:
        self._graphs = {}
        self.model = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()
