import json
import subprocess
import sys

import pytest

from device.service.agent import AgentConfig, load_token
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


# ------------------------------------------------------------------ which TensorRT, said first
@pytest.mark.slow
def test_serve_says_first_which_tensorrt_it_found_and_device_tells_why_not(tmp_path):
    """No TensorRT here: the agent's first line and /v1/device say so, with what `auto` runs instead and the fix."""
    from tests.device.agent_process import AgentProcess

    with AgentProcess(tmp_path / "agent") as running:
        with running.client() as client:
            status = client.device()["tensorrt_status"]
        first = running.log.read_text().splitlines()[0]
    assert status["found"] is False and status["runtime_auto"] == "onnxruntime"
    assert "no module named 'tensorrt'" in status["reason"] and "--system-site-packages" in status["fix"]
    assert first.startswith("edgefold-agent ") and "TensorRT NOT found" in first
    assert "runtime auto → onnxruntime (" in first and "CPUExecutionProvider" in first


def test_tensorrt_status_names_where_it_found_tensorrt(tmp_path, monkeypatch):
    """With a STAND-IN ``tensorrt`` on the path (found, not imported: version from the module only when no
    package metadata exists, as with JetPack's apt bindings)."""
    from device.info import tensorrt_status

    package = tmp_path / "site" / "tensorrt"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text('__version__ = "10.3.0"  # STAND-IN, not TensorRT\n')
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    try:
        status = tensorrt_status()
    finally:
        sys.modules.pop("tensorrt", None)  # imported for its version: gone with the stand-in
    assert status == {"found": True, "version": "10.3.0", "location": str(package), "runtime_auto": "tensorrt",
                      "reason": None, "fix": None}


def test_tensorrt_hidden_by_the_venv_is_explained(tmp_path, monkeypatch):
    """JetPack's TensorRT sits in the system's dist-packages; a venv without --system-site-packages cannot see it."""
    import device.info
    from device.info import runtime_banner, tensorrt_status

    system = tmp_path / "dist-packages"
    (system / "tensorrt").mkdir(parents=True)
    monkeypatch.setattr(device.info, "venv_includes_system_site", lambda prefix=None: False)
    status = tensorrt_status(system_dirs=(str(system),))
    assert not status["found"] and f"installed in {system} (JetPack)" in status["reason"]
    assert "--system-site-packages --upgrade" in status["fix"]
    banner = runtime_banner({"edgefold": "1", "board": "NVIDIA Jetson Orin Nano", "tensorrt_status": status,
                             "onnxruntime_providers": ["CPUExecutionProvider"]})
    assert banner.startswith("edgefold-agent 1 on NVIDIA Jetson Orin Nano: TensorRT NOT found (TensorRT is installed")
