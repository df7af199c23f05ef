"""Architecture keys from their three sources: the built-ins, ``timm/<name>``, and installed entry points (a package
pip really installs: :mod:`tests.arch_plugin`)."""

import json
import os
import subprocess
import sys
import textwrap

import pytest

from device.models.architectures import ARCHITECTURES, build_model
from device.errors import ConfigError, UnknownKeyError
from tests.arch_plugin import install

timm = pytest.importorskip("timm")
torch = pytest.importorskip("torch")


def test_a_timm_key_builds_the_model_with_the_head_its_pretrained_cfg_names():
    arch = ARCHITECTURES.get("timm/resnet10t")
    assert arch.classifier == "fc" and arch.source == f"timm {timm.__version__}" and not arch.sized
    model = build_model("timm/resnet10t", 7, in_channels=1).eval()
    assert model.get_submodule(arch.classifier).out_features == 7
    assert model(torch.zeros(2, 1, 32, 32)).shape == (2, 7)
    assert "timm/resnet10t" in ARCHITECTURES and "timm/resnet10x" not in ARCHITECTURES


def test_an_unknown_timm_name_suggests_timms_near_names():
    with pytest.raises(UnknownKeyError) as err:
        ARCHITECTURES.get("timm/convnext_atoo")
    assert "timm/convnext_atoo" in err.value.message and "'timm/convnext_atto'" in err.value.fix


def test_the_preprocessing_comes_from_the_pretrained_cfg():
    cfg = timm.get_pretrained_cfg("resnet10t")  # 176 px, crop_pct 0.875, bicubic
    pre = ARCHITECTURES.get("timm/resnet10t").preprocess()
    assert pre["input_size"] == cfg.input_size[1] == 176
    assert pre["resize"] == int(176 / cfg.crop_pct) == 201
    assert pre["interpolation"] == "bicubic" and pre["mean"] == list(cfg.mean) and pre["channels"] == 3


