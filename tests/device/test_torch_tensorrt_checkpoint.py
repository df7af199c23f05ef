"""The Torch-TensorRT road from a device checkpoint: the device rebuilds the rung (architecture registry, pruned
widths, ModelOpt's quantizer state) and exports it with its own torch. Against the Torch-TensorRT STAND-IN
(tests/device/torch_tensorrt_standin.py) compiling for the CPU; the INT8 rung's export needs CUDA, so here it is
restored for real and then refused with the reason, and the real thing runs where a GPU and Torch-TensorRT exist."""

from __future__ import annotations

import numpy as np
import pytest

from device.errors import DeviceError
from device.runners import make_runner
from device.runners.torch_tensorrt import artifact_kind
from device.runners.torch_tensorrt_rules import rules_for
from tests.device.test_torch_tensorrt import program, standin  # noqa: F401 (the fixture and the stand-in)

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory):
    """A pruned-width tiny_resnet's checkpoint, its float device checkpoint and its INT8 one (ModelOpt, max)."""
    from pipeline.checkpoint import save_checkpoint
    from pipeline.models import build_model
    from pipeline.tasks.classification.torch_export import write_device_checkpoint

    tmp = tmp_path_factory.mktemp("devckpt")
    torch.manual_seed(0)
    model = build_model("tiny_resnet", 5)
    # A pruned width (12 of 16 stem channels) that only the recorded structure can rebuild.
    import torch_pruning as tp

    group = tp.DependencyGraph().build_dependency(model, torch.zeros(1, 3, 16, 16)).get_pruning_group(
        model.stem[0], tp.prune_conv_out_channels, idxs=[0, 1, 2, 3])
    group.prune()
    model.eval()
    checkpoint = save_checkpoint(tmp / "model.pt", model, "tiny_resnet", 5)
    float_path = write_device_checkpoint(checkpoint, tmp / "student.device.pt", (3, 16, 16))
    images = np.random.default_rng(0).standard_normal((40, 3, 16, 16)).astype(np.float32)
    int8_path = None
    try:
        from pipeline.quantize.modelopt_state import calibrate

        int8_path = tmp / "student.int8.device.pt"
        calibrate(checkpoint, images[:32], int8_path, "max", (3, 16, 16))
    except ImportError:
        pass
    return model, float_path, int8_path, images


def test_a_device_checkpoint_is_told_from_a_program_without_torch(tmp_path, checkpoints, program):  # noqa: F811
    """By its stored suffix, and, under a name that says nothing, by what its zip holds."""
    import shutil

    _, float_path, _, _ = checkpoints
    assert artifact_kind(float_path) == "torch-checkpoint" and artifact_kind(program[1]) == "torch-export"
    shutil.copy(float_path, tmp_path / "a.bin")
    shutil.copy(program[1], tmp_path / "b.bin")
    assert artifact_kind(tmp_path / "a.bin") == "torch-checkpoint"
    assert artifact_kind(tmp_path / "b.bin") == "torch-export"
    (tmp_path / "c.bin").write_text("not a zip")
    with pytest.raises(DeviceError, match="not a zip archive"):
        artifact_kind(tmp_path / "c.bin")


@pytest.mark.parametrize("version", ["2.5.0", "2.14.0"])
def test_a_float_rung_is_rebuilt_and_exported_on_the_device(monkeypatch, tmp_path, checkpoints, version):
    model, float_path, _, images = checkpoints
    tt = standin(monkeypatch, version)
    with make_runner("torch_tensorrt", str(float_path), batch_sizes=(1, 4), engine_cache=str(tmp_path)) as runner:
        out = runner.infer(images[:4])
        info = runner.torch_tensorrt
    with torch.no_grad():
        eager = model(torch.from_numpy(images[:4])).numpy()
    np.testing.assert_allclose(out, eager, rtol=1e-4, atol=1e-5)  # the pruned widths came back
    assert runner.precision_built == "fp32" and [c["inputs"][0][0] for c in tt.calls] == [(1, 3, 16, 16),
                                                                                         (4, 3, 16, 16)]
    assert info["artifact"] == "device checkpoint" and info["exported_on_device"] and info["arch"] == "tiny_resnet"
    assert info["modelopt"] is None and f"torch {torch.__version__}" in info["notes"][0]


