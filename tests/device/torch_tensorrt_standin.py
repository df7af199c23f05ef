"""A STAND-IN for ``torch_tensorrt`` — not Torch-TensorRT, no TensorRT, no GPU — encoding the documented API of
three releases, for the agent's ``torch_tensorrt`` runtime tests on machines where Torch-TensorRT cannot be
installed (its wheels need TensorRT libraries from NVIDIA's own index).

What it encodes, per release, from pytorch/TensorRT's sources (file@tag):

* ``dynamo.compile``'s keyword parameters (:data:`COMPILE_PARAMETERS`, the signature of
  py/torch_tensorrt/dynamo/_compiler.py at v2.5.0 — JetPack 6's era —, v2.9.0, and main d7f2062, version.txt
  2.14.0a0, the newest read; no v2.14.0 tag existed in the snapshot), plus the names the body reads from
  ``**kwargs`` itself (``refit``, ``truncate_long_and_double`` …).
  The real ``compile`` ends in ``**kwargs`` and IGNORES any other name silently — so passing
  ``enabled_precisions`` to 2.13+ would quietly compile in the graph's types. The stand-in is deliberately
  stricter: such a name raises ``TypeError``, so a test fails where the real release would mislead.
* ``use_explicit_typing`` with ``enabled_precisions`` other than {float32} raises ``AssertionError``
  (_compiler.py@v2.6.0 … v2.12.0).
* ``Input(shape=…, dtype=…)`` (py/torch_tensorrt/_Input.py): the runner must give static shapes; a dynamic
  ``min_shape/opt_shape/max_shape`` Input is recorded as such and refused here (the runner never sends one).
* Partitioning: the program's ATen ops are split into contiguous runs; runs of ops in ``unsupported`` become
  children named ``_run_on_gpu_<i>`` (GraphModules PyTorch runs), the others ``_run_on_acc_<i>`` (TensorRT
  engines in the real one) — the names _compiler.py's partitioner gives. Here every child is the real ATen
  subgraph, so the compiled module's outputs are the program's own.
* ``save(module, path, *, output_format="exported_program", arg_inputs=…)`` re-exports and saves (a GraphModule
  without example inputs is a ``ValueError``, as in _compile.py@v2.5.0); ``load`` wraps ``torch.export.load``.

* Loading and profiling: ``load`` returns the program whose ``module()`` runs each ``_run_on_acc_<i>`` subgraph
  through an engine object (:class:`StandinEngine`, attribute ``_run_on_acc_<i>_engine``, read by a ``get_attr``
  node and passed to a call of ``execute_engine(inputs, engine)``, as _exporter.py's inline_trt_modules leaves
  them). Its profiling API is the C++ ``torch.classes.tensorrt.Engine``'s (core/runtime/register_jit_hooks.cpp):
  ``profile_path_prefix``, ``enable_profiling()``, ``disable_profiling()``, and from 2.8 ``set_profile_format``.
  While profiling, each call times every ATen op (a "layer") and rewrites, as core/runtime/execute_engine.cpp
  does, ``<prefix>/<name>_engine_exectuion_profile.trace`` (sic, before 2.8; Chrome-trace events whose ``dur``
  is µs summed since enable_profiling) or ``<name>_engine_execution_profile.trace`` (2.8+, ``trex``: name,
  timeMs, averageMs, percentage) — core/runtime/TRTEngineProfiler.cpp's dump_trace — and
  ``<name>_layer_information.json`` (the inspector's JSON at LAYER_NAMES_ONLY: ``{"Layers": [names]}``).
  With ``cpp_runtime=False`` (2.13+'s Python TRTEngine, ``ENABLED_FEATURES.torch_tensorrt_runtime`` False) the
  profiler prints and writes nothing (_TRTEngine.py@v2.13.0). The subgraph's outputs are returned as it returns
  them (the real op returns a list); the times are this CPU's, not a GPU's.

Every ``compile`` call is appended to ``module.calls`` (its keyword arguments and input specs) so tests can
check what the runner asked of each release.
"""

from __future__ import annotations

import types
import warnings
from typing import Any, Iterable

