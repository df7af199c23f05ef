"""Nothing stale or wrong passes as good: sanity gates, exact gates, cache keys, resume, data checks.

Each test names the failure it guards against; all use real models on real (small) data.
"""

import json
import shutil
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch

from device.errors import CheckpointError, ConfigError, DataError, ManifestError, StageError
from pipeline.core.ladder import points
from pipeline.core import codehash
from device.files import sha256_file
from pipeline.runner import run_pipeline, stage_code_roots
from pipeline.tasks.classification.scores import assess
from pipeline.core.stage import STAGE_ORDER
from pipeline.tasks import classification, detection

STAGES = classification.TASK.stages
from pipeline.quantize.quantizers import QUANTIZERS, within_budget



def write_digits_folder(root: Path, classes: int = 5, train_per_class: int = 60, val_per_class: int = 20,
                        size: int = 32) -> Path:
    """scikit-learn's digits as an ImageFolder of PNGs (train/ and val/, one folder per class)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    for split, start, count in (("train", 0, train_per_class), ("val", train_per_class, val_per_class)):
        for label in range(classes):
            folder = root / split / f"digit{label}"
            folder.mkdir(parents=True, exist_ok=True)
            for index in np.flatnonzero(digits.target == label)[start : start + count]:
                image = np.clip(digits.images[index] * 16, 0, 255).astype(np.uint8)
                cv2.imwrite(str(folder / f"{index}.png"), cv2.resize(image, (size, size),
                                                                     interpolation=cv2.INTER_NEAREST))
    return root


def mobilenet_recipe(tmp_path: Path, data: Path, **teacher_train) -> Path:
    train = {"epochs": 2, "batch_size": 16, "lr": 0.003, "schedule": "constant", **teacher_train}
    recipe = {
        "name": "mnv3", "data": {"source": f"imagefolder:{data}", "calib_size": 32},
        "preprocess": {"input_size": 32, "channels": 3, "mean": [0.3] * 3, "std": [0.38] * 3},
        "teacher": {"arch": "mobilenet_v3_small", "train": train},
        "prune": {"macs_target": 0.5, "tolerance": 0.2, "round_to": 4},
        "distill": {"train": {"epochs": 1, "batch_size": 16, "lr": 0.001}},
    }
    path = tmp_path / "mnv3.yaml"
    path.write_text(json.dumps(recipe))  # JSON is YAML
    return path


@pytest.fixture(scope="module")
def digits_folder(tmp_path_factory):
    return write_digits_folder(tmp_path_factory.mktemp("digits-folder"))


# ------------------------------------------------------------------ 1. a collapsed teacher
@pytest.mark.slow  # trains a teacher
def test_stale_batchnorm_teacher_is_refused_not_reported_as_a_win(digits_folder, tmp_path):
    """MobileNetV3's BatchNorm momentum 0.01: after two short epochs its running statistics are stale and
    it predicts one class. Without re-estimation the teacher stage must fail, naming the collapse."""
    recipe = mobilenet_recipe(tmp_path, digits_folder, bn_recalibration="off")
    with pytest.raises(StageError, match="the teacher learned nothing usable: predicts class") as err:
        run_pipeline(str(recipe), runs_dir=tmp_path / "runs", until="teacher")
    assert "within noise of chance" in str(err.value) and "bn_recalibration" in str(err.value)


@pytest.mark.slow  # trains a teacher
def test_batchnorm_statistics_are_re_estimated_for_low_momentum_architectures(digits_folder, tmp_path):
    recipe = mobilenet_recipe(tmp_path, digits_folder)  # bn_recalibration: auto
    ctx = run_pipeline(str(recipe), runs_dir=tmp_path / "runs", until="teacher")
    metrics = ctx.manifest.stage("teacher")["metrics"]
    assert metrics["bn_recalibrated_images"] == 300
    assert metrics["top1"] > 0.6 > metrics["top1_before_bn_recalibration"]
    assert not metrics["sanity"]["collapsed"] and not metrics["sanity"]["at_chance"]


def test_sanity_verdicts_on_known_counts():
    balanced = [20] * 5
    collapsed = {"images": 100, "top1_correct": 20, "top1": 0.2, "label_counts": balanced,
                 "predicted_counts": [0, 0, 100, 0, 0]}
    verdict = assess(collapsed, ["a", "b", "c", "d", "e"])
    assert verdict["collapsed"] and verdict["at_chance"] and verdict["top_predicted_class"] == "c"
    good = {**collapsed, "top1_correct": 90, "top1": 0.9, "predicted_counts": [22, 18, 20, 21, 19]}
    assert not assess(good)["collapsed"] and not assess(good)["at_chance"]
    # A model that mostly predicts the class that is most of the labels is not collapsed.
    skewed = {"images": 100, "top1_correct": 93, "top1": 0.93, "label_counts": [90, 10],
              "predicted_counts": [95, 5]}
    assert not assess(skewed)["collapsed"]
    # 32% on 5 balanced classes over 100 images is within 3σ of chance (20% ± 12%); 40% is not.
    assert assess({**good, "top1_correct": 32})["at_chance"] and not assess({**good, "top1_correct": 40})["at_chance"]


# ------------------------------------------------------------------ 2. gates on integer counts
def test_accuracy_gate_decides_on_counts_not_floats():
    # 86 → 85 of 100 is exactly 1 point: within a 1.0 budget. In floats it was 1.0000000000000009.
    assert 100 * (0.86 - 0.85) > 1.0
    assert within_budget(86, 85, 100, 1.0)
    assert not within_budget(86, 84, 100, 1.0)
    assert within_budget(1000, 999, 1000, 0.1) and not within_budget(1000, 998, 1000, 0.1)
    assert f"{points(-0.0):+.2f}" == "+0.00" and f"{points(100 * (0.85 - 0.85)):.2f}" == "0.00"


def test_recorded_scores_carry_their_counts(tiny_run):
    stages = tiny_run.manifest.data["stages"]
    for stage in ("teacher", "distill", "quantize"):
        metrics = stages[stage]["metrics"]
        assert metrics["top1"] == metrics["top1_correct"] / metrics["images"]
    rungs = stages["evaluate"]["metrics"]["rungs"]
    for name, rung in rungs.items():
        expected = 100 * (rung["top1_correct"] - rungs["teacher"]["top1_correct"]) / rung["images"]
        assert rung["top1_delta_points"] == pytest.approx(expected, abs=1e-9)
        assert str(rung["top1_delta_points"]) != "-0.0"


# ------------------------------------------------------------------ 4. stages never write into others' outputs
@pytest.fixture
def run_copy(tiny_run, tmp_path):
    target = tmp_path / "runs" / "tiny" / "shared"
    shutil.copytree(tiny_run.run_dir, target, symlinks=True)
    return target


def rewriting_quantizer(fp32, out, calibration, method, per_channel):
    """ONNX Runtime's quantizer after writing shape information into its input, as ModelOpt does
    (module-level: quantizers run in a spawned process)."""
    import onnx

    from pipeline.quantize.ort import quantize_ort

    onnx.save(onnx.shape_inference.infer_shapes(onnx.load(str(fp32))), str(fp32))
    quantize_ort(fp32, out, calibration, method, per_channel)


def test_quantizer_that_rewrites_its_input_gets_a_copy(run_copy, monkeypatch):
    """A stand-in quantizer (says so) does what ModelOpt's shape inference does: it writes into the file
    it is given. The export stage's recorded ONNX must stay as recorded."""
    monkeypatch.setitem(QUANTIZERS._items, "ort", rewriting_quantizer)
    ctx = run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", force=["quantize"], until="quantize")
    export = ctx.manifest.stage("export")
    for rel, digest in export["sha256"].items():
        assert sha256_file(run_copy / rel) == digest, f"{rel} was modified by the quantize stage"