def test_an_int8_rung_is_restored_then_refused_without_cuda(monkeypatch, tmp_path, checkpoints):
    _, _, int8_path, _ = checkpoints
    if int8_path is None:
        pytest.skip("needs nvidia-modelopt")
    standin(monkeypatch, "2.14.0")
    calls = []
    import device.uploads.torch_checkpoint as device_checkpoint

    real = device_checkpoint.restore_quantized
    monkeypatch.setattr(device_checkpoint, "restore_quantized",
                        lambda *a, **k: calls.append(a[2]) or real(*a, **k))
    with pytest.raises(DeviceError, match="needs CUDA tensors") as err:
        make_runner("torch_tensorrt", str(int8_path), precision="int8", engine_cache=str(tmp_path)).load()
    assert calls == [str(int8_path)]  # restored first: a bad state would have been a CheckpointError
    assert "CUDA GPU" in err.value.fix


def test_the_int8_export_follows_its_releases_example():
    assert rules_for("2.5.0")["int8_export"].value == "torch.export._trace._export"
    assert rules_for("2.8.0")["int8_export"].value == "torch.export.export(strict=False)"
    assert "vgg16_ptq.py@v2.7.0" in rules_for("2.8.0")["int8_export"].source


def device_info(**changes) -> dict:
    """What an agent's GET /v1/device says that the road reads: its torch, whether it trusts programs, and the
    architecture sources it has (this machine's, by default)."""
    from device.models.architectures import architecture_sources

    return {"torch": torch.__version__, "trust_programs": False, "architectures": architecture_sources(), **changes}


def test_the_road_sends_the_device_checkpoint_and_a_program_only_where_trusted(checkpoints, program):  # noqa: F811
    from pipeline.tasks.classification.road_artifacts import RoadArtifacts, recorded_architecture

    _, float_path, int8_path, _ = checkpoints
    identity = recorded_architecture(float_path)
    assert identity == {"key": "tiny_resnet", "source": "built-in (test model)", "fingerprint": "",
                        "requirement": "torchvision"}
    both = RoadArtifacts(float_path, program[1], identity)
    sent, why = both.for_device(device_info())  # a default agent: data only
    assert sent == float_path and why.startswith("device checkpoint: the device rebuilds the module")
    assert both.for_device(device_info(trust_programs=True))[0] == program[1]
    # A trusting agent on another torch release (JetPack 6's NVIDIA torch) still gets the checkpoint.
    assert both.for_device(device_info(trust_programs=True, torch="2.5.0a0+nv24.08"))[0] == float_path
    assert RoadArtifacts(int8_path or float_path, None, identity).for_device(device_info())[0] == (
        int8_path or float_path)
    assert RoadArtifacts().for_device(device_info()) == (None, "no artifact for this rung on the "
                                                               "Torch-TensorRT road")


@pytest.mark.parametrize("identity,sources,reason", [
    ({"key": "tiny_resnet", "source": "built-in (test model)", "fingerprint": "", "requirement": "torchvision"},
     {"torchvision": None, "timm": None, "entry_points": {}}, "built from torchvision, which the device lacks"),
    ({"key": "timm/resnet10t", "source": "timm 1.0.31", "fingerprint": "timm 1.0.31", "requirement": "timm==1.0.31"},
     {"torchvision": "0.23.0", "timm": "1.0.20", "entry_points": {}}, "needs timm 1.0.31 .* has timm 1.0.20"),
    ({"key": "mynet", "source": "entry point nets:NET (nets 2.0)", "fingerprint": "nets 2.0, …",
      "requirement": "nets==2.0"}, {"torchvision": "0.23.0", "timm": None, "entry_points": {}},
     "comes from nets==2.0 and the device has no such entry point"),
])
def test_a_device_that_cannot_rebuild_the_architecture_is_sent_nothing_and_told_what_to_install(
        tmp_path, identity, sources, reason):
    from pipeline.tasks.classification.road_artifacts import RoadArtifacts

    sent, why = RoadArtifacts(tmp_path / "x.device.pt", None, identity).for_device(
        {"torch": torch.__version__, "architectures": sources})
    assert sent is None
    import re

    assert re.search(reason, why) and f"pip install '{identity['requirement']}'" in why


