"""An ONNX file as the ladder's starting point: the checks that refuse a bad file before any work, the rewrite into
the ladder's form, the recipe (``start:`` and ``MODEL=model.onnx``), and whole runs that take a trained torchvision
classifier EdgeFold's registry does not have to INT8 and measure it on a loopback agent.

The small graphs are made here with torch and onnx; the trained one by :mod:`tests.onnx_models` (digits, 32 px).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch
import yaml

from device.models.architectures import ARCHITECTURES
from device.errors import ConfigError
from pipeline.core.recipe import load_recipe, parse_recipe
from pipeline.export.onnx_start import graph_compute, inspect_start, start_parity, write_start_graph
from tests import onnx_models
from tests.slow import slow_fixture


def small_net(classes: int = 10, channels: int = 3) -> torch.nn.Module:
    """A BatchNorm-free classifier (its MACs are the same counted on the graph and by Torch-Pruning)."""
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Conv2d(channels, 8, 3, padding=1), torch.nn.ReLU(),
                               torch.nn.Conv2d(8, 16, 3, stride=2, padding=1, groups=2), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(16, classes)).eval()


class TwoInputs(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.net = small_net()

    def forward(self, image, mask):
        return self.net(image * mask)


def small_onnx(tmp_path: Path, name: str = "small.onnx", **kwargs) -> Path:
    return onnx_models.export(small_net(**{k: kwargs.pop(k) for k in ("classes", "channels") if k in kwargs}),
                              tmp_path / name, kwargs.pop("shape", (1, 3, 16, 16)), **kwargs)


def refused(path, layout="nchw", channels=3, size=16, classes=10) -> str:
    with pytest.raises(ConfigError) as err:
        inspect_start(path, layout, channels, size, classes)
    return f"{err.value.message} | fix: {err.value.fix}"


# ---------------------------------------------------------------------------------------------- the checks
def test_a_text_file_named_onnx_is_refused_with_its_hash(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_text("this is a model, honest\n")
    said = refused(path)
    assert "is not a valid ONNX model (sha256 " in said and "torch.onnx.export" in said


def test_a_missing_file_is_named(tmp_path):
    assert "no such file" in refused(tmp_path / "nowhere.onnx")


def test_a_second_input_is_refused_naming_both(tmp_path):
    path = onnx_models.export(TwoInputs(), tmp_path / "two.onnx", (1, 3, 16, 16), input_names=("image", "mask"))
    said = refused(path)
    assert "has 2 inputs (image, mask)" in said and "one image input" in said


def test_an_output_of_another_class_count_is_refused_with_the_data_order(tmp_path):
    said = refused(small_onnx(tmp_path, classes=7))
    assert "is [2, 7] for a batch of 2; the data has 10 classes" in said
    assert "folders sorted by name" in said


def test_an_input_that_does_not_fit_the_declared_preprocessing_names_the_fix(tmp_path):
    path = small_onnx(tmp_path)
    assert "has height 16; preprocess.input_size is 32" in refused(path, size=32)
    assert "preprocess.input_size=16" in refused(path, size=32)
    assert "has 3 channels; preprocess.channels is 1" in refused(path, channels=1)
    # an NHWC graph read as NCHW: the fix names the layout
    nhwc = onnx_models.export(onnx_models_channels_last(small_net()), tmp_path / "nhwc.onnx", (1, 16, 16, 3))
    assert "set start.layout: nhwc" in refused(nhwc)


def onnx_models_channels_last(model):
    class ChannelsLast(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = model

        def forward(self, x):
            return self.inner(x.permute(0, 3, 1, 2))

    return ChannelsLast().eval()


def test_opsets_and_operators_tensorrt_10_cannot_parse_are_refused(tmp_path):
    path = small_onnx(tmp_path)
    model = onnx.load(str(path))
    model.opset_import[0].version = 21
    onnx.save(model, str(tmp_path / "opset21.onnx"))
    assert "is opset 21; TensorRT 10's ONNX parser imports opsets 9–20" in refused(tmp_path / "opset21.onnx")

    model = onnx.load(str(path))
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(4, dtype=np.float32), "values"))
    model.graph.node.append(onnx.helper.make_node("Unique", ["values"], ["unique"]))
    onnx.save(model, str(tmp_path / "unique.onnx"))
    assert "uses Unique, which TensorRT 10's ONNX parser does not import" in refused(tmp_path / "unique.onnx")

    model = onnx.load(str(path))
    model.graph.node.append(onnx.helper.make_node("FusedThing", [model.graph.output[0].name], ["fused"],
                                                  domain="com.example"))
    model.opset_import.append(onnx.helper.make_opsetid("com.example", 1))
    onnx.save(model, str(tmp_path / "custom.onnx"))
    assert "outside the ONNX standard: com.example::FusedThing" in refused(tmp_path / "custom.onnx")


def test_a_graph_that_fixes_its_batch_inside_is_refused_before_any_work(tmp_path):
    class FlattenToOne(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.net = small_net()

        def forward(self, x):
            return self.net[-1](self.net[:-2](x).reshape(1, -1))  # a reshape to [1, …] as traced code writes it

    path = onnx_models.export(FlattenToOne().eval(), tmp_path / "fixed.onnx", (1, 3, 16, 16), dynamic_batch=False)
    assert "fixes its batch at 1 inside the graph" in refused(path)


# ---------------------------------------------------------------------------------------------- the rewrite
@pytest.mark.parametrize("layout, opset", [("nchw", 17), ("nhwc", 11)])
def test_the_rewrite_gives_the_ladder_its_input_and_changes_no_logit(tmp_path, layout, opset):
    """A user's I/O names, an NHWC layout, an old opset and a static batch of 1 become the ladder's form: one NCHW
    input named ``input`` of a free batch, ``logits`` out, opset ≥ 13; the logits are the given graph's."""
    net = small_net() if layout == "nchw" else onnx_models_channels_last(small_net())
    shape = (1, 3, 16, 16) if layout == "nchw" else (1, 16, 16, 3)
    path = onnx_models.export(net, tmp_path / "given.onnx", shape, dynamic_batch=False, opset=opset)
    facts, written = write_start_graph(path, layout, 3, 16, 10, tmp_path / "student.onnx")
    assert facts == inspect_start(path, layout, 3, 16, 10)
    model = onnx.load(str(tmp_path / "student.onnx"))
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    dims = model.graph.input[0].type.tensor_type.shape.dim
    assert dims[0].dim_param == "batch" and [d.dim_value for d in dims[1:]] == [3, 16, 16]
    assert "batch made dynamic (it was 1)" in written["changes"]
    assert (f"opset {opset} → 13" in written["changes"]) == (opset < 13) and written["opset"] == max(opset, 13)
    assert ("NHWC input behind a Transpose from NCHW" in written["changes"]) == (layout == "nhwc")
    images = np.random.default_rng(1).standard_normal((9, 3, 16, 16)).astype(np.float32)
    parity = start_parity(facts, tmp_path / "student.onnx", images)
    assert parity["images"] == 9 and parity["max_abs_diff"] < 1e-5 and parity["top1_agreement"] == 1.0
    with torch.no_grad():
        expected = small_net()(torch.from_numpy(images)).numpy()
    from pipeline.tasks.classification.onnx_scores import onnx_accuracy

    scored = onnx_accuracy(tmp_path / "student.onnx", images, expected.argmax(1))
    assert scored["top1_correct"] == 9