def test_a_stage_that_modifies_its_input_is_stopped(run_copy, monkeypatch):
    from pipeline.stages.evaluate import EvaluateStage

    real = EvaluateStage.run

    def tampering(self, ctx, workdir):
        path = ctx.manifest.output("distill", "model")
        path.write_bytes(path.read_bytes() + b"\0")
        return real(self, ctx, workdir)

    monkeypatch.setattr(EvaluateStage, "run", tampering)
    with pytest.raises(ManifestError, match="stage evaluate modified its input distill/model.pt"):
        run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", force=["evaluate"], until="evaluate")


def test_every_recorded_output_is_as_recorded_after_a_full_run(tiny_run):
    for name, entry in tiny_run.manifest.data["stages"].items():
        for rel, digest in entry["sha256"].items():
            assert sha256_file(tiny_run.run_dir / rel) == digest, f"{name}: {rel} changed after it was recorded"


# ------------------------------------------------------------------ 5. the cache key covers the code
def test_code_closure_follows_imports_but_not_package_inits():
    modules = codehash.closure(stage_code_roots(STAGES.get("distill")))
    assert {"pipeline.tasks.classification.train", "pipeline.train.engine", "pipeline.tasks.classification.losses",
            "pipeline.checkpoint", "pipeline.models"} <= set(modules)
    assert "pipeline.stages.quantize" not in modules and "pipeline.tasks.classification" not in modules
    quantize = codehash.closure(stage_code_roots(STAGES.get("quantize")))
    assert {"device.runners.qdq_lint", "pipeline.tasks.classification.int8"} <= set(quantize), "the task's part is its code"
    assert "device.jobs.measure" in codehash.closure(stage_code_roots(STAGES.get("deploy")))
    assert "pipeline.tasks.classification.report" in codehash.closure(stage_code_roots(STAGES.get("report")))


