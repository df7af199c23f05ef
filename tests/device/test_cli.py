import json
import subprocess
import sys

import pytest

from device.agent import AgentConfig, load_token
from device.errors import ConfigError


def agent(repo, *args):
    return subprocess.run([sys.executable, "-m", "device.cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=60)


def test_device_prints_its_fingerprint(repo):
    result = agent(repo, "device")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["machine"] and "CPUExecutionProvider" in info["onnxruntime_providers"]
    assert set(info) >= {"l4t", "jetpack", "gpu", "compute_capability", "tensorrt", "cuda", "nvpmodel"}


def test_serve_help_tells_the_defaults(repo):
    result = agent(repo, "serve", "--help")
    assert result.returncode == 0
    for text in ("127.0.0.1", "8765", "--token-file", "--data-dir", "--config"):
        assert text in result.stdout


def test_config_errors_name_the_key(repo, tmp_path):
    config = tmp_path / "agent.yaml"
    config.write_text("port: 8765\njob_timeout: 10\n")
    result = agent(repo, "serve", "--config", str(config))
    assert result.returncode == 2 and "job_timeout" in result.stderr and "job_timeout_s" in result.stderr
    with pytest.raises(ConfigError, match="port"):
        AgentConfig.load(None, port=70000)


def test_token_sources(tmp_path, monkeypatch):
    monkeypatch.delenv("EDGEFOLD_AGENT_TOKEN", raising=False)
    config = AgentConfig.load(None, data_dir=tmp_path / "data")
    generated = load_token(config)
    assert len(generated) >= 32 and (tmp_path / "data" / "token").stat().st_mode & 0o777 == 0o600
    assert load_token(config) == generated, "the generated token is kept across restarts"
    short = tmp_path / "short"
    short.write_text("abc\n")
    with pytest.raises(ConfigError, match="shorter than 16"):
        load_token(AgentConfig.load(None, token_file=short))
    with pytest.raises(ConfigError, match="cannot read the token file"):
        load_token(AgentConfig.load(None, token_file=tmp_path / "missing"))
    monkeypatch.setenv("EDGEFOLD_AGENT_TOKEN", "from-the-environment-123")
    assert load_token(AgentConfig.load(None, data_dir=tmp_path / "other")) == "from-the-environment-123"