def test_the_ladders_names_are_freed_whatever_the_user_called_their_tensors(tmp_path):
    """A graph whose input is called ``logits`` and whose output ``input``, its initialisers listed as inputs (an
    older exporter's habit): rewritten, it runs and gives the same scores."""
    path = onnx_models.export(small_net(), tmp_path / "swapped.onnx", (1, 3, 16, 16), input_names=("logits",),
                              output_names=("input",), keep_initializers_as_inputs=True)
    assert len(onnx.load(str(path)).graph.input) > 1  # the initialisers are listed
    facts, _ = write_start_graph(path, "nchw", 3, 16, 10, tmp_path / "student.onnx")
    model = onnx.load(str(tmp_path / "student.onnx"))
    assert [i.name for i in model.graph.input] == ["input"] and [o.name for o in model.graph.output] == ["logits"]
    images = np.random.default_rng(2).standard_normal((4, 3, 16, 16)).astype(np.float32)
    assert start_parity(facts, tmp_path / "student.onnx", images)["max_abs_diff"] < 1e-5


def test_a_non_square_input_is_refused_as_such(tmp_path):
    said = refused(small_onnx(tmp_path, shape=(1, 3, 16, 24)))
    assert "is 16×24; EdgeFold's preprocessing (device/preprocess.py) makes square inputs" in said


