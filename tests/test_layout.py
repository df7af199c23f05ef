"""The project's shape, checked from its sources (``ast``, lazy imports included, nothing executed): one import
direction (device ← pipeline core ← libraries ← tasks ← a task's stages), no cycle anywhere, no task importing
another, stage modules that hold stages, cache keys that cover what a stage runs and nothing more, and sizes whose
allowlists can only shrink."""

import ast
from pathlib import Path

import pytest

from device.errors import ConfigError
from pipeline.core import codehash
from pipeline.runner import stage_code_roots
from pipeline.core.recipe import TASKS
from pipeline.tasks import TASK_NAMES
from pipeline.tasks.classification import TASK
from tests.pipeline.test_integrity import _cycles

ROOT = Path(codehash.PROJECT_ROOT)
STAGES = TASK.stages
ASSEMBLERS = {"pipeline.runner", "pipeline.cli", "pipeline.__main__", "pipeline.tasks"}
MODULE_LINES, FUNCTION_LINES = 600, 80
# Measured when the rule came in; each entry may only get smaller, and goes once it is within the limit.
LONG_MODULES: dict[str, int] = {}
LONG_FUNCTIONS = {
    "device/service/agent.py:create_app": 211, "pipeline/latency/budget.py:plan_to_budget": 179,
    "device/jobs/jobrun.py:run_job": 125, "device/uploads/safe_pickle.py:interpret": 106, "pipeline/tasks/classification/report_data.py:collect": 94,
    "pipeline/runner.py:run_pipeline": 104, "pipeline/latency/measure.py:measure": 95,
    "device/runners/engine.py:build_engine": 94, "pipeline/quantize/fp16_nodes.py:nodes_to_fp16": 92}
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


def _layer(name: str) -> str:
    """``device``, ``core``, ``library``, ``assembler``, ``task:<name>`` or ``stage:<task>``."""
    if name.startswith("device"):
        return "device"
    if name.startswith("pipeline.core"):
        return "core"
    if name in ASSEMBLERS:
        return "assembler"
    if name.startswith("pipeline.tasks."):
        task = name.split(".")[2]
        return f"stage:{task}" if ".stages" in name else f"task:{task}"
    return "library"


# What each layer may import besides itself (a task's stages: their own task and everything below).
BELOW = {"device": set(), "core": {"device"}, "library": {"device", "core"}}


def test_imports_go_one_way():
    """device ← pipeline core ← libraries ← tasks ← a task's stages; only the runner, the CLI and the task
    registry assemble them. A library that imported a stage would tie every stage using it to that stage's code."""
    wrong = {}
    for name, imports in _graph().items():
        layer = _layer(name)
        if layer == "assembler":
            continue
        allowed = BELOW.get(layer)
        if allowed is None:  # a task's libraries and its stages
            kind, task = layer.split(":")
            allowed = {"device", "core", "library", f"task:{task}"} | ({f"stage:{task}"} if kind == "stage" else set())
            if name == f"pipeline.tasks.{task}":  # the task's declaration lists its stages
                allowed.add(f"stage:{task}")
        up = sorted(m for m in imports if _layer(m) not in allowed | {layer})
        if up:
            wrong[name] = up
    assert wrong == {}


def test_a_task_never_imports_another_task():
    graph = _graph()
    crossing = {name: sorted(m for m in imports if m.startswith("pipeline.tasks.")
                             and m.split(".")[2] != name.split(".")[2])
                for name, imports in graph.items() if name.startswith("pipeline.tasks.")}
    assert {name: up for name, up in crossing.items() if up} == {}
    assert set(TASK_NAMES) == {path.name for path in (ROOT / "pipeline" / "tasks").iterdir()
                               if (path / "__init__.py").is_file()}, "every task package is registered"
    # Every task's recipe root lives in its own package: the recipe loader (core) names it and imports none.
    assert set(TASKS) == set(TASK_NAMES)
    assert {task: root for task, root in TASKS.items() if not root.startswith(f"pipeline.tasks.{task}.")} == {}


def test_stage_modules_hold_stages_only():
    found = {}
    for name, path in _modules().items():
        if ".stages." not in name:
            continue
        public = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
                if isinstance(node, ast.ClassDef) and any("Stage" in ast.unparse(base) for base in node.bases):
                    continue
                public.add(node.name)
        if public:
            found[name] = public
    assert found == {}, "a stage module holds its stage only: move library code to the library it belongs to"


