"""TensorRT runner: builds (or loads from the cache) an engine from the ONNX on this device, then runs it.

Uses TensorRT's name-based tensor API (10.x and 11.x): ``num_io_tensors``/``get_tensor_name``/
``get_tensor_mode``, ``set_input_shape``, ``set_tensor_address`` and ``execute_async_v3``. Device
memory comes from the CUDA runtime through ctypes, so neither pycuda nor cuda-python is needed
(neither ships for every JetPack's Python).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
from pathlib import Path

import numpy as np

from device.client import file_sha256
from device.engine import BuildOptions, EngineCache, build_engine, detect_gpu, fingerprint, import_tensorrt, read_l4t
from device.errors import MissingDependencyError, StageError
from device.runners import Runner

_H2D, _D2H = 1, 2  # cudaMemcpyHostToDevice, cudaMemcpyDeviceToHost


class CudaRuntime:
    """The few CUDA runtime calls a TensorRT runner needs, through ctypes."""

    def __init__(self) -> None:
        candidates = [ctypes.util.find_library("cudart"), "libcudart.so", "/usr/local/cuda/lib64/libcudart.so"]
        for name in filter(None, candidates):
            try:
                self.lib = ctypes.CDLL(name)
                break
            except OSError:
                continue
        else:
            raise MissingDependencyError("the CUDA runtime (libcudart) is not loadable",
                                         fix="install CUDA (JetPack ships it under /usr/local/cuda/lib64) and add "
                                             "its lib folder to LD_LIBRARY_PATH")

    def check(self, status: int, call: str) -> None:
        if status != 0:
            self.lib.cudaGetErrorString.restype = ctypes.c_char_p
            raise StageError(f"{call} failed: {self.lib.cudaGetErrorString(status).decode()}")

    def malloc(self, nbytes: int) -> int:
        pointer = ctypes.c_void_p()
        self.check(self.lib.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(nbytes)), "cudaMalloc")
        return int(pointer.value)

    def free(self, pointer: int) -> None:
        self.lib.cudaFree(ctypes.c_void_p(pointer))

    def stream(self) -> int:
        handle = ctypes.c_void_p()
        self.check(self.lib.cudaStreamCreate(ctypes.byref(handle)), "cudaStreamCreate")
        return int(handle.value or 0)

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        self.check(self.lib.cudaMemcpyAsync(ctypes.c_void_p(dst), ctypes.c_void_p(src), ctypes.c_size_t(nbytes),
                                            kind, ctypes.c_void_p(stream)), "cudaMemcpyAsync")

    def synchronize(self, stream: int) -> None:
        self.check(self.lib.cudaStreamSynchronize(ctypes.c_void_p(stream)), "cudaStreamSynchronize")


class TensorRTRunner(Runner):
    """Runs a Q/DQ (or float) ONNX model through a TensorRT engine built on this device.

    Args:
        onnx: The ONNX file.
        options: Precision, batch profile, workspace, DLA core.
        cache_dir: Engine cache folder (engines keyed by ONNX sha256 and device fingerprint).
    """

    name = "tensorrt"

    def __init__(self, onnx: str | os.PathLike, options: BuildOptions, cache_dir: str | os.PathLike | None = None):
        self.onnx, self.options = str(onnx), options
        self.cache = EngineCache(cache_dir or Path(onnx).parent / "engines")
        self.engine_path: Path | None = None
        self.built_now = False
        self._buffers: dict[str, tuple[int, int]] = {}

    def load(self) -> None:
        trt = import_tensorrt()
        gpu, capability = detect_gpu()
        fp = fingerprint(trt.__version__, gpu, capability, read_l4t())
        self.engine_path, self.built_now = self.cache.get_or_build(self.onnx, file_sha256(self.onnx), fp, self.options,
                                                                   build_engine)
        self.cuda = CudaRuntime()
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        self.engine = self.runtime.deserialize_cuda_engine(self.engine_path.read_bytes())
        if self.engine is None:
            raise StageError(f"TensorRT could not deserialize {self.engine_path}",
                             fix="delete the engine cache folder; it is rebuilt on the next job")
        self.context = self.engine.create_execution_context()
        names = [self.engine.get_tensor_name(i) for i in range(self.engine.num_io_tensors)]
        self.inputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self.outputs = [n for n in names if self.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        self.dtypes = {n: np.dtype(trt.nptype(self.engine.get_tensor_dtype(n))) for n in names}
        self.input_chw = tuple(d if d > 0 else None for d in self.engine.get_tensor_shape(self.inputs[0])[1:])
        self.stream = self.cuda.stream()

    def _buffer(self, name: str, nbytes: int) -> int:
        pointer, size = self._buffers.get(name, (0, 0))
        if size < nbytes:
            if pointer:
                self.cuda.free(pointer)
            pointer = self.cuda.malloc(nbytes)
            self._buffers[name] = (pointer, nbytes)
            self.context.set_tensor_address(name, pointer)
        return pointer

    def infer(self, batch: np.ndarray) -> np.ndarray:
        host_in = np.ascontiguousarray(batch, dtype=self.dtypes[self.inputs[0]])
        self.context.set_input_shape(self.inputs[0], host_in.shape)
        self.cuda.copy(self._buffer(self.inputs[0], host_in.nbytes), host_in.ctypes.data, host_in.nbytes, _H2D,
                       self.stream)
        outputs = {}
        for name in self.outputs:
            outputs[name] = np.empty(tuple(self.context.get_tensor_shape(name)), dtype=self.dtypes[name])
            self._buffer(name, outputs[name].nbytes)
        if not self.context.execute_async_v3(self.stream):
            raise StageError("TensorRT execute_async_v3 failed", fix="see the TensorRT log in the job's log")
        first = self.outputs[0]
        self.cuda.copy(outputs[first].ctypes.data, self._buffers[first][0], outputs[first].nbytes, _D2H, self.stream)
        self.cuda.synchronize(self.stream)
        return outputs[first]

    def close(self) -> None:
        for pointer, _ in self._buffers.values():
            self.cuda.free(pointer)
        self._buffers = {}
        self.context = self.engine = None
