import json
import subprocess
import sys


def agent(repo, *args):
    return subprocess.run([sys.executable, "-m", "device.cli", *args], cwd=repo, capture_output=True, text=True,
                          timeout=60)


def test_device_prints_its_fingerprint(repo):
    result = agent(repo, "device")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["machine"] and "CPUExecutionProvider" in info["onnxruntime_providers"]
    assert set(info) >= {"l4t", "jetpack", "gpu", "compute_capability", "tensorrt"}


def test_serve_is_visibly_unfinished(repo):
    result = agent(repo, "serve")
    assert result.returncode == 2
    assert "not built yet" in result.stderr and "trtexec" in result.stderr and "Traceback" not in result.stderr
