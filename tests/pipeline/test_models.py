import pytest
import torch

from pipeline.models import ARCHITECTURES, build_model, count_macs
from pipeline.core.recipe import PruneConfig
from pipeline.prune.ratio import find_plan, make_pruner

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
    from device.models.architectures import stem_name

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


def test_an_architecture_is_checked_before_any_stage_relies_on_it(monkeypatch):
    """checked_model runs what the stages rely on: a convolution first, the classifier the registry names, one
    forward pass at the recipe's size giving the class scores; each failure names the architecture and the fix."""
    from torch import nn

    from device.models.architectures import Architecture, ArchitectureRegistry
    from device.errors import ConfigError
    from pipeline.models import checked_model

    assert checked_model("tiny_resnet", 7, 3, 16).fc.out_features == 7
    registry = ArchitectureRegistry("architecture")
    registry._plugins_loaded = True  # no entry points: these three are the users' modules
    registry.add("no_stem", Architecture("no_stem", lambda n, c=3: nn.Sequential(nn.Flatten(), nn.Linear(c * 256, n)),
                                         "1", source="entry point t:NO_STEM (t 1)"))
    registry.add("bad_head", Architecture("bad_head", lambda n, c=3: nn.Sequential(
        nn.Conv2d(c, 4, 3), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, n)), "head", source="t"))
    registry.add("fixed", Architecture("fixed", lambda n, c=3: nn.Sequential(
        nn.Conv2d(c, 4, 3), nn.Flatten(), nn.Linear(4 * 14 * 14, n)), "2", source="t"))
    monkeypatch.setattr("device.models.architectures.ARCHITECTURES", registry)
    monkeypatch.setattr("pipeline.models.ARCHITECTURES", registry)
    with pytest.raises(ConfigError, match="no_stem .* cannot enter the ladder: Sequential has no convolution"):
        checked_model("no_stem", 5, 1, 16)
    with pytest.raises(ConfigError, match="bad_head .* cannot enter the ladder"):
        checked_model("bad_head", 5, 3, 16)
    assert checked_model("fixed", 5, 3, 16)
    with pytest.raises(ConfigError, match=r"fixed does not run on 3×32×32 input") as err:
        checked_model("fixed", 5, 3, 32)
    assert "preprocess.input_size" in err.value.fix


def test_batchnorm_folding_says_when_torch_fx_cannot_trace_and_skips_models_without_batchnorm():
    from torch import nn

    from device.errors import ConfigError
    from pipeline.models import fold_batchnorm

    class Branchy(nn.Module):  # control flow on values: what torch.fx cannot trace (as a timm ViT's patch check)
        def __init__(self):
            super().__init__()
            self.conv, self.bn = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4)

        def forward(self, x):
            return self.bn(self.conv(x)) if x.sum() > 0 else self.conv(x)

    with pytest.raises(ConfigError, match="Branchy cannot be traced by torch.fx") as err:
        fold_batchnorm(Branchy())
    assert "quantize.qat: null" in err.value.fix
    plain = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU())
    folded = fold_batchnorm(plain)
    assert folded is not plain and torch.equal(folded[0].weight, plain[0].weight)