def _edited(path, tmp_path, change) -> "Path":
    payload = torch.load(path, weights_only=True)
    change(payload)
    edited = tmp_path / "edited.device.pt"
    torch.save(payload, edited)
    return edited


@pytest.mark.parametrize("change,reason,install", [
    (lambda p: p.pop("architecture"), "records no architecture source and fingerprint", None),
    (lambda p: p["architecture"].update(key="timm/resnet10t", source="timm 9.9.9", fingerprint="timm 9.9.9",
                                        requirement="timm==9.9.9"), "names architecture 'tiny_resnet' but records", None),
    (lambda p: p.update(arch="timm/resnet10t", architecture={
        "key": "timm/resnet10t", "source": "timm 9.9.9", "fingerprint": "timm 9.9.9", "requirement": "timm==9.9.9"}),
     r"built by timm 9\.9\.9 \(timm 9\.9\.9\) on the build host; this device has timm", "timm==9.9.9"),
    (lambda p: p.update(arch="no_such_net", architecture={
        "key": "no_such_net", "source": "entry point nets:NET (nets 2.0)", "fingerprint": "nets 2.0",
        "requirement": "nets==2.0"}), "comes from entry point nets:NET .* which this device lacks", "nets==2.0"),
    (lambda p: p["architecture"].update(fingerprint="timm 1.0.31"), "may build another module", "torchvision"),
])
def test_the_device_rebuilds_only_the_same_module_and_names_the_package_otherwise(tmp_path, checkpoints, change,
                                                                                  reason, install):
    from device.errors import CheckpointError
    from device.uploads.torch_checkpoint import load_for_export

    _, float_path, _, _ = checkpoints
    with pytest.raises(CheckpointError, match=reason) as err:
        load_for_export(_edited(float_path, tmp_path, change))
    if install:
        assert f"pip install '{install}'" in err.value.fix


def _modelopt_edit(int8_path, tmp_path, change):
    return _edited(int8_path, tmp_path, lambda p: change(p["modelopt"]))


def _first_quantizer(modelopt) -> dict:
    mode = modelopt["state"]["modelopt_state_dict"][0][1]
    return next(iter(mode["metadata"]["quantizer_state"].values()))


@pytest.mark.parametrize("change,reason", [
    (lambda m: _first_quantizer(m).update(forward="x"), "sets forward, which ModelOpt's TensorQuantizer"),
    (lambda m: _first_quantizer(m).update(_num_bits="8; import os"), "_num_bits = '8; import os'"),
    (lambda m: _first_quantizer(m).update(backend="my.pkg:kernel"), "backend = 'my.pkg:kernel'"),
    (lambda m: _first_quantizer(m)["_pytorch_state_metadata"]["buffers"].update(
        _secret={"shape": torch.Size([1]), "dtype": torch.float32}), "_pytorch_state_metadata"),
    (lambda m: m["state"]["modelopt_state_dict"].append(("sparsegpt", {"config": {}, "metadata": {}})),
     "mode 'sparsegpt'"),
    (lambda m: m["state"]["modelopt_state_dict"][0][1]["metadata"]["quantizer_state"].update(
        {"ghost.input_quantizer": {}}), "quantizer 'ghost.input_quantizer' is not"),
    (lambda m: m["state"]["modelopt_state_dict"][0][1]["config"]["quant_cfg"][1]["cfg"].update(
        calibrator="evil.module:Calibrator"), "calibrator 'evil.module:Calibrator'"),
    (lambda m: m.update(extra=1), "version, state and state_dict only"),
])
def test_modelopts_restore_gets_only_what_modelopt_writes(tmp_path, checkpoints, change, reason):
    """ModelOpt's restore sets every key of a quantizer's state as an attribute: any other key, value kind, mode or
    quantizer is refused by name before it runs."""
    from device.errors import CheckpointError
    from device.uploads.torch_checkpoint import load_for_export

    _, _, int8_path, _ = checkpoints
    if int8_path is None:
        pytest.skip("needs nvidia-modelopt")
    with pytest.raises(CheckpointError, match=reason) as err:
        load_for_export(_modelopt_edit(int8_path, tmp_path, change))
    assert "ModelOpt state refused" in err.value.message


