"""TensorRT engine builder: built on the device from the Q/DQ ONNX, cached by fingerprint.

Engines are bound to the TensorRT version and the GPU they were built with ("Plan file is not
compatible with this version of TensorRT" after a JetPack upgrade), so every engine is stored
with the fingerprint of the device that built it and is rebuilt, never loaded, when the current
device's fingerprint differs.

Two TensorRT generations are supported:

* TensorRT 10.x (JetPack 6): weakly typed networks; INT8 is enabled by ``BuilderFlag.INT8`` and
  the Q/DQ nodes, with ``BuilderFlag.FP16`` so the float layers may fall back to FP16. From 10.12
  those flags are deprecated: a Q/DQ model is built strongly typed there (DLA builds keep the flags).
* TensorRT 11.x: strongly typed networks only, no precision flags; the Q/DQ ONNX itself
  decides which layers run in INT8, and a float model runs in its own type. DLA only from 11.4.1,
  on AGX Orin.

The requested precision is checked against the artifact (:func:`reconcile_precision`, the Q/DQ
lint deciding what is INT8), one engine is built per measured batch (opt = that batch), and every
build records its trtexec line and the layers the DLA refused in ``build.json`` beside the engine.

The build settings (flags, profile, trtexec equivalent) are plain Python and tested without TensorRT;
only :func:`build_engine` imports ``tensorrt``, lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict
from pathlib import Path
from typing import Any, Callable, Sequence

from device.errors import (DlaError, EngineBuildError, PrecisionMismatchError, StaticShapeError,
                           TimingCacheError, require)
from device.files import write_atomic
from device.jobs.frame_schema import PREFIX_NODES

# L4T → JetPack (exact, jetson-stats' table) and SoC → compute capability live with the board facts.
from device.power.jetson import L4T_TO_JETPACK, TEGRA_COMPUTE_CAPABILITY, board_model, jetpack_for  # noqa: E402,F401
# The build's settings and its trtexec line, plain data (re-exported: the builder's callers name them here).
from device.runners.trt_settings import (DLA_LAST_10, DLA_ON_11_FROM, PARSER_LAYER_TYPES, STRONGLY_TYPED_FROM,  # noqa: F401
                                 BuildOptions, BuildSettings, build_settings, trt_major, trt_version_tuple,
                                 trtexec_command, trtexec_lines)


# ------------------------------------------------------------------ precision of the artifact
def artifact_precision(onnx: str | os.PathLike) -> str:
    """The precision the ONNX itself carries: ``int8`` with Q/DQ pairs (per the Q/DQ lint), else the
    type of its compute layers' weights (``fp16`` or ``fp32``) — never its input's type: an FP16 model
    keeps float32 I/O so the client does not change.

    Raises:
        EngineBuildError: A Q/DQ model that breaks TensorRT's Q/DQ rules (the lint's findings named),
            before TensorRT's parser fails on it with less to go on.
    """
    import onnx as onnx_lib

    from device.runners.qdq_lint import lint_qdq

    model = onnx_lib.load(str(onnx))
    lint = lint_qdq(model)
    if lint.qdq_pairs:
        if not lint.ok:
            raise EngineBuildError(f"{Path(onnx).name} breaks TensorRT's Q/DQ rules: {lint.describe()}",
                                   fix="re-quantize (edgefold run … --force quantize)")
        return "int8"
    return float_compute_precision(model)


def float_compute_precision(model) -> str:
    """``fp16`` when the float weights of the compute layers (Conv, Gemm, MatMul, ConvTranspose) are FP16
    or BF16, else ``fp32``; a graph with no such weights is read by its first input's type."""
    import onnx as onnx_lib

    half = {onnx_lib.TensorProto.FLOAT16, onnx_lib.TensorProto.BFLOAT16}
    initializers = {init.name: init.data_type for init in model.graph.initializer}
    # A frame job's preprocessing in the graph (its colour and grey Convs in FP32) is not the network's precision.
    weights = [initializers[node.input[1]] for node in model.graph.node
               if node.op_type in ("Conv", "Gemm", "MatMul", "ConvTranspose") and len(node.input) > 1
               and node.input[1] in initializers and not node.name.startswith(PREFIX_NODES)]
    if weights:
        return "fp16" if sum(w in half for w in weights) * 2 > len(weights) else "fp32"
    inputs = [i for i in model.graph.input if i.name not in initializers]
    elem = inputs[0].type.tensor_type.elem_type if inputs else onnx_lib.TensorProto.FLOAT
    return "fp16" if elem in half else "fp32"


