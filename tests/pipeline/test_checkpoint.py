import pytest
import torch

from device.errors import CheckpointError
from pipeline.checkpoint import load_checkpoint, load_torchvision_weights, save_checkpoint
from pipeline.models import build_model


def test_round_trip_with_weights_only(tmp_path):
    model = build_model("tiny_resnet", 10).eval()
    path = save_checkpoint(tmp_path / "m.pt", model, "tiny_resnet", 10, note="x")
    payload = torch.load(path, weights_only=True)  # the format needs no pickled classes
    assert payload["format"] == "edgefold.checkpoint/1"
    loaded, info = load_checkpoint(path)
    x = torch.randn(2, 3, 16, 16)
    torch.testing.assert_close(loaded(x), model(x))
    assert info["meta"] == {"note": "x"} and [p.name for p in tmp_path.iterdir()] == ["m.pt"]  # no temporary left


def test_pickled_module_is_refused(tmp_path):
    path = tmp_path / "pickled.pt"
    torch.save(build_model("tiny_resnet", 10), path)
    with pytest.raises(CheckpointError, match="(holds pickled Python objects|a file of tensors never needs)"):
        load_checkpoint(path)


def test_foreign_state_dict_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "sd.pt"
    torch.save(build_model("tiny_resnet", 10).state_dict(), path)
    with pytest.raises(CheckpointError, match="not an EdgeFold checkpoint"):
        load_checkpoint(path)


def test_tampered_shape_names_the_layer(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", build_model("tiny_resnet", 10), "tiny_resnet", 10)
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["fc.weight"] = torch.zeros(10, 7)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"layer fc\.weight has shape \(10, 7\) but its recorded structure says \(10, 64\)"):
        load_checkpoint(path)


def test_missing_checkpoint_says_which_stage_to_rerun(tmp_path):
    with pytest.raises(CheckpointError, match="does not exist") as err:
        load_checkpoint(tmp_path / "nope.pt")
    assert "--force" in err.value.fix


def test_torchvision_weights_replace_the_head_when_classes_differ(tmp_path):
    source = build_model("resnet18", 1000)
    path = tmp_path / "resnet18.pth"
    torch.save(source.state_dict(), path)
    target = build_model("resnet18", 10)
    replaced = load_torchvision_weights(target, "resnet18", path)
    assert replaced == ["fc.weight", "fc.bias"]
    torch.testing.assert_close(target.conv1.weight, source.conv1.weight)
    assert target.fc.weight.shape == (10, 512)


def test_torchvision_weights_of_another_arch_name_the_layer(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(build_model("resnet18", 10).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"WEIGHTS=.*does not match resnet34: missing \['layer1\.2"):
        load_torchvision_weights(build_model("resnet34", 10), "resnet34", path)
    state = build_model("resnet18", 10).state_dict()
    state["layer1.0.conv1.weight"] = torch.zeros(64, 64, 5, 5)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"layer layer1\.0\.conv1\.weight has shape \(64, 64, 5, 5\)"):
        load_torchvision_weights(build_model("resnet18", 10), "resnet18", path)


def test_torchvision_weights_accept_wrapped_and_ddp_prefixed_dicts(tmp_path):
    source = build_model("tiny_resnet", 10)
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    target = build_model("tiny_resnet", 10)
    assert load_torchvision_weights(target, "tiny_resnet", path) == []
    torch.testing.assert_close(target.fc.weight, source.fc.weight)