def test_a_vit_is_built_for_the_recipes_input_size():
    """A ViT's position embedding fixes its input size: timm marks it, and the key builds it at the asked size."""
    assert ARCHITECTURES.get("timm/test_vit").sized
    model = build_model("timm/test_vit", 5, input_size=32).eval()
    assert model(torch.zeros(1, 3, 32, 32)).shape == (1, 5)
    patch = model.patch_embed.patch_size[0]
    tokens = model.pos_embed.shape[1] - model.num_prefix_tokens
    assert tokens == (32 // patch) ** 2  # not (160 // patch)², the size it is built at by default
    assert build_model("timm/test_vit", 5).pos_embed.shape[1] - model.num_prefix_tokens == (160 // patch) ** 2


def child(code: str, *sites):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(str(s) for s in sites)}
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    return install(tmp_path_factory.mktemp("plugin"), "edgefold-test-arch", 'my_net = "edgefold_test_arch:MY_NET"')


@pytest.mark.slow
def test_an_installed_package_registers_a_key_named_with_its_source(plugin):
    result = child(textwrap.dedent("""
        import json, torch
        from device.models.architectures import ARCHITECTURES, build_model
        model = build_model("my_net", 4, in_channels=1)  # its builder makes 3 channels: the stem is swapped
        print(json.dumps({"names": ARCHITECTURES.names(), "source": ARCHITECTURES.source("my_net"),
                          "out": list(model(torch.zeros(2, 1, 8, 8)).shape)}))
        """), plugin)
    assert result.returncode == 0, result.stderr
    found = json.loads(result.stdout)
    assert "my_net" in found["names"] and "resnet18" in found["names"]
    assert found["source"] == "entry point edgefold_test_arch:MY_NET (edgefold-test-arch 1.2.3)"
    assert found["out"] == [2, 4]
    listing = child("from pipeline.cli import main; raise SystemExit(main(['recipes', '--check']))", plugin)
    assert listing.returncode == 0, listing.stderr
    assert "my_net" in listing.stdout and "entry point edgefold_test_arch:MY_NET" in listing.stdout
    assert "built-in (torchvision)" in listing.stdout and f"timm {timm.__version__}" in listing.stdout


@pytest.mark.slow
def test_two_packages_claiming_one_key_are_refused_naming_both(tmp_path, plugin):
    clash = install(tmp_path, "edgefold-clash", 'my_net = "edgefold_clash:MY_NET"')
    result = child("from pipeline.cli import main; raise SystemExit(main(['recipes', '--check']))", plugin, clash)
    assert result.returncode == 1
    line = next(line for line in result.stdout.splitlines() if line.startswith("architectures: FAIL"))
    assert "'my_net' is registered twice" in line
    assert "edgefold-test-arch 1.2.3" in line and "edgefold-clash 1.2.3" in line
    assert not any(row.strip().startswith("my_net ") for row in result.stdout.splitlines())  # no listing follows


def test_a_key_taken_by_a_built_in_or_a_source_prefix_is_refused():
    from device.models.architectures import Architecture, ArchitectureRegistry

    registry = ArchitectureRegistry("architecture")
    registry._plugins_loaded = True  # this registry reads no entry points
    registry.add("resnet18", Architecture("resnet18", print, "fc", source="built-in (torchvision)"))
    with pytest.raises(ConfigError, match=r"registered twice: by built-in \(torchvision\) and by entry point x:Y"):
        registry.add("resnet18", Architecture("resnet18", print, "fc", source="entry point x:Y (pkg 1)"))
    with pytest.raises(ConfigError, match="reserved prefix timm/"):
        registry.add("timm/resnet18", Architecture("timm/resnet18", print, "fc", source="entry point x:Y (pkg 1)"))


@pytest.mark.slow
def test_an_entry_point_of_another_shape_names_its_package(tmp_path):
    odd = install(tmp_path, "edgefold-odd", 'odd_net = "edgefold_odd:NOT_AN_ARCH"')
    result = child("from device.models.architectures import build_model; build_model('resnet18', 3)", odd)
    assert result.returncode != 0
    assert "edgefold-odd 1.2.3" in result.stderr and "registers 'odd_net' as int, not an architecture" in result.stderr


@pytest.mark.slow
def test_a_timm_or_plugin_key_carries_a_fingerprint_for_the_stage_caches(tmp_path):
    """A stage cached on another timm, or on a user's builder before its file changed, must not be reused: the key's
    fingerprint (timm's version; the package's version and its module's sha256) enters the stage's configuration."""
    assert ARCHITECTURES.get("timm/resnet10t").fingerprint == f"timm {timm.__version__}"
    assert ARCHITECTURES.get("resnet18").fingerprint == ""  # the project's own code is hashed already
    plugin = install(tmp_path, "edgefold-test-arch", 'my_net = "edgefold_test_arch:MY_NET"')
    code = "from device.models.architectures import ARCHITECTURES; print(ARCHITECTURES.get('my_net').fingerprint)"
    before = child(code, plugin).stdout.strip()
    assert before.startswith("edgefold-test-arch 1.2.3, edgefold_test_arch sha256 ")
    module = plugin / "edgefold_test_arch" / "__init__.py"
    module.write_text(module.read_text().replace("16, 3", "24, 3").replace("(16)", "(24)").replace("(16, 32", "(24, 32"))
    after = child(code, plugin).stdout.strip()
    assert after != before and after.startswith("edgefold-test-arch 1.2.3, edgefold_test_arch sha256 ")


def test_a_refused_source_registers_nothing_and_is_refused_on_every_read(monkeypatch):
    """Two entry points claiming one key: neither is half-registered, and every later read raises the same error
    (not just the first), so no run goes on with whichever package happened to load first."""
    from device.models import architectures
    from device.models.architectures import Architecture, ArchitectureRegistry

    def two_claims():
        return [Architecture("net", print, "fc", source="entry point a:NET (a 1)"),
                Architecture("net", print, "fc", source="entry point b:NET (b 2)")]

    monkeypatch.setattr(architectures, "entry_point_architectures", two_claims)
    registry = ArchitectureRegistry("architecture")
    registry.add("resnet18", Architecture("resnet18", print, "fc", source="built-in (torchvision)"))
    for _ in range(2):
        with pytest.raises(ConfigError, match=r"'net' is registered twice: by entry point a:NET \(a 1\) and by "
                                              r"entry point b:NET \(b 2\)"):
            registry.names()
    with pytest.raises(ConfigError, match="registered twice"):
        registry.get("resnet18")
    assert "net" not in registry._items


def test_a_timm_name_with_a_tag_timm_lacks_lists_the_tags_it_has():
    with pytest.raises(UnknownKeyError, match="Invalid pretrained tag") as err:
        ARCHITECTURES.get("timm/resnet18.bogus")
    assert "resnet18.a1_in1k" in err.value.fix
    assert "timm/resnet18.bogus" not in ARCHITECTURES


@pytest.mark.parametrize("name, size, folds", [("repvit_m0_9", 64, True), ("deit_tiny_distilled_patch16_224", 32, False)])
def test_a_two_headed_timm_model_is_built_as_timm_evaluates_it(name, size, folds):
    """A distilled timm model (a distillation head beside the classifier) is taken, not refused: built and trained with
    its two heads averaged, as timm runs it outside distilled training. RepViT's heads read one feature and fold into
    one layer in the inference form; DeiT's read two tokens and stay two. Either way the outputs are timm's."""
    from pipeline.checkpoint import apply_torchvision_state

    key = f"timm/{name}"
    arch = ARCHITECTURES.get(key)
    assert len(arch.heads) == 2 and arch.extra_heads == arch.heads[1:]
    torch.manual_seed(0)
    model = build_model(key, 5, input_size=size).eval()
    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False, num_classes=5,
                                  **({"img_size": size} if arch.sized else {})).eval()
    x = torch.randn(3, 3, size, size)
    with torch.no_grad():
        out = model(x)
        torch.testing.assert_close(out, reference(x))
        features = reference.forward_features(x)
        if folds:  # RepViT: one pooled feature, each head a BatchNorm and a Linear over it
            pooled = reference.forward_head(features, pre_logits=True)
            averaged = (reference.head.head(pooled) + reference.head.head_dist(pooled)) / 2
        else:  # DeiT: the class token to one head, the distillation token to the other
            averaged = (reference.head(features[:, 0]) + reference.head_dist(features[:, 1])) / 2
        torch.testing.assert_close(out, averaged, rtol=1e-4, atol=1e-5)
        folded = arch.inference_form(model)
        torch.testing.assert_close(folded(x), out, rtol=1e-4, atol=1e-5)
    assert len(arch.head_modules(model)) == 2
    assert len(arch.head_modules(folded)) == (1 if folds else 2)
    # weights trained for another class count: both heads are replaced, the rest loaded
    other = build_model(key, 7, input_size=size).state_dict()
    replaced = apply_torchvision_state(model, key, other, "WEIGHTS=other.pt")
    assert {k.rsplit(".", 1)[0] for k in replaced} >= set(arch.heads)