# dynamo.compile's keyword-only parameters, by release (ast of py/torch_tensorrt/dynamo/_compiler.py@tag).
_COMMON = ("arg_inputs", "kwarg_inputs", "device", "disable_tf32", "assume_dynamic_shape_support", "sparse_weights",
           "engine_capability", "num_avg_timing_iters", "workspace_size", "dla_sram_size", "dla_local_dram_size",
           "dla_global_dram_size", "truncate_double", "require_full_compilation", "min_block_size",
           "torch_executed_ops", "torch_executed_modules", "pass_through_build_failures", "max_aux_streams",
           "version_compatible", "optimization_level", "use_python_runtime", "use_fast_partitioner",
           "enable_experimental_decompositions", "dryrun", "hardware_compatible", "timing_cache_path",
           "lazy_engine_init", "cache_built_engines", "reuse_cached_engines", "engine_cache_dir", "engine_cache_size",
           "custom_engine_cache")
_WEIGHTS = ("use_fp32_acc", "refit_identical_engine_weights", "strip_engine_weights", "immutable_weights",
            "enable_weight_streaming", "tiling_optimization_level", "l2_limit_for_tiling", "offload_module_to_cpu")
COMPILE_PARAMETERS: dict[str, dict[str, Any]] = {
    "2.5.0": {"source": "py/torch_tensorrt/dynamo/_compiler.py@v2.5.0",
              "parameters": _COMMON + ("enabled_precisions", "make_refittable", "debug"),
              "read_from_kwargs": ("truncate_long_and_double", "refit")},
    "2.9.0": {"source": "py/torch_tensorrt/dynamo/_compiler.py@v2.9.0",
              "parameters": _COMMON + ("enabled_precisions", "use_explicit_typing") + _WEIGHTS,
              "read_from_kwargs": ("truncate_long_and_double", "refit", "make_refittable", "debug")},
    "2.14.0": {"source": "py/torch_tensorrt/dynamo/_compiler.py@main d7f2062 (2.14.0a0)",
               "parameters": _COMMON + ("use_complex_decomposition",) + _WEIGHTS + (
                   "use_distributed_mode_trace", "enable_autocast", "autocast_low_precision_type",
                   "autocast_excluded_nodes", "autocast_excluded_ops", "autocast_max_output_threshold",
                   "autocast_max_depth_of_reduction", "autocast_calibration_dataloader", "cpu_memory_budget",
                   "enable_resource_partitioning", "dynamically_allocate_resources", "decompose_attention",
                   "disabled_constant_fold_exclusions", "attn_bias_is_causal", "fallback_data_dependent_ops"),
               "read_from_kwargs": ("debug", "truncate_long_and_double", "refit", "make_refittable",
                                    "enable_cross_compile_for_windows")},
}
DEFAULT_UNSUPPORTED = ("aten.adaptive_avg_pool2d.default",)  # planted: what this stand-in "cannot convert"


class Input:
    """``torch_tensorrt.Input``: static (``shape=``) or dynamic (``min_shape/opt_shape/max_shape``)."""

    def __init__(self, *args: Any, shape=None, min_shape=None, opt_shape=None, max_shape=None, dtype=None,
                 **kwargs: Any):
        if args:
            shape = args[0]
        if shape is not None and any(s is not None for s in (min_shape, opt_shape, max_shape)):
            raise ValueError("shape must not be defined with min_shape/opt_shape/max_shape (_Input.py)")
        self.shape, self.dtype = tuple(shape) if shape is not None else None, dtype
        self.shape_mode = "STATIC" if shape is not None else "DYNAMIC"
        self.kwargs = kwargs

    def __repr__(self) -> str:
        return f"Input(shape={self.shape}, dtype={self.dtype})"