def test_a_transposed_convolution_counts_each_input_element_once_per_kernel_output(tmp_path):
    net = torch.nn.Sequential(torch.nn.ConvTranspose2d(3, 4, 2, stride=2), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(4, 10)).eval()
    facts = graph_compute(onnx_models.export(net, tmp_path / "up.onnx", (1, 3, 8, 8)), (3, 8, 8))
    # input 3×8×8, each element into 4×2×2 outputs; bias adds on the 4×16×16 output; the head 4×10 + 10
    assert round(facts["macs_g"] * 1e9) == 3 * 8 * 8 * 4 * 2 * 2 + 4 * 16 * 16 + 4 * 10 + 10


def test_the_graph_counts_the_macs_torch_pruning_counts_per_layer(tmp_path):
    """Conv (grouped included), Linear and their bias adds, as Torch-Pruning counts them layer by layer."""
    from pipeline.models import count_parameters, layer_macs

    net = small_net()
    facts = graph_compute(small_onnx(tmp_path, shape=(1, 3, 24, 24)), (3, 24, 24))
    assert facts["macs_g"] * 1e9 == sum(layer_macs(net, (1, 3, 24, 24)).values())
    assert round(facts["params_m"] * 1e6) == count_parameters(net)


# ---------------------------------------------------------------------------------------------- the recipe
def start_recipe(**changes) -> dict:
    raw = {"name": "mine", "data": {"source": "digits"}, "start": {"onnx": "model.onnx"},
           "preprocess": {"input_size": 16, "mean": [0.3] * 3, "std": [0.38] * 3}}
    for key, value in changes.items():
        section, _, leaf = key.partition(".")
        if leaf:
            raw.setdefault(section, {})[leaf] = value
        else:
            raw[section] = value
    return raw


def config_error(raw) -> str:
    with pytest.raises(ConfigError) as err:
        parse_recipe(raw, "test")
    return err.value.message


def test_an_onnx_start_recipe_has_the_student_and_its_forms_only():
    recipe = parse_recipe(start_recipe(), "test")
    assert recipe.teacher is None and recipe.prune is None and recipe.distill is None
    assert recipe.export.rungs == ["student"] and recipe.export.fp16_rungs == ["student_fp16"]
    assert recipe.deploy.rungs == ["student", "student_fp16", "student_int8"]
    assert recipe.start.layout == "nchw"


@pytest.mark.parametrize("changes, said", [
    ({"teacher": {"arch": "resnet18", "train": {"epochs": 1, "batch_size": 8, "lr": 0.1}}},
     "start.onnx enters the ladder at export: teacher would not run; remove it"),
    ({"export.rungs": ["teacher", "student"]}, "export.rungs: an ONNX start has student here"),
    ({"export.rungs": []}, "export.rungs: an ONNX start has student here"),
    ({"deploy.rungs": ["pruned"]}, "deploy.rungs: an ONNX start has student, student_fp16, student_int8 here"),
    ({"deploy": {"runtimes": 3}}, "deploy.runtimes: Input should be a valid list"),
    ({"quantize": 5}, "quantize: Input should be a valid dictionary"),
    ({"quantize.qat": {"epochs": 1, "batch_size": 8, "lr": 0.001}}, "quantize.qat needs the PyTorch model"),
    ({"deploy.runtimes": ["tensorrt", "torch_tensorrt"]}, "torch_tensorrt compiles the PyTorch model"),
    ({"start.layout": "nwhc"}, "start.layout: Input should be 'nchw' or 'nhwc'"),
])
def test_what_an_onnx_start_cannot_do_is_refused_by_the_recipe(changes, said):
    assert said in config_error(start_recipe(**changes))


