"""The build side of the Torch-TensorRT road, for real on CPU with tiny_resnet: the float rung's torch.export
program and ModelOpt's INT8 quantizer state (calibrated, saved, restored into a fresh student, gated)."""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def student():
    from pipeline.models import build_model

    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    # Non-trivial BatchNorm statistics, so that folding them matters.
    with torch.no_grad():
        model.train()
        for _ in range(3):
            model(torch.randn(16, 3, 16, 16))
    return model.eval()


@pytest.fixture(scope="module")
def images():
    return np.random.default_rng(0).standard_normal((48, 3, 16, 16)).astype(np.float32)


def test_float_program_records_its_torch_and_runs_as_the_model(tmp_path, student, images):
    from device.runners.torch_tensorrt import read_program_versions
    from pipeline.torch_export import check_program_parity, export_program

    path = tmp_path / "student.pt2"
    facts = export_program(student, path, (1, 3, 16, 16))
    assert facts["torch"] == torch.__version__ and facts["aten_ops"] > 5
    versions = read_program_versions(path)  # what the device reads, without torch
    assert versions.torch == torch.__version__ and f"{versions.schema[0]}.{versions.schema[1]}" == facts["schema"]
    parity = check_program_parity(student, path, images)
    assert parity["max_abs_diff"] < 1e-4 and parity["top1_agreement"] == 1.0
    # The batch axis is dynamic: the runtime re-exports at each measured batch.
    program = torch.export.load(path)
    assert program.module()(torch.zeros(5, 3, 16, 16)).shape == (5, 10)


@pytest.fixture(scope="module")
def student_checkpoint(tmp_path_factory, student):
    from pipeline.checkpoint import save_checkpoint

    return save_checkpoint(tmp_path_factory.mktemp("student") / "model.pt", student, "tiny_resnet", 10)


def test_modelopt_state_restores_into_a_fresh_student(tmp_path, student, student_checkpoint, images):
    pytest.importorskip("modelopt.torch.quantization")
    from pipeline.modelopt_state import MODELOPT_METHODS, calibrate, restore

    path = tmp_path / "student.int8.device.pt"
    record = calibrate(student_checkpoint, images[:32], path, "max")
    assert record["modelopt_algorithm"] == "max" and record["quantizers"] > 0
    recorded = json.loads((tmp_path / "student.int8.device.pt.json").read_text())
    assert recorded["calibration_images"] == 32 and recorded["input_chw"] == [3, 16, 16]
    assert MODELOPT_METHODS["entropy"] == "mse" and MODELOPT_METHODS["percentile"] == "mse"

    restored = restore(path)  # a fresh student, rebuilt from the file alone, as the device rebuilds it
    quantizers = {name: module for name, module in restored.named_modules()
                  if type(module).__name__ == "TensorQuantizer"}
    assert len(quantizers) == record["quantizers"]
    assert all(q.amax is not None for q in quantizers.values() if q.is_enabled)
    test = torch.from_numpy(images[32:])
    with torch.no_grad():
        fake_quant = restored(test)
        reference = student(test)
    # Fake quantization changes the logits (the quantizers are live) but keeps them close.
    difference = (fake_quant - reference).abs().max().item()
    assert 0 < difference < 0.5 * reference.abs().max().item()


def test_the_device_checkpoint_loads_with_weights_only_and_passes_the_upload_check(tmp_path, student_checkpoint,
                                                                                    images):
    """What the agent accepts at upload (pickle globals read without torch) and what torch.load(weights_only=True)
    reads: the whole INT8 device checkpoint, ModelOpt's state included."""
    pytest.importorskip("modelopt.torch.quantization")
    from device.artifacts import check
    from device.files import sha256_file
    from pipeline.modelopt_state import calibrate

    path = tmp_path / "student.int8.device.pt"
    calibrate(student_checkpoint, images[:32], path, "max")
    payload = torch.load(path, weights_only=True)
    assert payload["modelopt"]["state"]["modelopt_state_dict"] and payload["input_chw"] == [3, 16, 16]
    sha = sha256_file(path)
    assert check(path, sha, sha, path.stat().st_size) == "torch-checkpoint"


def test_an_upload_that_pickles_a_module_is_refused_naming_the_global(tmp_path):
    from device.artifacts import ArtifactError, check
    from device.files import sha256_file

    path = tmp_path / "module.pt"
    torch.save({"format": "edgefold.checkpoint/1", "model": torch.nn.Linear(2, 2)}, path)
    sha = sha256_file(path)
    with pytest.raises(ArtifactError, match="a file of tensors never needs") as err:
        check(path, sha, sha, path.stat().st_size)
    assert err.value.status == 422 and "torch.nn.modules.linear.Linear" in err.value.message