def reconcile_precision(requested: str, artifact: str, trt_version: str) -> str:
    """The precision to build: the artifact's own, which the job's label must name.

    A rung's precision is its artifact's (Q/DQ for INT8, FP16 weights for FP16), never only a builder
    flag: TensorRT 11 has no flags, strongly typed 10.12+ builds take the graph's types, and an FP32
    model built "as FP16" on 10.x would be timed in one precision and scored in another.

    Raises:
        PrecisionMismatchError: The request contradicts the artifact (on every TensorRT version).
    """
    trt_major(trt_version)  # an unreadable version is refused here too
    if requested == artifact:
        return requested
    if artifact == "int8":
        fix = "send precision int8 with a Q/DQ model, or send the float ONNX for a float build"
        what = "the artifact has Q/DQ nodes: TensorRT builds it as INT8"
    elif requested == "int8":
        fix = "send the quantize stage's student.int8.onnx for an INT8 build"
        what = f"the artifact has no Q/DQ nodes: TensorRT would build it in {artifact} and the result would say INT8"
    elif requested == "fp16":
        fix = "send the rung's FP16 form (export.fp16_rungs: student_fp16), written in the graph"
        what = "the artifact's weights are FP32: an FP16 builder flag would time a model nobody scored"
    else:
        fix = f"send precision {artifact}"
        what = f"the artifact is {artifact}"
    raise PrecisionMismatchError(f"the job asks for {requested} but {what} (TensorRT {trt_version})", fix=fix)


# ------------------------------------------------------------------ the device's fingerprint
def read_l4t(path: str = "/etc/nv_tegra_release") -> str | None:
    """``# R36 (release), REVISION: 4.3, …`` → ``36.4.3``; None off a Jetson."""
    try:
        text = Path(path).read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r"R(\d+)\s*\(release\),\s*REVISION:\s*([\d.]+)", text)
    return f"{match.group(1)}.{match.group(2)}" if match else None


def fingerprint(trt_version: str, gpu_name: str, compute_capability: str | None, l4t: str | None,
                board: str | None = None) -> dict[str, Any]:
    """What an engine is bound to.

    Args:
        board: The board's model (``/proc/device-tree/model``); read here when not given. Orin Nano,
            Orin NX and AGX Orin share GPU name and compute capability but not their SM count.
    """
    return {"tensorrt": trt_version, "gpu": gpu_name, "compute_capability": compute_capability,
            "l4t": l4t, "jetpack": jetpack_for(l4t), "board": board if board is not None else board_model()}


def fingerprint_key(fp: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(fp, sort_keys=True).encode()).hexdigest()[:16]


def detect_gpu(device_tree: str = "/proc/device-tree/compatible",
               pci_bus_id: str | None = None) -> tuple[str, str | None]:
    """(GPU name, compute capability): NVML on data-center GPUs, the device tree on a Jetson.

    Args:
        device_tree: The device tree's ``compatible`` file (Jetson).
        pci_bus_id: CUDA device 0's PCI bus id (``CudaRuntime.pci_bus_id()``), so NVML describes the
            GPU CUDA will use.
    """
    from device.telemetry.nvml import cuda_device_handle, cuda_pci_bus_id

    try:
        import pynvml

        pynvml.nvmlInit()
        handle = cuda_device_handle(pynvml, pci_bus_id or cuda_pci_bus_id())
        name = pynvml.nvmlDeviceGetName(handle)
        major, minor = pynvml.nvmlDeviceGetCudaComputeCapability(handle)
        return (name.decode() if isinstance(name, bytes) else name), f"{major}.{minor}"
    except Exception:  # no NVML, or Tegra, where NVML reports NOT_SUPPORTED
        pass
    try:
        compatible = Path(device_tree).read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return "unknown", None
    for soc, capability in TEGRA_COMPUTE_CAPABILITY.items():
        if any(entry.endswith(soc) for entry in compatible):
            return f"{soc} iGPU", capability
    return "unknown", None