@pytest.mark.parametrize("name, size, option", [("repvit_m0_9", 64, {"distillation": False}),
                                                ("levit_128s", 224, {"distilled": False})])
def test_a_distilled_timm_model_is_built_with_one_head_for_training_from_scratch(name, size, option):
    """``:single_head``: timm's own keyword leaves the distillation head out (RepViT's ``distillation``, LeViT's
    ``distilled``); the key goes wherever a key goes (checkpoints, the device's rebuild)."""
    key = f"timm/{name}:single_head"
    arch = ARCHITECTURES.get(key)
    assert arch.name == key and arch.extra_heads == () and len(arch.heads) == 1
    torch.manual_seed(0)
    model = build_model(key, 5, input_size=size).eval()
    torch.manual_seed(0)
    reference = timm.create_model(name, pretrained=False, num_classes=5, **option).eval()
    x = torch.randn(2, 3, size, size)
    with torch.no_grad():
        torch.testing.assert_close(model(x), reference(x))
    assert not any("dist" in module for module, _ in model.named_modules())
    assert len(arch.head_modules(model)) == 1


@pytest.mark.parametrize("name, said", [("resnet18", "has one head already"),
                                        ("deit_tiny_distilled_patch16_224", "only with its distillation head")])
def test_single_head_is_refused_where_timm_has_no_such_form(name, said):
    with pytest.raises(ConfigError, match=said) as err:
        ARCHITECTURES.get(f"timm/{name}:single_head")
    assert f"timm/{name}" in err.value.fix or "undistilled" in err.value.fix


def test_a_head_registered_under_a_wrong_name_is_not_hidden_by_its_parent():
    """On the trained form every head must exist as registered; only a folded model's heads are looked up at the
    nearest module that still exists (RepViT's two fused into one)."""
    from dataclasses import replace

    entry = ARCHITECTURES.get("mobilenet_v3_small")
    model = build_model("mobilenet_v3_small", 4)
    assert entry.head_modules(model, exact=True) == [model.classifier[3]]
    wrong = replace(entry, classifier="classifier.4")
    with pytest.raises(AttributeError, match="classifier.4"):
        wrong.head_modules(model, exact=True)
    assert wrong.head_modules(model) == [model.classifier], "the lenient lookup, kept for folded models"