@pytest.mark.parametrize("module", ["pipeline.tasks.classification.losses", "pipeline.perclass"])
def test_editing_a_helper_module_reruns_exactly_the_stages_that_use_it(run_copy, tmp_path, monkeypatch, capsys,
                                                                     module):
    """The project is copied and the copy's helper edited (a comment: same behaviour, new code): every
    stage whose code closure holds it re-runs; the rest stay cached, as do stages whose inputs came
    out byte-identical."""
    project = tmp_path / "project"
    for package in codehash.PROJECT_PACKAGES:
        shutil.copytree(codehash.PROJECT_ROOT / package, project / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(codehash, "PROJECT_ROOT", project)
    run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", until="evaluate")
    assert capsys.readouterr().err.count("] running") == 0, "the copy hashes like the checkout"
    helper = codehash.module_path(module, project)
    helper.write_text(helper.read_text() + "\n# edited\n")
    run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", until="evaluate")
    reran = {line.split("]")[0].strip("[ ") for line in capsys.readouterr().err.splitlines() if "] running" in line}
    users = {name for name in STAGE_ORDER[: STAGE_ORDER.index("evaluate") + 1]
             if module in codehash.closure(stage_code_roots(STAGES.get(name)), project)}
    expected = {"pipeline.tasks.classification.losses": {"distill", "quantize"}, "pipeline.perclass": {"evaluate"}}[module]
    assert users == expected
    assert reran == expected, f"re-ran {sorted(reran)}, expected exactly {sorted(expected)}"


# ------------------------------------------------------------------ 6. resume keyed by config and inputs
def interrupt_after_first_epoch(monkeypatch):
    from pipeline.train import engine

    real = engine._save_resume

    def save_then_die(path, state):
        real(path, state)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine, "_save_resume", save_then_die)


