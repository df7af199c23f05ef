"""A STAND-IN for TensorRT's Python module (``tensorrt``) and the CUDA runtime — not TensorRT.

TensorRT cannot be installed on the build machines (no GPU; its wheels live on NVIDIA's index), so the
TensorRT runner is tested here against this stand-in, which encodes only the documented behaviour the
runner relies on. Each rule carries a comment citing where it comes from (NVIDIA/TensorRT tags v10.3.0,
v10.16 and v11.1: ``include/NvInfer.h``, ``include/NvInferRuntime.h``, ``python/src/infer/pyCore.cpp``,
``python/docstrings/infer/pyCoreDoc.h``, ``samples/common/sampleEngines.cpp``; NVIDIA's DLA docs;
shared/research/tensorrt-behaviour.md). What it does not model (kernel choice, real timings, fusion
beyond merging consecutive DLA layers) it does not pretend to: the arithmetic of inference is done by
ONNX Runtime on the same ONNX, and per-layer times are synthetic.

Real-TensorRT tests keep their ``tensorrt``/``gpu`` markers and run where TensorRT exists.

Usage::

    trt = install(monkeypatch, version="10.3.0", dla_cores=2)   # sys.modules["tensorrt"], fake CUDA
"""

from __future__ import annotations

import ctypes
import enum
import json
import sys
import types
from pathlib import Path
from typing import Any

import numpy as np

# NVIDIA TensorRT docs, "DLA Supported Layers and Restrictions": convolution, pooling, activation,
# element-wise, scale/batch-norm, concatenation… run on the DLA; the stand-in lets exactly these ONNX
# ops run there. Everything else (here: Gemm/MatMul, Flatten, Reshape) needs GPU fallback.
DLA_OPS = {"Conv", "Relu", "MaxPool", "AveragePool", "GlobalAveragePool", "Add", "BatchNormalization", "Concat",
           "Sigmoid", "Clip"}
STANDIN_DEVICE = "standin-gpu-0"


def _version(text: str) -> tuple[int, int, int]:
    parts = [int(p) for p in text.split(".")[:3]]
    return tuple(parts + [0] * (3 - len(parts)))  # type: ignore[return-value]


