import re

import pytest
import torch

from device.errors import CheckpointError
from pipeline.checkpoint import load_checkpoint, load_weights, save_checkpoint
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
    replaced = load_weights(target, "resnet18", path)
    assert replaced == ["fc.weight", "fc.bias"]
    torch.testing.assert_close(target.conv1.weight, source.conv1.weight)
    assert target.fc.weight.shape == (10, 512)


def test_torchvision_weights_of_another_arch_name_the_layer(tmp_path):
    path = tmp_path / "resnet18.pth"
    torch.save(build_model("resnet18", 10).state_dict(), path)
    with pytest.raises(CheckpointError, match=r"WEIGHTS=.*does not match resnet34: missing \['layer1\.2"):
        load_weights(build_model("resnet34", 10), "resnet34", path)
    state = build_model("resnet18", 10).state_dict()
    state["layer1.0.conv1.weight"] = torch.zeros(64, 64, 5, 5)
    torch.save(state, path)
    with pytest.raises(CheckpointError, match=r"layer layer1\.0\.conv1\.weight has shape \(64, 64, 5, 5\)"):
        load_weights(build_model("resnet18", 10), "resnet18", path)


def test_torchvision_weights_accept_wrapped_and_ddp_prefixed_dicts(tmp_path):
    source = build_model("tiny_resnet", 10)
    path = tmp_path / "wrapped.pth"
    torch.save({"state_dict": {f"module.{k}": v for k, v in source.state_dict().items()}}, path)
    target = build_model("tiny_resnet", 10)
    assert load_weights(target, "tiny_resnet", path) == []
    torch.testing.assert_close(target.fc.weight, source.fc.weight)


def test_a_timm_safetensors_file_loads_with_its_head_replaced(tmp_path):
    """timm's own checkpoints come as .safetensors (read as tensors, never unpickled); a 1000-class head is kept
    fresh for the data's classes, as timm's pretrained_cfg names it."""
    pytest.importorskip("timm")
    from safetensors.torch import save_file

    source = build_model("timm/test_convnext", 1000)
    path = tmp_path / "model.safetensors"
    save_file({k: v.contiguous() for k, v in source.state_dict().items()}, str(path))
    target = build_model("timm/test_convnext", 10)
    assert sorted(load_weights(target, "timm/test_convnext", path)) == ["head.fc.bias", "head.fc.weight"]
    torch.testing.assert_close(target.stem[0].weight, source.stem[0].weight)
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(CheckpointError, match="is not a readable .safetensors file"):
        load_weights(target, "timm/test_convnext", path)


def test_weights_whose_keys_fit_no_layer_name_the_architecture_and_its_source(tmp_path):
    pytest.importorskip("timm")
    path = tmp_path / "other.pth"
    torch.save({"features.0.weight": torch.zeros(4, 3, 3, 3), "classifier.weight": torch.zeros(10, 4)}, path)
    with pytest.raises(CheckpointError, match=r"does not match timm/test_convnext: missing \['stem.*unexpected "
                                              r"\['features.0.weight'") as err:
        load_weights(build_model("timm/test_convnext", 10), "timm/test_convnext", path)
    assert "timm/test_convnext (timm " in err.value.fix


def test_a_pruned_timm_model_reloads_with_its_norm_subclasses_and_layer_scales_narrowed(tmp_path):
    """ConvNeXt's LayerNorm2d (a LayerNorm subclass) and its blocks' layer-scale gamma are narrowed by pruning;
    the checkpoint records and restores both, and a file widening a gamma past the architecture is refused."""
    pytest.importorskip("timm")
    from pipeline.core.recipe import PruneConfig
    from pipeline.prune.ratio import make_pruner

    model = build_model("timm/test_convnext", 10).eval()
    make_pruner(model, "timm/test_convnext", PruneConfig(macs_target=0.5, steps=1),
                {"ratio": 0.5, "harder_ratio": 0.5}, (1, 3, 32, 32)).step()
    assert model.stem[1].weight.shape[0] < 24 and type(model.stem[1]).__name__ == "LayerNorm2d"
    path = save_checkpoint(tmp_path / "m.pt", model, "timm/test_convnext", 10)
    loaded, _ = load_checkpoint(path)
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(loaded(x), model(x))
    payload = torch.load(path, weights_only=True)
    gamma = next(k for k in payload["state_dict"] if k.endswith(".gamma"))
    payload["state_dict"][gamma] = torch.zeros(4096)
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=rf"{re.escape(gamma)} has shape \(4096,\)"):
        load_checkpoint(path)


def test_a_small_file_naming_a_huge_architecture_is_refused_before_it_is_built(tmp_path):
    """The device rebuilds a checkpoint's architecture by its key: a crafted few-kilobyte file naming a large timm
    model (or a ViT at an enormous input size) is refused before any memory is allocated for it."""
    pytest.importorskip("timm")
    path = save_checkpoint(tmp_path / "m.pt", build_model("tiny_resnet", 10), "tiny_resnet", 10)
    payload = torch.load(path, weights_only=True)
    payload["arch"] = "timm/vit_large_patch16_224"
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match=r"names timm/vit_large_patch16_224 \(30\d\.\d M parameters\) but holds "
                                              r"0\.08 M values"):
        load_checkpoint(path)
    payload["arch"], payload["input_size"] = "timm/test_vit", 1 << 16
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="input size 65536"):
        load_checkpoint(path)


def test_widths_recorded_for_a_layer_that_has_none_are_refused(tmp_path):
    path = save_checkpoint(tmp_path / "m.pt", build_model("tiny_resnet", 10), "tiny_resnet", 10)
    payload = torch.load(path, weights_only=True)
    payload["structure"]["layers.0"] = {"type": "BasicBlock", "out_channels": 7}
    torch.save(payload, path)
    with pytest.raises(CheckpointError, match="records widths for a BasicBlock, which has none"):
        load_checkpoint(path)