def test_a_recipe_without_a_start_still_needs_its_teacher():
    raw = start_recipe()
    del raw["start"]
    message = config_error(raw)
    for section in ("teacher", "prune", "distill"):
        assert f"{section}: required; the ladder starts from a PyTorch teacher" in message
    assert "MODEL=path/to/model.onnx" in message


def test_model_equals_an_onnx_file_reads_its_layout_and_size_and_says_what_it_assumed(tmp_path):
    path = onnx_models.export(onnx_models_channels_last(small_net()), tmp_path / "My Net.onnx", (1, 16, 16, 3))
    recipe, recipe_path, sha = load_recipe(str(path), {"data.source": "digits"})
    assert recipe.name == "My_Net.onnx" and recipe.start.layout == "nhwc" and recipe.start.onnx == str(path)
    assert recipe.preprocess.input_size == 16 and recipe.preprocess.mean == [0.485, 0.456, 0.406]
    assert "ImageNet's mean and std (assumed" in recipe._preprocess_from
    assert recipe_path == path and len(sha) == 64
    with pytest.raises(ConfigError) as err:  # no DATA: where the images are is asked for
        load_recipe(str(path), {})
    assert "data: required; say where the images are" in err.value.message
    with pytest.raises(ConfigError, match="does not exist"):
        load_recipe(str(tmp_path / "missing.onnx"), {"data.source": "digits"})


@pytest.mark.parametrize("kind, said", [
    ("text", "is not a valid ONNX model (sha256 "),
    ("two inputs", "has 2 inputs (image, mask)"),
    ("seven classes", "the data has 10 classes"),
])
def test_a_bad_file_is_refused_before_any_stage_and_leaves_nothing(tmp_path, kind, said):
    """Through the CLI as a user runs it: the refusal names the problem and the fix; no run folder, no latest."""
    bad = tmp_path / "bad.onnx"
    if kind == "text":
        bad.write_text("not a model\n")
    elif kind == "two inputs":
        onnx_models.export(TwoInputs(), bad, (1, 3, 16, 16), input_names=("image", "mask"))
    else:
        onnx_models.export(small_net(classes=7), bad, (1, 3, 16, 16))
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    result = subprocess.run([sys.executable, "-m", "pipeline", "run", str(bad), "--data", "digits", "--runs-dir",
                             str(tmp_path / "runs")], capture_output=True, text=True, timeout=300, env=env,
                            cwd=Path(__file__).resolve().parents[2])
    assert result.returncode != 0
    assert said in result.stderr and "fix:" in result.stderr
    assert "[ teacher] not in this run: the ladder starts at export from" in result.stderr
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------------------------------------- whole runs
@pytest.fixture(scope="module")
@slow_fixture
def trained(tmp_path_factory) -> Path:
    """The trained ShuffleNet as its user's code exports it (their I/O names, a dynamic batch)."""
    assert onnx_models.ARCH not in ARCHITECTURES  # the point: a model EdgeFold cannot build
    return onnx_models.trained_onnx(tmp_path_factory.mktemp("onnx") / "shufflenet.onnx")


