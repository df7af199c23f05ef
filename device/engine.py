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
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from device.errors import (ConfigError, DlaError, EngineBuildError, PrecisionMismatchError, StaticShapeError,
                           TimingCacheError, require)
from device.files import write_atomic

# L4T → JetPack (exact, jetson-stats' table) and SoC → compute capability live with the board facts.
from device.jetson import L4T_TO_JETPACK, TEGRA_COMPUTE_CAPABILITY, board_model, jetpack_for  # noqa: E402,F401


@dataclass(frozen=True)
class BuildOptions:
    """What the engine is built for.

    Attributes:
        precision: ``int8`` (Q/DQ model), ``fp16`` or ``fp32``; must agree with the artifact
            (:func:`reconcile_precision`).
        batch: (min, opt, max) batch sizes of the optimization profile. The runner builds one engine
            per measured batch with min = opt = max = that batch: kernels are tuned for the shape that
            is timed, as trtexec does, and DLA (static shapes only) takes the same engines.
        workspace_mib: Workspace memory pool limit.
        dla_core: DLA core to build for (Jetson AGX/NX), with GPU fallback; None for the GPU.
        timing_cache: File to read and update the timing cache from (speeds up rebuilds).
    """

    precision: str = "int8"
    batch: tuple[int, int, int] = (1, 1, 1)
    workspace_mib: int = 1024
    dla_core: int | None = None
    timing_cache: str | None = None

    def __post_init__(self) -> None:
        if self.precision not in ("int8", "fp16", "fp32"):
            raise ConfigError(f"precision must be int8, fp16 or fp32, got {self.precision!r}")
        low, opt, high = self.batch
        if not 1 <= low <= opt <= high:
            raise ConfigError(f"batch sizes must satisfy 1 ≤ min ≤ opt ≤ max, got {self.batch}")
        if self.workspace_mib < 1:
            raise ConfigError(f"workspace_mib must be positive, got {self.workspace_mib}")
        if self.dla_core is not None and self.dla_core < 0:
            raise ConfigError(f"dla_core must be ≥ 0, got {self.dla_core}")

    def for_batch(self, batch: int) -> "BuildOptions":
        """These options for the engine that times ``batch``: a static profile, opt = the batch timed."""
        return replace(self, batch=(batch, batch, batch))


@dataclass(frozen=True)
class BuildSettings:
    """TensorRT settings derived from the options and the TensorRT version."""

    trt_major: int
    network_flags: tuple[str, ...]
    builder_flags: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def trt_version_tuple(version: str) -> tuple[int, int, int]:
    """``10.3.0.30`` → (10, 3, 0); a missing minor or patch reads as 0."""
    match = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version or "")
    if not match:
        raise ConfigError(f"cannot read the TensorRT version {version!r}")
    return tuple(int(part or 0) for part in match.groups())  # type: ignore[return-value]


def trt_major(version: str) -> int:
    if not re.match(r"(\d+)\.", version or ""):
        raise ConfigError(f"cannot read the TensorRT version {version!r}")
    return trt_version_tuple(version)[0]


# TensorRT 10.12 deprecates BuilderFlag.INT8/FP16 in favour of strongly typed networks.
STRONGLY_TYPED_FROM = (10, 12, 0)
# NVIDIA's TensorRT 11.x "Working with DLA": 10.7 was the last 10.x release with DLA; 11 drops it, then
# brings it back in 11.4.1 for Jetson AGX Orin only (never Thor).
DLA_LAST_10 = (10, 7, 99)
DLA_ON_11_FROM = (11, 4, 1)
# Layers TensorRT's ONNX parser makes from initializers, reshapes and Q/DQ nodes: they fold into their
# neighbours (Q/DQ fusion, constant folding) and never run as layers of their own, so can_run_on_DLA's
# answer for them says nothing about GPU fallback.
PARSER_LAYER_TYPES = ("CONSTANT", "SHUFFLE", "QUANTIZE", "DEQUANTIZE")


def _is_agx_orin(board: str | None) -> bool:
    return bool(board) and "agx orin" in board.lower()