# ------------------------------------------------------------------ cache and build
ENGINE_KEY = r"^[0-9a-f]{16}-[0-9a-f]{16}-[0-9a-f]{8}$"  # a cache folder's name: ONNX sha256, fingerprint, options
ENGINE_FILES = ("engine.plan", "compiled.pt2")


class EngineCache:
    """Engines under ``root/<onnx sha256>-<fingerprint key>-<options key>/`` with the fingerprint beside them.

    Attributes:
        filename: The cached file's name in its folder (a TensorRT plan here; the Torch-TensorRT runner
            caches a compiled program under the same folder rules).
    """

    filename = "engine.plan"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def folder(self, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions) -> Path:
        keyed = asdict(options)
        if not keyed["mark_outputs"]:  # the key of every engine cached before debug builds existed stays as it was
            del keyed["mark_outputs"]
        if keyed.get("precision") == "fp32":  # built without TF32 since result 2.12: an older fp32 plan is not reused
            keyed["cleared_flags"] = ["TF32"]
        options_key = hashlib.sha256(json.dumps(keyed, sort_keys=True, default=list).encode()).hexdigest()[:8]
        return self.root / f"{onnx_sha256[:16]}-{fingerprint_key(fp)}-{options_key}"

    def lookup(self, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions) -> Path | None:
        """The cached engine when it was built by a device with exactly this fingerprint."""
        folder = self.folder(onnx_sha256, fp, options)
        engine, recorded = folder / self.filename, folder / "fingerprint.json"
        if not engine.is_file() or not recorded.is_file():
            return None
        try:
            if json.loads(recorded.read_text()) != fp:
                return None
        except json.JSONDecodeError:
            return None
        return engine

    def get_or_build(self, onnx: str | os.PathLike, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions,
                     build: Callable[[Path, BuildOptions, Path], None]) -> tuple[Path, bool]:
        """Returns (engine path, built now?), building with ``build(onnx, options, engine_path)`` on a miss."""
        cached = self.lookup(onnx_sha256, fp, options)
        if cached is not None:
            return cached, False
        folder = self.folder(onnx_sha256, fp, options)
        folder.mkdir(parents=True, exist_ok=True)
        engine = folder / self.filename
        # Not files.atomic_writer: ``build`` (TensorRT's serializer or trtexec) writes the file by path itself.
        tmp = folder / f"{self.filename}.tmp"
        build(Path(onnx), options, tmp)
        os.replace(tmp, engine)
        write_atomic(folder / "fingerprint.json", json.dumps(fp, indent=2, sort_keys=True) + "\n")
        return engine, True


def dla_placement(trt, network, config) -> tuple[list[str], list[str]]:
    """(the network's layers placed on the DLA, those refused), by ``IBuilderConfig.can_run_on_DLA``, less the
    layers the parser made (:data:`PARSER_LAYER_TYPES`). The refused run on the GPU; the placed are how the
    per-layer profile tells DLA engine layers from GPU ones (the inspector's JSON does not say)."""
    parser_made = {getattr(trt.LayerType, name) for name in PARSER_LAYER_TYPES if hasattr(trt.LayerType, name)}
    placed, refused = [], []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if getattr(layer, "type", None) in parser_made:
            continue
        (placed if config.can_run_on_DLA(layer) else refused).append(layer.name)
    return placed, refused


def mark_outputs(network, names: Sequence[str], where: str) -> dict[str, Any]:
    """Marks each named tensor (an output of a layer the ONNX parser made) as a network output.

    The parser names a layer's output tensors after the ONNX node's outputs, so the graph's names find them
    (``ITensor.name``; ``INetworkDefinition.mark_output``, NvInfer.h).

    A tensor that already is a network output (the model's own output) is not marked again (``ITensor.
    is_network_output``, as Polygraphy's ``mark_outputs`` checks), and the network's own outputs are recorded: the
    engine's I/O tensors need not come in the network's order, and the runner must still read the model's output.

    Returns:
        What build.json records: ``marked_outputs`` (each marked tensor → the network layer that writes it) and
        ``network_outputs`` (the network's own outputs, in order); empty when nothing is marked.

    Raises:
        TensorNotFoundError: A name no layer writes (the parser may have folded a constant subgraph away).
    """
    from device.jobs.marked import check_names

    if not names:
        return {}
    tensors: dict[str, tuple[Any, str]] = {}
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        for output in range(layer.num_outputs):
            tensor = layer.get_output(output)
            tensors.setdefault(tensor.name, (tensor, layer.name))
    check_names(names, list(tensors), f"the TensorRT network parsed from {where}")
    own = [network.get_output(index).name for index in range(network.num_outputs)]
    for name in names:
        if not tensors[name][0].is_network_output:
            network.mark_output(tensors[name][0])
    return {"marked_outputs": {name: tensors[name][1] for name in names}, "network_outputs": own}


