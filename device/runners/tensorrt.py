"""TensorRT runner: builds (or loads from the cache) an engine from the ONNX on this device, then runs it.

Uses TensorRT's name-based tensor API (10.x and 11.x): ``num_io_tensors``/``get_tensor_name``/
``get_tensor_mode``, ``set_input_shape``, ``set_tensor_address`` and ``execute_async_v3``, each of
which reports failure by returning False — every one is checked. Device memory comes from the CUDA
runtime through ctypes, so neither pycuda nor cuda-python is needed (neither ships for every JetPack's
Python).

One engine per measured batch size (static profile, opt = that batch), so each batch is timed on
kernels tuned for it, and DLA builds (static shapes only) take the same engines.
"""

# Polygraphy's loaders (NetworkFromOnnxPath, CreateConfig, EngineBytesFromNetwork, EngineFromBytes) and TrtRunner,
# evaluated (polygraphy 0.53) and not used: they would remove no plumbing the tests' stand-in imitates.
# CreateConfig and the loaders touch a wider TensorRT surface (tactic sources, progress monitors, calibrators, preview
# features, builder-version fallbacks) and TrtRunner brings its own ctypes CUDA wrapper (polygraphy.cuda), so the
# stand-in would have to imitate more of TensorRT plus that wrapper, not less. What stays ours either way: the engine
# cache keyed by the device fingerprint, the precision checks, and CUDA-event device timing (TrtRunner times infer()
# with the host clock); and the agent's Jetson bundle would carry one more package for it.

from __future__ import annotations

import ctypes
import json
import os
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any, Sequence

import numpy as np

# CudaRuntime is looked up here at run time: the TensorRT stand-in replaces this module's name in tests.
from device.runners.cuda import D2H as _D2H, H2D as _H2D, CudaRuntime
from device.files import sha256_file
from device.runners.engine import (BuildOptions, EngineCache, artifact_precision, build_engine, detect_gpu, fingerprint,
                           import_tensorrt, read_l4t, reconcile_precision)
from device.errors import (DlaError, EngineBuildError, MissingDependencyError, RunnerError, ShapeOutsideProfileError,
                           TensorRTCallError)
from device.runners.base import Runner, engine_facts


def host_type(trt, dtype, name: str) -> np.dtype:
    """The NumPy type a tensor's host buffer holds: TensorRT's own (``trt.nptype``), bfloat16 as its 16 bits
    (``nptype`` refuses it; widened to float32 when read).

    Raises:
        RunnerError: A type no host buffer can hold element by element (FP8, INT4, FP4: ``nptype`` refuses them too).
    """
    if dtype == getattr(trt.DataType, "BF16", object()):
        return np.dtype(np.uint16)
    try:
        return np.dtype(trt.nptype(dtype))
    except TypeError:
        kind = getattr(dtype, "name", str(dtype))
        raise RunnerError(f"TensorRT tensor {name!r} is of type {kind}, which has no host type this runner can read "
                          "or write", fix="keep the network's inputs, outputs and marked tensors in FP32, FP16, BF16 "
                                          "or INT8 (a Cast in the ONNX before an output; mark a tensor before its "
                                          "quantize)") from None


def to_bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 → bfloat16's 16 bits, rounded to nearest even."""
    bits = np.ascontiguousarray(values, np.float32).view(np.uint32)
    return ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)


def from_bfloat16(bits: np.ndarray) -> np.ndarray:
    """bfloat16's 16 bits → float32 (exact)."""
    return (np.asarray(bits, np.uint16).astype(np.uint32) << 16).view(np.float32)


@dataclass
class _Engine:
    """One engine (one batch size), its execution context, device buffers and pinned host buffers.

    The input shape is set once, when the engine is loaded (every engine is static: min = opt = max),
    and the addresses bound once, as trtexec does: the timed call does only copies and the enqueue.
    """

    batch: int
    path: Path
    built_now: bool
    engine: Any
    context: Any
    buffers: dict[str, tuple[int, int]] = field(default_factory=dict)
    build: dict[str, Any] = field(default_factory=dict)
    host_in: np.ndarray | None = None
    host_out: np.ndarray | None = None
    pinned: list[int] = field(default_factory=list)