def build_settings(trt_version: str, options: BuildOptions, board: str | None = None,
               artifact: str | None = None) -> BuildSettings:
    """Chooses network and builder flags for this TensorRT generation.

    Args:
        trt_version: ``tensorrt.__version__``.
        options: What to build.
        board: The board's model (``/proc/device-tree/model``) when known: DLA on TensorRT 11 needs an AGX Orin.
        artifact: The ONNX's own precision (:func:`artifact_precision`) when known.

    Raises:
        ConfigError: For TensorRT older than 10, or FP16 on TensorRT 11 for a model that is not FP16
            (it has no precision flags: the model must be converted to FP16 first).
        DlaError: A DLA build this TensorRT, board or shape cannot give.
    """
    version = trt_version_tuple(trt_version)
    major = trt_major(trt_version)
    notes: list[str] = []
    if major < 10:
        raise ConfigError(f"TensorRT {trt_version} is too old", fix="use TensorRT 10 (JetPack 6) or newer")
    dla = options.dla_core is not None
    if dla:
        low, opt, high = options.batch
        if not low == opt == high:
            # NVIDIA DLA docs ("DLA Supported Layers and Restrictions"): no dynamic dimensions on the DLA.
            raise DlaError(f"DLA needs static shapes (min = opt = max), got batch profile {options.batch}",
                           fix="build one engine per batch size (BuildOptions.for_batch)")
        if major == 10 and version > DLA_LAST_10:
            raise DlaError(f"TensorRT {trt_version} has no DLA support: NVIDIA's \"Working with DLA\" documentation "
                           "(TensorRT 11.x) names 10.7 as the last 10.x release with DLA",
                           fix="leave dla_core unset to run on the GPU, or use JetPack 6.x's TensorRT 10.3 "
                               "(≤ 10.7), or TensorRT ≥ 11.4.1 on an AGX Orin (JetPack ≥ 7.2.2)")
        if major >= 11 and version < DLA_ON_11_FROM:
            raise DlaError(f"TensorRT {trt_version} has no DLA support (TensorRT 11.0–11.3 dropped it)",
                           fix="leave dla_core unset, or use TensorRT 10 (JetPack 6) or ≥ 11.4.1 on an AGX Orin")
        if major >= 11 and board is not None and not _is_agx_orin(board):
            raise DlaError(f"TensorRT {trt_version} supports DLA only on Jetson AGX Orin, not on {board!r}",
                           fix="leave dla_core unset (Thor has no DLA under TensorRT 11)")
        if options.precision == "fp32":
            # The DLA runs FP16 and INT8 only. trtexec turns FP16 on for an FP32 network, but then the
            # rung timed is not the artifact scored: the DLA gets the FP16 artifact (export.fp16_rungs).
            raise DlaError("an FP32 artifact cannot run on the DLA (it runs FP16 and INT8 only; TensorRT 11 is "
                           "strongly typed, and building it \"as FP16\" on 10.x would time a model nobody scored)",
                           fix="send the rung's FP16 form (student_fp16, teacher_fp16) or the Q/DQ INT8 model")
    if major == 10:
        # The builder flags follow the artifact: its precision is written in the graph (FP16 weights, Q/DQ
        # with FP16 float islands), so the flags only allow what the graph already says.
        strongly_typed = options.precision in ("int8", "fp16") and version >= STRONGLY_TYPED_FROM and not dla
        if strongly_typed:
            network_flags: tuple[str, ...] = ("STRONGLY_TYPED",)
            builder: tuple[str, ...] = ()
            notes.append(f"TensorRT {trt_version}: strongly typed (INT8/FP16 builder flags are deprecated from "
                         "10.12); the ONNX's own types decide each layer's precision")
        else:
            network_flags = ()
            builder = {"int8": ("INT8", "FP16"), "fp16": ("FP16",), "fp32": ()}[options.precision]
            if options.precision == "int8":
                notes.append("INT8 from the model's Q/DQ nodes; FP16 for the layers left in float (the artifact's "
                             "float islands)")
            if version >= STRONGLY_TYPED_FROM and builder:
                notes.append(f"BuilderFlag {'/'.join(builder)} is deprecated from TensorRT 10.12"
                             + (" (kept: the DLA needs FP16 for the layers around the Q/DQ pairs)" if dla else ""))
    else:
        network_flags, builder = ("STRONGLY_TYPED",), ()
        if options.precision == "fp16" and artifact != "fp16":
            raise ConfigError(
                f"TensorRT {trt_version} has no FP16 builder flag (networks are strongly typed)",
                fix="convert the ONNX first: python -m modelopt.onnx.autocast --onnx_path model.onnx",
            )
        notes.append("strongly typed: the Q/DQ ONNX decides each layer's precision")
    if dla:
        builder = builder + ("GPU_FALLBACK",)
        notes.append("DLA with GPU fallback (layers and reformats DLA cannot run go to the GPU)")
        if major == 10:
            # trtexec (samples/common/sampleEngines.cpp, setupNetworkAndConfig) sets
            # kPREFER_PRECISION_CONSTRAINTS on every --useDLACore build; EdgeFold builds what its recorded
            # trtexec line builds. TensorRT 11 removed the precision-constraint flags (strongly typed).
            builder = builder + ("PREFER_PRECISION_CONSTRAINTS",)
    return BuildSettings(major, network_flags, tuple(builder), tuple(notes))