def test_no_task_defines_a_stage():
    """#57: every stage is written once (:mod:`pipeline.stages`) over hooks a task supplies; a task (and a new one,
    segmentation) brings hooks, not stages."""
    defining = {name for name, path in _modules().items() if name.startswith("pipeline.tasks.")
                and any(isinstance(node, ast.ClassDef) and any("Stage" in ast.unparse(base) for base in node.bases)
                        for node in ast.parse(path.read_text()).body)}
    assert defining == set(), "a task supplies hooks to the shared stages; it defines no stage of its own"


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

    training = {"pipeline.tasks.classification.train", "pipeline.train.engine"}
    assert training.isdisjoint(codehash.closure(["pipeline.core.context"]))
    for stage in ("data", "export", "evaluate", "report"):
        assert training.isdisjoint(closure(stage)), stage
    quantize = closure("quantize")
    assert {"device.runners.onnxruntime", "device.runners.trt_settings", "device.runners.qdq_lint"} <= quantize
    never = {"device.runners", "device.runners.tensorrt", "device.runners.torch_tensorrt", "device.telemetry.nvml",
             "device.runners.engine", "device.jobs.jobrun"}
    assert quantize & never == set()
    assert {"device.runners.tensorrt", "device.jobs.jobrun"} <= closure("deploy"), "what deploy runs on the agent"


def test_a_misspelled_code_root_is_an_error_with_the_near_name():
    with pytest.raises(ConfigError, match="code root 'pipeline.tasks.classification.pruner' is not a module") as err:
        codehash.closure(["pipeline.tasks.classification.pruner"])
    assert "pipeline.tasks.classification.pruned" in err.value.fix


def test_the_device_never_tells_tasks_apart_by_which_fields_are_set():
    """A job names its post-processor (``EvaluationSpec.postprocess``) and the device looks it up by that name
    (:mod:`device.scoring.postprocessors`): outside the schema (which reads an older client's job), no device module branches
    on whether a job's evaluation holds a sidecar; every registered name is a module with ``evaluate_job`` and
    ``frame_answer`` (``none`` is a debug job's: nothing post-processes its set)."""
    import importlib
    import importlib.util
    from typing import get_args

    from device.scoring.postprocessors import POSTPROCESSORS
    from device.schema import Postprocess

    assert set(POSTPROCESSORS) == set(get_args(Postprocess)) - {"none"}
    for name, module in POSTPROCESSORS.items():
        assert importlib.util.find_spec(module) is not None, f"{name}: {module} is not a module"
        for hook in ("evaluate_job", "frame_answer"):
            assert callable(getattr(importlib.import_module(module), hook, None)), f"{module}.{hook}"
    branching = []
    for path in sorted((ROOT / "device").rglob("*.py")):
        if path.name in ("schema.py", "evaluation_schema.py"):  # reading an older client's job, which names none
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            tests = [node.test] if isinstance(node, (ast.If, ast.IfExp, ast.While)) else []
            tests += [cond for gen in getattr(node, "generators", []) for cond in gen.ifs]
            for test in tests:
                if any(isinstance(n, ast.Attribute) and n.attr == "head" for n in ast.walk(test)):
                    branching.append(f"{path.relative_to(ROOT)}:{test.lineno}")
    assert branching == [], "branch on evaluation.postprocess (the job's own word), not on which fields are set"


def _named_modules() -> dict[str, list[str]]:
    """Every module the sources name in a string (``"device.jobs.jobrun"``, ``b"device.jobs.jobrun"`` in /proc lines,
    ``"pkg.mod:Attr"`` roots), and setup.cfg's entry points, with where each is written."""
    import re

    pattern = re.compile(r"^(device|pipeline)(\.[A-Za-z_]\w*)+(:[A-Za-z_]\w*)?$")
    named: dict[str, list[str]] = {}
    for path in sorted((ROOT / "device").rglob("*.py")) + sorted((ROOT / "pipeline").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
                text = node.value.decode("utf-8", "replace") if isinstance(node.value, bytes) else node.value
                if pattern.match(text):
                    named.setdefault(text, []).append(f"{path.relative_to(ROOT)}:{node.lineno}")
    for line in (ROOT / "setup.cfg").read_text().splitlines():
        target = line.partition("=")[2].strip()
        if pattern.match(target):
            named.setdefault(target, []).append("setup.cfg")
    return named


def test_every_module_named_in_a_string_is_a_module():
    """Module names written as strings (job processes found in /proc by name, post-processors and recipe roots loaded
    by name, code roots, entry points) move with their modules: one that no longer names a module, or an attribute
    it no longer has, fails here instead of on a board."""
    import importlib
    import importlib.util

    named = _named_modules()
    assert {"device.jobs.jobrun", "device.service.zygote", "device.cli:main", "pipeline.cli:console"} <= set(named), "the scan sees them"
    missing = []
    for text, where in named.items():
        module, _, attribute = text.partition(":")
        if importlib.util.find_spec(module) is None:
            missing.append(f"{text} ({', '.join(where)})")
        elif attribute and not hasattr(importlib.import_module(module), attribute):
            missing.append(f"{text}: no {attribute} ({', '.join(where)})")
    assert missing == []