def _partition(graph_module, unsupported: Iterable[str]):
    """Splits ``graph_module`` into ``_run_on_acc_<i>``/``_run_on_gpu_<i>`` children of contiguous ATen ops."""
    from torch.fx.passes.split_module import split_module

    unsupported = set(unsupported)
    part: dict[Any, int] = {}
    kinds: dict[int, str] = {}
    index, last = 0, None
    for node in graph_module.graph.nodes:
        if node.op == "call_function":
            kind = "gpu" if str(node.target) in unsupported else "acc"
            if kind != last:
                index, last = index + 1, kind
                kinds[index] = kind
            part[node] = index

    def which(node) -> int:
        if node in part:
            return part[node]
        users = [user for user in node.users if user in part]
        return part[users[0]] if users else 1

    split = split_module(graph_module, graph_module, which, keep_original_order=True)
    for node in split.graph.nodes:
        if node.op == "call_module" and node.target.startswith("submod_"):
            number = int(node.target.split("_")[1])
            name = f"_run_on_{kinds[number]}_{number}"
            setattr(split, name, getattr(split, node.target))
            delattr(split, node.target)
            node.target = name
    split.recompile()
    return split


def execute_engine(inputs, engine):
    """``torch.ops.tensorrt.execute_engine(inputs, engine)``: runs the engine on its inputs."""
    return engine.execute(inputs)


class StandinEngine:
    """``torch.classes.tensorrt.Engine`` (or, with ``cpp_runtime`` False, 2.13+'s Python ``TRTEngine``): one
    subgraph, and the profiling API of the release (see the module docstring)."""

    def __init__(self, name: str, module, version: str, cpp_runtime: bool = True):
        import tempfile

        self.name, self._module, self._cpp_runtime = name, module, cpp_runtime
        self._release = tuple(int(part) for part in version.split(".")[:2])
        self.profile_path_prefix = tempfile.gettempdir()  # TRTEngine.h's default
        self._profile: dict[str, list[float]] | None = None  # layer → [summed ms, invocations], in report order
        self._format = "perfetto"

    def enable_profiling(self) -> None:
        self._profile, self._format = {}, "perfetto"

    def __getattr__(self, name: str):
        # set_profile_format is bound from 2.8 on (register_jit_hooks.cpp@v2.8.0): before, the attribute is absent.
        if name == "set_profile_format" and self.__dict__.get("_release", (0, 0)) >= (2, 8):
            return self._set_profile_format
        raise AttributeError(name)

    def _set_profile_format(self, profile_format: str) -> None:
        if profile_format not in ("trex", "perfetto"):
            raise RuntimeError(f"Invalid profile format: {profile_format}")
        self._format = profile_format

    def disable_profiling(self) -> None:
        self._profile = None

    def execute(self, inputs):
        if self._profile is None:
            return self._module(*inputs)
        import time

        import torch

        report = self._report_layer_time

        class Timed(torch.fx.Interpreter):
            def run_node(self, node):
                started = time.perf_counter()
                out = super().run_node(node)
                if node.op == "call_function":
                    report(node.name, (time.perf_counter() - started) * 1e3)
                return out

        out = Timed(self._module).run(*inputs)
        self._dump()
        return out

    def _report_layer_time(self, name: str, ms: float) -> None:
        entry = self._profile.setdefault(name, [0.0, 0])
        entry[0] += ms
        entry[1] += 1

    def _dump(self) -> None:
        import json
        from pathlib import Path

        if not self._cpp_runtime:  # tensorrt.Profiler: a printed table, no file
            print("\n".join(f"{name}: {total / count:.3f} ms" for name, (total, count) in self._profile.items()))
            return
        folder = Path(self.profile_path_prefix)
        if self._release < (2, 8):
            trace = folder / f"{self.name}_engine_exectuion_profile.trace"
        else:
            trace = folder / f"{self.name}_engine_execution_profile.trace"
        events, running = [], 0.0
        total = sum(ms for ms, _ in self._profile.values()) or 1.0
        for name, (ms, count) in self._profile.items():
            if self._format == "perfetto":
                events.append({"name": name, "ph": "X", "ts": running * 1000, "dur": ms * 1000, "tid": 1,
                               "pid": f"{self.name} Engine Execution", "args": {}})
            else:
                events.append({"name": name, "timeMs": ms, "averageMs": ms / count, "percentage": ms * 100 / total})
            running += ms
        trace.write_text(json.dumps(events, indent=2) + "\n")
        (folder / f"{self.name}_layer_information.json").write_text(
            json.dumps({"Layers": list(self._profile), "Bindings": ["input", "output"]}))