@pytest.mark.tensorrt
@pytest.mark.gpu
def test_real_int8_rung_compiles_from_its_device_checkpoint(tmp_path, checkpoints):
    pytest.importorskip("torch_tensorrt")
    pytest.importorskip("modelopt.torch.quantization")
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from pipeline.quantize.modelopt_state import restore

    _, _, int8_path, images = checkpoints
    with make_runner("torch_tensorrt", str(int8_path), precision="int8", batch_sizes=(4,),
                     engine_cache=str(tmp_path)) as runner:
        out = runner.infer(images[:4])
    with torch.no_grad():
        fake_quant = restore(int8_path)(torch.from_numpy(images[:4])).numpy()
    assert runner.precision_built == "int8" and runner.torch_tensorrt["exported_on_device"]
    assert (out.argmax(1) == fake_quant.argmax(1)).mean() >= 0.75


def test_a_zip_that_is_neither_program_nor_checkpoint_is_refused_at_upload(tmp_path):
    import zipfile

    from device.uploads.artifacts import ArtifactError, check
    from device.files import sha256_file

    path = tmp_path / "notes.zip"
    with zipfile.ZipFile(path, "w") as archive:
        archive.writestr("notes/readme.txt", "hello")
    sha = sha256_file(path)
    with pytest.raises(ArtifactError, match="neither a torch.export archive .* nor a torch.save checkpoint") as err:
        check(path, sha, sha, path.stat().st_size)
    assert err.value.status == 422 and ".device.pt" in err.value.fix


def _zip_with_pickle(path, pickled: bytes, extra: dict[str, bytes] | None = None, compress=None):
    import zipfile

    with zipfile.ZipFile(path, "w", compression=compress or zipfile.ZIP_STORED) as archive:
        archive.writestr("ckpt/data.pkl", pickled)
        archive.writestr("ckpt/version", b"3\n")
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return path


@pytest.mark.parametrize("what,pickled,extra,compress,refused", [
    # INST: names os.system inside the opcode itself, no GLOBAL at all (protocol 0: its STRING is refused first).
    ("INST", b"(S'true'\nios\nsystem\n.", None, None, "uses (STRING|INST)"),
    # STACK_GLOBAL: the callable's names come from the memo, not the last two strings pushed.
    ("STACK_GLOBAL", b"\x80\x04\x8c\x02os\x94\x8c\x06system\x94\x8c\x05torch\x8c\x04Size\x86\x94h\x00h\x01\x93.",
     None, None, "uses (MEMOIZE|STACK_GLOBAL)"),
    ("TorchScript", b"\x80\x02}q\x00.", {"ckpt/constants.pkl": b"\x80\x02).", "ckpt/code/m.py": b"x = 1"}, None,
     "TorchScript archive"),
    ("compressed", b"\x80\x02}q\x00." + b"N0" * 4096 + b".", None, 8, "compressed|zip bomb"),
])
def test_a_checkpoint_upload_that_could_run_code_or_blow_up_is_refused(tmp_path, what, pickled, extra, compress,
                                                                       refused):
    """The agent's upload check reads the pickle without torch: every way of naming a callable other than torch.save's
    own GLOBALs, a TorchScript archive (torch < 2.6 runs it under weights_only) and a compressed pickle (a zip bomb)."""
    from device.uploads.artifacts import ArtifactError, check
    from device.files import sha256_file

    path = _zip_with_pickle(tmp_path / f"{what}.pt", pickled, extra, compress)
    sha = sha256_file(path)
    with pytest.raises(ArtifactError, match=refused) as err:
        check(path, sha, sha, path.stat().st_size)
    assert err.value.status == 422 and ".device.pt" in err.value.fix


def test_the_runner_reads_an_artifact_as_the_kind_the_agent_stored_it_as(tmp_path, checkpoints):
    """A file the upload check passed as a program (stored as .pt2) is never unpickled as a checkpoint, whatever
    else its zip holds."""
    import shutil

    _, float_path, _, _ = checkpoints
    disguised = tmp_path / "0123.pt2"
    shutil.copy(float_path, disguised)
    assert artifact_kind(disguised) == "torch-export" and artifact_kind(tmp_path / "x.device.pt") == "torch-checkpoint"


def test_releases_before_2_5_have_no_int8_rung():
    assert "int8_export" not in rules_for("2.4.0") and "int8_needs_modelopt" not in rules_for("2.3.0")
    assert rules_for("2.5.0")["int8_export"].since == (2, 5)
