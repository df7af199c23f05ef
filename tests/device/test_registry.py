import pytest

from device.errors import ConfigError, UnknownKeyError
from device.registry import Registry


def test_register_and_get():
    registry = Registry("widget")

    @registry.register("alpha")
    def alpha():
        return 1

    assert registry.get("alpha") is alpha
    assert "alpha" in registry and len(registry) == 1 and list(registry) == ["alpha"]


def test_duplicate_refused():
    registry = Registry("widget")
    registry.add("alpha", 1)
    with pytest.raises(ConfigError, match="already registered"):
        registry.add("alpha", 2)
    assert registry.get("alpha") == 1


def test_unknown_key_suggests_near_name():
    registry = Registry("architecture")
    for name in ("resnet18", "resnet50", "mobilenet_v2"):
        registry.add(name, name)
    with pytest.raises(UnknownKeyError) as err:
        registry.get("resnet05")
    assert "unknown architecture 'resnet05'" in str(err.value)
    assert "resnet50" in err.value.fix


def test_unknown_key_lists_all_when_nothing_is_near():
    registry = Registry("stage")
    registry.add("prune", 1)
    with pytest.raises(UnknownKeyError) as err:
        registry.get("zzz")
    assert "known stages: prune" in err.value.fix
