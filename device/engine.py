"""TensorRT engine builder: built on the device from the Q/DQ ONNX, cached by fingerprint.

Engines are bound to the TensorRT version and the GPU they were built with ("Plan file is not
compatible with this version of TensorRT" after a JetPack upgrade), so every engine is stored
with the fingerprint of the device that built it and is rebuilt, never loaded, when the current
device's fingerprint differs.

Two TensorRT generations are supported:

* TensorRT 10.x (JetPack 6): weakly typed networks; INT8 is enabled by ``BuilderFlag.INT8`` and
  the Q/DQ nodes, with ``BuilderFlag.FP16`` so the float layers may fall back to FP16.
* TensorRT 11.x: strongly typed networks only, no precision flags; the Q/DQ ONNX itself
  decides which layers run in INT8.

The plan (flags, profile, trtexec equivalent) is plain Python and tested without TensorRT;
only :func:`build_engine` imports ``tensorrt``, lazily.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

from device.errors import ConfigError, StageError, require

# L4T → JetPack (exact, jetson-stats' table) and SoC → compute capability live with the board facts.
from device.jetson import L4T_TO_JETPACK, TEGRA_COMPUTE_CAPABILITY, board_model, jetpack_for  # noqa: E402,F401


@dataclass(frozen=True)
class BuildOptions:
    """What the engine is built for.

    Attributes:
        precision: ``int8`` (Q/DQ model), ``fp16`` or ``fp32``.
        batch: (min, opt, max) batch sizes of the optimization profile.
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


@dataclass(frozen=True)
class BuildPlan:
    """TensorRT settings derived from the options and the TensorRT version."""

    trt_major: int
    network_flags: tuple[str, ...]
    builder_flags: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())


def trt_major(version: str) -> int:
    match = re.match(r"(\d+)\.", version or "")
    if not match:
        raise ConfigError(f"cannot read the TensorRT version {version!r}")
    return int(match.group(1))


def plan_build(trt_version: str, options: BuildOptions) -> BuildPlan:
    """Chooses network and builder flags for this TensorRT generation.

    Raises:
        ConfigError: For TensorRT older than 10, or FP16 on TensorRT 11 (which has no
            precision flags: the model must be converted to FP16 first).
    """
    major = trt_major(trt_version)
    notes: list[str] = []
    if major < 10:
        raise ConfigError(f"TensorRT {trt_version} is too old", fix="use TensorRT 10 (JetPack 6) or newer")
    if major == 10:
        network_flags: tuple[str, ...] = ()
        builder = {"int8": ("INT8", "FP16"), "fp16": ("FP16",), "fp32": ()}[options.precision]
        if options.precision == "int8":
            notes.append("INT8 from the model's Q/DQ nodes; FP16 allowed for the layers left in float")
    else:
        network_flags, builder = ("STRONGLY_TYPED",), ()
        if options.precision == "fp16":
            raise ConfigError(
                f"TensorRT {trt_version} has no FP16 builder flag (networks are strongly typed)",
                fix="convert the ONNX first: python -m modelopt.onnx.autocast --onnx_path model.onnx",
            )
        notes.append("strongly typed: the Q/DQ ONNX decides each layer's precision")
    if options.dla_core is not None:
        builder = builder + ("GPU_FALLBACK",)
        notes.append("DLA with GPU fallback (layers and reformats DLA cannot run go to the GPU)")
    return BuildPlan(major, network_flags, tuple(builder), tuple(notes))


def trtexec_command(onnx: str, engine: str, input_name: str, chw: tuple[int, int, int], options: BuildOptions,
                    trt_version: str) -> list[str]:
    """The trtexec line that builds the same engine by hand."""
    plan = plan_build(trt_version, options)
    shape = lambda b: f"{input_name}:{b}x" + "x".join(str(d) for d in chw)  # noqa: E731
    low, opt, high = options.batch
    cmd = ["trtexec", f"--onnx={onnx}", f"--saveEngine={engine}", f"--minShapes={shape(low)}",
           f"--optShapes={shape(opt)}", f"--maxShapes={shape(high)}", f"--memPoolSize=workspace:{options.workspace_mib}M"]
    if plan.trt_major == 10:
        cmd += [f"--{flag.lower()}" for flag in plan.builder_flags if flag in ("INT8", "FP16")]
    if options.dla_core is not None:
        cmd += [f"--useDLACore={options.dla_core}", "--allowGPUFallback"]
    if options.timing_cache:
        cmd.append(f"--timingCacheFile={options.timing_cache}")
    return cmd


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