def make_tensorrt(version: str = "10.3.0", dla_cores: int = 0, device_memory_bytes: int | None = None) -> types.ModuleType:
    """A fresh stand-in ``tensorrt`` module of TensorRT ``version`` on a device with ``dla_cores`` DLA cores.

    Args:
        device_memory_bytes: Free device memory for execution contexts (None: unlimited); an engine
            needing more gets None from ``create_execution_context``, as on an 8 GB board.
    """
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.__doc__ = "STAND-IN for tensorrt (tests/device/trt_standin.py), not TensorRT"
    major = _version(version)[0]
    trt.log: list[str] = []
    trt.planted_swap_every = 0  # see Context.execute_async_v3: 0 = the engine computes what ONNX Runtime does
    trt.planted_swap_batches = None  # None: every engine deviates; else only the engines built for these batches
    # Planted device time (tests only): a callable (dla_core or None, batch) → seconds each execute_async_v3 takes
    # on top of the ONNX Runtime arithmetic (tests/device/clocked_runtime.py scales it with a simulated clock).
    trt.planted_call_s = None
    # A planted deviation at a named tensor (tests only): (ONNX tensor name, factor). Every engine then computes that
    # tensor times the factor, and everything downstream of it from the changed value, as a faulty fused layer would;
    # the ONNX itself is untouched, so ONNX Runtime on the host keeps the model's values.
    trt.planted_deviation = None

    # --------------------------------------------------------------- enums (pyCore.cpp, NvInfer.h)
    # NvInfer.h v10.3.0: kEXPLICIT_BATCH = 0 (deprecated), kSTRONGLY_TYPED = 1. v11.1: kSTRONGLY_TYPED = 0,
    # "Deprecated in TensorRT 11.0. Strongly typed mode is always enabled … retained … but is ignored".
    trt.NetworkDefinitionCreationFlag = enum.IntEnum(
        "NetworkDefinitionCreationFlag", {"EXPLICIT_BATCH": 0, "STRONGLY_TYPED": 1} if major == 10
        else {"STRONGLY_TYPED": 0, "PREFER_JIT_PYTHON_PLUGINS": 1})
    # NvInfer.h v10.3.0 BuilderFlag: kFP16 = 0, kINT8 = 1, kGPU_FALLBACK = 3; research note: on 11 the
    # INT8 and FP16 flags are gone (getattr(trt.BuilderFlag, "INT8") raises AttributeError there).
    # NvInfer.h v10.3.0: kPREFER_PRECISION_CONSTRAINTS = 10 (11: removed with the other precision flags).
    # kTF32 = 6, on by default (NvInfer.h: "Enabled by default"): a new config has it set.
    trt.BuilderFlag = enum.IntEnum("BuilderFlag", {"FP16": 0, "INT8": 1, "GPU_FALLBACK": 3, "TF32": 6,
                                                   "PREFER_PRECISION_CONSTRAINTS": 10} if major == 10
                                   else {"GPU_FALLBACK": 3, "TF32": 6})
    # NvInfer.h LayerType (the members the code reads); the parser makes CONSTANT for initializers,
    # SHUFFLE for Reshape/Flatten and QUANTIZE/DEQUANTIZE for Q/DQ nodes.
    trt.LayerType = enum.IntEnum("LayerType", {"CONVOLUTION": 0, "ACTIVATION": 2, "POOLING": 3, "ELEMENTWISE": 7,
                                               "SHUFFLE": 15, "CONSTANT": 18, "MATRIX_MULTIPLY": 16,
                                               "QUANTIZE": 33, "DEQUANTIZE": 34, "OTHER": 99})
    trt.MemoryPoolType = enum.IntEnum("MemoryPoolType", {"WORKSPACE": 0})
    trt.DeviceType = enum.IntEnum("DeviceType", {"GPU": 0, "DLA": 1})  # NvInferRuntime.h: kGPU = 0, kDLA = 1
    trt.ProfilingVerbosity = enum.IntEnum("ProfilingVerbosity", {"LAYER_NAMES_ONLY": 0, "NONE": 1, "DETAILED": 2})
    trt.LayerInformationFormat = enum.IntEnum("LayerInformationFormat", {"ONELINE": 0, "JSON": 1})
    trt.TensorIOMode = enum.IntEnum("TensorIOMode", {"NONE": 0, "INPUT": 1, "OUTPUT": 2})
    # NvInfer.h v10.3.0: kFLOAT = 0, kHALF = 1, kINT8 = 2, kINT32 = 3, kBOOL = 4, kUINT8 = 5 (network I/O only),
    # kINT64 = 8 (shape arithmetic: Shape, and Slice/Concat of shapes).
    # kFP8 = 6, kBF16 = 7, kINT4 = 9: trt.nptype has no NumPy type for them and raises TypeError
    # (python/packaging/bindings_wheel/tensorrt/__init__.py nptype, v10.3.0 and v11.1).
    trt.DataType = enum.IntEnum("DataType", {"FLOAT": 0, "HALF": 1, "INT8": 2, "INT32": 3, "UINT8": 5, "FP8": 6,
                                             "BF16": 7, "INT64": 8, "INT4": 9})

    def nptype(dtype):
        found = {0: np.float32, 1: np.float16, 2: np.int8, 3: np.int32, 5: np.uint8, 8: np.int64}.get(int(dtype))
        if found is None:
            raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
        return found

    trt.nptype = nptype
    # Planted I/O types (tests only): "input", "output" or "marked" → "bf16" or "fp8", as a strongly typed network
    # with such tensors would report them; BF16 values travel as their upper 16 bits.
    trt.planted_io_types = {}

    class Logger:
        WARNING, ERROR, INFO = 2, 1, 3

        def __init__(self, severity: int = 2) -> None:
            self.severity = severity

    trt.Logger = Logger

    # --------------------------------------------------------------- the network and the parser
    class Tensor:
        def __init__(self, name: str, shape: tuple[int, ...], is_network_output: bool = False,
                     dtype=None) -> None:
            self.name, self.shape, self.is_network_output = name, shape, is_network_output
            self.dtype = trt.DataType.FLOAT if dtype is None else dtype

    # ONNX op → the layer type TensorRT's parser makes for it (onnx-tensorrt's builtin_op_importers).
    layer_types = {"Conv": "CONVOLUTION", "Relu": "ACTIVATION", "Sigmoid": "ACTIVATION", "Clip": "ACTIVATION",
                   "MaxPool": "POOLING", "AveragePool": "POOLING", "GlobalAveragePool": "POOLING",
                   "Add": "ELEMENTWISE", "Reshape": "SHUFFLE", "Flatten": "SHUFFLE", "Constant": "CONSTANT",
                   "QuantizeLinear": "QUANTIZE", "DequantizeLinear": "DEQUANTIZE", "Gemm": "MATRIX_MULTIPLY",
                   "MatMul": "MATRIX_MULTIPLY"}
    parser_made = {"CONSTANT", "SHUFFLE", "QUANTIZE", "DEQUANTIZE"}

    class Layer:
        def __init__(self, name: str, op: str, quantized: bool, outputs: tuple[Tensor, ...] = ()) -> None:
            self.name, self.op, self.quantized = name, op, quantized
            self.type = getattr(trt.LayerType, layer_types.get(op, "OTHER"))
            # Fused into their neighbours at build time (Q/DQ fusion, constant folding): never engine layers.
            self.folded = layer_types.get(op) in parser_made and op != "Flatten"
            # onnx-tensorrt names a layer's output tensors after the ONNX node's outputs (ITensor::getName).
            self._outputs = list(outputs)
            self._precision = None
            self.output_types: dict[int, Any] = {}

        @property
        def precision(self):
            return self._precision if self._precision is not None else trt.DataType.FLOAT

        @precision.setter
        def precision(self, dtype) -> None:  # ILayer::setPrecision: honoured under the precision-constraint flags
            self._precision = dtype

        def precision_is_set(self) -> bool:
            return self._precision is not None

        def set_output_type(self, index: int, dtype) -> None:
            self.output_types[index] = dtype

        @property
        def num_outputs(self) -> int:
            return len(self._outputs)

        def get_output(self, index: int) -> Tensor:
            return self._outputs[index]

    class Network:
        def __init__(self, flags: int) -> None:
            self.flags = flags
            self.inputs: list[Tensor] = []
            self.layers: list[Layer] = []
            self.onnx: str | None = None
            self.float_type = "fp32"
            self.io_type = "fp32"
            self.marked: list[str] = []
            self.outputs: list[Tensor] = []
            self.refused: list[str] = []

        @property
        def num_outputs(self) -> int:
            return len(self.outputs)

        def get_output(self, index: int) -> Tensor:
            return self.outputs[index]

        def mark_output(self, tensor: Tensor) -> None:
            # INetworkDefinition::markOutput: the tensor becomes a network output (an I/O tensor of the engine). What
            # marking a tensor that already is one does is not documented: the stand-in refuses the build, so the
            # runner never relies on it (Polygraphy checks ITensor.is_network_output first).
            if tensor.is_network_output or tensor.name in self.marked:
                self.refused.append(tensor.name)
            self.marked.append(tensor.name)

        @property
        def num_inputs(self) -> int:
            return len(self.inputs)

        @property
        def num_layers(self) -> int:
            return len(self.layers)

        def get_input(self, index: int) -> Tensor:
            return self.inputs[index]

        def get_layer(self, index: int) -> Layer:
            return self.layers[index]

        def strongly_typed(self) -> bool:
            # 11.x: always strongly typed (NvInfer.h v11.1); 10.x: only with the flag (bit kSTRONGLY_TYPED = 1).
            return major >= 11 or bool(self.flags & (1 << 1))

    class OnnxParser:
        def __init__(self, network: Network, logger: Logger) -> None:
            self.network, self.errors = network, []

        @property
        def num_errors(self) -> int:
            return len(self.errors)

        def get_error(self, index: int) -> str:
            return self.errors[index]

        def parse_from_file(self, path: str) -> bool:
            import onnx

            try:
                model = onnx.load(path)
            except Exception as err:  # the parser reports, it does not raise
                self.errors.append(f"cannot read {path}: {err}")
                return False
            initializers = {i.name for i in model.graph.initializer}
            graph_input = next(i for i in model.graph.input if i.name not in initializers)
            dims = tuple(d.dim_value if d.HasField("dim_value") else -1
                         for d in graph_input.type.tensor_type.shape.dim)
            self.network.inputs.append(Tensor(graph_input.name, dims))
            own = [output.name for output in model.graph.output]
            # A Shape's output is INT64, and so is whatever only slices or concatenates such tensors (a Resize's sizes).
            integer: set[str] = set()
            for node in model.graph.node:
                if node.op_type == "Shape" or (node.op_type in ("Slice", "Concat") and node.input[0] in integer):
                    integer.update(node.output)
            tensors = {name: Tensor(name, (), name in own, trt.DataType.INT64 if name in integer else None)
                       for node in model.graph.node for name in node.output}
            self.network.outputs = [tensors[name] for name in own if name in tensors]
            self.network.onnx = path
            # The network's float type is its weights' (an FP16 model keeps float32 I/O behind Casts); the
            # I/O tensors keep the graph's own input type (HALF when the ONNX says float16).
            # (A frame job's preprocessing in the graph, frame_prefix/…, is FP32 whatever the network's type.)
            floats = [t.data_type for t in model.graph.initializer
                      if t.data_type in (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16) and len(t.dims) > 1
                      and not t.name.startswith("frame_prefix/")]
            self.network.float_type = "fp16" if floats and floats.count(onnx.TensorProto.FLOAT16) * 2 > len(floats) \
                else "fp32"
            self.network.io_type = {onnx.TensorProto.FLOAT16: "fp16", onnx.TensorProto.UINT8: "uint8"}.get(
                graph_input.type.tensor_type.elem_type, "fp32")
            producers = {out: node for node in model.graph.node for out in node.output}
            # onnx-tensorrt makes a Constant layer for each initializer a layer consumes as a tensor (here:
            # the int8 weights behind a DequantizeLinear); TensorRT's log then names them "(CONSTANT):
            # Unsupported on DLA" (ultralytics/ultralytics#16449), though they are folded away.
            for init in model.graph.initializer:
                if any(node.op_type == "DequantizeLinear" and node.input[0] == init.name for node in model.graph.node):
                    self.network.layers.append(Layer(f"{init.name}_constant", "Constant", False,
                                                     (Tensor(init.name, ()),)))
            for index, node in enumerate(model.graph.node):
                source = producers.get(node.input[1]) if len(node.input) > 1 else None
                quantized = source is not None and source.op_type == "DequantizeLinear"
                self.network.layers.append(Layer(node.name or f"{node.op_type}_{index}", node.op_type, quantized,
                                                 tuple(tensors[name] for name in node.output if name)))
            return True

    trt.OnnxParser = OnnxParser

    # --------------------------------------------------------------- builder, config, profile, timing cache
    class OptimizationProfile:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_shape(self, name: str, min: tuple, opt: tuple, max: tuple) -> None:  # noqa: A002
            self.shapes[name] = (tuple(min), tuple(opt), tuple(max))

    class TimingCache:
        def __init__(self, blob: bytes) -> None:
            self.blob = blob

        def serialize(self) -> bytes:
            return f"STANDIN-CACHE:{STANDIN_DEVICE}:{version}".encode()

    class BuilderConfig:
        def __init__(self) -> None:
            self.flags_set: set[int] = {int(trt.BuilderFlag.TF32)}  # on by default
            self.default_device_type = trt.DeviceType.GPU
            self.DLA_core = -1
            self.profiling_verbosity = trt.ProfilingVerbosity.LAYER_NAMES_ONLY
            self.profiles: list[OptimizationProfile] = []
            self.pool: dict[int, int] = {}
            self.cache: TimingCache | None = None

        def set_memory_pool_limit(self, pool, size: int) -> None:
            self.pool[int(pool)] = size

        def set_flag(self, flag) -> None:
            self.flags_set.add(int(flag))

        def clear_flag(self, flag) -> None:
            self.flags_set.discard(int(flag))

        def get_flag(self, flag) -> bool:
            return int(flag) in self.flags_set

        def add_optimization_profile(self, profile: OptimizationProfile) -> int:
            self.profiles.append(profile)
            return len(self.profiles) - 1

        def can_run_on_DLA(self, layer: Layer) -> bool:
            return layer.op in DLA_OPS

        def create_timing_cache(self, blob: bytes) -> TimingCache | None:
            # NvInfer.h IBuilderConfig::createTimingCache: "returns a pointer to the timing cache, or nullptr
            # if it could not be created" — a blob that is not a serialized cache (truncated, foreign).
            if blob and not bytes(blob).startswith(b"STANDIN-CACHE:"):
                return None
            return TimingCache(bytes(blob))

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            # pyCoreDoc.h set_timing_cache: "A failure will be reported if the CUDA device property in the
            # provided cache is different from current environment"; pyCore.cpp returns the bool.
            if cache.blob and not ignore_mismatch and not cache.blob.startswith(
                    f"STANDIN-CACHE:{STANDIN_DEVICE}:".encode()):
                return False
            self.cache = cache
            return True

        def get_timing_cache(self) -> TimingCache:
            return self.cache or TimingCache(b"")

    class Builder:
        def __init__(self, logger: Logger) -> None:
            self.logger = logger

        @property
        def num_DLA_cores(self) -> int:
            return dla_cores

        def create_network(self, flags: int = 0) -> Network:
            return Network(flags)

        def create_builder_config(self) -> BuilderConfig:
            return BuilderConfig()

        def create_optimization_profile(self) -> OptimizationProfile:
            return OptimizationProfile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> bytes | None:
            """An engine as JSON bytes, or None with the reason in ``trt.log`` (the API returns None)."""
            def fail(reason: str) -> None:
                trt.log.append(reason)
                return None

            FP16, INT8, FALLBACK, PREFER = 0, 1, 3, 10
            tensor = network.inputs[0]
            if network.refused:
                return fail(f"tensors marked as outputs twice or already network outputs: {network.refused}")
            strongly = network.strongly_typed()
            if strongly and any(layer.precision_is_set() or layer.output_types for layer in network.layers):
                # NvInfer.h (kSTRONGLY_TYPED): "Setting layer precision and layer output types is not allowed".
                return fail("layer precision set on a strongly typed network")
            if major == 10 and strongly and config.flags_set & {FP16, INT8}:
                # NvInfer.h (kSTRONGLY_TYPED): "Setting layer precision and layer output types is not allowed";
                # the builder rejects precision flags on a strongly typed network.
                return fail("precision builder flags on a strongly typed network")
            if -1 in tensor.shape:
                if not config.profiles:
                    # NvInfer.h (addOptimizationProfile): a network with dynamic inputs needs a profile.
                    return fail(f"network has dynamic input {tensor.name} but no optimization profile")
                low, opt, high = config.profiles[0].shapes[tensor.name]
            else:
                low = opt = high = tensor.shape
                for profile in config.profiles:
                    if profile.shapes.get(tensor.name, (tensor.shape,) * 3) != (tensor.shape,) * 3:
                        # NvInferRuntime.h (IOptimizationProfile::setDimensions): each dimension of a static
                        # input must equal the network's. The build fails — the error names no workspace.
                        return fail(f"profile for {tensor.name} does not match its static shape {tensor.shape}")
            dla = config.default_device_type == trt.DeviceType.DLA
            if dla and not 0 <= config.DLA_core < dla_cores:
                # sampleEngines.cpp: "Cannot create DLA engine, <core> not available" (Orin Nano: 0 cores).
                return fail(f"DLA core {config.DLA_core} not available ({dla_cores} cores)")
            if dla and major >= 11 and _version(version) < (11, 4, 1):
                return fail("DLA is not supported by TensorRT 11.0–11.3")  # research note, TensorRT 11 release notes
            static = low == opt == high
            layers = []
            for layer in network.layers:
                if layer.folded:
                    continue
                if strongly:
                    # Strongly typed (NvInfer.h): each tensor's type comes from the network — Q/DQ layers INT8,
                    # the rest in the ONNX's own float type.
                    precision = ("int8" if layer.quantized else "fp32" if layer.name.startswith("frame_prefix/")
                                 else network.float_type)
                elif layer.precision_is_set() and PREFER in config.flags_set:
                    # kPREFER_PRECISION_CONSTRAINTS: the layer's own precision where a kernel exists (the stand-in's
                    # kernels take every precision).
                    precision = {trt.DataType.FLOAT: "fp32", trt.DataType.HALF: "fp16"}[layer.precision]
                else:
                    precision = ("int8" if layer.quantized and INT8 in config.flags_set
                                 else "fp16" if FP16 in config.flags_set else network.float_type)
                # DLA docs: DLA runs FP16 and INT8 only, no dynamic dimensions, and only its layer set.
                on_dla = (dla and static and precision in ("fp16", "int8") and config.can_run_on_DLA(layer))
                if dla and not on_dla and FALLBACK not in config.flags_set:
                    return fail(f"layer {layer.name} cannot run on DLA and GPU fallback is off")
                layers.append({"name": layer.name, "op": layer.op, "precision": precision,
                               "device": "dla" if on_dla else "gpu"})
            plan = {"standin": True, "version": version, "onnx": network.onnx, "input": tensor.name,
                    "io_dtype": network.io_type, "tf32": int(trt.BuilderFlag.TF32) in config.flags_set,
                    "network_shape": list(tensor.shape), "min": list(low), "max": list(high),
                    "dla_core": config.DLA_core if dla else None, "layers": _fuse_dla(layers),
                    "marked": list(network.marked),
                    "verbosity": int(config.profiling_verbosity)}
            return json.dumps(plan).encode()

    trt.Builder = Builder

    # --------------------------------------------------------------- runtime, engine, context, inspector
    class IProfiler:
        """pyCoreDoc.h / Profiler docs: a Python profiler must call ``trt.IProfiler.__init__(self)``."""

        def __init__(self) -> None:
            self._initialised = True

        def report_layer_time(self, layer_name: str, ms: float) -> None:
            raise NotImplementedError

    trt.IProfiler = IProfiler

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            self._dla_core = -1

        @property
        def num_DLA_cores(self) -> int:
            return dla_cores

        @property
        def DLA_core(self) -> int:
            return self._dla_core

        @DLA_core.setter
        def DLA_core(self, core: int) -> None:
            # NvInferRuntime.h (IRuntime::setDLACore): "if getNbDLACores() returns 0, then this function does nothing".
            if dla_cores:
                self._dla_core = core

        def deserialize_cuda_engine(self, blob: bytes):
            try:
                plan = json.loads(bytes(blob))
            except ValueError:
                return None
            if not plan.get("standin") or plan["version"] != version:
                return None  # "Plan file is not compatible with this version of TensorRT"
            if plan["dla_core"] is not None and self._dla_core != plan["dla_core"]:
                # trtexec (sampleEngines.cpp) sets runtime.setDLACore before deserializing a DLA engine; the
                # stand-in refuses an engine whose DLA core the runtime was not told.
                trt.log.append(f"DLA engine for core {plan['dla_core']} deserialized with runtime core {self._dla_core}")
                return None
            return Engine(plan)

    trt.Runtime = Runtime

    class Engine:
        def __init__(self, plan: dict[str, Any]) -> None:
            self.plan = plan
            self._session = None
            outputs = _ort(plan["onnx"]).get_outputs()[0]
            self.classes = outputs.shape[-1]
            self.output_name = outputs.name
            self.marked = list(plan.get("marked", []))
            self._marked_shapes: dict[tuple, dict[str, tuple]] = {}

        @property
        def num_io_tensors(self) -> int:
            return 2 + len(self.marked)

        def get_tensor_name(self, index: int) -> str:
            # The I/O order is not the network's (pytorch/TensorRT#1646): the marked outputs come before the model's.
            return [self.plan["input"], *self.marked, self.output_name][index]

        def get_tensor_mode(self, name: str):
            if name in self.marked:
                return trt.TensorIOMode.OUTPUT
            return {self.plan["input"]: trt.TensorIOMode.INPUT, self.output_name: trt.TensorIOMode.OUTPUT}.get(
                name, trt.TensorIOMode.NONE)

        def marked_shape(self, name: str, shape: tuple) -> tuple:
            # A marked tensor's shape at this input shape, from one ONNX Runtime run on zeros.
            if shape not in self._marked_shapes:
                io = {"fp16": np.float16, "uint8": np.uint8}.get(self.plan.get("io_dtype"), np.float32)
                values = _ort_run(self.plan["onnx"], self.marked, None, {self.plan["input"]: np.zeros(shape, io)})
                self._marked_shapes[shape] = {n: tuple(v.shape) for n, v in zip(self.marked, values[1:])}
            return self._marked_shapes[shape][name]

        def get_tensor_dtype(self, name: str):
            # An FP16 ONNX's I/O tensors are HALF (the parser keeps the graph's I/O types); a marked tensor is FLOAT.
            role = "marked" if name in self.marked else "input" if name == self.plan["input"] else \
                "output" if name == self.output_name else None
            if role in trt.planted_io_types:
                return {"bf16": trt.DataType.BF16, "fp8": trt.DataType.FP8}[trt.planted_io_types[role]]
            if name in self.marked:
                return trt.DataType.FLOAT
            if self.plan.get("io_dtype") == "uint8":  # UINT8 is network I/O only: here a frame in, logits out
                return trt.DataType.UINT8 if name == self.plan["input"] else trt.DataType.FLOAT
            return trt.DataType.HALF if self.plan.get("io_dtype") == "fp16" else trt.DataType.FLOAT

        @property
        def device_memory_size(self) -> int:
            # Synthetic: activations scale with the largest batch (ICudaEngine::getDeviceMemorySize).
            return int(np.prod([max(d, 1) for d in self.plan["max"]])) * 4 * 64

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple]:
            # NvInferRuntime.h ICudaEngine::getProfileShape (Python get_tensor_profile_shape): [min, opt, max] of an
            # input in a profile; the engine's builds have one profile, min = opt = max per measured batch.
            if name != self.plan["input"] or profile_index != 0:
                raise ValueError(f"no profile {profile_index} for {name}")
            return [tuple(self.plan["min"]), tuple(self.plan["max"]), tuple(self.plan["max"])]

        def get_tensor_shape(self, name: str) -> tuple:
            if name == self.plan["input"]:
                return tuple(self.plan["network_shape"])
            if name in self.marked:
                return self.marked_shape(name, tuple(self.plan["max"]))
            return (self.plan["network_shape"][0], self.classes)

        def create_execution_context(self):
            # NvInferRuntime.h ICudaEngine::createExecutionContext: nullptr when the context's device memory
            # cannot be allocated (trtexec checks it: "Unable to create execution context for stream").
            if device_memory_bytes is not None and self.device_memory_size > device_memory_bytes:
                trt.log.append(f"out of device memory: context needs {self.device_memory_size} bytes")
                return None
            return Context(self)

        def create_engine_inspector(self):
            return Inspector(self)

    class Context:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.shape: tuple | None = None
            self.addresses: dict[str, int] = {}
            self._profiler = None
            self.enqueue_emits_profile = True  # pyCoreDoc.h: "The default value is True"
            # pyCoreDoc.h (nvtx_verbosity): "The default is the verbosity with which the engine was built".
            self.nvtx_verbosity = engine.plan["verbosity"]

        @property
        def profiler(self):
            return self._profiler

        @profiler.setter
        def profiler(self, profiler) -> None:
            if profiler is not None and not getattr(profiler, "_initialised", False):
                raise TypeError("IProfiler.__init__ was not called")  # pybind11: base class not initialised
            self._profiler = profiler

        def set_input_shape(self, name: str, shape) -> bool:
            # NvInferRuntime.h setInputShape: "True on success, false if the provided name does not map to an
            # input tensor, or if some other error occurred"; each dimension must agree with the network's unless
            # it is -1, and a shape outside the profile's [min, max] is such an error.
            plan = self.engine.plan
            shape = tuple(int(d) for d in shape)
            if name != plan["input"] or len(shape) != len(plan["network_shape"]):
                return False
            if any(n != -1 and n != d for n, d in zip(plan["network_shape"], shape)):
                return False
            if not all(lo <= d <= hi for lo, d, hi in zip(plan["min"], shape, plan["max"])):
                return False
            self.shape = shape
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            # NvInferRuntime.h getTensorShape: dimensions that depend on unset input shapes are -1.
            if name == self.engine.plan["input"]:
                return self.shape or tuple(self.engine.plan["network_shape"])
            if name in self.engine.marked:
                return self.engine.marked_shape(name, self.shape) if self.shape else (-1,)
            return (self.shape[0] if self.shape else -1, self.engine.classes)

        def set_tensor_address(self, name: str, address: int) -> bool:
            # NvInferRuntime.h setTensorAddress: false for a name that is no I/O tensor; "The pointer must have
            # at least 256-byte alignment".
            if self.engine.get_tensor_mode(name) == trt.TensorIOMode.NONE or address % 256:
                return False
            self.addresses[name] = address
            return True

        def execute_async_v3(self, stream_handle: int) -> bool:
            # NvInferRuntime.h enqueueV3: returns false when input shapes or tensor addresses are missing.
            import time

            began = time.perf_counter()
            plan = self.engine.plan
            output = self.engine.output_name
            if self.shape is None or set(self.addresses) != {plan["input"], output, *self.engine.marked}:
                return False
            count = int(np.prod(self.shape))
            io = {"fp16": np.float16, "uint8": np.uint8}.get(plan.get("io_dtype"), np.float32)
            planted = trt.planted_io_types
            read_as = np.uint16 if planted.get("input") == "bf16" else io
            data = np.frombuffer((ctypes.c_char * (count * np.dtype(read_as).itemsize)).from_address(
                self.addresses[plan["input"]]), dtype=read_as).reshape(self.shape)
            if planted.get("input") == "bf16":
                data = (data.astype(np.uint32) << 16).view(np.float32).astype(io)
            values = _ort_run(plan["onnx"], self.engine.marked, trt.planted_deviation, {plan["input"]: data.copy()})
            result = values[0].astype(np.float32 if io is np.uint8 else io)
            if planted.get("output") == "bf16":  # truncated to bfloat16's upper 16 bits, as a BF16 output holds
                result = (np.ascontiguousarray(result, np.float32).view(np.uint32) >> 16).astype(np.uint16)
            for name, value in zip(self.engine.marked, values[1:]):
                # Marked outputs are FLOAT unless the network says otherwise (ITensor::setType is never called).
                value = np.ascontiguousarray(value, dtype=np.float32)
                if planted.get("marked") == "bf16":
                    value = (value.view(np.uint32) >> 16).astype(np.uint16)
                ctypes.memmove(self.addresses[name], value.ctypes.data, value.nbytes)
            if trt.planted_swap_every and (trt.planted_swap_batches is None
                                           or self.shape[0] in trt.planted_swap_batches):
                # A planted device-side deviation (tests only): every n-th image of a call has its top two
                # classes swapped, as a fused INT8 layer's rounding might flip close calls on a real board.
                for row in range(0, len(result), trt.planted_swap_every):
                    first, second = np.argsort(-result[row])[:2]
                    result[row, [first, second]] = result[row, [second, first]]
            ctypes.memmove(self.addresses[output], result.ctypes.data, result.nbytes)
            if trt.planted_call_s is not None:
                # The call lasts the planted time, the graph's own computing on this host included (as a GPU's
                # kernels take their time whatever the host did meanwhile): a busy host then moves every call by
                # the same little, not each by its own share of the graph's CPU time.
                time.sleep(max(0.0, began + trt.planted_call_s(plan["dla_core"], self.shape[0]) - time.perf_counter()))
            if self._profiler is not None and self.enqueue_emits_profile:
                # IProfiler docs: called once per layer for each enqueueV3 (after execution). Synthetic
                # times: INT8 layers cost less than float ones, so shares are deterministic and non-trivial.
                for index, layer in enumerate(plan["layers"]):
                    cost = {"int8": 0.25, "fp16": 0.5}.get(layer["precision"], 1.0)
                    self._profiler.report_layer_time(layer["name"], cost * (1 + index % 3) * self.shape[0] / 8)
                if plan["dla_core"] is not None:
                    # A DLA engine's profiler also reports its I/O copies into and out of the DLA's memory and
                    # their completion, named after the tensors (NVIDIA/TensorRT#3143: "images to nvm",
                    # "head_3 from nvm", "images copy finish").
                    for entry in (f"{plan['input']} to nvm", f"{output} from nvm", f"{plan['input']} copy finish",
                                  f"{output} copy finish"):
                        self._profiler.report_layer_time(entry, 0.05 * self.shape[0])
            return True

    class Inspector:
        def __init__(self, engine: Engine) -> None:
            self.engine = engine
            self.execution_context = None

        def get_engine_information(self, fmt) -> str:
            # Engine inspector docs: DETAILED verbosity gives objects (Name, LayerType, Inputs/Outputs with
            # Format/Datatype, TacticName); LAYER_NAMES_ONLY gives names only. Formats as in the trex examples
            # (tools/experimental/trt-engine-explorer): "Row major linear FP32", "Channel major FP16 format…".
            plan = self.engine.plan
            if plan["verbosity"] != int(trt.ProfilingVerbosity.DETAILED):
                return json.dumps({"Layers": [layer["name"] for layer in plan["layers"]]})
            fmt_of = {"int8": "Channel major INT8 format where channel % 16 == 0",
                      "fp16": "Channel major FP16 format where channel % 8 == 0", "fp32": "Row major linear FP32"}
            layers = []
            for layer in plan["layers"]:
                dla = layer["device"] == "dla"
                entry = {"Name": layer["name"],
                         "LayerType": {"Conv": "CaskConvolution", "Gemm": "CaskGemmConvolution"}.get(layer["op"],
                                                                                                  layer["op"]),
                         "Inputs": [{"Name": "in", "Format/Datatype": fmt_of[layer["precision"]]}],
                         "Outputs": [{"Name": "out", "Format/Datatype": fmt_of[layer["precision"]]}],
                         "TacticName": f"standin_{layer['precision']}_kernel"}
                if layer["op"] in ("QuantizeLinear", "DequantizeLinear"):
                    # An unfused Q/DQ is marked by its origin, not its type: trex's example engines
                    # (tools/experimental/trt-engine-explorer, kept in the v10 tree) carry "LayerType": "Reformat",
                    # "Origin": "QDQ", and trex's graphing.py at v10.16 keys on exactly that.
                    entry.update(LayerType="Reformat", Origin="QDQ")
                if dla:
                    # No source read documents a DLA layer's inspector JSON: nothing here names the DLA, so the
                    # profile must take the placement from the build's own record (build.json dla_layers).
                    entry.update(LayerType="Unknown")
                    entry.pop("TacticName")
                layers.append(entry)
            return json.dumps({"Layers": layers, "Bindings": [plan["input"], self.engine.output_name]})

    return trt