@pytest.mark.slow  # trains a teacher
def test_resume_after_interruption_gives_the_uninterrupted_model(tmp_path, monkeypatch, capsys):
    overrides = {"teacher.train.epochs": 2}
    whole = run_pipeline("tiny", runs_dir=tmp_path / "a", until="teacher", overrides=overrides)
    with monkeypatch.context() as patch:
        interrupt_after_first_epoch(patch)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline("tiny", runs_dir=tmp_path / "b", until="teacher", overrides=overrides)
    resumed = run_pipeline("tiny", runs_dir=tmp_path / "b", until="teacher", overrides=overrides)
    assert "teacher: resuming after epoch 1" in capsys.readouterr().err
    a = torch.load(whole.run_dir / "teacher" / "model.pt", weights_only=True)["state_dict"]
    b = torch.load(resumed.run_dir / "teacher" / "model.pt", weights_only=True)["state_dict"]
    assert all(torch.equal(a[key], b[key]) for key in a)
    assert not list((resumed.run_dir / "resume").glob("teacher-*.pt")), "a completed stage leaves no resume state"


def interrupted_teacher(runs_dir, monkeypatch) -> dict:
    """A two-epoch teacher killed after its first epoch (its resume state saved); returns the overrides."""
    overrides = {"teacher.train.epochs": 2}
    with monkeypatch.context() as patch:
        interrupt_after_first_epoch(patch)
        with pytest.raises(KeyboardInterrupt):
            run_pipeline("tiny", runs_dir=runs_dir, until="teacher", overrides=overrides)
    return overrides


@pytest.mark.slow  # trains a teacher
def test_changed_data_never_resumes_old_weights(tmp_path, monkeypatch, capsys):
    overrides = interrupted_teacher(tmp_path, monkeypatch)
    capsys.readouterr()
    run_pipeline("tiny", runs_dir=tmp_path, until="teacher", overrides={**overrides, "data.train_size": 1000})
    err = capsys.readouterr().err
    assert "resuming" not in err and "teacher epoch 1/2" in err


@pytest.mark.slow  # trains a teacher
def test_a_resume_state_that_does_not_fit_is_discarded_not_a_crash(tmp_path, monkeypatch, capsys):
    overrides = interrupted_teacher(tmp_path, monkeypatch)
    (state_file,) = (tmp_path / "tiny" / "latest").resolve().glob("resume/teacher-*.pt")
    state = torch.load(state_file, weights_only=True)
    state["model"]["fc.weight"] = torch.zeros(3, 64)  # saved for another class count
    torch.save(state, state_file)
    capsys.readouterr()
    ctx = run_pipeline("tiny", runs_dir=tmp_path, until="teacher", overrides=overrides)
    err = capsys.readouterr().err
    assert "discarding the saved training state" in err and "teacher epoch 1/2" in err
    assert ctx.manifest.stage("teacher")["metrics"]["top1"] > 0.5


# ------------------------------------------------------------------ 7. overrides recorded only on success
def test_a_failed_run_leaves_the_manifest_as_it_was(tmp_path):
    ctx = run_pipeline("tiny", runs_dir=tmp_path, until="data")
    before = ctx.manifest.path.read_bytes()
    with pytest.raises(DataError):
        run_pipeline("tiny", runs_dir=tmp_path, until="data", force=["data"],
                     overrides={"data.source": f"imagefolder:{tmp_path / 'nonexistent'}"})
    assert ctx.manifest.path.read_bytes() == before


