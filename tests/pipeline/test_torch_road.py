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


def test_modelopt_state_restores_into_a_fresh_student(tmp_path, student, images):
    pytest.importorskip("modelopt.torch.quantization")
    from pipeline.models import build_model
    from pipeline.modelopt_state import MODELOPT_METHODS, calibrate, restore

    path = tmp_path / "student.modelopt.pth"
    record = calibrate(student, images[:32], path, "max")
    assert record["modelopt_algorithm"] == "max" and record["quantizers"] > 0
    assert json.loads((tmp_path / "student.modelopt.pth.json").read_text())["calibration_images"] == 32
    assert MODELOPT_METHODS["entropy"] == "mse" and MODELOPT_METHODS["percentile"] == "mse"

    fresh = build_model("tiny_resnet", 10)
    fresh.load_state_dict(student.state_dict())
    restored = restore(fresh, path)
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


def test_a_student_without_the_state_is_not_restored(tmp_path, student):
    pytest.importorskip("modelopt.torch.quantization")
    from device.errors import CheckpointError
    from pipeline.modelopt_state import restore

    bogus = tmp_path / "none.pth"
    torch.save({"model_state_dict": student.state_dict()}, bogus)
    with pytest.raises(CheckpointError, match="no ModelOpt quantizer state") as err:
        restore(student, bogus)
    assert "--force quantize" in err.value.fix


# ------------------------------------------------------------------ the recipe key and the stages
def test_roads_default_to_the_onnx_road_and_unknown_ones_are_refused(repo):
    import yaml

    from device.errors import ConfigError
    from pipeline.recipe import parse_recipe

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


def test_quantize_stage_ships_the_modelopt_state_behind_the_gate(torch_road_run):
    pytest.importorskip("modelopt.torch.quantization")
    entry = torch_road_run.manifest.stage("quantize")
    state = torch_road_run.run_dir / entry["outputs"]["student_int8_modelopt"]
    assert state.is_file() and entry["metrics"]["torch_road"]["modelopt_algorithm"] == "max"
    road = entry["metrics"]["torch_road"]
    assert road["calibration_images"] == torch_road_run.recipe.data.calib_size  # the ONNX road's images
    assert road["drop_points"] <= torch_road_run.recipe.quantize.accuracy_budget_points
    assert 0.5 < road["top1"] <= 1.0