class _LoadedProgram:
    """What ``torch_tensorrt.load`` returns: the program, whose ``module()`` runs its engines."""

    def __init__(self, program, tt):
        self._program, self._tt = program, tt

    def __getattr__(self, name: str):
        return getattr(self._program, name)

    def module(self):
        flat = self._program.module()
        split = _partition(flat, self._tt.unsupported)
        graph = split.graph
        for node in list(graph.nodes):
            if node.op != "call_module" or not node.target.startswith("_run_on_acc_"):
                continue
            attribute = f"{node.target}_engine"
            setattr(split, attribute, StandinEngine(node.target, getattr(split, node.target), self._tt.__version__,
                                                    self._tt.ENABLED_FEATURES.torch_tensorrt_runtime))
            with graph.inserting_before(node), warnings.catch_warnings():
                # FX warns that the attribute is no module, parameter or buffer: so is the real torchbind engine.
                warnings.simplefilter("ignore", UserWarning)
                call = graph.call_function(execute_engine, (list(node.args), graph.get_attr(attribute)))
            node.replace_all_uses_with(call)
            graph.erase_node(node)
            delattr(split, node.target)
        split.recompile()
        return split


def make_torch_tensorrt(version: str = "2.5.0", unsupported: Iterable[str] = DEFAULT_UNSUPPORTED,
                        cpp_runtime: bool = True) -> types.ModuleType:
    """A ``torch_tensorrt`` module object for ``version`` (a key of :data:`COMPILE_PARAMETERS`); ``cpp_runtime``
    False stands for a 2.13+ install without the C++ runtime (its Python engine prints its profile)."""
    import collections

    import torch

    release = COMPILE_PARAMETERS[version]
    known = set(release["parameters"]) | set(release["read_from_kwargs"])
    import importlib.machinery

    tt = types.ModuleType("torch_tensorrt")
    # A spec, as an imported module has: torch.export.load looks optional packages up with importlib.util.find_spec.
    tt.__spec__ = importlib.machinery.ModuleSpec("torch_tensorrt", None)
    tt.__doc__ = "STAND-IN for Torch-TensorRT (tests/device/torch_tensorrt_standin.py)"
    tt.__version__ = version
    tt.Input = Input
    tt.calls = []
    tt.unsupported = tuple(unsupported)
    # _features.py's FeatureSet, re-exported by torch_tensorrt/__init__.py
    features = collections.namedtuple("FeatureSet", ["torchscript_frontend", "torch_tensorrt_runtime",
                                                     "dynamo_frontend", "fx_frontend"])
    tt.ENABLED_FEATURES = features(cpp_runtime, cpp_runtime, True, True)

    def compile(exported_program, inputs=None, **kwargs):  # noqa: A001 (the real name)
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise TypeError(f"compile() got unexpected keyword argument(s) {unknown} for Torch-TensorRT {version} "
                            f"(STAND-IN: the real one swallows them in **kwargs and ignores them; "
                            f"{release['source']})")
        if not isinstance(exported_program, torch.export.ExportedProgram):
            raise TypeError("compile() takes a torch.export.ExportedProgram")
        specs = inputs if inputs is not None else kwargs.get("arg_inputs")
        if specs is None:
            raise AssertionError("'arg_inputs' and 'inputs' should not both be None.")
        if kwargs.get("use_explicit_typing") and set(kwargs.get("enabled_precisions", {torch.float32})) != {
                torch.float32}:
            raise AssertionError("use_explicit_typing was set to True, however found that enabled_precisions was "
                                 "also specified (_compiler.py@v2.6.0…v2.12.0)")
        for spec in specs:
            if not isinstance(spec, Input) or spec.shape_mode != "STATIC":
                raise AssertionError(f"STAND-IN: the runner sends static Input specs only, got {spec!r}")
        tt.calls.append({"kwargs": dict(kwargs), "inputs": [(spec.shape, spec.dtype) for spec in specs]})
        compiled = _partition(exported_program.module(), tt.unsupported)
        compiled.standin_torch_tensorrt = version
        return compiled

    def save(module, file_path="", *, output_format="exported_program", inputs=None, arg_inputs=None,
             kwarg_inputs=None, retrace=None, **kwargs):
        if output_format not in ("exported_program", "torchscript"):
            raise ValueError(f"Provided output_format {output_format} is not supported")
        examples = inputs or arg_inputs
        if examples is None:
            raise ValueError("Provided model is a torch.fx.GraphModule however the inputs are empty (_compile.py)")
        program = torch.export.export(module, tuple(examples), strict=False)
        torch.export.save(program, file_path)

    def load(file_path=""):
        return _LoadedProgram(torch.export.load(file_path), tt)

    tt.dynamo = types.ModuleType("torch_tensorrt.dynamo")
    tt.dynamo.compile = compile
    tt.save, tt.load = save, load
    return tt