def detect_gpu(device_tree: str = "/proc/device-tree/compatible") -> tuple[str, str | None]:
    """(GPU name, compute capability): NVML on data-center GPUs, the device tree on a Jetson."""
    try:
        import pynvml

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
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
    """Engines under ``root/<onnx sha256>-<fingerprint key>/`` with the fingerprint beside them."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def folder(self, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions) -> Path:
        options_key = hashlib.sha256(json.dumps(asdict(options), sort_keys=True, default=list).encode()).hexdigest()[:8]
        return self.root / f"{onnx_sha256[:16]}-{fingerprint_key(fp)}-{options_key}"

    def lookup(self, onnx_sha256: str, fp: dict[str, Any], options: BuildOptions) -> Path | None:
        """The cached engine when it was built by a device with exactly this fingerprint."""
        folder = self.folder(onnx_sha256, fp, options)
        engine, recorded = folder / "engine.plan", folder / "fingerprint.json"
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
        engine = folder / "engine.plan"
        tmp = folder / "engine.plan.tmp"
        build(Path(onnx), options, tmp)
        os.replace(tmp, engine)
        (folder / "fingerprint.json").write_text(json.dumps(fp, indent=2, sort_keys=True) + "\n")
        return engine, True


def import_tensorrt():
    return require("tensorrt", "TensorRT",
                   "on a Jetson it comes with JetPack (apt install nvidia-tensorrt, python3-libnvinfer); on a GPU "
                   "server pip install 'edgefold[trt]' from NVIDIA's index; elsewhere use the onnxruntime runner")


def build_engine(onnx: Path, options: BuildOptions, engine_path: Path) -> None:
    """Builds a serialized engine from an ONNX file with the TensorRT Python API (10.x or 11.x).

    Raises:
        MissingDependencyError: Without TensorRT.
        StageError: When the ONNX parser or the builder fails (their messages included).
    """
    trt = import_tensorrt()
    plan = plan_build(trt.__version__, options)
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    flags = 0
    for name in plan.network_flags:
        flags |= 1 << int(getattr(trt.NetworkDefinitionCreationFlag, name))
    network = builder.create_network(flags)
    parser = trt.OnnxParser(network, logger)
    if not parser.parse_from_file(str(onnx)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise StageError(f"TensorRT's ONNX parser rejected {onnx}: {errors}",
                         fix="run the Q/DQ lint (device.qdq_lint) on the model and re-quantize")
    config = builder.create_builder_config()
    config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, options.workspace_mib << 20)
    for name in plan.builder_flags:
        config.set_flag(getattr(trt.BuilderFlag, name))
    if options.dla_core is not None:
        config.default_device_type = trt.DeviceType.DLA
        config.DLA_core = options.dla_core
    profile = builder.create_optimization_profile()
    tensor = network.get_input(0)
    chw = tuple(tensor.shape)[1:]
    low, opt, high = options.batch
    profile.set_shape(tensor.name, (low, *chw), (opt, *chw), (high, *chw))
    config.add_optimization_profile(profile)
    cache_path = Path(options.timing_cache) if options.timing_cache else None
    if cache_path is not None:
        cache = config.create_timing_cache(cache_path.read_bytes() if cache_path.is_file() else b"")
        config.set_timing_cache(cache, ignore_mismatch=False)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise StageError(f"TensorRT could not build an engine from {onnx}",
                         fix="see the TensorRT log above; on small Jetsons lower workspace_mib or the max batch")
    Path(engine_path).write_bytes(bytes(serialized))
    if cache_path is not None:
        cache_path.write_bytes(bytes(config.get_timing_cache().serialize()))