# ------------------------------------------------------------------ 8. data checked where it enters
def test_empty_class_folder_is_refused(digits_folder, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(digits_folder, data)
    (data / "train" / "empty").mkdir()
    with pytest.raises(DataError, match=r"1 classes have no training images: \['empty'\]"):
        run_pipeline(str(mobilenet_recipe(tmp_path, data)), runs_dir=tmp_path / "runs", until="data")


def test_val_split_missing_a_class_is_refused_unless_allowed(digits_folder, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(digits_folder, data)
    shutil.rmtree(data / "val" / "digit3")
    recipe = mobilenet_recipe(tmp_path, data)
    with pytest.raises(DataError, match=r"test split has no images of 1 classes: \['digit3'\]") as err:
        run_pipeline(str(recipe), runs_dir=tmp_path / "runs", until="data")
    assert "data.allow_missing_test_classes" in err.value.fix
    ctx = run_pipeline(str(recipe), runs_dir=tmp_path / "runs", until="data",
                       overrides={"data.allow_missing_test_classes": True})
    assert ctx.manifest.stage("data")["metrics"]["num_classes"] == 5


def test_corrupt_image_is_named_before_any_training(digits_folder, tmp_path):
    data = tmp_path / "data"
    shutil.copytree(digits_folder, data)
    bad = next((data / "val" / "digit2").glob("*.png"))
    bad.write_bytes(bad.read_bytes()[:40])  # truncated
    with pytest.raises(DataError, match="1 of 100 test images cannot be decoded") as err:
        run_pipeline(str(mobilenet_recipe(tmp_path, data)), runs_dir=tmp_path / "runs")
    assert str(bad) in str(err.value) and "remove or replace" in err.value.fix
    assert not list((tmp_path / "runs").glob("*/*/teacher")), "the teacher never started"


# ------------------------------------------------------------------ 9. clear errors
@pytest.mark.parametrize("pair, message", [
    ("teacher.train.epochs.max=1", "teacher.train.epochs is a value (6), not a section"),
    ("teacher.train.lr=[0.1", "the value is not valid YAML"),
])
def test_bad_set_values_are_errors_not_tracebacks(pair, message, tmp_path, capsys):
    from pipeline.cli import main

    assert main(["run", "tiny", "--runs-dir", str(tmp_path), "--until", "data", "--set", pair]) == 2
    err = capsys.readouterr().err
    assert message in err and "fix:" in err and "Traceback" not in err


def test_weights_that_are_not_a_torch_file_say_so(tmp_path):
    from pipeline.checkpoint import load_checkpoint, load_weights
    from pipeline.models import build_model

    text = tmp_path / "weights.pth"
    text.write_text("hello, these are not weights\n")
    with pytest.raises(CheckpointError, match=r"is not a torch file \(it starts with 'hello"):
        load_weights(build_model("tiny_resnet", 10), "tiny_resnet", text)
    real = tmp_path / "real.pth"
    torch.save(build_model("tiny_resnet", 10).state_dict(), real)
    truncated = tmp_path / "truncated.pth"
    truncated.write_bytes(real.read_bytes()[: real.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt") as err:
        load_weights(build_model("tiny_resnet", 10), "tiny_resnet", truncated)
    assert "state_dict" not in err.value.fix and "again" in err.value.fix
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_checkpoint(truncated)


def test_deploy_removes_the_loopback_agents_folder(run_copy, monkeypatch):
    import tempfile

    made = []
    real = tempfile.mkdtemp

    def recording(*args, **kwargs):
        made.append(real(*args, **kwargs))
        return made[-1]

    monkeypatch.setattr(tempfile, "mkdtemp", recording)
    run_pipeline("tiny", runs_dir=run_copy.parent.parent, run_id="shared", force=["deploy"], until="deploy")
    loopback = [path for path in made if Path(path).name.startswith("edgefold-loopback-")]
    assert loopback and not any(Path(path).exists() for path in loopback)


def test_report_names_the_baseline_when_no_data_center_device_exists(tiny_run):
    text = (tiny_run.run_dir / "report" / "report.md").read_text()
    assert "Ratios are against the data-center device" not in text
    assert "no data-center device configured" in text
    assert "-0.00" not in text and "−0.00" not in text


def test_libraries_never_import_a_stage():
    """A stage's cache key follows its imports: a library that imported a stage would tie every stage using it to
    that stage's code (a MACs-target prune re-ran when the deploy stage changed). Only the runner and the CLI,
    which drive the stages, may import them."""
    root = Path(codehash.PROJECT_ROOT)
    drivers = {"pipeline.runner", "pipeline.cli", "pipeline.__main__"}
    offenders = {}
    for path in sorted((root / "pipeline").rglob("*.py")):
        name = ".".join(path.relative_to(root).with_suffix("").parts)
        if ".stages" in name or name in drivers or name.endswith("__init__"):
            continue
        stages = sorted(m for m in codehash.imported_modules(name) if ".stages." in m)
        if stages:
            offenders[name] = stages
    assert offenders == {}
    # A prune no longer hashes the deploy and export stages through the latency library.
    prune = codehash.closure(["pipeline.tasks.classification.pruned"])
    assert "pipeline.tasks.classification.deployed" not in prune and "pipeline.stages.deploy" not in prune
    assert "pipeline.tasks.classification.exported" not in prune


def _module_graph(package: str) -> dict[str, set[str]]:
    """Every module of ``package`` and the project modules it imports (lazy imports included)."""
    root = Path(codehash.PROJECT_ROOT)
    graph = {}
    for path in sorted((root / package).rglob("*.py")):
        parts = path.relative_to(root).with_suffix("").parts
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        graph[name] = codehash.imported_modules(name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            child = next((w for w in edges if w in graph), None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_pipeline_modules():
    """Libraries below, stages above: a cycle (the latency library and the prune stage imported each other) ties
    every module in it to the others' code hashes. Lazy imports count: the code hash follows them."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]], "the check finds one"
    assert _cycles(_module_graph("pipeline")) == []


def test_no_classification_stage_hashes_detection_code():
    """Every classification stage reads the recipe module; detection recipes, models and metrics live beside it
    and are loaded by name, so editing them re-runs no classification stage (it re-ran all of them)."""
    for name in STAGE_ORDER:
        closure = codehash.closure(stage_code_roots(STAGES.get(name)))
        assert not [m for m in closure if "detection" in m], f"{name} hashes detection code"
    data_stage = codehash.closure(stage_code_roots(detection.TASK.stages.get("data")))
    assert "pipeline.tasks.detection.recipe" in data_stage or "pipeline.tasks.detection.data" in data_stage, \
        "the check can fail"


def _prune_ctx(**prune):
    from types import SimpleNamespace

    from pipeline.core.recipe import PruneConfig

    return SimpleNamespace(recipe=SimpleNamespace(prune=PruneConfig(round_to=4, **prune)))


@pytest.mark.parametrize("edited, macs_changes, latency_changes", [
    ("device.runners.tensorrt", False, True),   # the agent's engine builds: what the latency table timed
    ("pipeline.deploy.jobs", False, True),             # the job spec the table is measured with (the deploy stage's own)
    ("pipeline.tasks.classification.deployed", False, False),   # the deploy stage's hooks: neither prunes through them
    ("pipeline.prune.channels", True, True),          # the pruning mechanics both modes share
])
def test_a_prunes_code_hash_follows_its_mode(tmp_path, edited, macs_changes, latency_changes):
    """A MACs target hashes the MACs path only: editing the runners or the job spec no longer re-runs it (its
    closure held 35 modules, the agent's among them); a latency budget, which times networks on the agent, still
    re-runs when they change."""
    project = tmp_path / "project"
    for package in codehash.PROJECT_PACKAGES:
        shutil.copytree(codehash.PROJECT_ROOT / package, project / package,
                        ignore=shutil.ignore_patterns("__pycache__"))
    stage = STAGES.get("prune")
    modes = {"macs": _prune_ctx(macs_target=0.5), "latency": _prune_ctx(latency={"ratio": 0.5})}
    roots = {mode: stage_code_roots(stage, ctx) for mode, ctx in modes.items()}
    before = {mode: codehash.code_sha256(r, project)[0] for mode, r in roots.items()}
    macs_modules = codehash.closure(roots["macs"], project)
    assert "pipeline.latency.budget" not in macs_modules and "device.client" not in macs_modules
    assert len(macs_modules) < len(codehash.closure(roots["latency"], project))
    path = codehash.module_path(edited, project)
    path.write_text(path.read_text() + "\n# edited\n")
    after = {mode: codehash.code_sha256(r, project)[0] for mode, r in roots.items()}
    assert (before["macs"] != after["macs"]) is macs_changes
    assert (before["latency"] != after["latency"]) is latency_changes