def with_spec(module: types.ModuleType, name: str) -> types.ModuleType:
    """``module`` with a ``__spec__`` (``importlib.util.find_spec`` raises on a module in sys.modules without one)."""
    import importlib.machinery

    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    return module


def install_in_process(version: str = "2.5.0", unsupported: Iterable[str] = DEFAULT_UNSUPPORTED):
    """Installs the stand-in in this process, compiling for the CPU; returns the stand-in module."""
    import sys

    import device.runners.torch_tensorrt as runtime
    from tests.device import trt_standin

    tt = make_torch_tensorrt(version, unsupported)
    sys.modules["torch_tensorrt"] = tt
    sys.modules["torch_tensorrt.dynamo"] = tt.dynamo
    # No TensorRT stand-in here: the agent would then choose TensorRT for the ONNX road (runtime auto) and run the
    # real TensorRT runner's CUDA calls. The compiled programs' fingerprint says TensorRT "unknown".
    runtime.compute_device = lambda torch: torch.device("cpu")
    runtime.detect_gpu = lambda **_: (trt_standin.STANDIN_DEVICE, "8.7")
    return tt


def install_lazily(version: str = "2.5.0") -> None:
    """Installs the stand-in in this process when ``torch_tensorrt`` is first imported (or looked up), so a
    process that never uses it (the agent's ONNX Runtime jobs) does not import torch for it."""
    import importlib.abc
    import importlib.machinery
    import sys

    class StandInFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
        def find_spec(self, name, path=None, target=None):
            if name == "torch_tensorrt":
                return importlib.machinery.ModuleSpec(name, self)
            return None

        def create_module(self, spec):
            sys.meta_path.remove(self)
            install_in_process(version)
            return sys.modules["torch_tensorrt"]

        def exec_module(self, module):
            pass

    sys.meta_path.insert(0, StandInFinder())


def sitecustomize_dir(folder, version: str = "2.5.0"):
    """A folder with a ``sitecustomize`` that installs the stand-in in the agent's job processes (on their first
    import of ``torch_tensorrt``), and the environment the agent needs (``PYTHONPATH``: the folder, then the
    repository)."""
    import os
    from pathlib import Path

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    repo = Path(__file__).resolve().parents[2]
    (folder / "sitecustomize.py").write_text(
        "# STAND-IN for Torch-TensorRT in EdgeFold's tests (tests/device/torch_tensorrt_standin.py)\n"
        "import os\n"
        "if os.environ.get('EDGEFOLD_TEST_TORCH_TENSORRT'):\n"
        "    from tests.device.torch_tensorrt_standin import install_lazily\n"
        "    install_lazily(os.environ['EDGEFOLD_TEST_TORCH_TENSORRT'])\n")
    # The distribution's metadata, as a wheel leaves it: the agent reads the version from it without importing
    # torch_tensorrt (device.info.torch_tensorrt_version), and the stand-in installs itself only on that import.
    metadata = folder / f"torch_tensorrt-{version}.dist-info"
    metadata.mkdir(exist_ok=True)
    (metadata / "METADATA").write_text(f"Metadata-Version: 2.1\nName: torch-tensorrt\nVersion: {version}\n")
    env = {"PYTHONPATH": os.pathsep.join([str(folder), str(repo), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
           "EDGEFOLD_TEST_TORCH_TENSORRT": version}
    return folder, env