def test_a_trained_torchvision_model_not_in_the_registry_goes_to_int8_and_is_measured(repo, tmp_path, trained):
    """``make edge MODEL=model.onnx DATA=digits``: the given graph is the student; its FP16 and INT8 forms are written
    by the same ladder; the three are measured on a loopback agent; the report says which rungs are absent and why."""
    if subprocess.run(["which", "make"], capture_output=True).returncode:
        pytest.skip("make is not installed")
    settings = ["preprocess.mean=[0.3,0.3,0.3]", "preprocess.std=[0.38,0.38,0.38]", "deploy.duration_s=0.1",
                "deploy.rounds=2", "deploy.batch_sizes=[1,8]", "deploy.idle_s=0.1", "deploy.warmup_iterations=3",
                "quantize.accuracy_budget_points=3.0", "data.calib_size=128"]
    venv = Path(sys.prefix)
    result = subprocess.run(["make", "-s", f"VENV={venv}", "-o", f"{venv}/.edgefold-installed", "edge",
                             f"MODEL={trained}", "DATA=digits", f"RUNS={tmp_path / 'runs'}", f"SET={' '.join(settings)}"],
                            cwd=repo, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    run = tmp_path / "runs" / "shufflenet.onnx" / "latest"  # named after the whole file name
    stages = json.loads((run / "manifest.json").read_text())["stages"]
    assert set(stages) == {"data", "export", "quantize", "evaluate", "deploy", "report"}
    student = stages["export"]["metrics"]["rungs"]["student"]
    assert student["started_from"]["sha256"] == stages["export"]["config"]["start"]["sha256"]
    assert student["parity"]["max_abs_diff"] < 1e-4 and student["scores"]["top1"] > 0.6
    rungs = stages["evaluate"]["metrics"]["rungs"]
    assert list(rungs) == ["student", "student_fp16", "student_int8"] and stages["evaluate"]["metrics"]["baseline"] == "student"
    assert 0.0005 < rungs["student"]["macs_g"] < 0.001  # ShuffleNetV2 ×0.5 at 32 px: about 0.84 M
    assert abs(rungs["student_int8"]["top1_delta_points"]) <= 3.0
    assert stages["deploy"]["metrics"]["jobs_succeeded"] == stages["deploy"]["metrics"]["jobs"] == 3
    report = (run / "report" / "report.md").read_text()
    assert "Not in this ladder: teacher, teacher_fp16, pruned — the ladder starts at export from" in report
    assert "student INT8 on loopback vs given model FP32 on loopback" in report
    results = json.loads((run / "report" / "results.json").read_text())
    assert set(results["absent_rungs"]) == {"teacher", "teacher_fp16", "pruned"}


def test_the_export_is_cached_on_the_files_bytes(tmp_path, trained):
    """Stale-cache protection keyed on the user's file: the same bytes reuse the export, a re-exported file (an
    NHWC graph at an old opset here) redoes it and everything after it."""
    from pipeline.runner import run_pipeline

    path = tmp_path / "model.onnx"
    path.write_bytes(trained.read_bytes())
    recipe = start_recipe(**{"start": {"onnx": str(path)}, "data.calib_size": 64})
    recipe["preprocess"] = {**onnx_models.PREPROCESS}
    (tmp_path / "mine.yaml").write_text(yaml.safe_dump(recipe))
    first = run_pipeline(str(tmp_path / "mine.yaml"), until="export", runs_dir=tmp_path / "runs")
    exported = json.dumps(first.manifest.stage("export"))
    again = run_pipeline(str(tmp_path / "mine.yaml"), until="export", runs_dir=tmp_path / "runs")
    assert json.dumps(again.manifest.stage("export")) == exported  # cached: the same record
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        onnx_models.trained_onnx(path, opset=11)  # the same network, re-exported: other bytes, the same recipe
    redone = run_pipeline(str(tmp_path / "mine.yaml"), until="export", runs_dir=tmp_path / "runs")
    student = redone.manifest.stage("export")["metrics"]["rungs"]["student"]
    assert student["started_from"]["opset"] == 11 and "opset 11 → 13" in student["changes"]
    before = first.manifest.stage("export")["metrics"]["rungs"]["student"]["scores"]["top1_correct"]
    assert abs(student["scores"]["top1_correct"] - before) <= 1  # float rounding may flip one image's argmax


def test_a_run_of_another_ladder_is_never_resumed(tmp_path):
    """A recipe that now starts from an ONNX file must not read the teacher and student its run dir still holds:
    the latest run is left as it is and a new one begins; a RUN= naming it is refused."""
    from pipeline.core.manifest import Manifest
    from pipeline.runner import resolve_run_dir

    old = tmp_path / "mine" / "20260101-000000"
    manifest = Manifest.open(old, "mine")
    manifest.record("teacher", {"outputs": {}, "sha256": {}, "metrics": {}})
    manifest.save()
    (tmp_path / "mine" / "latest").symlink_to(old.name)
    assert resolve_run_dir(tmp_path, "mine", None, False) == old  # a PyTorch ladder resumes it
    fresh = resolve_run_dir(tmp_path, "mine", None, False, absent=["teacher", "prune", "distill"])
    assert fresh != old and fresh.parent == old.parent
    with pytest.raises(ConfigError, match="holds teacher of a ladder this recipe does not run"):
        resolve_run_dir(tmp_path, "mine", old.name, False, absent=["teacher"])