def _fuse_dla(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Consecutive DLA layers become one engine layer ``{ForeignNode[first...last]}``, as TensorRT's log
    shows DLA subgraphs (samples/sampleCudla/README.md: ``[DlaLayer] {ForeignNode[…]}``)."""
    fused: list[dict[str, Any]] = []
    for layer in layers:
        if layer["device"] == "dla" and fused and fused[-1]["device"] == "dla":
            fused[-1]["members"].append(layer["name"])
            first = fused[-1]["members"][0]
            fused[-1]["name"] = f"{{ForeignNode[{first}...{layer['name']}]}}"
            fused[-1]["precision"] = min(fused[-1]["precision"], layer["precision"], key=["int8", "fp16"].index)
        elif layer["device"] == "dla":
            fused.append({**layer, "name": f"{{ForeignNode[{layer['name']}]}}", "members": [layer["name"]]})
        else:
            fused.append(layer)
    return fused


_SESSIONS: dict[Any, Any] = {}


def _ort_run(path: str, marked: list[str], planted: tuple[str, float] | None, feed: dict[str, np.ndarray]) -> list:
    """The first output, then the marked tensors, computed by ONNX Runtime on the ONNX with the planted deviation
    (a Mul after the named tensor's writer, so its readers see the changed value) and the marked tensors appended to
    its outputs; the ONNX file itself is left as it is."""
    import onnx
    import onnxruntime as ort

    key = (path, tuple(marked), planted)
    if key not in _SESSIONS:
        model = onnx.load(path)
        graph = model.graph
        if planted is not None:
            name, factor = planted
            writer = next(node for node in graph.node if name in node.output)
            writer.output[list(writer.output).index(name)] = f"{name}__planted"
            graph.initializer.append(onnx.numpy_helper.from_array(np.array(factor, np.float32), f"{name}__factor"))
            position = list(graph.node).index(writer) + 1
            graph.node.insert(position, onnx.helper.make_node("Mul", [f"{name}__planted", f"{name}__factor"], [name]))
        first = graph.output[0]
        del graph.output[1:]
        for name in marked:
            if name != first.name:
                graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        _SESSIONS[key] = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    session = _SESSIONS[key]
    names = [output.name for output in session.get_outputs()]
    values = dict(zip(names, session.run(None, feed)))
    return [values[names[0]], *(values[name] for name in marked)]


def _ort(path: str):
    import onnxruntime as ort

    if path not in _SESSIONS:
        options = ort.SessionOptions()
        options.intra_op_num_threads = 1
        _SESSIONS[path] = ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])
    return _SESSIONS[path]


class FakeCuda:
    """Stand-in for ``device.runners.tensorrt.CudaRuntime``: host memory, 256-byte aligned (as cudaMalloc)."""

    def __init__(self) -> None:
        self.blocks: dict[int, Any] = {}
        self.freed: list[int] = []

    def malloc(self, nbytes: int) -> int:
        block = ctypes.create_string_buffer(nbytes + 256)
        address = (ctypes.addressof(block) + 255) // 256 * 256
        self.blocks[address] = block
        return address

    def free(self, pointer: int) -> None:
        self.freed.append(pointer)
        self.blocks.pop(pointer, None)

    def stream(self) -> int:
        self.streams = getattr(self, "streams", set())
        handle = len(self.streams) + 1 + len(getattr(self, "streams_destroyed", []))
        self.streams.add(handle)
        return handle

    def destroy_stream(self, stream: int) -> None:
        self.streams.remove(stream)  # a stream destroyed twice, or never created, fails here as in CUDA
        self.streams_destroyed = [*getattr(self, "streams_destroyed", []), stream]

    def copy(self, dst: int, src: int, nbytes: int, kind: int, stream: int) -> None:
        ctypes.memmove(dst, src, nbytes)

    def synchronize(self, stream: int) -> None:
        pass

    def pci_bus_id(self, device: int = 0) -> str | None:
        return self.bus_id

    bus_id: str | None = None

    def host_alloc(self, nbytes: int) -> int:
        self.pinned_bytes = getattr(self, "pinned_bytes", 0) + nbytes
        return self.malloc(nbytes)

    def free_host(self, pointer: int) -> None:
        self.free(pointer)

    # Events: the stand-in runs every call synchronously, so an event's time is when it was recorded.
    def event(self, blocking: bool = False) -> int:
        self.events = getattr(self, "events", {})
        self.blocking_events = getattr(self, "blocking_events", set())
        handle = len(self.events) + 1
        self.events[handle] = None
        if blocking:
            self.blocking_events.add(handle)
        return handle

    def wait_event(self, event: int) -> None:
        # cudaEventSynchronize on an event never recorded returns at once; here every waited event was recorded.
        if self.events.get(event) is None:
            raise AssertionError(f"waited on event {event}, which was never recorded")
        self.waited = [*getattr(self, "waited", []), event]

    def record(self, event: int, stream: int) -> None:
        import time

        self.events[event] = time.perf_counter()

    def elapsed_ms(self, start: int, end: int) -> float:
        return (self.events[end] - self.events[start]) * 1e3

    def destroy_event(self, event: int) -> None:
        self.events.pop(event, None)


def install(monkeypatch, version: str = "10.3.0", dla_cores: int = 0, board: str | None = None,
            device_memory_bytes: int | None = None) -> types.ModuleType:
    """Puts a stand-in ``tensorrt`` in ``sys.modules`` and the fake CUDA runtime in the runner and NVML's lookup."""
    import device.runners.cuda
    import device.runners.engine
    import device.runners.tensorrt

    trt = make_tensorrt(version, dla_cores, device_memory_bytes)
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr(device.runners.tensorrt, "CudaRuntime", FakeCuda)
    monkeypatch.setattr(device.runners.cuda, "CudaRuntime", FakeCuda)
    monkeypatch.setattr(device.runners.engine, "board_model", lambda *a, **k: board)
    monkeypatch.setattr(device.runners.tensorrt, "detect_gpu", lambda **_: (STANDIN_DEVICE, "8.7"))
    return trt


def standin_path() -> Path:
    return Path(__file__)


def qdq_classifier(path: str | Path, batch: int | str = "batch", channels: int = 3, size: int = 16,
                   classes: int = 10, seed: int = 0) -> Path:
    """A test model (not part of the stand-in): a small classifier explicitly quantized the way TensorRT
    wants it (int8 Q/DQ, zero point 0, per-channel weights on axis 0) around its Conv; the Gemm head
    stays in float. Runs under ONNX Runtime on CPU; the Q/DQ lint passes it."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    weight = rng.integers(-100, 100, (8, channels, 3, 3)).astype(np.int8)
    inits = [numpy_helper.from_array(np.array(0.02, np.float32), "x_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "x_zero"),
             numpy_helper.from_array(weight, "w_int8"),
             numpy_helper.from_array(np.full(8, 0.002, np.float32), "w_scale"),
             numpy_helper.from_array(np.zeros(8, np.int8), "w_zero"),
             numpy_helper.from_array(np.zeros(8, np.float32), "b"),
             numpy_helper.from_array(np.array(0.05, np.float32), "r_scale"),
             numpy_helper.from_array(np.array(0, np.int8), "r_zero"),
             numpy_helper.from_array(rng.standard_normal((classes, 8)).astype(np.float32) * 0.2, "fc_w"),
             numpy_helper.from_array(np.zeros(classes, np.float32), "fc_b")]
    nodes = [helper.make_node("QuantizeLinear", ["input", "x_scale", "x_zero"], ["xq"], name="quant_input"),
             helper.make_node("DequantizeLinear", ["xq", "x_scale", "x_zero"], ["xdq"], name="dequant_input"),
             helper.make_node("DequantizeLinear", ["w_int8", "w_scale", "w_zero"], ["w"], name="dequant_w", axis=0),
             helper.make_node("Conv", ["xdq", "w", "b"], ["conv"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["conv"], ["relu"], name="relu"),
             helper.make_node("QuantizeLinear", ["relu", "r_scale", "r_zero"], ["rq"], name="quant_relu"),
             helper.make_node("DequantizeLinear", ["rq", "r_scale", "r_zero"], ["rdq"], name="dequant_relu"),
             helper.make_node("GlobalAveragePool", ["rdq"], ["pool"], name="pool"),
             helper.make_node("Flatten", ["pool"], ["flat"], name="flatten"),
             helper.make_node("Gemm", ["flat", "fc_w", "fc_b"], ["logits"], name="head", transB=1)]
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info("input", TensorProto.FLOAT,
                                                                          [batch, channels, size, size])],
                              [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [batch, classes])],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    onnx.save(model, str(path))
    return Path(path)
