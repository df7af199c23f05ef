"""The build side of the Torch-TensorRT road, for real on CPU with tiny_resnet: the float rung's torch.export
program and ModelOpt's INT8 quantizer state (calibrated, saved, restored into a fresh student, gated)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from tests.slow import slow_fixture

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
    from pipeline.tasks.classification.torch_export import export_program, runner_parity

    path = tmp_path / "student.pt2"
    facts = export_program(student, path, (1, 3, 16, 16))
    assert facts["torch"] == torch.__version__ and facts["aten_ops"] > 5
    versions = read_program_versions(path)  # what the device reads, without torch
    assert versions.torch == torch.__version__ and f"{versions.schema[0]}.{versions.schema[1]}" == facts["schema"]
    parity = runner_parity(student, path, images)
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
    from pipeline.quantize.modelopt_state import MODELOPT_METHODS, calibrate, restore

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
    from device.uploads.artifacts import check
    from device.files import sha256_file
    from pipeline.quantize.modelopt_state import calibrate

    path = tmp_path / "student.int8.device.pt"
    calibrate(student_checkpoint, images[:32], path, "max")
    payload = torch.load(path, weights_only=True)
    assert payload["modelopt"]["state"]["modelopt_state_dict"] and payload["input_chw"] == [3, 16, 16]
    sha = sha256_file(path)
    assert check(path, sha, sha, path.stat().st_size) == "torch-checkpoint"


def test_an_upload_that_pickles_a_module_is_refused_naming_the_global(tmp_path):
    from device.uploads.artifacts import ArtifactError, check
    from device.files import sha256_file

    path = tmp_path / "module.pt"
    torch.save({"format": "edgefold.checkpoint/1", "model": torch.nn.Linear(2, 2)}, path)
    sha = sha256_file(path)
    with pytest.raises(ArtifactError, match="a file of tensors never needs") as err:
        check(path, sha, sha, path.stat().st_size)
    assert err.value.status == 422 and "torch.nn.modules.linear.Linear" in err.value.message


def test_a_float_checkpoint_is_not_restored_as_int8(tmp_path, student_checkpoint):
    from device.errors import CheckpointError
    from pipeline.quantize.modelopt_state import restore
    from pipeline.tasks.classification.torch_export import write_device_checkpoint

    float_device = write_device_checkpoint(student_checkpoint, tmp_path / "student.device.pt", (3, 16, 16))
    with pytest.raises(CheckpointError, match="no ModelOpt quantizer state") as err:
        restore(float_device)
    assert "--force quantize" in err.value.fix


def test_a_state_for_another_student_is_refused(tmp_path, student_checkpoint, images):
    pytest.importorskip("modelopt.torch.quantization")
    from device.errors import CheckpointError
    from pipeline.quantize.modelopt_state import calibrate, restore

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


def test_export_stage_writes_a_device_checkpoint_per_float_rung_and_no_program(torch_road_run):
    """The road's artifact is data: each float rung's device checkpoint, rebuilt here by the device's own loader and
    checked against the rung; no program unless deploy.torch_programs asks for one."""
    from device.uploads.torch_checkpoint import load_for_export
    from pipeline.tasks.classification.images import preprocess_of

    entry = torch_road_run.manifest.stage("export")
    chw = tuple(preprocess_of(torch_road_run).input_shape(1)[1:])
    for rung in ("teacher", "pruned", "student"):
        assert f"{rung}_pt2" not in entry["outputs"]
        _, facts = load_for_export(torch_road_run.run_dir / entry["outputs"][f"{rung}_device_checkpoint"])
        assert not facts["quantized"] and facts["input_chw"] == chw and facts["source"] == "built-in (test model)"
        parity = entry["metrics"]["rungs"][rung]["device_checkpoint"]["parity"]
        assert parity["top1_agreement"] == 1.0 and parity["max_abs_diff"] < 1e-4
    assert "student_fp16_device_checkpoint" not in entry["outputs"]  # the device casts the student itself


def test_torch_programs_needs_the_torch_road(repo):
    import yaml

    from device.errors import ConfigError
    from pipeline.core.recipe import parse_recipe

    raw = yaml.safe_load((repo / "models" / "tiny.yaml").read_text())
    raw["deploy"]["torch_programs"] = True
    with pytest.raises(ConfigError, match="add torch_tensorrt to deploy.runtimes"):
        parse_recipe(raw)


def test_torch_programs_is_refused_before_any_upload_when_an_agent_does_not_trust_programs(tiny_run, tmp_path):
    """A clear error before the first stage runs, naming the agent and both ways out."""
    import shutil

    from device.errors import ConfigError
    from pipeline.deploy.devices import Device
    from pipeline.runner import run_pipeline
    from tests.device.agent_process import AgentProcess

    runs = tmp_path / "runs"
    shutil.copytree(tiny_run.run_dir, runs / "tiny" / "shared")
    with AgentProcess(tmp_path / "agent") as agent:
        orin = Device("orin", "edge", agent.url, "edge", str(agent.token_file))
        with pytest.raises(ConfigError, match=r"orin \(http.*\) does not trust programs") as err:
            run_pipeline("tiny", runs_dir=runs, run_id="shared", devices=[orin],
                         overrides={"deploy.runtimes": ["tensorrt", "torch_tensorrt"], "deploy.torch_programs": True})
        assert "leave deploy.torch_programs out" in err.value.fix and "--trust-programs" in err.value.fix
        assert not list((agent.data_dir / "artifacts").glob("*"))  # nothing was uploaded


@pytest.fixture(scope="module")
@slow_fixture
def both_roads_deployed(tiny_run, tmp_path_factory):
    """The tiny run deployed through the Torch-TensorRT road twice, on loopback agents whose job processes have the
    Torch-TensorRT STAND-IN (tests/device/torch_tensorrt_standin.py, compiling for the CPU): by default (a default
    agent gets each rung's device checkpoint), and with deploy.torch_programs (a trusted agent gets the programs)."""
    import shutil

    from pipeline.runner import run_pipeline
    from tests.device.torch_tensorrt_standin import sitecustomize_dir

    folder = tmp_path_factory.mktemp("roads-e2e")
    _, env = sitecustomize_dir(folder / "site", "2.14.0")
    runs = {}
    with pytest.MonkeyPatch.context() as patch:
        for key, value in env.items():  # the loopback agents inherit them; this process imported torch_tensorrt never
            patch.setenv(key, value)
        # The program run reads the Torch-TensorRT road alone: its ONNX road would measure the checkpoint run's again
        for name, extra in (("checkpoint", {"deploy.runtimes": ["tensorrt", "torch_tensorrt"]}),
                            ("program", {"deploy.runtimes": ["torch_tensorrt"], "deploy.torch_programs": True})):
            shutil.copytree(tiny_run.run_dir, folder / name / "tiny" / "shared")
            runs[name] = run_pipeline("tiny", runs_dir=folder / name, run_id="shared", until="deploy",
                                      overrides={"deploy.rounds": 1,
                                                 "deploy.batch_sizes": [1], "deploy.duration_s": 0.05,
                                                 "deploy.idle_s": 0, "deploy.retries": 0, **extra})
    return runs


@pytest.fixture(scope="module")
def torch_road_run(both_roads_deployed):
    """The tiny run with both roads selected (its export and quantize stages), as deployed by default."""
    return both_roads_deployed["checkpoint"]


def road_top1(run) -> tuple[dict[str, str], dict[str, float], dict[str, list[int]], dict]:
    results = json.loads((run.run_dir / run.manifest.stage("deploy")["outputs"]["results"]).read_text())
    road = results["devices"][0]["roads"]["torch_tensorrt"]
    labels = np.asarray(results["evaluation"]["labels"])
    top1, predictions = {}, {}
    for rung, entry in road["rungs"].items():
        if entry["state"] == "succeeded":
            predictions[rung] = [p[0] for p in entry["result"]["evaluation"]["predictions"]]
            top1[rung] = float((np.asarray(predictions[rung]) == labels).mean())
    return road["sent"], top1, predictions, results


def test_the_torch_road_deploys_device_checkpoints_with_the_programs_device_top1(both_roads_deployed):
    sent, top1, _, results = road_top1(both_roads_deployed["checkpoint"])
    program_sent, program_top1, _, _ = road_top1(both_roads_deployed["program"])
    float_rungs = ("teacher", "pruned", "student", "teacher_fp16", "student_fp16")
    assert all(sent[rung].startswith("device checkpoint") for rung in sent), sent
    assert all(program_sent[rung].startswith("torch.export program") for rung in float_rungs), program_sent
    # The INT8 rung is always its device checkpoint (ModelOpt's export needs CUDA): on this CPU agent it fails on both
    # runs with that reason, and every float rung is measured on both.
    assert set(top1) == set(program_top1) == set(float_rungs), (top1, program_top1)
    assert top1 == program_top1
    assert top1["student"] > 0.5 and results["evaluation"]["images"] >= 100
    # With deploy.torch_programs the export stage wrote each float rung's program too, checked the same way.
    exported = both_roads_deployed["program"].manifest.stage("export")
    for rung in ("teacher", "pruned", "student"):
        assert exported["metrics"]["rungs"][rung]["program"]["parity"]["top1_agreement"] == 1.0
        assert f"{rung}_pt2" in exported["outputs"] and f"{rung}_device_checkpoint" in exported["outputs"]


def test_the_plain_torch_runner_scores_the_device_checkpoints_the_same(both_roads_deployed, tmp_path):
    from device.schema import EvaluationSpec
    from pipeline.tasks.classification.deployed import ClassificationDeploy
    from tests.device.agent_process import AgentProcess

    run = both_roads_deployed["checkpoint"]
    _, top1, predictions, results = road_top1(run)
    images = ClassificationDeploy().evaluation_inputs(run.manifest, None, results["evaluation"]["indices"])
    np.save(tmp_path / "evaluation.npy", images)
    exported = run.manifest.stage("export")["outputs"]
    with AgentProcess(tmp_path / "agent") as agent, agent.client() as client:
        scoring = EvaluationSpec(artifact=client.upload(tmp_path / "evaluation.npy"), images=len(images), top_k=1)
        for rung in ("teacher", "pruned", "student"):
            artifact = client.upload(run.run_dir / exported[f"{rung}_device_checkpoint"])
            job = client.submit({"artifact": artifact, "runtime": "torch", "precision": "fp32", "batch_sizes": [1],
                                 "iterations": 2, "warmup_iterations": 1, "idle_s": 0, "telemetry": ["host"],
                                 "evaluation": scoring.model_dump()})
            done = client.wait(job["id"], timeout_s=300)
            assert done["state"] == "succeeded", done["error"]
            assert done["result"]["runtime"]["loaded_from"]["artifact"] == "device checkpoint"
            assert [p[0] for p in done["result"]["evaluation"]["predictions"]] == predictions[rung], rung


def test_quantize_stage_ships_the_modelopt_state_behind_the_gate(torch_road_run):
    pytest.importorskip("modelopt.torch.quantization")
    entry = torch_road_run.manifest.stage("quantize")
    state = torch_road_run.run_dir / entry["outputs"]["student_int8_device_checkpoint"]
    assert state.is_file() and entry["metrics"]["torch_road"]["modelopt_algorithm"] == "max"
    from device.uploads.torch_checkpoint import load_for_export

    assert load_for_export(state)[1]["quantized"]  # the file the device gets holds the quantizers
    road = entry["metrics"]["torch_road"]
    assert road["calibration_images"] == torch_road_run.recipe.data.calib_size  # the ONNX road's images
    assert road["drop_points"] <= torch_road_run.recipe.quantize.accuracy_budget_points
    assert 0.5 < road["top1"] <= 1.0