# Which of a call's times is which, in the words of trtexec's summary (samples/common/sampleReporting.cpp).
TIMING_NAMES = {
    "latency_ms": "trtexec \"Latency\": host-to-device copy + GPU compute + device-to-host copy, CUDA events, "
                  "pinned buffers",
    "gpu_compute_ms": "trtexec \"GPU Compute Time\": CUDA events around execute_async_v3",
    # trtexec's default keeps several inferences in flight on overlapping streams (sampleOptions.h, sampleInference.cpp
    # at v10.3.0); these calls run one at a time with a sync after each, which is trtexec --exposeDMA.
    "depth": "one inference in flight, synchronized after each call (trtexec --exposeDMA), not trtexec's "
             "default of overlapped streams: throughput is 1 / latency, not the overlapped figure",
}


class TensorRTRunner(Runner):
    """Runs a Q/DQ (or float) ONNX model through TensorRT engines built on this device.

    Args:
        onnx: The ONNX file.
        options: Precision, workspace, DLA core (its batch profile is replaced per measured batch).
        cache_dir: Engine cache folder (engines keyed by ONNX sha256, device fingerprint and options).
        batch_sizes: The batch sizes the job measures: one engine each, opt = that batch. Default: the
            options' opt batch.
    """

    name = "tensorrt"
    timing_method = ("CUDA events on the stream: begin → H2D copy → enqueued → execute_async_v3 → computed → "
                     "D2H copy → end; pinned host buffers, input shape set once (trtexec's inference loop)")

    def __init__(self, onnx: str | os.PathLike, options: BuildOptions, cache_dir: str | os.PathLike | None = None,
                 batch_sizes: Sequence[int] | None = None):
        self.onnx, self.options = str(onnx), options
        self.batch_sizes = tuple(sorted(set(batch_sizes or (options.batch[1],))))
        self.cache = EngineCache(cache_dir or Path(onnx).parent / "engines")
        self.engine_path: Path | None = None
        self.built_now = False
        self.device: str | None = None
        self.precision_built: str | None = None
        self.trtexec: dict[int, str] = {}
        self.engine_keys: dict[int, str] = {}  # batch → the engine's folder in the cache (GET /v1/engines/{key})
        self.dla_unsupported_layers: list[str] = []
        self._engines: dict[int, _Engine] = {}
        self.marked = tuple(options.mark_outputs)
        self._marked_layers: dict[str, str] = {}
        self.pci_bus_id: str | None = None
        # The last call's device-side times (TIMING_NAMES), read by the measurement after each call.
        self.last_device_ms: dict[str, float] | None = None
        self._events: tuple[int, int, int, int] | None = None

    def load(self) -> None:
        trt = import_tensorrt()
        self.trt = trt
        self.precision_built = reconcile_precision(self.options.precision, artifact_precision(self.onnx),
                                                   trt.__version__)
        options = BuildOptions(precision=self.precision_built, batch=self.options.batch,
                               workspace_mib=self.options.workspace_mib, dla_core=self.options.dla_core,
                               timing_cache=self.options.timing_cache, mark_outputs=self.options.mark_outputs)
        self.cuda = CudaRuntime()
        try:
            bus_id = self.cuda.pci_bus_id(0)
        except Exception:  # a CUDA without the call, or no device: the fingerprint falls back to NVML order
            bus_id = None
        self.pci_bus_id = bus_id  # the NVML sampler reads this GPU, not NVML's index 0
        gpu, capability = detect_gpu(pci_bus_id=bus_id)
        fp = fingerprint(trt.__version__, gpu, capability, read_l4t())
        build = partial(build_engine, board=fp.get("board"), artifact=self.precision_built)
        self.logger = trt.Logger(trt.Logger.WARNING)
        self.runtime = trt.Runtime(self.logger)
        if options.dla_core is not None:
            # trtexec (sampleEngines.cpp) sets the runtime's DLA core before deserializing: a DLA engine
            # runs on the core the runtime names (NvInferRuntime.h, IRuntime::setDLACore).
            if options.dla_core >= self.runtime.num_DLA_cores:
                raise DlaError(f"DLA core {options.dla_core} requested but this device has "
                               f"{self.runtime.num_DLA_cores} DLA core(s) (Jetson Orin Nano has none)",
                               fix="leave dla_core unset to run on the GPU")
            self.runtime.DLA_core = options.dla_core
        sha = sha256_file(self.onnx)
        for batch in self.batch_sizes:
            path, built = self.cache.get_or_build(self.onnx, sha, fp, options.for_batch(batch), build)
            engine = self.runtime.deserialize_cuda_engine(path.read_bytes())
            if engine is None:
                raise EngineBuildError(f"TensorRT could not deserialize {path}",
                                       fix="delete the engine cache folder; it is rebuilt on the next job")
            record_path = path.parent / "build.json"
            record = json.loads(record_path.read_text()) if record_path.is_file() else {}
            context = engine.create_execution_context()
            if context is None:
                # ICudaEngine::createExecutionContext returns null when the device memory for the context's
                # activations cannot be allocated (an 8 GB Orin Nano holding a large engine); trtexec checks it.
                raise RunnerError(f"TensorRT could not create an execution context for the batch-{batch} engine "
                                  "(out of device memory)",
                                  fix="measure smaller batch sizes (deploy.batch_sizes), lower the workspace, or "
                                      "free GPU memory (other processes: tegrastats / nvidia-smi)")
            # Built at DETAILED verbosity for the inspector; pyCoreDoc.h (nvtx_verbosity): DETAILED "will
            # generally increase latency in enqueueV3()", so the timed context emits layer names only, as a
            # default trtexec build does. It "does not affect how IEngineInspector interacts with the engine".
            context.nvtx_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
            self._engines[batch] = _Engine(batch, path, built, engine, context, build=record)
            self.engine_keys[batch] = path.parent.name
            self.trtexec[batch] = record.get("trtexec", "")
        first = self._engines[self.batch_sizes[0]]
        self.engine_path = first.path.parent
        self.built_now = any(e.built_now for e in self._engines.values())
        names = [first.engine.get_tensor_name(i) for i in range(first.engine.num_io_tensors)]
        self.inputs = [n for n in names if first.engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if first.engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        # The model's own outputs first (a debug build records them): marked outputs may come before them.
        own = [n for n in first.build.get("network_outputs") or () if n in outputs]
        self.outputs = own + [n for n in outputs if n not in own]
        self.dtypes = {n: host_type(trt, first.engine.get_tensor_dtype(n), n) for n in names}
        self.bfloat16 = {n for n in names if first.engine.get_tensor_dtype(n) == getattr(trt.DataType, "BF16", None)}
        self.input_chw = tuple(d if d > 0 else None for d in first.engine.get_tensor_shape(self.inputs[0])[1:])
        self._marked_layers = dict(first.build.get("marked_outputs") or {})
        self.dla_unsupported_layers = sorted({name for e in self._engines.values()
                                              for name in e.build.get("dla_unsupported_layers", [])})
        if options.dla_core is None:
            self.device = "gpu"
        else:
            self.device = f"dla:{options.dla_core}" + (
                f" + GPU fallback ({len(self.dla_unsupported_layers)} network layers cannot run on the DLA)"
                if self.dla_unsupported_layers else "")
        self.stream = self.cuda.stream()
        # The host sleeps on the last event of each call (blocking sync, trtexec's default without --useSpinWait):
        # a spinning wait would hold a core the frame's decode thread needs and move the energy per image.
        self._events = (*(self.cuda.event() for _ in range(3)), self.cuda.event(blocking=True))  # type: ignore
        self.host_wait = "blocking-sync event"
        for entry in self._engines.values():
            self._bind(entry)

    def _bind(self, entry: _Engine) -> None:
        """Sets the engine's input shape once, binds device buffers and allocates pinned host buffers."""
        shape = (entry.batch, *self.input_chw)
        if not entry.context.set_input_shape(self.inputs[0], shape):
            raise ShapeOutsideProfileError(
                f"TensorRT refused input shape {shape} (set_input_shape returned False): outside the engine's "
                f"profile for batch {entry.batch}", fix="check the model's C×H×W against the preprocessing")
        dtype = self.dtypes[self.inputs[0]]
        self._buffer(entry, self.inputs[0], int(np.prod(shape)) * dtype.itemsize)
        out_shape = None
        for name in self.outputs:
            out_shape_i = tuple(entry.context.get_tensor_shape(name))
            if any(d < 0 for d in out_shape_i):
                raise ShapeOutsideProfileError(f"TensorRT left output {name!r} with unknown dimensions {out_shape_i}",
                                               fix="set every input's shape within the profile first")
            self._buffer(entry, name, int(np.prod(out_shape_i)) * self.dtypes[name].itemsize)
            out_shape = out_shape if out_shape is not None else out_shape_i
        entry.host_in = self._pinned(entry, shape, dtype)
        entry.host_out = self._pinned(entry, out_shape, self.dtypes[self.outputs[0]])

    def _pinned(self, entry: _Engine, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
        nbytes = int(np.prod(shape)) * dtype.itemsize
        pointer = self.cuda.host_alloc(nbytes)
        entry.pinned.append(pointer)
        raw = (ctypes.c_char * nbytes).from_address(pointer)
        return np.frombuffer(raw, dtype=dtype).reshape(shape)

    def _buffer(self, entry: _Engine, name: str, nbytes: int) -> int:
        pointer, size = entry.buffers.get(name, (0, 0))
        if size < nbytes:
            if pointer:
                self.cuda.free(pointer)
            pointer = self.cuda.malloc(nbytes)
            entry.buffers[name] = (pointer, nbytes)
            if not entry.context.set_tensor_address(name, pointer):
                raise TensorRTCallError(f"TensorRT set_tensor_address({name!r}) returned False",
                                        fix="see the TensorRT log in the job's log")
        return pointer

    def infer(self, batch: np.ndarray) -> np.ndarray:
        """Runs one batch on the engine built for its size; ``last_device_ms`` then holds its device times.

        The batch is copied into the engine's pinned input buffer (part of the application's wall time,
        not of trtexec's "Latency"); CUDA events bracket the host-to-device copy, the enqueue and the
        device-to-host copy on the stream, as trtexec's inference loop does.

        Raises:
            ShapeOutsideProfileError: A batch size or C×H×W no engine was built for.
            TensorRTCallError: ``execute_async_v3`` returned False.
        """
        entry = self._engines.get(batch.shape[0])
        if entry is None:
            raise ShapeOutsideProfileError(
                f"batch {batch.shape[0]} is outside the engines built for batch sizes {list(self.batch_sizes)}",
                fix="add the batch size to the job's batch_sizes (each gets an engine with opt = that batch)")
        if tuple(batch.shape) != entry.host_in.shape:
            raise ShapeOutsideProfileError(
                f"input shape {tuple(batch.shape)} is not the engine's {entry.host_in.shape} (batch {entry.batch})",
                fix="check the model's C×H×W against the preprocessing")
        if self.inputs[0] in self.bfloat16:
            entry.host_in[...] = to_bfloat16(batch)
        else:
            np.copyto(entry.host_in, batch, casting="unsafe")
        first = self.outputs[0]
        begin, enqueued_at, computed_at, end = self._events
        self.cuda.record(begin, self.stream)
        self.cuda.copy(entry.buffers[self.inputs[0]][0], entry.host_in.ctypes.data, entry.host_in.nbytes, _H2D,
                       self.stream)
        self.cuda.record(enqueued_at, self.stream)
        if not entry.context.execute_async_v3(self.stream):
            raise TensorRTCallError("TensorRT execute_async_v3 returned False",
                                    fix="see the TensorRT log in the job's log")
        self.cuda.record(computed_at, self.stream)
        self.cuda.copy(entry.host_out.ctypes.data, entry.buffers[first][0], entry.host_out.nbytes, _D2H, self.stream)
        self.cuda.record(end, self.stream)
        self.cuda.wait_event(end)
        self.last_device_ms = {"latency_ms": self.cuda.elapsed_ms(begin, end),
                               "gpu_compute_ms": self.cuda.elapsed_ms(enqueued_at, computed_at),
                               "h2d_ms": self.cuda.elapsed_ms(begin, enqueued_at),
                               "d2h_ms": self.cuda.elapsed_ms(computed_at, end)}
        return from_bfloat16(entry.host_out) if first in self.bfloat16 else entry.host_out.copy()

    def run_marked(self, batch: np.ndarray) -> dict[str, np.ndarray]:
        """Runs ``batch`` and returns the tensors marked at build time (``BuildOptions.mark_outputs``), float32.

        A debug pass, never timed: each marked output is copied back to pageable memory after the call.
        """
        entry = self._engines.get(batch.shape[0])
        if entry is None:
            raise ShapeOutsideProfileError(f"no engine for batch {batch.shape[0]}",
                                           fix="run the debug job at its one batch size")
        self.infer(batch)
        values = {}
        for name in self.marked:
            shape = tuple(entry.context.get_tensor_shape(name))
            host = np.empty(shape, dtype=self.dtypes[name])
            self.cuda.copy(host.ctypes.data, entry.buffers[name][0], host.nbytes, _D2H, self.stream)
            self.cuda.synchronize(self.stream)
            values[name] = from_bfloat16(host) if name in self.bfloat16 else host.astype(np.float32)
        return values

    def marked_shapes(self, batch: int) -> dict[str, tuple[tuple[int, ...], int]]:
        """Each marked tensor's shape and item size at ``batch``, before anything runs (the job's memory check)."""
        entry = self._engines[batch]
        return {name: (tuple(entry.context.get_tensor_shape(name)), self.dtypes[name].itemsize) for name in self.marked}

    def marked_layers(self) -> dict[str, str]:
        """Each marked tensor → the network layer that writes it (recorded by the build)."""
        return {name: self._marked_layers.get(name, "") for name in self.marked}

    # ------------------------------------------------------------- per-layer profile
    def profile_batch(self, batch: np.ndarray, iterations: int, warmup: int):
        """Per-layer precision, tactic and device (IEngineInspector) and time (IProfiler) at this batch.

        A separate pass: the profiler makes every enqueue synchronous (``enqueue_emits_profile`` is
        True by default), so it never runs in the timed window.

        Returns:
            A :class:`device.jobs.profile.BatchProfile`.
        """
        from device.jobs.profile import from_tensorrt

        trt = self.trt
        entry = self._engines.get(batch.shape[0])
        if entry is None:
            raise ShapeOutsideProfileError(f"no engine for batch {batch.shape[0]}",
                                           fix="profile the batch sizes the job measures")
        for _ in range(warmup):
            self.infer(batch)
        inspector = entry.engine.create_engine_inspector()
        inspector.execution_context = entry.context
        information = inspector.get_engine_information(trt.LayerInformationFormat.JSON)

        class _LayerTimes(trt.IProfiler):
            def __init__(self) -> None:
                trt.IProfiler.__init__(self)  # the bindings require the base initialised explicitly
                self.samples_ms: dict[str, list[float]] = {}

            def report_layer_time(self, layer_name: str, ms: float) -> None:
                self.samples_ms.setdefault(layer_name, []).append(ms)

        profiler = _LayerTimes()
        entry.context.profiler = profiler
        try:
            for _ in range(iterations):
                self.infer(batch)
        finally:
            entry.context.profiler = None
        return from_tensorrt(information, profiler.samples_ms, entry.batch, iterations,
                             "dla" if self.options.dla_core is not None else "gpu", entry.build.get("dla_layers"),
                             entry.build.get("dla_unsupported_layers", ()))

    def profile_meta(self) -> dict[str, Any]:
        notes = []
        if self.dla_unsupported_layers:
            notes.append("IBuilderConfig.can_run_on_DLA refused: " + ", ".join(self.dla_unsupported_layers[:10])
                         + (f" (+{len(self.dla_unsupported_layers) - 10})" if len(self.dla_unsupported_layers) > 10
                            else ""))
        return {"source": "tensorrt IEngineInspector (JSON, ProfilingVerbosity.DETAILED) + IProfiler, separate pass",
                "requested_device": "dla" if self.options.dla_core is not None else "gpu", "notes": notes}

    def runtime_facts(self) -> dict[str, Any]:
        return engine_facts(self)

    def close(self) -> None:
        for entry in self._engines.values():
            for pointer, _ in entry.buffers.values():
                self.cuda.free(pointer)
            entry.buffers = {}
            entry.host_in = entry.host_out = None
            for pointer in entry.pinned:
                self.cuda.free_host(pointer)
            entry.pinned = []
            entry.context = entry.engine = None
        self._engines = {}
        for event in self._events or ():
            self.cuda.destroy_event(event)
        self._events = None
        if getattr(self, "stream", None):
            self.cuda.destroy_stream(self.stream)
            self.stream = None
