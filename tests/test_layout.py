"""The project's shape, checked from its sources (``ast``, lazy imports included, nothing executed): one import
direction, no cycle anywhere, stage modules that hold stages, cache keys that cover what a stage runs and nothing
more, and sizes whose allowlists can only shrink."""

import ast
from pathlib import Path

import pytest

from device.errors import ConfigError
from pipeline import codehash
from pipeline.runner import stage_code_roots
from pipeline.stages import STAGES
from tests.pipeline.test_integrity import _cycles

ROOT = Path(codehash.PROJECT_ROOT)
MODULE_LINES, FUNCTION_LINES = 600, 80
# Measured when the rule came in; each entry may only get smaller, and goes once it is within the limit.
LONG_MODULES = {"pipeline/report.py": 1297, "device/schema.py": 701, "device/runners/torch_tensorrt.py": 686}
LONG_FUNCTIONS = {
    "device/agent.py:create_app": 211, "pipeline/latency/budget.py:plan_to_budget": 179,
    "device/jobrun.py:run_job": 135, "device/safe_pickle.py:interpret": 106, "pipeline/report.py:collect": 105,
    "pipeline/runner.py:run_pipeline": 104, "pipeline/latency/measure.py:measure": 95,
    "device/engine.py:build_engine": 94, "pipeline/fp16_nodes.py:nodes_to_fp16": 92,
    "pipeline/stages/deploy.py:_device": 88, "device/sweep.py:run_sweep": 85,
    "pipeline/quantizers.py:float_islands_to_fp16": 81}
# Public library functions still living in a stage module (the stage itself should be all there is).
STAGE_MODULE_LIBRARY = {
    "pipeline.stages.data": {"check_classes", "check_decodable", "balance_warnings"},
    "pipeline.stages.deploy": {"stratified_indices", "unmeasured_edges"},
    "pipeline.stages.detection_deploy": {"device_boxes"},
    "pipeline.stages.evaluate": {"ladder_table"},
    "pipeline.stages.prune": {"unpruned_layers", "macs_concentration"}}


def _modules() -> dict[str, Path]:
    found = {}
    for package in codehash.PROJECT_PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _graph() -> dict[str, set[str]]:
    return {name: codehash.imported_modules(name) for name in _modules()}


def test_no_import_cycle_anywhere():
    """device/ and pipeline/ together: a cycle ties every module in it to the others' code hashes."""
    assert _cycles(_graph()) == []


def test_imports_go_one_way():
    """The device side never imports the build side; a library never imports a stage (only the runner and the CLI
    assemble stages)."""
    graph = _graph()
    device_up = {name: sorted(m for m in imports if m.startswith("pipeline")) for name, imports in graph.items()
                 if name.startswith("device")}
    assert {name: up for name, up in device_up.items() if up} == {}
    assemblers = {"pipeline.runner", "pipeline.cli", "pipeline.__main__"}
    library_up = {name: sorted(m for m in imports if m.startswith("pipeline.stages")) for name, imports in graph.items()
                  if name.startswith("pipeline") and not name.startswith("pipeline.stages") and name not in assemblers}
    assert {name: up for name, up in library_up.items() if up} == {}


def test_stage_modules_hold_stages_only():
    found = {}
    for name, path in _modules().items():
        if not name.startswith("pipeline.stages.") or path.name in ("base.py", "detection_base.py"):
            continue
        public = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if isinstance(node, ast.ClassDef) and any("Stage" in ast.unparse(base) for base in node.bases):
                    continue
                public.add(node.name)
        if public:
            found[name] = public
    assert found == STAGE_MODULE_LIBRARY, "move library code out of stage modules; shrink the allowlist when you do"


def _sizes() -> tuple[dict[str, int], dict[str, int]]:
    modules, functions = {}, {}
    for path in _modules().values():
        rel = str(path.relative_to(ROOT))
        text = path.read_text()
        modules[rel] = text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                functions[f"{rel}:{node.name}"] = max(functions.get(f"{rel}:{node.name}", 0),
                                                      node.end_lineno - node.lineno + 1)
    return modules, functions


def test_no_module_or_function_grows_past_its_limit_and_the_allowlists_only_shrink():
    modules, functions = _sizes()
    for sizes, allowed, limit, what in ((modules, LONG_MODULES, MODULE_LINES, "module"),
                                        (functions, LONG_FUNCTIONS, FUNCTION_LINES, "function")):
        new = {name: size for name, size in sizes.items() if size > limit and name not in allowed}
        assert new == {}, f"{what}s over {limit} lines: split them"
        grown = {name: (sizes.get(name), size) for name, size in allowed.items() if sizes.get(name, 0) > size}
        assert grown == {}, f"allowlisted {what}s grew (now, allowed): split them instead"
        done = [name for name in allowed if sizes.get(name, 0) <= limit]
        assert done == [], f"within {limit} lines now: remove them from the allowlist"


def test_cache_keys_cover_what_a_stage_runs_and_nothing_more():
    """The run context imports no training; quantize hashes the ONNX Runtime runner it scores with, not the TensorRT,
    Torch-TensorRT or NVML code it never runs, nor the engine builder (only the trtexec line's settings)."""
    def closure(stage):
        return set(codehash.closure(stage_code_roots(STAGES.get(stage))))

    assert "pipeline.train" not in codehash.closure(["pipeline.context"])
    for stage in ("data", "export", "evaluate", "report"):
        assert "pipeline.train" not in closure(stage), stage
    quantize = closure("quantize")
    assert {"device.runners.onnxruntime", "device.trt_settings", "device.qdq_lint"} <= quantize
    never = {"device.runners", "device.runners.tensorrt", "device.runners.torch_tensorrt", "device.telemetry.nvml",
             "device.engine", "device.jobrun"}
    assert quantize & never == set()
    assert {"device.runners.tensorrt", "device.jobrun"} <= closure("deploy"), "what deploy runs on the agent"


def test_a_misspelled_code_root_is_an_error_with_the_near_name():
    with pytest.raises(ConfigError, match="code root 'pipeline.stages.quantise' is not a module") as err:
        codehash.closure(["pipeline.stages.quantise"])
    assert "pipeline.stages.quantize" in err.value.fix