def trtexec_command(onnx: str, engine: str, input_name: str, chw: tuple[int, int, int], options: BuildOptions,
                    trt_version: str, board: str | None = None, static_batch: bool = False) -> list[str]:
    """The trtexec line that builds the same engine by hand (same profile, flags and verbosity).

    Args:
        static_batch: The ONNX input's batch is fixed: the line gives no shapes, which trtexec refuses for a static
            model ("Static model does not take explicit shapes", samples/common/sampleEngines.cpp at v10.3.0 and
            v10.16), as the build gives it no optimization profile.
    """
    settings = build_settings(trt_version, options, board=board, artifact=options.precision)
    shape = lambda b: f"{input_name}:{b}x" + "x".join(str(d) for d in chw)  # noqa: E731
    low, opt, high = options.batch
    cmd = ["trtexec", f"--onnx={onnx}", f"--saveEngine={engine}"]
    if not static_batch:
        cmd += [f"--minShapes={shape(low)}", f"--optShapes={shape(opt)}", f"--maxShapes={shape(high)}"]
    cmd.append(f"--memPoolSize=workspace:{options.workspace_mib}M")
    if settings.trt_major == 10:
        cmd += [f"--{flag.lower()}" for flag in settings.builder_flags if flag in ("INT8", "FP16")]
        if "STRONGLY_TYPED" in settings.network_flags:
            cmd.append("--stronglyTyped")
    if options.dla_core is not None:
        cmd += [f"--useDLACore={options.dla_core}", "--allowGPUFallback"]
        if "PREFER_PRECISION_CONSTRAINTS" in settings.builder_flags:
            cmd.append("--precisionConstraints=prefer")  # trtexec sets it for DLA anyway: said, not implied
    # The agent builds with detailed verbosity so IEngineInspector can name each layer's precision and device.
    cmd.append("--profilingVerbosity=detailed")
    if options.timing_cache:
        cmd.append(f"--timingCacheFile={options.timing_cache}")
    return cmd


def trtexec_lines(onnx: str, engine_stem: str, input_name: str, chw: tuple[int, int, int],
                  batch_sizes: list[int] | tuple[int, ...], precision: str, trt_version: str) -> str:
    """The trtexec lines of the engines the agent builds for ``batch_sizes``: one per batch, opt = that
    batch (``<engine_stem>.b<batch>.plan``), one line each."""
    return "\n".join(" ".join(trtexec_command(onnx, f"{engine_stem}.b{b}.plan", input_name, chw,
                                               BuildOptions(precision=precision).for_batch(b), trt_version))
                     for b in sorted(set(batch_sizes)))


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

    from device.qdq_lint import lint_qdq

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
    weights = [initializers[node.input[1]] for node in model.graph.node
               if node.op_type in ("Conv", "Gemm", "MatMul", "ConvTranspose") and len(node.input) > 1
               and node.input[1] in initializers]
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
class EngineCache:
    """Engines under ``root/<onnx sha256>-<fingerprint key>/`` with the fingerprint beside them.

    Attributes:
        filename: The cached file's name in its folder (a TensorRT plan here; the Torch-TensorRT runner
            caches a compiled program under the same folder rules).
    """

    filename = "engine.plan"

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def folder(self, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions) -> Path:
        options_key = hashlib.sha256(json.dumps(asdict(options), sort_keys=True, default=list).encode()).hexdigest()[:8]
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


def import_tensorrt():
    return require("tensorrt", "TensorRT",
                   "on a Jetson it comes with JetPack (apt install nvidia-tensorrt, python3-libnvinfer); on a GPU "
                   "server pip install 'edgefold[trt]' from NVIDIA's index; elsewhere use the onnxruntime runner")


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
    flags = 0
    for name in settings.network_flags:
        flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise EngineBuildError(f"TensorRT's ONNX parser rejected {onnx}: {errors}",
                               fix="run the Q/DQ lint (device.qdq_lint) on the model and re-quantize")
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
    for name in settings.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    # IEngineInspector reports each layer's formats (precision), tactic and device only at DETAILED.
    config.profiling_verbosity = trt.ProfilingVerbosity.DETAILED
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
              "trtexec": " ".join(trtexec_command(str(onnx), str(Path(engine_path).parent / "engine.plan"), tensor.name, chw, options,
                                                  trt.__version__, board=board, static_batch=shape[0] > 0)),
              "dla_unsupported_layers": refused, "dla_layers": placed}
    write_atomic(Path(engine_path).parent / "build.json", json.dumps(record, indent=1, default=list) + "\n")
    if cache_path is not None:
        # Shared by every build on this device: written whole or not at all, so a kill mid-write cannot
        # leave a truncated cache that fails the next build.
        write_atomic(cache_path, bytes(config.get_timing_cache().serialize()))