def import_tensorrt():
    return require("tensorrt", "TensorRT",
                   "on a Jetson it comes with JetPack (apt install nvidia-tensorrt, python3-libnvinfer); on a GPU "
                   "server pip install 'edgefold[trt]' from NVIDIA's index; elsewhere use the onnxruntime runner")


def pin_prefix_fp32(trt, network, config, builder_flags: Sequence[str]) -> list[str]:
    """Keeps a frame job's preprocessing in the graph (layers named ``frame_prefix/…``, :mod:`pipeline.deploy.frame_prefix`)
    in FP32 where the builder may choose FP16 for it (the FP16 flag of TensorRT 10 before strong typing): its rounding
    to OpenCV's uint8 levels is what the stated tolerance was measured in, and FP16 steps by 0.125–0.25 above 128.
    Strongly typed builds (10.12+ for FP16/INT8 rungs, 11) take the ONNX's own FP32 types and need nothing.

    Returns:
        The layers pinned (``ILayer.precision``, ``set_output_type``, ``BuilderFlag.PREFER_PRECISION_CONSTRAINTS``).
    """
    if "FP16" not in builder_flags:
        return []
    pinned = []
    for index in range(network.num_layers):
        layer = network.get_layer(index)
        if not layer.name.startswith(PREFIX_NODES):
            continue
        floats = [i for i in range(layer.num_outputs) if layer.get_output(i).dtype == trt.DataType.FLOAT]
        if floats:  # its shape arithmetic (Shape, Slice and Concat of sizes) is integer and left alone
            layer.precision = trt.DataType.FLOAT
            for output in floats:
                layer.set_output_type(output, trt.DataType.FLOAT)
            pinned.append(layer.name)
    if pinned:
        config.set_flag(trt.BuilderFlag.PREFER_PRECISION_CONSTRAINTS)
    return pinned


def precision_constraints(command: list[str], pinned: Sequence[str]) -> list[str]:
    """The trtexec line ``command`` with the flags for the layers :func:`pin_prefix_fp32` kept in FP32; the
    constraint flag once (a DLA build's line has it already, and trtexec refuses a flag given twice)."""
    if not pinned:
        return command
    prefer = [] if any(part.startswith("--precisionConstraints") for part in command) else ["--precisionConstraints=prefer"]
    return [*command, *prefer, "--layerPrecisions=" + ",".join(f"{name}:fp32" for name in pinned),
            "--layerOutputTypes=" + ",".join(f"{name}:fp32" for name in pinned)]


def apply_flags(trt, config, settings: BuildSettings) -> None:
    """Sets the settings' builder flags and clears those it turns off (TF32 for fp32: on by default)."""
    for name in settings.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    for name in settings.cleared_flags:
        if hasattr(trt.BuilderFlag, name):  # a flag this TensorRT does not have is not on either
            config.clear_flag(getattr(trt.BuilderFlag, name))


