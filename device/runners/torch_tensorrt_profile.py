"""Per-layer timing on the ``torch_tensorrt`` runtime: Torch-TensorRT's own engine profiler, read back into the
agent's per-layer table (:mod:`device.jobs.profile`), so "where the time goes" reads the same on both roads.

What Torch-TensorRT offers (the release-dependent parts are rules in :data:`device.runners.torch_tensorrt_rules.RULES`,
``engine_profiler`` and ``engine_profiler_runtime``, each citing file@tag):

* A compiled program saved and loaded as an ``ExportedProgram`` keeps each TensorRT engine as an attribute
  (``<submodule>_engine``) read by a ``get_attr`` node and passed to ``torch.ops.tensorrt.execute_engine``
  (py/torch_tensorrt/dynamo/_exporter.py). On the C++ runtime that object is ``torch.classes.tensorrt.Engine``,
  whose ``enable_profiling()``, ``disable_profiling()``, ``profile_path_prefix`` (and from 2.8
  ``set_profile_format``) are bound in core/runtime/register_jit_hooks.cpp — the calls
  ``TorchTensorRTModule.enable_profiling(profiling_results_dir=…, profile_format=…)`` makes on it.
* While profiling, every ``execute_engine`` call rewrites ``<prefix>/<name>_engine_ex…_profile.trace`` with the
  per-layer times TensorRT's ``IProfiler`` reported since ``enable_profiling`` (summed; core/runtime/
  TRTEngineProfiler.cpp ``dump_trace``), and ``<prefix>/<name>_layer_information.json``, the engine inspector's
  JSON (core/runtime/TRTEngine.cpp ``dump_engine_layer_info``).

Only the TensorRT engines are timed: ops that fell back to PyTorch run between them, outside the profiler, and
the profile's notes say so. No torch import here: the objects come from the loaded module.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

from device.errors import RunnerError
from device.jobs.profile import BatchProfile, batch_profile, inspector_layers, tensorrt_timings

ENGINE_OP = "tensorrt.execute_engine"


def _is_execute_engine(target: Any) -> bool:
    # torch.ops.tensorrt.execute_engine.default prints as "tensorrt.execute_engine.default".
    return str(target).startswith(ENGINE_OP) or getattr(target, "__name__", "") == "execute_engine"


def find_engines(module) -> list[tuple[str, Any]]:
    """(attribute name, engine object) for each TensorRT engine a loaded program's module runs, in graph order.

    The engines are the ``get_attr`` argument of each ``tensorrt.execute_engine`` call (``_exporter.py``'s
    ``inline_trt_modules``: ``execute_engine(inputs, engine)``).
    """
    found: list[tuple[str, Any]] = []
    for node in getattr(getattr(module, "graph", None), "nodes", ()):
        if node.op != "call_function" or not _is_execute_engine(node.target):
            continue
        reference = node.args[1] if len(node.args) > 1 else node.kwargs.get("engine")
        if getattr(reference, "op", None) != "get_attr":
            continue
        engine = module
        for part in reference.target.split("."):
            engine = getattr(engine, part)
        if all(engine is not seen for _, seen in found):
            found.append((reference.target, engine))
    return found


def unavailable(version: str, rules: dict[str, Any], cpp_runtime: bool, modules: Sequence[Any]) -> str | None:
    """Why this installation cannot time layers, in words; None when it can.

    Args:
        version: Torch-TensorRT's version.
        rules: The release's rules (:func:`device.runners.torch_tensorrt_rules.rules_for`).
        cpp_runtime: ``torch_tensorrt.ENABLED_FEATURES.torch_tensorrt_runtime``.
        modules: The loaded modules, one per measured batch.
    """
    if "engine_profiler" not in rules:
        return (f"Torch-TensorRT {version} documents no engine profiler this runner reads: no per-layer profile "
                "(the latency, power and accuracy figures are unaffected)")
    if not cpp_runtime:
        rule = rules.get("engine_profiler_runtime")
        return (f"Torch-TensorRT {version} runs here without its C++ runtime: "
                f"{rule.value if rule else 'its Python engine writes no trace'} — no per-layer profile "
                f"({rule.source if rule else 'see RULES'})")
    if not any(find_engines(module) for module in modules):
        return ("no TensorRT engine to profile: every op fell back to PyTorch (see runtime.torch_tensorrt.fallback)")
    return None


def read_engine_trace(folder: Path, spec: dict[str, Any], iterations: int) -> tuple[dict[str, float], str]:
    """One engine's layer times (ms summed over ``iterations`` inferences) and its layer information JSON.

    Args:
        folder: The engine's ``profile_path_prefix``.
        spec: The release's ``engine_profiler`` rule value (``trace_suffix``, ``layer_information_suffix``,
            ``format``).
        iterations: Inferences run since ``enable_profiling``.

    Raises:
        RunnerError: No trace was written, or it does not parse as the release's format.
    """
    traces = sorted(folder.glob("*" + spec["trace_suffix"]))
    if not traces:
        written = sorted(p.name for p in folder.iterdir())
        raise RunnerError(f"Torch-TensorRT wrote no *{spec['trace_suffix']} in its profile folder (found: "
                          f"{', '.join(written) or 'nothing'})",
                          fix="check that the program runs on Torch-TensorRT's C++ runtime (the job log); the "
                              "timed figures stand")
    try:
        events = json.loads(traces[0].read_text())
        if spec["format"] == "trex":
            # averageMs = the layer's time / its invocations (TRTEngineProfiler.cpp): one inference's time.
            times = {str(e["name"]): float(e["averageMs"]) * iterations for e in events}
        else:
            # Perfetto's "dur" is µs summed over every invocation since enable_profiling.
            times = {str(e["name"]): float(e["dur"]) / 1e3 for e in events if e.get("ph", "X") == "X"}
    except (ValueError, KeyError, TypeError) as err:
        raise RunnerError(f"cannot read Torch-TensorRT's {spec['format']} trace {traces[0].name}: {err}",
                          fix="report the trace with the Torch-TensorRT version (runtime.torch_tensorrt)") from None
    information = sorted(folder.glob("*" + spec["layer_information_suffix"]))
    return times, (information[0].read_text() if information else "{}")


def profile_engines(module, run: Callable[[], Any], batch_size: int, iterations: int, warmup: int,
                    spec: dict[str, Any]) -> tuple[BatchProfile, bool]:
    """Times ``module``'s engines over ``iterations`` calls of ``run`` (after ``warmup`` unprofiled ones).

    Enables the profiler on each engine with a folder of its own (as ``TorchTensorRTModule.enable_profiling``
    does: ``profile_path_prefix``, ``enable_profiling()``, then ``set_profile_format`` where the release has it),
    and always disables it again: profiling makes every enqueue synchronous, so it must not outlive this pass.

    Returns:
        (the table, whether the engines carried layer details: False when Torch-TensorRT built them with
        ``ProfilingVerbosity.LAYER_NAMES_ONLY`` and precisions are unknown).
    """
    engines = find_engines(module)
    for _ in range(warmup):
        run()
    per_engine = []
    with tempfile.TemporaryDirectory(prefix="edgefold-ttprof-") as folder:
        enabled: list[tuple[Any, Any]] = []
        try:
            for index, (_, engine) in enumerate(engines):
                where = Path(folder) / f"engine{index}"
                where.mkdir()
                previous = engine.profile_path_prefix
                engine.profile_path_prefix = str(where)
                engine.enable_profiling()
                enabled.append((engine, previous))
                if spec["set_format"]:
                    engine.set_profile_format(spec["format"])
            for _ in range(iterations):
                run()
        finally:
            for engine, previous in enabled:
                engine.disable_profiling()
                engine.profile_path_prefix = previous
        for index, (name, _) in enumerate(engines):
            times, information = read_engine_trace(Path(folder) / f"engine{index}", spec, iterations)
            per_engine.append((name, times, information))
    timings, detailed = [], True
    for name, times, information in per_engine:
        layers = inspector_layers(information)
        detailed = detailed and bool(layers) and all("LayerType" in layer for layer in layers)
        for timing in tensorrt_timings(information, times, "gpu"):
            if len(per_engine) > 1:  # layer names are per engine: keep two engines' layers apart
                timing["name"] = f"{name}/{timing['name']}"
            timings.append(timing)
    if not timings:
        raise RunnerError("Torch-TensorRT's engine traces list no layers", fix="see the job log")
    return batch_profile(batch_size, iterations, timings, "gpu"), detailed
