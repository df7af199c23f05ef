"""The runners behind the one interface: ONNX Runtime and Torch really run here; TensorRT where it exists."""

import numpy as np
import pytest

from device.uploads.artifacts import UnsafeArtifactError
from device.errors import ConfigError, RunnerError, UnknownKeyError
from device.runners import RUNNERS, make_runner
from tests.device.agent_process import tiny_onnx


def test_registry_suggests_near_runtimes():
    assert RUNNERS.names() == ["onnxruntime", "tensorrt", "torch", "torch_tensorrt"]
    with pytest.raises(UnknownKeyError) as err:
        make_runner("onnxruntim", "x.onnx")
    assert "onnxruntime" in err.value.fix


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch = pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("torch")
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                                torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10)).eval()
    example = torch.randn(2, 3, 16, 16)
    program = torch.export.export(model, (example,),
                                  dynamic_shapes=({0: torch.export.Dim("batch", min=1, max=64)},))
    torch.export.save(program, folder / "model.pt2")
    return model, folder / "model.pt2"


@pytest.fixture(scope="module")
def device_checkpoint(tmp_path_factory):
    """tiny_resnet's device checkpoint as the export stage writes it (state, architecture identity, input C×H×W)."""
    torch = pytest.importorskip("torch")
    from pipeline.checkpoint import save_checkpoint
    from pipeline.models import build_model
    from pipeline.tasks.classification.torch_export import write_device_checkpoint

    folder = tmp_path_factory.mktemp("checkpoint")
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 10).eval()
    checkpoint = save_checkpoint(folder / "model.pt", model, "tiny_resnet", 10)
    return model, write_device_checkpoint(checkpoint, folder / "student.device.pt", (3, 16, 16))


@pytest.mark.parametrize("artifact", ["device checkpoint", "program (trusted)"])
def test_torch_runner_matches_eager_and_takes_any_batch(exported, device_checkpoint, artifact):
    import torch

    model, path = device_checkpoint if artifact == "device checkpoint" else exported
    batch = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with make_runner("torch", str(path), trust_programs=artifact != "device checkpoint") as runner:
        assert runner.input_chw == (3, 16, 16) and runner.device.type == "cpu"
        out = runner.infer(batch)
        assert runner.infer(batch[:1]).shape == (1, 10)
        loaded = runner.runtime_facts()["loaded_from"]
    assert loaded["artifact"] == ("device checkpoint" if artifact == "device checkpoint" else "torch.export program")
    with torch.inference_mode():
        expected = model(torch.from_numpy(batch)).numpy()
    np.testing.assert_allclose(out, expected, atol=1e-5)


def test_torch_runner_refuses_an_int8_checkpoint_it_would_run_in_float(tmp_path, device_checkpoint):
    pytest.importorskip("modelopt.torch.quantization")
    from pipeline.quantize.modelopt_state import calibrate

    _, path = device_checkpoint
    int8 = tmp_path / "student.int8.device.pt"
    calibrate(path, np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32), int8)
    with pytest.raises(ConfigError, match="carries ModelOpt's INT8 quantizers: the torch runner runs float rungs"):
        make_runner("torch", str(int8)).load()


def test_torch_runner_refuses_what_a_cpu_cannot_do(exported, tmp_path):
    _, path = exported
    with pytest.raises(ConfigError, match="needs a CUDA GPU"):
        make_runner("torch", str(path), precision="fp16").load()
    with pytest.raises(ConfigError, match="fp32, fp16 or bf16"):
        make_runner("torch", str(path), precision="int8")
    bogus = tmp_path / "bogus.pt2"
    bogus.write_bytes(b"PK\x03\x04 not really")
    with pytest.raises(UnsafeArtifactError, match="fails the torch-export check"):
        make_runner("torch", str(bogus), trust_programs=True).load()


def test_onnxruntime_runner_reports_its_input(tmp_path):
    path = tiny_onnx(tmp_path / "m.onnx", channels=1, size=8)
    with make_runner("onnxruntime", str(path), threads=1) as runner:
        assert runner.input_chw == (1, 8, 8)
        assert runner.infer(np.zeros((3, 1, 8, 8), np.float32)).shape == (3, 10)


@pytest.mark.gpu
def test_torch_runner_cuda_graphs_and_half_precision(exported):
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    model, path = exported
    batch = np.random.default_rng(0).standard_normal((8, 3, 16, 16)).astype(np.float32)
    with torch.inference_mode():
        expected = model(torch.from_numpy(batch)).numpy()
    for precision, tolerance in (("fp32", 1e-3), ("bf16", 5e-2), ("fp16", 1e-2)):
        with make_runner("torch", str(path), precision=precision, cuda_graphs=True, trust_programs=True) as runner:
            np.testing.assert_allclose(runner.infer(batch), expected, atol=tolerance)


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_tensorrt_runner_matches_onnxruntime(tmp_path):
    pytest.importorskip("tensorrt")
    path = tiny_onnx(tmp_path / "m.onnx")
    batch = np.random.default_rng(0).standard_normal((4, 3, 16, 16)).astype(np.float32)
    with make_runner("onnxruntime", str(path)) as reference:
        expected = reference.infer(batch)
    with make_runner("tensorrt", str(path), precision="fp32", batch_sizes=(1, 4),
                     engine_cache=str(tmp_path / "engines")) as runner:
        assert runner.built_now and runner.input_chw == (3, 16, 16)
        np.testing.assert_allclose(runner.infer(batch), expected, atol=1e-3)
    with make_runner("tensorrt", str(path), precision="fp32", batch_sizes=(1, 4),
                     engine_cache=str(tmp_path / "engines")) as runner:
        assert not runner.built_now, "the second load comes from the engine cache"


def test_onnxruntime_runner_profiles_on_a_second_session(tmp_path):
    """The profiling pass never touches the timed session (profiling is a session option)."""
    path = tiny_onnx(tmp_path / "m.onnx", channels=1, size=8)
    with make_runner("onnxruntime", str(path), threads=1) as runner:
        timed = runner.session
        table = runner.profile_batch(np.zeros((2, 1, 8, 8), np.float32), iterations=2, warmup=1)
        assert runner.session is timed and runner.batch_sizes is None
    assert table.batch_size == 2 and table.iterations == 2 and {l.kind for l in table.layers} >= {"Gemm"}


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_tensorrt_runner_per_batch_engines_and_layer_profile(tmp_path):
    """On real TensorRT: one engine per batch, the smoke inference inside them, and the per-layer table."""
    pytest.importorskip("tensorrt")
    from device.jobs.jobrun import smoke
    from device.jobs.profile import Profile, profile_runner
    from tests.device.trt_standin import qdq_classifier

    model = qdq_classifier(tmp_path / "int8.onnx")
    with make_runner("tensorrt", str(model), precision="int8", batch_sizes=(8, 32),
                     engine_cache=str(tmp_path / "engines")) as runner:
        assert smoke(runner, (3, 16, 16), None)["output_shape"] == [8, 10]
        with pytest.raises(RunnerError, match="outside the engines"):
            runner.infer(np.zeros((1, 3, 16, 16), np.float32))
        assert "--optShapes=input:32x3x16x16" in runner.trtexec[32]
        profile, note = profile_runner(runner, [8, 32], (3, 16, 16), iterations=5, warmup=2)
    assert note is None, note
    table = Profile.model_validate(profile).batch(32)
    assert table.layers and table.int8_share > 0 and all(l.device == "gpu" for l in table.layers)
