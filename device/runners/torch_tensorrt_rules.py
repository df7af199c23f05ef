"""What Torch-TensorRT asks of its caller, release by release: ONE table (:data:`RULES`), each rule with the file and
tag of the ``pytorch/TensorRT`` sources it was read from, and :func:`rules_for`, which picks the rules of the release
installed (the runner, :mod:`device.runners.torch_tensorrt`, records which release and rules ran).

No torch here: the table is read, tested and reported on machines without it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from device.errors import ConfigError

# The sources read: pytorch/TensorRT at these refs. No v2.14.0 tag existed in the snapshot read (2026-08-22):
# "main" is commit d7f2062 whose version.txt says 2.14.0a0, the newest; v2.13.0 is the newest tag.
MAIN = "main@d7f2062 (version.txt 2.14.0a0)"


@dataclass(frozen=True)
class Rule:
    """One release-dependent fact about Torch-TensorRT.

    Attributes:
        name: What it decides (``precision_arguments``, ``engine_prefix`` …).
        since: First release (major, minor) it holds for.
        until: First release it no longer holds for (None: still holds at the newest read).
        value: The fact.
        source: Where it was read: file@tag in pytorch/TensorRT.
    """

    name: str
    since: tuple[int, int]
    until: tuple[int, int] | None
    value: Any
    source: str


# The one table. Every call this runner makes into torch_tensorrt whose form depends on the release is here.
RULES: tuple[Rule, ...] = (
    # Oldest release read. Older ones are refused rather than guessed.
    Rule("supported", (2, 3), None, True,
         "py/torch_tensorrt/dynamo/_compiler.py@v2.3.0: compile(exported_program, inputs, *, …) takes a "
         "torch.export program"),
    # Precision: weakly typed; the set becomes TensorRT builder flags.
    Rule("precision_arguments", (2, 3), (2, 6),
         {"fp32": {"enabled_precisions": ("float32",)}, "fp16": {"enabled_precisions": ("float16",)},
          "int8": {"enabled_precisions": ("int8", "float16")}},
         "py/torch_tensorrt/dynamo/_compiler.py@v2.5.0 (compile(…, enabled_precisions=…), default {dtype.f32} in "
         "_defaults.py@v2.5.0); INT8 from examples/dynamo/vgg16_ptq.py@v2.5.0 (enabled_precisions={torch.int8}), "
         "with float16 beside it so the float islands build FP16 as on the ONNX road (TensorRT 10's INT8 + FP16 "
         "builder flags; the same example's FP4 branch at main d7f2062 enables several precisions together)"),
    # Precision: use_explicit_typing keeps the graph's own types; with it, enabled_precisions must stay {f32}.
    Rule("precision_arguments", (2, 6), (2, 13),
         {"fp32": {"use_explicit_typing": True}, "fp16": {"use_explicit_typing": True},
          "int8": {"enabled_precisions": ("int8", "float16")}},
         "py/torch_tensorrt/dynamo/_compiler.py@v2.6.0 and @v2.12.0 (use_explicit_typing \"respects the precisions "
         "set in the Pytorch model\"; an AssertionError when enabled_precisions is not {f32} with it); INT8 from "
         "examples/dynamo/vgg16_ptq.py@v2.9.0 (enabled_precisions={torch.int8}, weakly typed), float16 beside it "
         "for FP16 float islands"),
    # Precision: always strongly typed; both arguments removed (#4195). compile() still has **kwargs, so a
    # removed argument passed anyway is swallowed SILENTLY: the runner must not pass it.
    Rule("precision_arguments", (2, 13), None, {"fp32": {}, "fp16": {}, "int8": {}},
         f"py/torch_tensorrt/dynamo/_compiler.py@v2.13.0 and @{MAIN} (neither argument in compile()); "
         "docsrc/user_guide/compilation/compilation_settings.rst@main d7f2062: \"Strong typing (explicit typing) "
         "is always enabled in the Dynamo path\"; examples/dynamo/vgg16_ptq.py@main d7f2062 (INT8: no argument)"),
    # Where INT8 leaves layers in float: FP16 where the release's arguments can ask for it; strongly typed releases
    # build them in the graph's own type, and no source read shows a ModelOpt-quantized graph cast to half.
    Rule("int8_float_islands", (2, 3), (2, 13), "fp16",
         "py/torch_tensorrt/dynamo/_compiler.py@v2.5.0 and @v2.12.0: enabled_precisions becomes TensorRT's builder "
         "flags (weakly typed), so {int8, float16} lets unquantized layers run FP16"),
    Rule("int8_float_islands", (2, 13), None, "the graph's dtype (fp32)",
         f"docsrc/user_guide/compilation/compilation_settings.rst@{MAIN}: strong typing always on, so each layer "
         "runs in its type in the graph; examples/dynamo/vgg16_ptq.py@main d7f2062 quantizes an FP32 model"),
    # Blocks smaller than this stay in PyTorch (default 5, _defaults.py@v2.5.0 MIN_BLOCK_SIZE); upstream's INT8
    # example compiles every convertible op.
    Rule("min_block_size", (2, 3), None, 1,
         "examples/dynamo/vgg16_ptq.py@v2.5.0 … @v2.13.0: dynamo.compile(…, min_block_size=1); "
         "py/torch_tensorrt/dynamo/_defaults.py@v2.5.0 (MIN_BLOCK_SIZE = 5)"),
    Rule("static_input", (2, 3), None, "Input(shape=(batch, C, H, W), dtype=…)",
         f"py/torch_tensorrt/_Input.py@v2.5.0 and @{MAIN}: \"shape (Tuple or List, optional): Static shape of "
         "input tensor\""),
    Rule("engine_prefix", (2, 3), None, "_run_on_acc",
         f"py/torch_tensorrt/dynamo/_compiler.py@v2.5.0 and @{MAIN} (compile_module): children named _run_on_acc* "
         "become TensorRT modules; the other GraphModule children run in PyTorch"),
    Rule("fallback_nodes", (2, 3), None, "call_function/call_method nodes except operator.getitem",
         f"py/torch_tensorrt/dynamo/_DryRunTracker.py@v2.5.0 and @{MAIN} (parse_non_trt_nodes)"),
    Rule("save", (2, 3), None, {"output_format": "exported_program"},
         f"py/torch_tensorrt/_compile.py@v2.5.0 and @{MAIN}: save(module, file_path, *, output_format="
         "\"exported_program\", arg_inputs=[tensors]); a GraphModule needs example tensors"),
    Rule("load", (2, 3), None, "torch_tensorrt.load(file_path) -> ExportedProgram",
         "py/torch_tensorrt/_compile.py@v2.5.0 (torch.jit.load first, then torch.export.load) and "
         f"@{MAIN} (torch.export.load first)"),
    # Per-layer timing (device/runners/torch_tensorrt_profile.py). Where a loaded program keeps its engines:
    Rule("engine_attribute", (2, 3), None,
         "get_attr <submodule>_engine passed to tensorrt.execute_engine(inputs, engine)",
         f"py/torch_tensorrt/dynamo/_exporter.py@v2.5.0 and @{MAIN} (inline_trt_modules: setattr(gm, "
         "f\"{name}_engine\", trt_module.engine); execute_engine.default(args, engine_node))"),
    # The engine's profiling methods: the torchbind class's bindings, the calls TorchTensorRTModule.enable_profiling
    # makes on it. The trace's name and format changed in 2.8.
    Rule("engine_profiler", (2, 3), (2, 8),
         {"trace_suffix": "_engine_exectuion_profile.trace", "format": "perfetto", "set_format": False,
          "layer_information_suffix": "_layer_information.json"},
         "core/runtime/register_jit_hooks.cpp@v2.5.0 (Engine: enable_profiling, disable_profiling, "
         "profile_path_prefix; no set_profile_format), core/runtime/TRTEngine.cpp@v2.5.0 and @v2.7.0 "
         "(set_profiling_paths: <prefix>/<name>_engine_exectuion_profile.trace, sic; dump_engine_layer_info: "
         "<name>_layer_information.json), core/runtime/TRTEngineProfiler.cpp@v2.5.0 (dump_trace: Chrome-trace "
         "events, dur = the layer's summed time x1000, us), core/runtime/execute_engine.cpp@v2.5.0 (both rewritten "
         "after every execution while profiling), py/torch_tensorrt/dynamo/runtime/_TorchTensorRTModule.py@v2.5.0 "
         "(enable_profiling(profiling_results_dir) sets profile_path_prefix, then enable_profiling())"),
    Rule("engine_profiler", (2, 8), None,
         {"trace_suffix": "_engine_execution_profile.trace", "format": "trex", "set_format": True,
          "layer_information_suffix": "_layer_information.json"},
         f"core/runtime/register_jit_hooks.cpp@v2.8.0, @v2.9.0 and @{MAIN} (Engine.set_profile_format added), "
         f"core/runtime/TRTEngineProfiler.cpp@v2.9.0 and @{MAIN} (dump_trace, kTREX: name, timeMs, averageMs = "
         "time / invocations, percentage), core/runtime/TRTEngine.cpp@v2.9.0 (<name>_engine_execution_profile"
         ".trace; set_profile_format accepts trex or perfetto), py/torch_tensorrt/dynamo/runtime/"
         f"_TorchTensorRTModule.py@v2.9.0 and @{MAIN} (enable_profiling(profiling_results_dir, profile_format): "
         "prefix, enable_profiling(), set_profile_format())"),
    # Without the C++ runtime (ENABLED_FEATURES.torch_tensorrt_runtime False) a 2.13+ program runs on the Python
    # TRTEngine, whose profiler prints; before 2.13 such a program does not load at all.
    Rule("engine_profiler_runtime", (2, 3), None,
         "its Python engine's enable_profiling() attaches tensorrt.Profiler, which prints per-layer times to the "
         "log and writes no trace",
         f"py/torch_tensorrt/dynamo/runtime/_TRTEngine.py@v2.13.0 and @{MAIN} (enable_profiling: context.profiler "
         "= trt.Profiler(); set_profile_format only validates); py/torch_tensorrt/_features.py@v2.5.0 and "
         f"@{MAIN} (ENABLED_FEATURES.torch_tensorrt_runtime)"),
    # Why a profile's precisions are "other": Torch-TensorRT builds with detailed verbosity only when debugging.
    Rule("layer_information", (2, 3), None, "ProfilingVerbosity.LAYER_NAMES_ONLY unless debugging",
         "py/torch_tensorrt/dynamo/conversion/_TRTInterpreter.py@v2.5.0 (DETAILED only with debug=True), "
         f"@v2.9.0 (only under a Debugger with save_engine_profile), @v2.13.0 and @{MAIN} (only under a Debugger)"),
    # How a ModelOpt-quantized module is exported: always inside torch.no_grad() and ModelOpt's export_torch_mode(),
    # on CUDA, and compiled inside them too. The export call itself changed with the torch of the era.
    # Before 2.5 the only quantized example is FP8 (examples/dynamo/vgg16_fp8_ptq.py@v2.3.0; impl/quantize.py is
    # quantize_fp8): no INT8 through ModelOpt, refused by name. The _export form below is reachable only with a
    # ModelOpt older than the 0.47 this project pins (which needs torch >= 2.8, hence Torch-TensorRT >= 2.8).
    Rule("int8_export", (2, 5), (2, 7), "torch.export._trace._export",
         "examples/dynamo/vgg16_ptq.py@v2.5.0 and @v2.6.0 (\"torch.export.export() failed due to RuntimeError: "
         "Attempting to use FunctionalTensor on its own\": from torch.export._trace import _export; "
         "_export(model, (input_tensor,)))"),
    Rule("int8_export", (2, 7), None, "torch.export.export(strict=False)",
         f"examples/dynamo/vgg16_ptq.py@v2.7.0, @v2.8.0 and @{MAIN} (torch.export.export(model, (input_tensor,), "
         "strict=False) under export_torch_mode)"),
    Rule("int8_needs_modelopt", (2, 5), None, "modelopt.torch.quantization",
         f"py/torch_tensorrt/dynamo/conversion/aten_ops_converters.py@v2.5.0 and @{MAIN}: the converter of "
         "torch.ops.tensorrt.quantize_op registers only when modelopt.torch.quantization imports"),
)


def release(version: str) -> tuple[int, int]:
    """``2.5.0a0+b1f3…`` → (2, 5).

    Raises:
        ConfigError: An unreadable version string.
    """
    match = re.match(r"(\d+)\.(\d+)", version or "")
    if not match:
        raise ConfigError(f"cannot read the Torch-TensorRT version {version!r}",
                          fix="reinstall torch-tensorrt (torch_tensorrt.__version__ must be X.Y…)")
    return int(match.group(1)), int(match.group(2))


def rules_for(version: str) -> dict[str, Rule]:
    """The rules (by name) that hold for Torch-TensorRT ``version``.

    Raises:
        ConfigError: A release older than the oldest whose sources were read.
    """
    have = release(version)
    chosen = {rule.name: rule for rule in RULES
              if rule.since <= have and (rule.until is None or have < rule.until)}
    if "supported" not in chosen:
        oldest = min(rule.since for rule in RULES if rule.name == "supported")
        raise ConfigError(f"Torch-TensorRT {version} is older than {oldest[0]}.{oldest[1]}, the oldest release this "
                          "runner was written against",
                          fix="install Torch-TensorRT ≥ 2.3 (JetPack 6.2: 2.8.0 via TORCH_TENSORRT=1, docker/README.md), "
                              "or use runtime 'tensorrt' with the ONNX")
    return chosen


def compile_arguments(rules: dict[str, Rule], precision: str) -> dict[str, Any]:
    """The keyword arguments of ``dynamo.compile`` for this release (precision, ``min_block_size``), dtype names
    unresolved."""
    return {**rules["precision_arguments"].value[precision], "min_block_size": rules["min_block_size"].value}
