import pytest
import torch

from pipeline.models import ARCHITECTURES, build_model, count_macs
from pipeline.recipe import PruneConfig
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
