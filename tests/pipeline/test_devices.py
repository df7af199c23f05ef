import pytest

from device.errors import ConfigError
from pipeline.deploy.devices import load_devices


def test_edge_and_dc_urls(tmp_path):
    devices = load_devices(edge="http://nano:8765, http://nx:8765/", dc="http://gpu:8765")
    assert [(d.name, d.role, d.url) for d in devices] == [
        ("edge-1", "edge", "http://nano:8765"), ("edge-2", "edge", "http://nx:8765"), ("dc", "dc", "http://gpu:8765")]
    assert load_devices() == []


def test_devices_file_with_groups(tmp_path):
    path = tmp_path / "devices.yaml"
    path.write_text("token_file: /etc/edgefold/token\ngroups:\n"
                    "  orin-nano: {role: edge, urls: [http://a:8765, http://b:8765]}\n"
                    "  dc: {role: dc, urls: [http://gpu:8765], token_file: /tmp/dc-token}\n")
    devices = load_devices(devices_file=path)
    assert [(d.name, d.group, d.token_file) for d in devices] == [
        ("orin-nano-1", "orin-nano", "/etc/edgefold/token"), ("orin-nano-2", "orin-nano", "/etc/edgefold/token"),
        ("dc", "dc", "/tmp/dc-token")]
    assert "token" not in str(devices[0].public())


@pytest.mark.parametrize("text, words", [
    ("groups:\n  x: {role: edge, url: [http://a:1]}\n", ["groups.x.url"]),
    ("groups:\n  x: {role: cloud, urls: [http://a:1]}\n", ["groups.x.role"]),
    ("groups:\n  x: {role: edge, urls: [ftp://a]}\n", ["not an agent URL", "http://HOST:8765"]),
    ("groups:\n  dc: {role: edge, urls: [http://a:1]}\n", ["used twice"]),
])
def test_devices_file_errors_name_the_problem(tmp_path, text, words):
    path = tmp_path / "devices.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as err:
        load_devices(devices_file=path, dc="http://gpu:1")
    for word in words:
        assert word in str(err.value)


def test_missing_devices_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read devices file"):
        load_devices(devices_file=tmp_path / "nope.yaml")
