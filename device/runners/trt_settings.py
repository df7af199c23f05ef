"""What a TensorRT build is asked for, as plain data: the options, the network and builder flags each TensorRT
generation takes (10.x weakly typed with INT8/FP16 flags, strongly typed from 10.12 for Q/DQ models; 11.x strongly
typed only; the DLA's version and board rules), and the trtexec line that builds the same engine by hand.

Apart from the builder (:mod:`device.runners.engine`), which imports ``tensorrt``: the build host records the trtexec
lines of the engines a device will build without depending on the builder's code. No TensorRT here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from device.errors import ConfigError, DlaError


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
        mark_outputs: ONNX tensors marked as extra network outputs (a debug job's); marking changes which layers
            TensorRT may fuse, so such an engine is cached apart and never timed.
    """

    precision: str = "int8"
    batch: tuple[int, int, int] = (1, 1, 1)
    workspace_mib: int = 1024
    dla_core: int | None = None
    timing_cache: str | None = None
    mark_outputs: tuple[str, ...] = ()

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
    # Flags TensorRT sets by default that the build clears (IBuilderConfig::clearFlag; trtexec's --no<Flag>).
    cleared_flags: tuple[str, ...] = field(default=())


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


def _check_dla(trt_version: str, version: tuple[int, ...], major: int, options: BuildOptions,
               board: str | None) -> None:
    """Raises :class:`DlaError` where this TensorRT, board, shape or precision gives no DLA build."""
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
        _check_dla(trt_version, version, major, options, board)
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
    cleared: tuple[str, ...] = ()
    if options.precision == "fp32":
        # BuilderFlag.TF32 is on by default (NvInfer.h; trtexec too, unless --noTF32): on Ampere and later an
        # "fp32" engine may then round convolution and matrix inputs to 10-bit mantissas. An fp32 rung is IEEE FP32
        # math here, the reference its FP16 and INT8 forms are held against.
        cleared = ("TF32",)
        notes.append("fp32: TF32 off (TensorRT allows it by default; the rung is IEEE FP32 math)")
    return BuildSettings(major, network_flags, tuple(builder), tuple(notes), cleared)


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
    if "TF32" in settings.cleared_flags:
        cmd.append("--noTF32")
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
