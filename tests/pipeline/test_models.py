import pytest
import torch

from pipeline.models import ARCHITECTURES, build_model, count_macs
from pipeline.core.recipe import PruneConfig
from pipeline.pruning import find_plan, make_pruner

REQUIRED = {"resnet50", "resnet18", "resnet34", "mobilenet_v3_large", "efficientnet_b0", "tiny_resnet"}


def test_registry_holds_the_documented_architectures():
    assert REQUIRED <= set(ARCHITECTURES.names())


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES.names()))
def test_every_architecture_builds_with_its_classifier(arch):
    model = build_model(arch, 7).eval()
    head = model.get_submodule(ARCHITECTURES.get(arch).classifier)
    assert isinstance(head, torch.nn.Linear) and head.out_features == 7
    with torch.no_grad():
        assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 7)


@pytest.mark.parametrize("arch", sorted(ARCHITECTURES.names()))
def test_every_architecture_builds_for_grey_input(arch):
    """A one-channel stem of the same shape otherwise; the rest of the network is the three-channel one's."""
    from device.architectures import stem_name

    grey, rgb = build_model(arch, 7, in_channels=1).eval(), build_model(arch, 7).eval()
    stem, rgb_stem = grey.get_submodule(stem_name(grey)), rgb.get_submodule(stem_name(rgb))
    assert stem.in_channels == 1 and rgb_stem.in_channels == 3
    assert (stem.out_channels, stem.kernel_size, stem.stride) == (rgb_stem.out_channels, rgb_stem.kernel_size,
                                                                   rgb_stem.stride)
    assert sum(p.numel() for p in rgb.parameters()) - sum(p.numel() for p in grey.parameters()) == stem.weight.numel() * 2
    with torch.no_grad():
        assert grey(torch.zeros(2, 1, 32, 32)).shape == (2, 7)


def test_rgb_weights_fold_to_a_grey_stem_that_answers_as_the_rgb_model_does_on_grey_images():
    from pipeline.checkpoint import apply_torchvision_state

    torch.manual_seed(0)
    rgb = build_model("resnet18", 5).eval()
    grey = build_model("resnet18", 5, in_channels=1).eval()
    assert apply_torchvision_state(grey, "resnet18", rgb.state_dict(), "test weights") == []
    image = torch.rand(2, 1, 32, 32)
    with torch.no_grad():
        assert torch.allclose(grey(image), rgb(image.repeat(1, 3, 1, 1)), atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["mobilenet_v3_large", "efficientnet_b0"])
def test_depthwise_and_squeeze_excite_architectures_prune(arch):
    """DepGraph keeps depthwise convs and SE blocks consistent; the head stays intact."""
    shape = (1, 3, 32, 32)
    model = build_model(arch, 10).eval()
    cfg = PruneConfig(macs_target=0.5, tolerance=0.1, round_to=8)
    base = count_macs(model, shape)
    plan, fraction = find_plan(model, arch, cfg, shape, base)
    make_pruner(model, arch, cfg, plan, shape).step()
    assert abs(count_macs(model, shape) / base - 0.5) <= 0.05
    with torch.no_grad():
        assert model(torch.zeros(2, 3, 32, 32)).shape == (2, 10)