def test_a_float_checkpoint_is_not_restored_as_int8(tmp_path, student_checkpoint):
    from device.errors import CheckpointError
    from pipeline.modelopt_state import restore

    with pytest.raises(CheckpointError, match="no ModelOpt quantizer state") as err:
        restore(student_checkpoint)
    assert "--force quantize" in err.value.fix


def test_a_state_for_another_student_is_refused(tmp_path, student_checkpoint, images):
    pytest.importorskip("modelopt.torch.quantization")
    from device.errors import CheckpointError
    from pipeline.modelopt_state import calibrate, restore

    path = tmp_path / "student.int8.device.pt"
    calibrate(student_checkpoint, images[:32], path, "max")
    payload = torch.load(path, weights_only=True)
    payload["modelopt"]["state_dict"] = {k: v for k, v in payload["modelopt"]["state_dict"].items()
                                         if not k.endswith("_amax")}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="ModelOpt") as err:
        restore(path)
    assert "--force quantize" in err.value.fix


# ------------------------------------------------------------------ the recipe key and the stages
def test_roads_default_to_the_onnx_road_and_unknown_ones_are_refused(repo):
    import yaml

    from device.errors import ConfigError
    from pipeline.core.recipe import parse_recipe

    raw = yaml.safe_load((repo / "models" / "tiny.yaml").read_text())
    assert parse_recipe(raw).deploy.runtimes == ["tensorrt"]
    raw["deploy"]["runtimes"] = ["tensorrt", "torch_tensorrt"]
    assert parse_recipe(raw).deploy.runtimes == ["tensorrt", "torch_tensorrt"]
    for wrong, why in ((["tensorrt", "torchtrt"], r"deploy\.runtimes"), (["tensorrt", "tensorrt"], "once"),
                       ([], r"deploy\.runtimes")):
        raw["deploy"]["runtimes"] = wrong
        with pytest.raises(ConfigError, match=why):
            parse_recipe(raw)


@pytest.fixture(scope="module")
def torch_road_run(tiny_run, tmp_path_factory):
    """The tiny run's export and quantize stages again with both roads selected."""
    import shutil

    from pipeline.runner import run_pipeline

    runs = tmp_path_factory.mktemp("torchroad")
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    return run_pipeline("tiny", runs_dir=runs, run_id="shared", until="quantize",
                        overrides={"deploy.runtimes": ["tensorrt", "torch_tensorrt"]})


def test_export_stage_writes_a_program_per_float_rung(torch_road_run):
    from device.runners.torch_tensorrt import read_program_versions

    entry = torch_road_run.manifest.stage("export")
    for rung in ("teacher", "pruned", "student"):
        path = torch_road_run.run_dir / entry["outputs"][f"{rung}_pt2"]
        assert path.is_file() and read_program_versions(path).torch == torch.__version__
        program = entry["metrics"]["rungs"][rung]["program"]
        assert program["parity"]["top1_agreement"] == 1.0 and program["torch"] == torch.__version__
    assert "student_fp16_pt2" not in entry["outputs"]  # the device casts the student's program itself
    # Beside each program, the rung's device checkpoint, for a device whose torch cannot load the program.
    from device.torch_checkpoint import load_for_export

    chw = tuple(torch_road_run.preprocess.input_shape(1)[1:])
    for rung in ("teacher", "pruned", "student"):
        _, facts = load_for_export(torch_road_run.run_dir / entry["outputs"][f"{rung}_device_checkpoint"])
        assert not facts["quantized"] and facts["input_chw"] == chw


def test_quantize_stage_ships_the_modelopt_state_behind_the_gate(torch_road_run):
    pytest.importorskip("modelopt.torch.quantization")
    entry = torch_road_run.manifest.stage("quantize")
    state = torch_road_run.run_dir / entry["outputs"]["student_int8_device_checkpoint"]
    assert state.is_file() and entry["metrics"]["torch_road"]["modelopt_algorithm"] == "max"
    from device.torch_checkpoint import load_for_export

    assert load_for_export(state)[1]["quantized"]  # the file the device gets holds the quantizers
    road = entry["metrics"]["torch_road"]
    assert road["calibration_images"] == torch_road_run.recipe.data.calib_size  # the ONNX road's images
    assert road["drop_points"] <= torch_road_run.recipe.quantize.accuracy_budget_points
    assert 0.5 < road["top1"] <= 1.0
