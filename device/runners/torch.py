"""Torch runner for data-center baselines where TensorRT is not installed.

Runs a ``torch.export`` program (``.pt2``, saved with ``torch.export.save``): a serialized graph and its weights.
``torch.export.load`` itself would unpickle parts of the file without restriction; here it is loaded through
:func:`device.runners.export_load.load_program`, which trusts only a file that passes the upload check again (ATen
and quantize operators, integer shape expressions, tensor-only pickles) and refuses any unrestricted unpickling while
torch reads it. What it still trusts: torch's own operators and its weights-only unpickler. On CUDA it supports
fp32/bf16/fp16, channels_last, and replaying a captured CUDA graph (what a serving stack does to
hide launch overhead at batch 1). torch is imported only when this runner loads.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from device.errors import ConfigError, RunnerError, require
from device.artifacts import UnsafeArtifactError
from device.runners.base import Runner
from device.runners.export_load import load_program

DTYPES = {"fp32": "float32", "fp16": "float16", "bf16": "bfloat16"}


class TorchRunner(Runner):
    """Runs a ``torch.export`` program with PyTorch.

    Args:
        path: The ``.pt2`` file.
        precision: ``fp32``, ``fp16`` or ``bf16`` (the half types on CUDA only).
        channels_last: NHWC memory format (Tensor Cores want it).
        cuda_graphs: Capture one CUDA graph per input shape and replay it.
        threads: CPU intra-op threads (0 = torch's default).
    """

    name = "torch"

    def __init__(self, path: str | os.PathLike, precision: str = "fp32", channels_last: bool = True,
                 cuda_graphs: bool = False, threads: int = 0):
        if precision not in DTYPES:
            raise ConfigError(f"the torch runner runs fp32, fp16 or bf16, not {precision!r}",
                              fix="use runtime 'tensorrt' or 'onnxruntime' with an INT8 Q/DQ model")
        self.path, self.precision, self.channels_last = str(path), precision, channels_last
        self.cuda_graphs, self.threads = cuda_graphs, threads
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
        try:
            program = load_program(torch, self.path)
        except UnsafeArtifactError:
            raise
        except Exception as err:  # torch raises several types for a foreign or truncated archive
            raise RunnerError(f"{self.path} is not a torch.export program: {err}",
                             fix="save the model with torch.export.save(torch.export.export(model, args), path)") from None
        example = program.example_inputs[0][0] if program.example_inputs else None
        self.input_chw = tuple(example.shape[1:]) if example is not None else (None,)
        self.dtype = getattr(torch, DTYPES[self.precision])
        self.model = program.module().to(self.device, self.dtype)
        self.memory_format = torch.channels_last if self.channels_last else torch.contiguous_format
        if self.channels_last:
            self.model = self.model.to(memory_format=torch.channels_last)

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
        return {"device": str(self.device)} if getattr(self, "device", None) is not None else {}

    def close(self) -> None:
        self._graphs = {}
        self.model = None
        if getattr(self, "device", None) is not None and self.device.type == "cuda":
            self.torch.cuda.empty_cache()