def build_engine(onnx: Path, options: BuildOptions, engine_path: Path, board: str | None = None,
                 artifact: str | None = None) -> None:
    """Builds a serialized engine from an ONNX file with the TensorRT Python API (10.x or 11.x).

    Beside the engine it writes ``build.json``: the settings, the trtexec line of exactly this build and,
    for DLA builds, the network layers ``IBuilderConfig.can_run_on_DLA`` refused (they run on the GPU).

    Args:
        onnx: The model.
        options: What to build (one batch: :meth:`BuildOptions.for_batch`).
        engine_path: Where to write the serialized engine.
        board: The board's model, for TensorRT 11's DLA rule.
        artifact: The ONNX's own precision (:func:`artifact_precision`).

    Raises:
        MissingDependencyError: Without TensorRT.
        DlaError: A DLA core this device does not have.
        StaticShapeError: An input shape that does not admit the batch asked for.
        TimingCacheError: A timing cache TensorRT refused.
        EngineBuildError: When the ONNX parser or the builder fails (their messages included).
    """
    trt = import_tensorrt()
    settings = build_settings(trt.__version__, options, board=board, artifact=artifact)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    if options.dla_core is not None and options.dla_core >= builder.num_DLA_cores:
        # trtexec (sampleEngines.cpp): "Cannot create DLA engine, N not available"; the Orin Nano has 0 cores.
        raise DlaError(f"DLA core {options.dla_core} requested but this device has {builder.num_DLA_cores} DLA "
                       "core(s) (Jetson Orin Nano has none)", fix="leave dla_core unset to build for the GPU")
    flags = sum(1 << int(getattr(trt.NetworkDefinitionCreationFlag, name)) for name in set(settings.network_flags))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT's ONNX parser rejected {onnx}: {errors}",
                               fix="run the Q/DQ lint (device.runners.qdq_lint) on the model and re-quantize")
    marked = mark_outputs(network, options.mark_outputs, Path(onnx).name)
    tensor = network.get_input(0)
    shape = tuple(tensor.shape)
    low, opt, high = options.batch
    if any(d < 0 for d in shape[1:]):
        raise StaticShapeError(f"{Path(onnx).name}: input {tensor.name} has dynamic dimensions besides the batch "
                               f"{shape}", fix="export with a fixed C×H×W (only the batch axis dynamic)")
    if shape[0] > 0 and not low == opt == high == shape[0]:
        raise StaticShapeError(
            f"{Path(onnx).name} has a static batch of {shape[0]} (input {tensor.name} {shape}); the job measures "
            f"batch {opt if low == high else options.batch}",
            fix=f"re-export with a dynamic batch axis (the export stage does), or measure batch_sizes: [{shape[0]}]")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    apply_flags(trt, config, settings)
    pinned = pin_prefix_fp32(trt, network, config, settings.builder_flags)
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED  # each layer's precision, tactic, device (inspector)
    if shape[0] < 0:  # a static input takes no optimization profile
        profile = builder.create_optimization_profile()
        profile.set_shape(tensor.name, (low, *shape[1:]), (opt, *shape[1:]), (high, *shape[1:]))
        config.add_optimization_profile(profile)
    placed: list[str] | None = None
    refused: list[str] = []
    if options.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = options.dla_core
        placed, refused = dla_placement(trt, network, config)
    cache_path = Path(options.timing_cache) if options.timing_cache else None
    if cache_path is not None:
        cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        if cache is None:
            # IBuilderConfig::createTimingCache returns null on a blob it cannot read (a truncated or foreign
            # file); trtexec (sampleEngines.cpp) stops there with "TimingCache creation failed".
            raise TimingCacheError(f"TensorRT could not read the timing cache {cache_path} (truncated or not a "
                                   "timing cache)", fix=f"delete {cache_path}; it is rewritten by the next build")
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            raise TimingCacheError(f"TensorRT refused the timing cache {cache_path} (another device or TensorRT "
                                   "version wrote it)", fix=f"delete {cache_path}; it is rewritten by the next build")
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        hint = ("see the TensorRT log above; on small Jetsons lower workspace_mib or the batch size"
                if options.dla_core is None else
                "see the TensorRT log above; DLA builds need static shapes and FP16/INT8, and fail on layers "
                "without GPU fallback")
        raise EngineBuildError(f"TensorRT could not build an engine from {onnx} (batch {options.batch})", fix=hint)
    Path(engine_path).write_bytes(bytes(serialized))
    chw = tuple(int(d) for d in shape[1:])
    record = {"tensorrt": trt.__version__, "settings": asdict(settings), "options": asdict(options),
              "trtexec": " ".join(precision_constraints(trtexec_command(
                  str(onnx), str(Path(engine_path).parent / "engine.plan"), tensor.name, chw, options, trt.__version__,
                  board=board, static_batch=shape[0] > 0), pinned)),
              "dla_unsupported_layers": refused, "dla_layers": placed, "fp32_layers": pinned, **marked}
    write_atomic(Path(engine_path).parent / "build.json", json.dumps(record, indent=1, default=list) + "\n")
    if cache_path is not None:
        # Shared by every build on this device: written whole or not at all, so a kill mid-write cannot
        # leave a truncated cache that fails the next build.
        write_atomic(cache_path, bytes(config.get_timing_cache().serialize()))
