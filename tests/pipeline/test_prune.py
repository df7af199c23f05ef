import pytest
import torch

from pipeline.checkpoint import load_checkpoint, save_checkpoint
from pipeline.models import build_model, count_macs
from pipeline.core.recipe import PruneConfig
from pipeline.prune.ratio import find_plan, make_pruner
from pipeline.tasks.classification.pruned import _channels_off_multiple


@pytest.mark.parametrize("arch, target, shape", [
    pytest.param("resnet18", 0.25, (1, 3, 32, 32), marks=pytest.mark.slow),  # a uniform ratio jumps 20.6% → 26.7%
    pytest.param("resnet50", 0.24, (1, 3, 32, 32), marks=pytest.mark.slow),
    ("tiny_resnet", 0.5, (1, 3, 16, 16)),
])
def test_pruning_hits_the_macs_target_and_reloads(tmp_path, arch, target, shape):
    torch.manual_seed(0)
    model = build_model(arch, 10).eval()
    cfg = PruneConfig(macs_target=target, tolerance=0.05, round_to=8)
    base = count_macs(model, shape)
    plan, predicted = find_plan(model, arch, cfg, shape, base)
    pruner = make_pruner(model, arch, cfg, plan, shape)
    pruner.step()
    fraction = count_macs(model, shape) / base
    assert fraction == pytest.approx(predicted)
    assert abs(fraction - target) <= cfg.tolerance * target
    assert model.fc.out_features == 10, "the classifier is never pruned"
    assert not _channels_off_multiple(model, arch, 8), "every pruned width is a multiple of round_to"
    path = save_checkpoint(tmp_path / "pruned.pt", model, arch, 10)
    reloaded, _ = load_checkpoint(path)
    x = torch.randn(2, *shape[1:])
    torch.testing.assert_close(reloaded(x), model(x))
    assert count_macs(reloaded, shape) == count_macs(model, shape)


def test_iterative_pruning_reaches_the_same_budget():
    shape = (1, 3, 16, 16)
    model = build_model("tiny_resnet", 10).eval()
    cfg = PruneConfig(macs_target=0.5, tolerance=0.1, round_to=8, steps=3)
    base = count_macs(model, shape)
    plan, _ = find_plan(model, "tiny_resnet", cfg, shape, base)
    pruner = make_pruner(model, "tiny_resnet", cfg, plan, shape)
    fractions = []
    for _ in range(cfg.steps):
        pruner.step()
        fractions.append(count_macs(model, shape) / base)
    assert fractions == sorted(fractions, reverse=True) and fractions[0] < 1.0
    assert abs(fractions[-1] - 0.5) <= 0.1 * 0.5


def test_attention_is_kept_whole_and_named():
    """Torch-Pruning would cut across a ViT's heads: the attention blocks are left whole, named with the reason, and
    the rest (the MLPs) still pruned; the pruned model runs."""
    pytest.importorskip("timm")
    from pipeline.prune.ratio import kept_whole

    model = build_model("timm/test_vit", 10, input_size=32).eval()
    whole = kept_whole(model)
    assert sorted(whole) == [f"blocks.{i}.attn" for i in range(len(model.blocks))]
    assert all("heads" in reason for reason in whole.values())
    qkv, hidden = model.blocks[0].attn.qkv.out_features, model.blocks[0].mlp.fc1.out_features
    base = count_macs(model, (1, 3, 32, 32))
    make_pruner(model, "timm/test_vit", PruneConfig(macs_target=0.5, steps=1), {"ratio": 0.5, "harder_ratio": 0.5},
                (1, 3, 32, 32)).step()
    assert model.blocks[0].attn.qkv.out_features == qkv and model.blocks[0].mlp.fc1.out_features < hidden
    assert count_macs(model, (1, 3, 32, 32)) < base


def test_an_architecture_torch_pruning_breaks_is_refused_with_what_to_do():
    """NFNet's weight-standardised convolutions carry a per-channel gain coupled through its SE blocks: a pruned copy
    fails to run, which the plan search reports instead of a traceback."""
    pytest.importorskip("timm")
    from device.errors import StageError

    model = build_model("timm/test_nfnet", 10).eval()
    with pytest.raises(StageError, match="Torch-Pruning cannot prune timm/test_nfnet") as err:
        find_plan(model, "timm/test_nfnet", PruneConfig(macs_target=0.5), (1, 3, 32, 32),
                  count_macs(model, (1, 3, 32, 32)))
    assert "choose a teacher Torch-Pruning can narrow" in err.value.fix
    assert "prune: null" in err.value.fix, "the way around it: distill without pruning"


@pytest.mark.parametrize("name", ["fastvit_t8", "mobileone_s0", "repvgg_a0", "repvit_m0_9"])
def test_a_reparameterisable_timm_net_is_pruned_in_its_folded_form(tmp_path, name):
    """timm's re-parameterisable families, each at its smallest variant: the teacher is folded as it is exported
    (parallel branches summed into one convolution), pruned to the target in that form, trains, and reloads from its
    checkpoint (``folded``) with the same outputs. FastViT's depthwise convolutions with a channel multiplier are kept
    whole and named; before, its pruned copy failed to run (an IndexError inside Torch-Pruning)."""
    pytest.importorskip("timm")
    from pipeline.prune.ratio import kept_whole
    from pipeline.models import as_exported

    arch, shape = f"timm/{name}", (1, 3, 64, 64)
    torch.manual_seed(0)
    trained = build_model(arch, 4).eval()
    model, folded = as_exported(trained, arch)
    assert folded and model is not trained
    def norms(net):
        return sum(isinstance(m, torch.nn.BatchNorm2d) for m in net.modules())

    assert norms(model) < norms(trained), "the branches' BatchNorms are folded away"
    cfg = PruneConfig(macs_target=0.5, tolerance=0.1, round_to=8)
    base = count_macs(model, shape)
    plan, _ = find_plan(model, arch, cfg, shape, base)
    make_pruner(model, arch, cfg, plan, shape).step()
    assert abs(count_macs(model, shape) / base - 0.5) <= 0.1 * 0.5
    multiplied = [n for n, reason in kept_whole(model).items() if "channel multiplier" in reason]
    assert bool(multiplied) == (name == "fastvit_t8")
    model.train()
    model(torch.randn(2, *shape[1:])).sum().backward()  # it fine-tunes in that form
    model.eval()
    path = save_checkpoint(tmp_path / "pruned.pt", model, arch, 4, folded=True)
    reloaded, info = load_checkpoint(path)
    assert info["folded"]
    from pipeline.models import ARCHITECTURES

    assert ARCHITECTURES.get(arch).inference_form(reloaded) is reloaded, "never folded twice (FastViT's would break)"
    x = torch.randn(2, *shape[1:])
    with torch.no_grad():
        torch.testing.assert_close(reloaded(x), model(x))
